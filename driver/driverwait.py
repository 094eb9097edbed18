"""Waiting for the NVIDIA driver: an agent started before the driver (a GPU Operator node whose driver container
is still building its modules, a host whose driver is being installed) waits for it instead of crash-looping.

Where the driver is, seen from the agent's `--driver-root` (the host's `/` in the shipped manifest, mounted with
HostToContainer propagation, so that mounts made on the host later show under it):
- the GPU Operator's driver container: its root is mounted on the host at /run/nvidia/driver. When that directory
  exists under the driver root, it is the driver root (host path /run/nvidia/driver), whatever the host's own
  library directories hold: the Operator manages the driver on that node;
- otherwise the driver installed on the host itself: the driver root as given.
This detection applies when the driver root is the host's `/` (`--host-driver-root=/`); a driver root given as
anything else (GKE's /home/kubernetes/bin/nvidia, an explicit /run/nvidia/driver) is the only candidate.

The driver is there when `libnvidia-ml.so.1` is found under that root (driver.driverroot) and the kernel module
has created `/dev/nvidiactl`. `locate` is one look; `wait` looks every `poll_s` and says what it waits for at
once and then every `report_s`, until the driver is there or `stop` is set.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from driver.driverroot import NVML_LIBRARY, DriverRoot, DriverRootError
from gpudra.logfmt import quote

log = logging.getLogger("gpu-dra.driverwait")

OPERATOR_DRIVER_ROOT = "/run/nvidia/driver"
CONTROL_NODE = "nvidiactl"
POLL_SECONDS = 2.0
REPORT_SECONDS = 30.0


@dataclass(frozen=True)
class DriverLocation:
    root: Path  # the driver root as the agent sees it
    host_root: str  # the same tree's path on the host (what CDI specs name)

    def describe(self) -> str:
        return f"{self.root} (host {self.host_root})"


def candidate(root: Path, host_root: str) -> DriverLocation:
    """Where to look for the driver: the GPU Operator's driver container root when its directory is there under a
    driver root that is the host's /, else the driver root as given."""
    if host_root == "/":
        operator = root / OPERATOR_DRIVER_ROOT.lstrip("/")
        if operator.is_dir():
            return DriverLocation(operator, OPERATOR_DRIVER_ROOT)
    return DriverLocation(root, host_root)


def locate(root: Path, host_root: str, dev: Path) -> tuple[DriverLocation | None, list[str]]:
    """(where the driver is, []) once it is there; else (None, what is missing, one phrase each)."""
    where = candidate(root, host_root)
    if not where.root.is_dir():
        return None, [f"the driver root {where.describe()} (it does not exist)"]
    try:
        DriverRoot(where.root).find_library()
    except DriverRootError:
        also = (f"; or the GPU Operator's driver container at {root / OPERATOR_DRIVER_ROOT.lstrip('/')} (host "
                f"{OPERATOR_DRIVER_ROOT})" if where.host_root == "/" else "")
        return None, [f"{NVML_LIBRARY} under the driver root {where.describe()}{also}"]
    if not (dev / CONTROL_NODE).exists():
        return None, [f"the device node {dev / CONTROL_NODE} (the NVIDIA kernel module is not loaded yet)"]
    return where, []


def wait(
    root: Path, host_root: str, dev: Path, stop: threading.Event, *, poll_s: float = POLL_SECONDS,
    report_s: float = REPORT_SECONDS, clock: Callable[[], float] = time.monotonic,
) -> DriverLocation | None:
    """Block until the driver is there (its location) or `stop` is set (None), saying what it waits for."""
    started = clock()
    next_report = started
    while True:
        where, missing = locate(root, host_root, dev)
        if where is not None:
            if clock() > started:
                log.info("event=driver-found root=%s host_root=%s waited_s=%d", where.root, where.host_root,
                         clock() - started)
            return where
        if clock() >= next_report:
            log.warning("event=waiting-for-driver waited_s=%d next_report_s=%d msg=%s", clock() - started, report_s,
                        quote(f"waiting for the NVIDIA driver: {'; '.join(missing)}; looking again every "
                              f"{poll_s:g} s (the agent starts once the driver is there)"))
            next_report = clock() + report_s
        if stop.wait(poll_s):
            return None
