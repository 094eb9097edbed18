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
        # Why the last pass failed, until one succeeds: what `cluster status` reports of this controller.
        self.failure: str | None = None

    def run_once(self) -> None:
        try:
            self._reconcile()
        except (ApiError, OSError) as exc:
            self._log.warning("event=%s-pass-failed error=%r", self.name, str(exc))
            self.failure = str(exc) or type(exc).__name__
        else:
            self.failure = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.run_once()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
