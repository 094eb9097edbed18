"""Rediscovery: the node's GPUs walked again on a timer and when something suggests they changed.

The inventory is not frozen at start: mig-parted (or an admin with nvidia-smi) re-laying out MIG instances, a GPU
falling off the bus, or a driver-container upgrade without a reboot all happen under a running agent. A
`Rediscoverer` thread runs `discover` every `interval_s` and whenever `poke()` is called (an NVML error, a health
event), and compares:

- the driver changed (NVML reports another version, NVML refuses because the kernel module and library differ,
  or the driver root's libnvidia-ml.so.1 now resolves to another file): the loaded NVML and every driver path in
  the specs belong to the old driver, so `on_driver_change(reason)` is called, once; the agent then exits and the
  DaemonSet restarts it cleanly on the new driver;
- the GPUs or MIG layout changed: `on_change(fresh)`, which republishes;
- a walk failed: logged, retried at the next tick (the old inventory stays in force).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pynvml

from driver.inventory import Inventory

log = logging.getLogger("gpu-dra.rediscovery")

DEFAULT_INTERVAL_S = 60.0
# NVML errors that mean the loaded library no longer matches the driver in the kernel.
_DRIVER_GONE = (pynvml.NVMLError_LibRmVersionMismatch, pynvml.NVMLError_DriverNotLoaded, pynvml.NVMLError_Uninitialized)


class Rediscoverer:
    def __init__(
        self,
        walk: Callable[[], Inventory],
        current: Callable[[], Inventory],
        on_change: Callable[[Inventory], None],
        on_driver_change: Callable[[str], None],
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        library_changed: Callable[[], str | None] = lambda: None,
        lock: threading.Lock | None = None,
    ) -> None:
        self._walk = walk
        self._current = current
        self._on_change = on_change
        self._on_driver_change = on_driver_change
        self._interval_s = interval_s
        self._library_changed = library_changed
        # Held around walk, compare and install: another walker (prepare after creating a MIG device) must not
        # have its fresher inventory replaced by this one's older walk.
        self._lock = lock or threading.Lock()
        self._poked = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.driver_changed: str | None = None  # why, once it did

    def poke(self) -> None:
        """Rediscover now (from any thread)."""
        self._poked.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rediscovery", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._poked.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set() and self.driver_changed is None:
            self._poked.wait(self._interval_s)
            self._poked.clear()
            if self._stop.is_set():
                return
            self.check()

    def check(self) -> None:
        """One rediscovery (what a tick or a poke does)."""
        with self._lock:
            self._check()

    def _check(self) -> None:
        reason = self._library_changed()
        fresh: Inventory | None = None
        if reason is None:
            try:
                fresh = self._walk()
            except _DRIVER_GONE as exc:
                reason = f"NVML refuses the loaded library: {exc}"
            except Exception as exc:  # noqa: BLE001 - a failed walk keeps the old inventory; retried next tick
                log.warning("event=rediscover-failed error=%r", str(exc))
                return
        old = self._current()
        if reason is None and fresh is not None and fresh.driver_version != old.driver_version:
            reason = f"NVML reports driver {fresh.driver_version}, the agent started on {old.driver_version}"
        if reason is not None:
            self.driver_changed = reason
            log.error("event=driver-changed reason=%r", reason)
            self._on_driver_change(reason)
            return
        assert fresh is not None
        if _layout(fresh) != _layout(old):
            log.warning("event=inventory-changed node=%s gpus=%d mig_devices=%d", fresh.node, len(fresh.gpus),
                        sum(len(g.mig_devices) for g in fresh.gpus))
            self._on_change(fresh)


def _layout(inventory: Inventory) -> Any:
    """What a rediscovery compares: everything discovery reports (health is the monitor's, kept apart)."""
    return (inventory.driver_version, inventory.gpus, inventory.skipped)
