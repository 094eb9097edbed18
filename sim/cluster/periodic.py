"""The loop of a simulated kube-controller-manager controller: one pass every `interval` seconds on its own
thread until stopped. A pass that fails on the API (the server restarting, a conflict) is logged and the next
pass tries again, as a controller's resync does."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gpudra.kubeapi import ApiError


class Periodic:
    def __init__(self, name: str, reconcile: Callable[[], None], interval: float, log: logging.Logger) -> None:
        self.name = name
        self.interval = interval
        self._reconcile = reconcile
        self._log = log
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._reconcile()
            except (ApiError, OSError) as exc:
                self._log.warning("event=%s-pass-failed error=%r", self.name, str(exc))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
