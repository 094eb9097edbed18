"""GPU health monitoring over an NVML backend: Xid events and GPUs that fall off the bus.

Classification follows NVIDIA's device plugin: a handful of Xids report application faults
(the GPU stays usable); every other critical Xid makes the device unhealthy. Application Xids
are still recorded, so that the slice shows them as an informational taint (effect None) while
the device stays HEALTHY on the health stream (`Health.healthy` ignores them). Xids that carry a
GPU-instance id are charged to that MIG device only.

Health is sticky, as in NVIDIA's drivers: an unhealthy or lost GPU stays so until the agent restarts,
which is what follows a GPU reset (the simulator's "clear" of its faults models that reset); NVML
has no event that says a GPU recovered, and a GPU that produced a double-bit ECC error must not
come back on its own.

The monitor never raises out of its loop: NVML errors are logged and retried with backoff.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import pynvml

from driver.inventory import APPLICATION_XIDS, Health, Inventory
from driver.nvmlapi import NvmlBackend

log = logging.getLogger(__name__)

# APPLICATION_XIDS (driver.inventory), as NVIDIA's device plugin skips them: 13 graphics engine exception,
# 31 GPU memory page fault, 43 GPU stopped processing, 45 preemptive cleanup after previous errors,
# 68 video processor exception, 109 context switch timeout. The GPU is still healthy.

# Known hardware/driver failures, for messages; any Xid not in APPLICATION_XIDS is critical.
XID_DESCRIPTIONS: dict[int, str] = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}

_NOT_A_MIG_INSTANCE = 0xFFFFFFFF
_XID_HISTORY = 16
_XID_LOST = 79


def classify_xid(xid: int) -> str:
    """'application' (ignored, the GPU stays healthy) or 'critical' (the device becomes unhealthy)."""
    return "application" if xid in APPLICATION_XIDS else "critical"


def describe_xid(xid: int) -> str:
    return XID_DESCRIPTIONS.get(xid, "application error" if xid in APPLICATION_XIDS else "critical error")


HealthCallback = Callable[[str, Health], None]


@dataclass(frozen=True)
class _Watched:
    uuid: str
    handle: Any
    mig_by_gi: dict[int, str]  # GPU instance id -> MIG device uuid


def _address(handle: Any) -> int | None:
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return None


class HealthMonitor:
    """Watches the inventory's GPUs (and MIG devices) and calls `on_change(uuid, health)` on every change.

    `ignored_xids` are dropped entirely (application Xids are recorded by default: see the module doc).

    Use `start()`/`stop()` for a background thread, or `setup()` + `poll_once()` to drive it step by step.
    """

    def __init__(
        self,
        nvml: NvmlBackend,
        inventory: Inventory,
        on_change: HealthCallback,
        *,
        wait_timeout_ms: int = 1000,
        ignored_xids: Iterable[int] = (),
        max_backoff_s: float = 10.0,
    ) -> None:
        self._nvml = nvml
        self._inventory = inventory
        self._on_change = on_change
        self._wait_timeout_ms = wait_timeout_ms
        self._ignored = frozenset(ignored_xids)
        self._max_backoff_s = max_backoff_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._health: dict[str, Health] = {}
        self._watched: dict[int, _Watched] = {}  # handle address -> GPU
        self._event_set: Any = None
        self.unmonitored: dict[str, str] = {}  # uuid -> why events cannot be received for it

    # ------------------------------------------------------------------ state

    def health(self, uuid: str) -> Health:
        with self._lock:
            return self._health.get(uuid, Health())

    def snapshot(self) -> dict[str, Health]:
        with self._lock:
            return dict(self._health)

    def _update(self, uuid: str, *, xid: int | None = None, lost: bool = False, unmonitored: bool = False) -> None:
        with self._lock:
            before = self._health.get(uuid, Health())
            after = before
            if xid is not None:
                after = replace(after, xids=(*after.xids, xid)[-_XID_HISTORY:])
            if lost:
                after = replace(after, lost=True)
            if unmonitored:
                after = replace(after, unmonitored=True)
            if after == before:
                return
            self._health[uuid] = after
        log.warning("event=health-change device=%s healthy=%s lost=%s xids=%s unmonitored=%s", uuid, after.healthy,
                    after.lost, list(after.xids), after.unmonitored)
        try:
            self._on_change(uuid, after)
        except Exception:  # noqa: BLE001 - a failing callback must not stop monitoring
            log.exception("event=health-callback-failed device=%s", uuid)

    # ------------------------------------------------------------------ NVML

    def setup(self) -> None:
        """Create the event set and register every GPU for Xid events (lost ones excepted: a lost GPU in the set
        fails every wait, and the other GPUs' Xids would never be read)."""
        self._event_set = self._nvml.nvmlEventSetCreate()
        self._watched = {}
        for gpu in self._inventory.gpus:
            if self.health(gpu.uuid).lost:
                continue
            mig_by_gi = {m.gpu_instance_id: m.uuid for m in gpu.mig_devices}
            try:
                handle = self._nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
            except pynvml.NVMLError_GpuIsLost:
                self._update(gpu.uuid, lost=True)
                continue
            except pynvml.NVMLError as exc:
                self._unmonitored(gpu.uuid, f"no handle: {exc}")
                continue
            addr = _address(handle)
            if addr is None:
                self._unmonitored(gpu.uuid, "NVML returned an unusable handle")
                continue
            self._watched[addr] = _Watched(gpu.uuid, handle, mig_by_gi)
            try:
                self._nvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._event_set)
            except pynvml.NVMLError_GpuIsLost:
                self._update(gpu.uuid, lost=True)
            except pynvml.NVMLError as exc:
                # Old GPUs cannot deliver Xid events; lost-GPU probing still covers them.
                self._unmonitored(gpu.uuid, f"Xid events not available: {exc}")

    def _unmonitored(self, uuid: str, reason: str) -> None:
        self.unmonitored[uuid] = reason
        log.warning("event=health-unmonitored device=%s reason=%r", uuid, reason)
        self._update(uuid, unmonitored=True)

    def poll_once(self, timeout_ms: int | None = None) -> bool:
        """Wait for one event (or the timeout) and apply it. Returns True when an event was processed."""
        if self._event_set is None:
            self.setup()
        try:
            data = self._nvml.nvmlEventSetWait(self._event_set, self._wait_timeout_ms if timeout_ms is None else timeout_ms)
        except pynvml.NVMLError_Timeout:
            self._probe_lost()
            return False
        except pynvml.NVMLError_GpuIsLost:
            self._wait_lost()
            return True
        if int(data.eventType) & pynvml.nvmlEventTypeXidCriticalError:
            self._apply_xid(data)
        return True

    def _apply_xid(self, data: Any) -> None:
        xid = int(data.eventData)
        watched = self._watched.get(_address(data.device) or -1)
        if watched is None:
            log.warning("event=xid-unknown-device xid=%d", xid)
            return
        if xid in self._ignored:
            log.info("event=xid-ignored device=%s xid=%d", watched.uuid, xid)
            return
        gi = int(data.gpuInstanceId)
        target = watched.mig_by_gi.get(gi, watched.uuid) if gi != _NOT_A_MIG_INSTANCE else watched.uuid
        log.warning("event=xid device=%s xid=%d kind=%s description=%r", target, xid, classify_xid(xid), describe_xid(xid))
        self._update(target, xid=xid, lost=xid == _XID_LOST and target == watched.uuid)

    def update_inventory(self, inventory: Inventory) -> None:
        """Follow MIG devices created or destroyed since setup, so their Xids are charged to them."""
        by_uuid = {g.uuid: g for g in inventory.gpus}
        with self._lock:
            for addr, w in list(self._watched.items()):
                gpu = by_uuid.get(w.uuid)
                if gpu is not None:
                    self._watched[addr] = replace(w, mig_by_gi={m.gpu_instance_id: m.uuid for m in gpu.mig_devices})
            self._inventory = inventory

    def _probe_lost(self) -> list[str]:
        """Between events, ask each GPU for something cheap: a lost GPU answers GPU_IS_LOST. Returns those found."""
        found = []
        for w in list(self._watched.values()):
            if self.health(w.uuid).lost:
                continue
            try:
                self._nvml.nvmlDeviceGetMemoryInfo(w.handle)
            except pynvml.NVMLError_GpuIsLost:
                self._update(w.uuid, lost=True)
                found.append(w.uuid)
            except pynvml.NVMLError:
                pass  # other failures say nothing about the GPU being on the bus
        return found

    def _wait_lost(self) -> None:
        """The event wait itself answered GPU_IS_LOST: a GPU of the set fell off the bus, the wait does not say
        which. Those that answer GPU_IS_LOST are tainted; when none does, every watched GPU is (the wait cannot be
        trusted for any of them, as NVIDIA's plugin treats it). The event set is then built again without the
        lost GPUs, so that the others' Xids are read again."""
        found = self._probe_lost()
        if not found:
            found = [w.uuid for w in self._watched.values() if not self.health(w.uuid).lost]
            for uuid in found:
                self._update(uuid, lost=True)
        log.error("event=event-wait-gpu-lost devices=%s", ",".join(found))
        self._free()

    # ------------------------------------------------------------------ thread

    def run(self) -> None:
        """Monitor until stop(); never raises."""
        backoff = 0.1
        while not self._stop.is_set():
            try:
                self.poll_once()
                backoff = 0.1
            except pynvml.NVMLError as exc:
                log.error("event=health-nvml-error error=%r retry_in_s=%.1f", str(exc), backoff)
                self._event_set = None if isinstance(exc, pynvml.NVMLError_Uninitialized) else self._event_set
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self._max_backoff_s)
            except Exception:  # noqa: BLE001 - the monitor must outlive any single failure
                log.exception("event=health-loop-error")
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self._max_backoff_s)
        self._free()

    def _free(self) -> None:
        if self._event_set is not None:
            try:
                self._nvml.nvmlEventSetFree(self._event_set)
            except pynvml.NVMLError:
                pass
            self._event_set = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name="gpu-health", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
