"""Health that must survive the agent (driver.stickyhealth): critical Xids, a lost GPU and unmonitored GPUs are kept
in the checkpoint and restored before the first publish, so a tainted GPU stays tainted across a restart or an
upgrade; a reboot (new boot id) or `forget_health` (after a GPU reset) drops them. Old checkpoints still load."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from driver.checkpoint import SCHEMA_VERSION, Checkpoint, HealthRecord, canonical_json, sha256_hex
from driver.discovery import discover
from driver.health import HealthMonitor
from driver.nvml import load_backend
from driver.plugin.agent import AgentSettings, NodeAgent, kubeapi_claim_getter
from driver.publisher import SlicePublisher
from driver.slices import gpu_device_name
from sim.kubelet.dra import KubeletSim
from sim.nvml.faults import append_xid, write_faults
from tests.plugin_helpers import DRIVER, NODE, short_tmp

PROFILE = "dgx-h100"


@pytest.fixture
def work() -> Iterator[Path]:
    with short_tmp() as path:
        yield path


class FirstPublish(SlicePublisher):
    """Records what the agent's first publish wrote."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.writes: list[list[dict[str, Any]]] = []

    def publish(self, desired: Sequence[Mapping[str, Any]]) -> Any:
        self.writes.append([dict(s) for s in desired])
        return super().publish(desired)


def _agent(work: Path, api: Any, faults: Path, instance: str = "") -> tuple[NodeAgent, FirstPublish]:
    nvml = load_backend(f"sim:{PROFILE}?faults={faults}", node=NODE)
    settings = AgentSettings(node_name=NODE, driver_name=DRIVER, kubelet_dir=work / "kubelet", cdi_dir=work / "cdi",
                             watch_seconds=0.05, boot_id_path=work / "boot_id", instance=instance)
    publisher = FirstPublish(api, DRIVER, NODE, backoff_seconds=0.05)
    agent = NodeAgent(settings, nvml=nvml, inventory=discover(nvml, NODE), get_claim=kubeapi_claim_getter(api),
                      publisher=publisher, monitor_factory=lambda n, inv, cb: HealthMonitor(n, inv, cb, wait_timeout_ms=50))
    agent.start()
    return agent, publisher


def _wait(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return value


def _taints(slices: Sequence[Mapping[str, Any]]) -> dict[str, set[tuple[str, str | None, str]]]:
    return {d["name"]: {(t["key"], t.get("value"), t["effect"]) for t in d["taints"]}
            for s in slices for d in s["spec"]["devices"] if d.get("taints")}


@pytest.mark.slow
def test_a_tainted_gpu_stays_tainted_from_the_first_publish_after_a_restart(work: Path, apiserver: Any) -> None:
    api = apiserver.api
    faults = work / "faults.json"
    write_faults(faults)
    (work / "boot_id").write_text("boot-1\n")
    kubelet = KubeletSim(work / "kubelet")
    agent, _ = _agent(work, api, faults)
    try:
        kubelet.wait_for_plugin(DRIVER, timeout=30)
        gpus = sorted(discover(load_backend(f"sim:{PROFILE}", node=NODE), NODE).gpus, key=lambda g: g.index)
        dbe, lost, app = gpus[0], gpus[1], gpus[2]
        append_xid(faults, dbe.uuid, 48)
        append_xid(faults, app.uuid, 13)
        write_faults(faults, xids=[(dbe.uuid, 48), (app.uuid, 13)], lost=[lost.uuid])
        expected = {
            gpu_device_name(dbe): {(f"{DRIVER}/xid", "48", "NoSchedule")},
            gpu_device_name(lost): {(f"{DRIVER}/gpu-lost", None, "NoSchedule")},
        }

        def published() -> dict[str, set[tuple[str, str | None, str]]]:
            items, _ = api.list("ResourceSlice")
            return _taints([s for s in items if s["spec"]["driver"] == DRIVER])

        _wait(lambda: all(published().get(k, set()) >= v for k, v in expected.items()), "the taints")
    finally:
        agent.stop()

    # The agent restarts (an upgrade: a new pod, nothing in memory); the GPUs are still faulty, one still lost.
    agent, publisher = _agent(work, api, faults)
    try:
        kubelet.sync()
        _wait(lambda: publisher.writes, "the first publish")
        first = _taints(publisher.writes[0])
        # Sticky faults from the very first publish; the application Xid (informational) is not kept.
        assert all(first.get(k, set()) >= v for k, v in expected.items())
        assert gpu_device_name(app) not in first
        assert gpu_device_name(lost) in {d["name"] for s in publisher.writes[0] for d in s["spec"]["devices"]}
        assert set(agent.checkpoint.state.health) == {dbe.uuid, lost.uuid}
        assert agent.checkpoint.state.health[dbe.uuid].xids == [48]
    finally:
        agent.stop()

    # After a GPU reset the operator forgets the recorded faults; the next start publishes the GPUs clean.
    write_faults(faults)
    cp, _ = Checkpoint.open(work / "kubelet" / "plugins" / DRIVER, boot_id_path=work / "boot_id")
    assert cp.forget_health() == sorted([dbe.uuid, lost.uuid])
    cp.close()
    agent, publisher = _agent(work, api, faults)
    try:
        kubelet.sync()
        _wait(lambda: publisher.writes, "the first publish after the reset")
        assert _taints(publisher.writes[0]) == {}
    finally:
        agent.stop()
        kubelet.close()


@pytest.mark.slow
def test_a_rolling_update_keeps_the_taint_from_first_publish_to_last(work: Path, apiserver: Any) -> None:
    """maxSurge: the new agent pod starts beside the old one, which saw the fault; every slice the new one writes
    carries the taint, and the old one, replaced as publisher, never writes the pool clean."""
    api = apiserver.api
    faults = work / "faults.json"
    write_faults(faults)
    (work / "boot_id").write_text("boot-1\n")
    kubelet = KubeletSim(work / "kubelet")
    old, old_publisher = _agent(work, api, faults, instance="uid-old")
    new = None
    try:
        kubelet.wait_for_plugin(DRIVER, timeout=30)
        gpu = sorted(discover(load_backend(f"sim:{PROFILE}", node=NODE), NODE).gpus, key=lambda g: g.index)[0]
        taint = (f"{DRIVER}/xid", "48", "NoSchedule")
        append_xid(faults, gpu.uuid, 48)

        def pool_taint() -> bool:
            items, _ = api.list("ResourceSlice")
            return taint in _taints([s for s in items if s["spec"]["driver"] == DRIVER]).get(gpu_device_name(gpu), set())

        _wait(pool_taint, "the old agent's taint")
        new, new_publisher = _agent(work, api, faults, instance="uid-new")
        kubelet.sync()
        _wait(lambda: new.seat.holder() == new.seat.me and new_publisher.writes, "the new agent publishing")
        old_writes = len(old_publisher.writes)
        old.request_publish()
        time.sleep(1.0)
        assert all(taint in _taints(w).get(gpu_device_name(gpu), set()) for w in new_publisher.writes)
        assert pool_taint()
        # The old one still runs its loop, but no longer writes (its rounds end at the seat).
        assert len(old_publisher.writes) == old_writes
    finally:
        if new is not None:
            new.stop()
        old.stop()
        kubelet.close()


def test_a_reboot_drops_the_recorded_health(tmp_path: Path) -> None:
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1")
    cp, _ = Checkpoint.open(tmp_path, boot_id_path=boot)
    with cp.locked():
        cp.commit([cp.put_health_op("GPU-a", HealthRecord(xids=[48]))])
    cp.close()
    again, _ = Checkpoint.open(tmp_path, boot_id_path=boot)
    assert again.state.health == {"GPU-a": HealthRecord(xids=[48])}
    again.close()
    boot.write_text("boot-2")  # a reboot resets every GPU
    rebooted, _ = Checkpoint.open(tmp_path, boot_id_path=boot)
    assert rebooted.state.health == {}


def test_a_schema_1_checkpoint_loads_and_is_migrated(tmp_path: Path) -> None:
    """What the previous release wrote: envelope version 1, content without schema_version and health."""
    data = {"seq": 3, "boot_id": "boot-1", "claims": {}, "ledger": {"GPU-a": ["deviceplugin:x"]}}
    doc = {"version": 1, "checksum": f"sha256:{sha256_hex(canonical_json(data))}", "data": data}
    (tmp_path / "checkpoint.json").write_bytes(canonical_json(doc))
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1")
    cp, report = Checkpoint.open(tmp_path, boot_id_path=boot)
    assert report.problems == [] and not report.corrupt
    assert cp.state.ledger == {"GPU-a": ["deviceplugin:x"]} and cp.state.health == {}
    assert cp.state.schema_version == SCHEMA_VERSION
    with cp.locked():
        cp.commit([cp.put_health_op("GPU-a", HealthRecord(lost=True))])
        cp.compact()
    written = json.loads((tmp_path / "checkpoint.json").read_bytes())
    # The envelope stays readable by the previous release (it checks version == 1 and ignores fields it does not
    # know), so an old and a new agent overlapping in a rolling update share the file.
    assert written["version"] == 1 and written["data"]["schema_version"] == SCHEMA_VERSION
    assert written["data"]["health"] == {"GPU-a": {"xids": [], "lost": True, "unmonitored": False, "gpu": None}}


def test_content_of_a_newer_schema_is_kept(tmp_path: Path) -> None:
    data = {"schema_version": SCHEMA_VERSION + 1, "seq": 0, "boot_id": "b", "claims": {}, "ledger": {},
            "health": {}, "future": {"x": 1}}
    doc = {"version": 1, "checksum": f"sha256:{sha256_hex(canonical_json(data))}", "data": data}
    (tmp_path / "checkpoint.json").write_bytes(canonical_json(doc))
    (tmp_path / "boot_id").write_text("b")
    cp, report = Checkpoint.open(tmp_path, boot_id_path=tmp_path / "boot_id")
    assert not report.corrupt and any("written by a newer agent" in n for n in report.notes)
    with cp.locked():
        cp.compact()
    assert json.loads((tmp_path / "checkpoint.json").read_bytes())["data"]["future"] == {"x": 1}


def test_node_health_shows_and_forgets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cli.main import main

    directory = tmp_path / "plugins" / DRIVER
    cp, _ = Checkpoint.open(directory)
    with cp.locked():
        cp.commit([cp.put_health_op("GPU-a", HealthRecord(xids=[48])), cp.put_health_op("GPU-b", HealthRecord(lost=True))])
    cp.close()
    base = ["node-health", "--kubelet-dir", str(tmp_path), "--driver-name", DRIVER, "-o", "json"]
    assert main(base) == 0
    assert [d["uuid"] for d in json.loads(capsys.readouterr().out)["devices"]] == ["GPU-a", "GPU-b"]
    assert main([*base, "--forget", "GPU-x"]) == 2
    assert "GPU-x: no health recorded for it; recorded: GPU-a, GPU-b" in capsys.readouterr().err
    assert main([*base, "--forget", "GPU-a"]) == 0
    out = capsys.readouterr()
    assert [d["uuid"] for d in json.loads(out.out)["devices"]] == ["GPU-b"] and "forgot GPU-a" in out.err
    assert main(["node-health", "--kubelet-dir", str(tmp_path / "nowhere")]) == 1
    assert "no checkpoint there" in capsys.readouterr().err
