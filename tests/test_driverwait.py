"""An agent started before the NVIDIA driver waits for it (driver/driverwait.py) instead of crash-looping: where
the driver is looked for (the host's / or the GPU Operator's /run/nvidia/driver under it), what the waiting
message names, the probes while it waits; the agent that goes on once the driver appears is in
tests/test_nodebox.py."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from driver import driverwait
from driver.plugin.healthcheck import LIVENESS_SERVICE, HealthServicer, Probe
from gpudra.kubeletapi.grpchealth.v1 import api_pb2 as health_pb

SERVING, NOT_SERVING = health_pb.HealthCheckResponse.SERVING, health_pb.HealthCheckResponse.NOT_SERVING


def _driver(root: Path, lib_dir: str = "usr/lib/x86_64-linux-gnu") -> None:
    lib = root / lib_dir
    lib.mkdir(parents=True, exist_ok=True)
    (lib / "libnvidia-ml.so.580.95.05").write_bytes(b"\x7fELF")
    (lib / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.580.95.05")


def test_locate_names_what_is_missing_and_prefers_the_operators_driver_root(tmp_path: Path) -> None:
    host, dev = tmp_path / "host", tmp_path / "dev"
    dev.mkdir()
    where, missing = driverwait.locate(host, "/", dev)
    assert where is None and missing == [f"the driver root {host} (host /) (it does not exist)"]
    host.mkdir()
    where, missing = driverwait.locate(host, "/", dev)
    assert where is None and missing[0].startswith(f"libnvidia-ml.so.1 under the driver root {host} (host /); or the "
                                                    f"GPU Operator's driver container at {host}/run/nvidia/driver")
    _driver(host)
    where, missing = driverwait.locate(host, "/", dev)
    assert where is None and missing == [f"the device node {dev}/nvidiactl (the NVIDIA kernel module is not loaded yet)"]
    (dev / "nvidiactl").touch()
    assert driverwait.locate(host, "/", dev) == (driverwait.DriverLocation(host, "/"), [])
    # The GPU Operator's mount point appears: its driver container's root is the driver root, waited for while empty.
    operator = host / "run/nvidia/driver"
    operator.mkdir(parents=True)
    where, missing = driverwait.locate(host, "/", dev)
    assert where is None and f"under the driver root {operator} (host /run/nvidia/driver)" in missing[0]
    _driver(operator)
    assert driverwait.locate(host, "/", dev) == (driverwait.DriverLocation(operator, "/run/nvidia/driver"), [])
    # A driver root given as something other than the host's / is the only place looked at (GKE).
    gke = host / "home/kubernetes/bin/nvidia"
    _driver(gke, "lib64")
    assert driverwait.locate(gke, "/home/kubernetes/bin/nvidia", dev) == (
        driverwait.DriverLocation(gke, "/home/kubernetes/bin/nvidia"), [])


def test_wait_reports_at_once_then_periodically_and_returns_when_the_driver_is_there(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    host, dev = tmp_path / "host", tmp_path / "dev"
    host.mkdir()
    dev.mkdir()
    stop = threading.Event()

    def arrive() -> None:
        time.sleep(0.5)
        _driver(host)
        time.sleep(0.3)
        (dev / "nvidiactl").touch()

    threading.Thread(target=arrive, daemon=True).start()
    with caplog.at_level(logging.INFO, logger="gpu-dra.driverwait"):
        where = driverwait.wait(host, "/", dev, stop, poll_s=0.05, report_s=0.2)
    assert where == driverwait.DriverLocation(host, "/")
    waiting = [r.getMessage() for r in caplog.records if "event=waiting-for-driver" in r.getMessage()]
    assert len(waiting) >= 3 and "waiting for the NVIDIA driver: libnvidia-ml.so.1 under the driver root" in waiting[0]
    assert any("the device node" in m and "nvidiactl" in m for m in waiting)
    assert "event=driver-found" in caplog.records[-1].getMessage()
    stop.set()
    assert driverwait.wait(tmp_path / "never", "/", dev, stop, poll_s=0.05) is None  # stopped while waiting


def test_probes_while_the_agent_is_not_up() -> None:
    """Waiting for the driver: the liveness service answers SERVING (no crash loop), readiness NOT_SERVING; while
    starting, liveness for the startup budget only; once up, every name runs the probes."""
    servicer = HealthServicer([], frozenset({"gpu.nvidia.com"}))
    servicer.pending("waiting for the NVIDIA driver")
    assert servicer.status(LIVENESS_SERVICE)[0] == SERVING
    assert servicer.status("") == (NOT_SERVING, "not up: waiting for the NVIDIA driver")
    servicer.pending("starting", budget_s=0.2)
    assert servicer.status(LIVENESS_SERVICE)[0] == SERVING
    time.sleep(0.3)
    assert servicer.status(LIVENESS_SERVICE)[0] == NOT_SERVING  # a start wedged past the budget is restarted

    def broken(timeout: float) -> None:
        raise RuntimeError("nvml wedged")

    servicer.up([Probe("nvml", broken)])
    assert servicer.status(LIVENESS_SERVICE) == (NOT_SERVING, "nvml: nvml wedged")
    servicer.up([])
    assert servicer.status("")[0] == SERVING and servicer.status(LIVENESS_SERVICE)[0] == SERVING


@pytest.mark.process
def test_plugin_waits_for_the_driver_instead_of_exiting(tmp_path: Path) -> None:
    """Before: exit 2 at once (CrashLoopBackOff). Now: it waits, naming what it waits for, and stops cleanly."""
    root = tmp_path / "no-driver"
    root.mkdir()
    with open(tmp_path / "plugin.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "plugin", "--node", "n1", "--nvml", "real", "--driver-root", str(root),
             "--dev-root", str(tmp_path / "dev")], stdout=subprocess.DEVNULL, stderr=log,
        )
    try:
        deadline = time.monotonic() + 60
        while "event=waiting-for-driver" not in (tmp_path / "plugin.log").read_text():
            assert proc.poll() is None, (tmp_path / "plugin.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "plugin.log").read_text()
            time.sleep(0.1)
        time.sleep(1.0)
        assert proc.poll() is None  # still waiting, not crashed
        text = (tmp_path / "plugin.log").read_text()
        assert f"libnvidia-ml.so.1 under the driver root {root} (host /)" in text
        assert f"GPU Operator's driver container at {root}/run/nvidia/driver (host /run/nvidia/driver)" in text
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
