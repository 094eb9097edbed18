"""Health monitoring: Xid classification, MIG attribution, lost GPUs, and a loop that never dies."""

from __future__ import annotations

import threading
from typing import Any

import pynvml
import pytest

from driver.discovery import discover
from driver.health import APPLICATION_XIDS, HealthMonitor, classify_xid, describe_xid
from driver.inventory import Health, Inventory
from driver.nvml import load_backend
from sim.nvml.simulator import SimulatedNvml


def _setup(profile: str = "dgx-a100-mig") -> tuple[SimulatedNvml, Inventory, HealthMonitor, list[tuple[str, Health]]]:
    nvml = load_backend(f"sim:{profile}")
    inv = discover(nvml, "n")
    changes: list[tuple[str, Health]] = []
    monitor = HealthMonitor(nvml, inv, lambda uuid, health: changes.append((uuid, health)))
    monitor.setup()
    return nvml, inv, monitor, changes


def _drain(monitor: HealthMonitor) -> None:
    while monitor.poll_once(0):
        pass


def test_classification_follows_nvidias_device_plugin() -> None:
    assert {13, 31, 43, 45, 68, 109} == APPLICATION_XIDS
    for xid in (13, 31, 43, 45, 68, 109):
        assert classify_xid(xid) == "application"
    for xid in (48, 64, 74, 79, 92, 94, 95, 119, 1234):
        assert classify_xid(xid) == "critical"
    assert describe_xid(79) == "GPU has fallen off the bus"


def test_critical_xid_marks_gpu_unhealthy_and_application_xid_is_informational() -> None:
    nvml, inv, monitor, changes = _setup("dgx-h100")
    gpu = inv.gpus[2].uuid
    nvml.inject_xid(gpu, 13)
    _drain(monitor)
    # Recorded (the slice shows it as an effect-None taint) but the GPU stays healthy.
    assert changes == [(gpu, Health(xids=(13,)))] and monitor.health(gpu).healthy
    nvml.inject_xid(gpu, 48)
    nvml.inject_xid(gpu, 48)  # a repeat is recorded too: health changes again
    _drain(monitor)
    assert changes[1:] == [(gpu, Health(xids=(13, 48))), (gpu, Health(xids=(13, 48, 48)))]
    assert not monitor.health(gpu).healthy
    assert monitor.health(inv.gpus[0].uuid).healthy


def test_xid_with_gpu_instance_goes_to_that_mig_device() -> None:
    nvml, inv, monitor, changes = _setup()
    mig = inv.gpus[2].mig_devices[1]
    nvml.inject_xid(mig.uuid, 94)
    _drain(monitor)
    assert changes == [(mig.uuid, Health(xids=(94,)))]
    assert monitor.health(inv.gpus[2].uuid).healthy


def test_lost_gpu_via_event_and_via_probe() -> None:
    nvml, inv, monitor, changes = _setup("dgx-a100")
    first, second = inv.gpus[0].uuid, inv.gpus[1].uuid
    nvml.mark_lost(first)
    _drain(monitor)
    assert monitor.health(first) == Health(xids=(79,), lost=True)
    # No event at all: the timeout path probes each GPU and finds it gone.
    nvml.fail_call("nvmlDeviceGetMemoryInfo", uuid=second, error="GPU_IS_LOST")
    assert monitor.poll_once(0) is False
    assert monitor.health(second).lost
    assert [u for u, _ in changes] == [first, second]


def test_faults_file_reaches_a_running_monitor(tmp_path: Any) -> None:
    from sim.nvml.faults import write_faults

    path = tmp_path / "faults.json"
    nvml = load_backend(f"sim:t4-1?faults={path}")
    inv = discover(nvml, "n")
    seen = threading.Event()
    got: list[tuple[str, Health]] = []

    def on_change(uuid: str, health: Health) -> None:
        got.append((uuid, health))
        seen.set()

    monitor = HealthMonitor(nvml, inv, on_change, wait_timeout_ms=50)
    monitor.start()
    try:
        write_faults(path, xids=[(inv.gpus[0].uuid, 64)])
        assert seen.wait(30), "the monitor thread never saw the Xid written to the faults file"
    finally:
        monitor.stop()
    assert got == [(inv.gpus[0].uuid, Health(xids=(64,)))]


class _FlakyNvml:
    """Delegates to the simulator; the first wait fails, the second stops the monitor."""

    def __init__(self, sim: SimulatedNvml, stop: Any) -> None:
        self._sim = sim
        self._stop = stop
        self.waits = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sim, name)

    def nvmlEventSetWait(self, es: Any, timeout: int) -> Any:
        self.waits += 1
        if self.waits == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        if self.waits == 2:
            raise ZeroDivisionError("a bug in a backend")
        self._stop()
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)


def test_run_survives_errors_and_stops() -> None:
    sim = load_backend("sim:t4-1")
    inv = discover(sim, "n")
    holder: dict[str, HealthMonitor] = {}
    flaky = _FlakyNvml(sim, lambda: holder["m"]._stop.set())
    monitor = HealthMonitor(flaky, inv, lambda u, h: None, max_backoff_s=0.0)
    holder["m"] = monitor
    monitor.run()  # returns only because the third wait asked it to stop
    assert flaky.waits == 3


def test_failing_callback_does_not_stop_monitoring() -> None:
    nvml = load_backend("sim:dgx-h100")
    inv = discover(nvml, "n")
    calls: list[str] = []

    def boom(uuid: str, health: Health) -> None:
        calls.append(uuid)
        raise RuntimeError("subscriber failed")

    monitor = HealthMonitor(nvml, inv, boom)
    monitor.setup()
    nvml.inject_xid(inv.gpus[0].uuid, 48)
    nvml.inject_xid(inv.gpus[1].uuid, 48)
    _drain(monitor)
    assert calls == [inv.gpus[0].uuid, inv.gpus[1].uuid]


def test_unregistrable_gpu_is_reported_unmonitored() -> None:
    nvml = load_backend("sim:l40s-4")
    inv = discover(nvml, "n")
    nvml.fail_call("nvmlDeviceRegisterEvents", uuid=inv.gpus[1].uuid, error="NOT_SUPPORTED")
    monitor = HealthMonitor(nvml, inv, lambda u, h: None)
    monitor.setup()
    assert list(monitor.unmonitored) == [inv.gpus[1].uuid]
    assert "Not Supported" in monitor.unmonitored[inv.gpus[1].uuid]


@pytest.mark.parametrize("xid", sorted(APPLICATION_XIDS))
def test_ignored_xids_can_be_configured(xid: int) -> None:
    nvml = load_backend("sim:t4-1")
    inv = discover(nvml, "n")
    changes: list[str] = []
    monitor = HealthMonitor(nvml, inv, lambda u, h: changes.append(u), ignored_xids=())
    monitor.setup()
    nvml.inject_xid(inv.gpus[0].uuid, xid)
    _drain(monitor)
    assert changes == [inv.gpus[0].uuid]


def test_gpu_lost_from_the_event_wait_taints_that_gpu_and_the_others_are_still_read() -> None:
    nvml, inv, monitor, changes = _setup("dgx-a100")
    first, second = inv.gpus[0].uuid, inv.gpus[1].uuid
    # Real NVML: once a GPU of the set is lost, the wait answers GPU_IS_LOST instead of an event.
    nvml.fail_call("nvmlEventSetWait_v2", error="GPU_IS_LOST")
    nvml.fail_call("nvmlDeviceGetMemoryInfo", uuid=first, error="GPU_IS_LOST")
    assert monitor.poll_once(0) is True
    assert monitor.health(first).lost and not monitor.health(second).lost
    assert [u for u, _ in changes] == [first]
    # The set is built again without the lost GPU: another GPU's Xid is read, not swallowed in a retry loop.
    nvml.clear()
    nvml.fail_call("nvmlDeviceGetMemoryInfo", uuid=first, error="GPU_IS_LOST")
    assert monitor.poll_once(0) is False  # a new event set, registered again
    nvml.inject_xid(second, 48)
    _drain(monitor)
    assert monitor.health(second) == Health(xids=(48,))
    assert first not in {w.uuid for w in monitor._watched.values()}


def test_gpu_lost_from_the_wait_with_no_gpu_answering_lost_taints_all() -> None:
    nvml, inv, monitor, _ = _setup("l40s-4")
    nvml.fail_call("nvmlEventSetWait_v2", error="GPU_IS_LOST")
    monitor.poll_once(0)
    assert all(monitor.health(g.uuid).lost for g in inv.gpus)


def test_unmonitored_gpu_gets_an_informational_taint() -> None:
    from driver.slices import SliceSettings, build_slices

    nvml = load_backend("sim:l40s-4")
    inv = discover(nvml, "n")
    nvml.fail_call("nvmlDeviceRegisterEvents", uuid=inv.gpus[1].uuid, error="NOT_SUPPORTED")
    changes: dict[str, Health] = {}
    monitor = HealthMonitor(nvml, inv, lambda u, h: changes.__setitem__(u, h))
    monitor.setup()
    health = changes[inv.gpus[1].uuid]
    assert health.unmonitored and health.healthy
    from dataclasses import replace as dc_replace

    gpus = tuple(dc_replace(g, health=changes.get(g.uuid, g.health)) for g in inv.gpus)
    slices = build_slices(dc_replace(inv, gpus=gpus), SliceSettings(node_name="n", driver_name="gpu.nvidia.com"))
    taints = {d["name"]: d.get("taints", []) for s in slices for d in s["spec"]["devices"]}
    tainted = [n for n, t in taints.items() if t]
    assert len(tainted) == 1
    assert taints[tainted[0]] == [{"key": "gpu.nvidia.com/unmonitored", "effect": "None"}]


def test_ignore_xids_flag() -> None:
    import argparse

    from driver.commands.plugin import register

    parser = argparse.ArgumentParser()
    register(parser)
    assert parser.parse_args(["--node", "n", "--nvml", "real", "--ignore-xids", "63, 64,92"]).ignore_xids == {63, 64, 92}
    assert parser.parse_args(["--node", "n", "--nvml", "real"]).ignore_xids == frozenset()
    with pytest.raises(SystemExit):
        parser.parse_args(["--node", "n", "--nvml", "real", "--ignore-xids", "48,x"])
