"""Per-MIG-device health through the node agent: simulator faults file -> real HealthMonitor -> NodeAgent ->
ResourceSlice taints in the embedded API server and the health stream the kubelet simulator follows.

An Xid carrying a GPU-instance id (the simulator sets it when the faulted UUID is a MIG device's) is charged to
that MIG device alone: only it is tainted and UNHEALTHY. A fault of the parent GPU taints every MIG device on it.
An application Xid on a MIG device taints it with effect None and leaves it HEALTHY. The stream and the slice
taints must agree device by device.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.discovery import discover
from driver.health import HealthMonitor
from driver.inventory import Gpu
from sim.kubelet.dra import HealthUpdate, KubeletSim, RegisteredPlugin
from driver.nvml import load_backend
from sim.nvml.faults import append_xid, write_faults
from driver.plugin.agent import AgentSettings, NodeAgent, kubeapi_claim_getter
from driver.publisher import SlicePublisher
from driver.slices import gpu_device_name, mig_device_name
from tests.plugin_helpers import DRIVER, NODE, short_tmp

DEADLINE_S = 30.0
PROFILE = "h100-mig"  # GPUs 0-3 carry MIG instances


def _wait(condition: Callable[[], Any], what: str, timeout: float = DEADLINE_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class HealthFollower:
    """Follows the plugin's health stream in a thread, keeping the latest complete device list."""

    def __init__(self, plugin: RegisteredPlugin) -> None:
        self.latest: HealthUpdate | None = None
        self._thread = threading.Thread(target=self._follow, args=(plugin,), daemon=True)
        self._thread.start()

    def _follow(self, plugin: RegisteredPlugin) -> None:
        try:
            for update in plugin.watch_health():
                self.latest = update
        except Exception:  # noqa: BLE001 - the stream ends with an error when the plugin stops
            return

    def states(self) -> dict[str, str]:
        latest = self.latest
        return {} if latest is None else {d: h for _, d, h in latest.devices}


def _published(api: Any) -> dict[str, dict[str, Any]]:
    slices, _ = api.list("ResourceSlice")
    return {d["name"]: d for s in slices if s["spec"]["nodeName"] == NODE for d in s["spec"].get("devices", [])}


def _taints(api: Any) -> dict[str, set[tuple[str, str | None, str]]]:
    """Device name -> its taints, for the tainted devices only."""
    return {
        name: {(t["key"], t.get("value"), t["effect"]) for t in d["taints"]}
        for name, d in _published(api).items()
        if d.get("taints")
    }


@pytest.fixture
def work() -> Iterator[Path]:
    with short_tmp() as path:
        yield path


def _start(work: Path, api: Any, faults: Path, partitionable: bool) -> tuple[NodeAgent, list[Gpu]]:
    nvml = load_backend(f"sim:{PROFILE}?faults={faults}", node=NODE)
    inventory = discover(nvml, NODE)
    (work / "boot_id").write_text("boot-1\n")
    settings = AgentSettings(
        node_name=NODE, driver_name=DRIVER, kubelet_dir=work / "kubelet", cdi_dir=work / "cdi", watch_seconds=0.05,
        boot_id_path=work / "boot_id", partitionable=partitionable,
    )
    agent = NodeAgent(
        settings, nvml=nvml, inventory=inventory, get_claim=kubeapi_claim_getter(api),
        publisher=SlicePublisher(api, DRIVER, NODE, backoff_seconds=0.05),
        monitor_factory=lambda n, inv, cb: HealthMonitor(n, inv, cb, wait_timeout_ms=50),
    )
    agent.start()
    return agent, list(inventory.gpus)


def _agree(follower: HealthFollower, api: Any) -> bool:
    """Every device on the stream is UNHEALTHY exactly when its published slice entry has a NoSchedule taint."""
    states, taints = follower.states(), _taints(api)
    return bool(states) and all(
        (h == "UNHEALTHY") == any(effect == "NoSchedule" for _, _, effect in taints.get(d, ())) for d, h in states.items()
    )


@pytest.mark.slow
@pytest.mark.parametrize("partitionable", [False, True], ids=["static", "partitionable"])
def test_mig_xid_taints_exactly_that_mig_device(work: Path, apiserver: Any, partitionable: bool) -> None:
    faults = work / "faults.json"
    write_faults(faults)
    agent, gpus = _start(work, apiserver.api, faults, partitionable)
    kubelet = KubeletSim(work / "kubelet")
    try:
        follower = HealthFollower(kubelet.wait_for_plugin(DRIVER, timeout=DEADLINE_S))
        first_gpu, second_gpu = [g for g in gpus if g.mig_devices][:2]
        assert len(first_gpu.mig_devices) >= 3 and second_gpu.mig_devices, f"profile {PROFILE} changed its MIG layout"
        sick, app, bystander = first_gpu.mig_devices[:3]
        names = {m.uuid: mig_device_name(first_gpu, m) for m in first_gpu.mig_devices}
        _wait(lambda: names[sick.uuid] in _published(apiserver.api), "the MIG devices published")
        _wait(lambda: follower.states().get(names[sick.uuid]) == "HEALTHY", "the first health message")
        assert _taints(apiserver.api) == {}

        # A contained ECC error in one GPU instance: NVML reports it with that instance's id.
        append_xid(faults, sick.uuid, 94)
        _wait(lambda: follower.states().get(names[sick.uuid]) == "UNHEALTHY", "Xid 94 on the health stream")
        _wait(lambda: _taints(apiserver.api) == {names[sick.uuid]: {(f"{DRIVER}/xid", "94", "NoSchedule")}},
              "the Xid 94 taint on exactly that MIG device")
        assert _agree(follower, apiserver.api)
        if partitionable:
            assert follower.states()[gpu_device_name(first_gpu)] == "HEALTHY"

        # An application Xid on a sibling: informational taint on it alone, still HEALTHY.
        append_xid(faults, app.uuid, 13)
        _wait(lambda: _taints(apiserver.api).get(names[app.uuid]) == {(f"{DRIVER}/xid", "13", "None")},
              "the Xid 13 taint on the sibling")
        assert follower.states()[names[app.uuid]] == "HEALTHY"
        assert set(_taints(apiserver.api)) == {names[sick.uuid], names[app.uuid]}

        # A double-bit ECC error on another GPU itself: every device of that GPU is tainted (its MIG devices, and
        # when partitionable also its full-GPU device and every placement), nothing else changes.
        before = _taints(apiserver.api)
        append_xid(faults, second_gpu.uuid, 48)
        children = {mig_device_name(second_gpu, m) for m in second_gpu.mig_devices}
        of_second = {n for n in _published(apiserver.api) if n.startswith(gpu_device_name(second_gpu))}
        assert children <= of_second and (gpu_device_name(second_gpu) in of_second) == partitionable
        _wait(lambda: of_second <= set(_taints(apiserver.api)), "the parent's Xid 48 on all its devices")
        got = _taints(apiserver.api)
        assert all(got[n] == {(f"{DRIVER}/xid", "48", "NoSchedule")} for n in of_second)
        assert {k: v for k, v in got.items() if k not in of_second} == before
        _wait(lambda: all(follower.states().get(c) == "UNHEALTHY" for c in children), "the parent's children UNHEALTHY")
        assert follower.states()[names[bystander.uuid]] == "HEALTHY"
        assert follower.states()[names[sick.uuid]] == "UNHEALTHY"
        _wait(lambda: _agree(follower, apiserver.api), "health stream and slice taints agreeing")
    finally:
        kubelet.close()
        agent.stop()
