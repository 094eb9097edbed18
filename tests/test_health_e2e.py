"""Health end to end: simulator faults file -> real `gpu-dra plugin` process (real HealthMonitor) -> health stream
followed by the kubelet simulator and device taints on the ResourceSlices in the embedded API server.

Xid 48 (double-bit ECC) makes the device UNHEALTHY and taints it NoSchedule; Xid 13 (an application error) leaves
it HEALTHY with an informational taint (effect None); a lost GPU gets the gpu-lost taint. Health is sticky as in
NVIDIA's drivers, and kept across agent restarts (the checkpoint): clearing the faults changes nothing until the
operator's reset step (`gpu-dra node-health --forget`) and an agent restart, which is what follows a GPU reset.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.discovery import discover
from sim.kubelet.dra import HealthUpdate, KubeletSim, RegisteredPlugin
from driver.nvml import load_backend
from sim.nvml.faults import append_xid, read_faults, write_faults
from driver.slices import gpu_device_name
from tests.plugin_helpers import DRIVER, NODE, short_tmp, stop_process

REPO = Path(__file__).resolve().parent.parent
DEADLINE_S = 60.0


def _wait(condition: Callable[[], Any], what: str, timeout: float = DEADLINE_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Plugin:
    def __init__(self, work: Path, kubeconfig: Path, faults: Path) -> None:
        self.work, self.kubeconfig, self.faults = work, kubeconfig, faults
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("GPU_DRA_SIM_FAULTS", None)
        with open(self.work / "plugin.log", "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "plugin", "--node", NODE, "--nvml", f"sim:dgx-h100?faults={self.faults}",
                 "--kubeconfig", str(self.kubeconfig), "--kubelet-dir", str(self.work / "kubelet"),
                 "--cdi-dir", str(self.work / "cdi"), "--log-level", "WARNING"],
                env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log,
            )

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_process(proc)


class HealthFollower:
    """Follows one plugin's health stream in a thread, keeping every message."""

    def __init__(self, plugin: RegisteredPlugin) -> None:
        self.updates: list[HealthUpdate] = []
        self._thread = threading.Thread(target=self._follow, args=(plugin,), daemon=True)
        self._thread.start()

    def _follow(self, plugin: RegisteredPlugin) -> None:
        try:
            for update in plugin.watch_health():
                self.updates.append(update)
        except Exception:  # noqa: BLE001 - the stream ends with an error when the plugin stops
            return

    def health(self, device: str) -> str | None:
        if not self.updates:
            return None
        return next((h for _, d, h in self.updates[-1].devices if d == device), None)


def _pool(api: Any) -> tuple[int, dict[str, dict[str, Any]]]:
    slices, _ = api.list("ResourceSlice")
    ours = [s for s in slices if s["spec"]["driver"] == DRIVER and s["spec"]["nodeName"] == NODE]
    generation = max((int(s["spec"]["pool"]["generation"]) for s in ours), default=-1)
    devices = {d["name"]: d for s in ours for d in s["spec"].get("devices", [])}
    return generation, devices


def _taints(api: Any, device: str) -> set[tuple[str, str | None, str]]:
    _, devices = _pool(api)
    return {(t["key"], t.get("value"), t["effect"]) for t in devices.get(device, {}).get("taints", [])}


@pytest.fixture
def work() -> Iterator[Path]:
    with short_tmp() as path:
        yield path


@pytest.mark.slow
def test_faults_reach_health_stream_and_slice_taints(work: Path, apiserver: Any) -> None:
    gpus = discover(load_backend("sim:dgx-h100", node=NODE), NODE).gpus
    dbe, app, lost, other = gpus[0], gpus[1], gpus[2], gpus[3]
    name = {g.uuid: gpu_device_name(g) for g in gpus}
    faults = work / "faults.json"
    write_faults(faults)
    plugin = Plugin(work, apiserver.kubeconfig, faults)
    kubelet = KubeletSim(work / "kubelet")
    plugin.start()
    try:
        registered = kubelet.wait_for_plugin(DRIVER, timeout=DEADLINE_S)
        follower = HealthFollower(registered)
        _wait(lambda: follower.health(name[dbe.uuid]) == "HEALTHY", "the first health message")
        _wait(lambda: len(_pool(apiserver.api)[1]) == len(gpus), "the slices published")
        first_generation = _pool(apiserver.api)[0]
        assert all("taints" not in d for d in _pool(apiserver.api)[1].values())

        # Xid 48: UNHEALTHY on the stream, NoSchedule taint, new pool generation.
        append_xid(faults, dbe.uuid, 48)
        _wait(lambda: follower.health(name[dbe.uuid]) == "UNHEALTHY", "Xid 48 on the health stream")
        _wait(lambda: _taints(apiserver.api, name[dbe.uuid]) == {(f"{DRIVER}/xid", "48", "NoSchedule")}, "the Xid 48 taint")
        xid_generation = _pool(apiserver.api)[0]
        assert xid_generation > first_generation

        # Xid 13 (application error): informational taint, the device stays HEALTHY.
        append_xid(faults, app.uuid, 13)
        _wait(lambda: _taints(apiserver.api, name[app.uuid]) == {(f"{DRIVER}/xid", "13", "None")}, "the Xid 13 taint")
        assert _pool(apiserver.api)[0] > xid_generation
        assert all(h == "HEALTHY" for u in follower.updates for _, d, h in u.devices if d == name[app.uuid])

        # A GPU that falls off the bus: gpu-lost taint (and the Xid 79 NVML reports with it), UNHEALTHY.
        current = read_faults(faults)
        write_faults(faults, xids=[(x.uuid, x.xid) for x in current.xids], lost=[lost.uuid])
        _wait(lambda: follower.health(name[lost.uuid]) == "UNHEALTHY", "the lost GPU on the health stream")
        _wait(
            lambda: _taints(apiserver.api, name[lost.uuid]) == {(f"{DRIVER}/gpu-lost", None, "NoSchedule"), (f"{DRIVER}/xid", "79", "NoSchedule")},
            "the gpu-lost taint",
        )
        assert follower.health(name[other.uuid]) == "HEALTHY" and _taints(apiserver.api, name[other.uuid]) == set()

        # Clearing the faults is a GPU reset: health is sticky until the agent restarts. An event on another GPU,
        # seen after the clear, shows the monitor read the cleared file and kept the earlier faults.
        write_faults(faults, xids=[(other.uuid, 13)])
        _wait(lambda: _taints(apiserver.api, name[other.uuid]) == {(f"{DRIVER}/xid", "13", "None")}, "the barrier event")
        assert _taints(apiserver.api, name[dbe.uuid]) == {(f"{DRIVER}/xid", "48", "NoSchedule")}
        assert (f"{DRIVER}/gpu-lost", None, "NoSchedule") in _taints(apiserver.api, name[lost.uuid])
        assert follower.health(name[dbe.uuid]) == "UNHEALTHY"
        before_restart = _pool(apiserver.api)[0]

        # Restart after the reset: taints gone, a new generation, everything HEALTHY on the new stream.
        write_faults(faults)
        plugin.stop()
        forgot = subprocess.run([sys.executable, "-m", "cli.main", "node-health", "--kubelet-dir", str(work / "kubelet"),
                                 "--forget", "all"], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                                capture_output=True, text=True, timeout=60)
        assert forgot.returncode == 0 and "forgot GPU-" in forgot.stderr, forgot.stderr
        kubelet.restart()
        plugin.start()
        registered = kubelet.wait_for_plugin(DRIVER, timeout=DEADLINE_S)
        follower = HealthFollower(registered)
        _wait(lambda: all(not d.get("taints") for d in _pool(apiserver.api)[1].values()), "the taints removed")
        assert _pool(apiserver.api)[0] > before_restart
        _wait(lambda: follower.updates, "the health stream after the restart")
        assert {h for _, _, h in follower.updates[-1].devices} == {"HEALTHY"}
    finally:
        kubelet.close()
        plugin.stop()
