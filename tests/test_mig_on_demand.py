"""Partitionable MIG on demand: prepare creates the MIG instance at the allocated placement, unprepare destroys it.

Runs against the NVML simulator (which keeps created instances) with rediscovery after every change, as the node
agent does; one test goes through real gRPC with the kubelet simulator and the embedded API server.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from driver import cdi
from driver.checkpoint import Checkpoint, ClaimPhase
from driver.discovery import discover
from driver.gputools import MpsDirs
from driver.inventory import Gpu, Inventory, MigPlacement, MigProfile
from sim.kubelet.dra import ClaimInfo, KubeletSim, Pod
from driver.nvml import load_backend
from driver.plugin.agent import NodeAgent
from driver.prepare import ClaimNotFound, ClaimRef, Preparer
from driver.slices import SliceSettings, build_slices, gpu_device_name, mig_device_name
from tests.plugin_helpers import create_allocated_claim, short_tmp, start_agent

DRIVER = "gpu.nvidia.com"
NODE = "node-a"


class Crash(BaseException):
    """Stands for kill -9 at a prepare step: escapes the preparer's per-claim error handling."""


class NoSharing:
    def set_compute_mode(self, gpu_uuid: str, mode: int) -> None:
        return None

    def set_timeslice(self, gpu_uuid: str, level: int) -> None:
        return None

    def mps_start(self, dirs: MpsDirs, device_uuids: Sequence[str], commands: Sequence[str] = (), *, multi_user: bool = False) -> None:
        return None

    def mps_command(self, dirs: MpsDirs, command: str) -> str:
        return ""

    def mps_stop(self, dirs: MpsDirs) -> None:
        return None

    def mps_running(self, dirs: MpsDirs) -> bool:
        return False

    def mps_wait(self, dirs: MpsDirs) -> None:
        return None


class Node:
    """A simulated node: NVML simulator, rediscovered inventory, claims 'in the API', a preparer over them."""

    def __init__(self, tmp: Path, profile: str = "dgx-h100") -> None:
        self.tmp = tmp
        self.nvml = load_backend(f"sim:{profile}", node=NODE)
        self.inv = discover(self.nvml, NODE)
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.changes = 0
        (tmp / "boot_id").write_text("boot-1")
        self.preparer = self.new()

    def rediscover(self) -> None:
        self.changes += 1
        self.inv = discover(self.nvml, NODE)

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        try:
            return self.claims[(namespace, name)]
        except KeyError:
            raise ClaimNotFound(f"{namespace}/{name}") from None

    def new(self, crash_at: str | None = None) -> Preparer:
        cp, report = Checkpoint.open(self.tmp / "plugin", boot_id_path=self.tmp / "boot_id")

        def hook(step: str) -> None:
            if step == crash_at:
                raise Crash(step)

        p = Preparer(
            driver_name=DRIVER, node_name=NODE, get_claim=self.get, inventory=lambda: self.inv, checkpoint=cp,
            cdi_dir=self.tmp / "cdi", sharing_backend=NoSharing(), mps_root=self.tmp / "mps", fault_hook=hook,
            partitionable=True, nvml=self.nvml, on_inventory_change=self.rediscover,
        )
        self.start_report = p.start(report)
        return p

    def add_claim(self, name: str, uid: str, devices: list[str]) -> ClaimRef:
        self.claims[("ns", name)] = {
            "metadata": {"namespace": "ns", "name": name, "uid": uid},
            "status": {"allocation": {"devices": {"results": [
                {"request": f"r{i}", "driver": DRIVER, "pool": NODE, "device": d} for i, d in enumerate(devices)
            ]}}},
        }
        return ClaimRef(uid, "ns", name)

    def gpu(self, i: int) -> Gpu:
        return self.inv.gpus[i]

    def sim_instances(self, i: int) -> list[tuple[str, int, int, bool]]:
        """(profile, start, size, has compute instance) of every instance the simulator holds on GPU i."""
        sim_gpu = next(g for g in self.nvml._gpus if g.spec.uuid == self.gpu(i).uuid)
        return [(m.profile.name, m.start, m.profile.placement_size, m.has_ci) for m in sim_gpu.migs]

    def mig_mode(self, i: int) -> list[int]:
        return list(self.nvml.nvmlDeviceGetMigMode(self.nvml.nvmlDeviceGetHandleByUUID(self.gpu(i).uuid)))


def placement(gpu: Gpu, profile: str, start: int) -> tuple[MigProfile, MigPlacement]:
    p = next(p for p in gpu.mig_profiles if p.name == profile)
    return p, next(pl for pl in p.placements if pl.start == start)


def placement_name(gpu: Gpu, profile: str, start: int) -> str:
    return mig_device_name(gpu, *placement(gpu, profile, start))


def mig_cap_paths(gpu: Gpu, mig: Any) -> list[str]:
    """The capability nodes that expose exactly this MIG device (what identifies it in a CDI spec)."""
    return [f"/dev/nvidia-caps/nvidia-cap{m}" for m in cdi.mig_cap_minors(gpu.minor, mig.gpu_instance_id, mig.compute_instance_id)]


def node_paths(spec_device: Mapping[str, Any]) -> list[str]:
    return [n["path"] for n in spec_device["containerEdits"]["deviceNodes"]]


def spec_of(node: Node, uid: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((node.tmp / "cdi" / cdi.spec_file_name(uid)).read_text())
    return data


def published(inv: Inventory) -> dict[str, dict[str, Any]]:
    slices = build_slices(inv, SliceSettings(node_name=NODE, driver_name=DRIVER, partitionable=True))
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_placement_claim_creates_the_instance_there_and_unprepare_destroys_it(node: Node) -> None:
    gpu = node.gpu(0)
    assert not gpu.mig_enabled and node.sim_instances(0) == []
    name = placement_name(gpu, "3g.40gb", 4)
    ref = node.add_claim("c1", "uid-1", [name])

    result = node.preparer.prepare([ref])["uid-1"]
    assert result.error == ""
    assert [d.device_name for d in result.devices] == [name]
    assert node.mig_mode(0) == [1, 1]
    assert node.sim_instances(0) == [("3g.40gb", 4, 4, True)]
    mig = node.gpu(0).mig_devices[0]
    assert (mig.profile, mig.placement) == ("3g.40gb", MigPlacement(4, 4))
    # The CDI spec exposes exactly that MIG device: its uuid and its capability device nodes.
    spec = spec_of(node, "uid-1")
    edits = spec["devices"][0]["containerEdits"]
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    gi_minor, ci_minor = cdi.mig_cap_minors(gpu.minor, mig.gpu_instance_id, mig.compute_instance_id)
    paths = [n["path"] for n in edits["deviceNodes"]]
    assert f"/dev/nvidia{gpu.minor}" in paths
    assert f"/dev/nvidia-caps/nvidia-cap{gi_minor}" in paths and f"/dev/nvidia-caps/nvidia-cap{ci_minor}" in paths
    record = node.preparer.checkpoint.claim("uid-1")
    assert record is not None and record.phase is ClaimPhase.PREPARE_COMPLETED
    created = record.devices[0].mig_created
    assert created is not None and (created.start, created.size, created.gpu_instance_id) == (4, 4, mig.gpu_instance_id)
    assert record.devices[0].uuid == mig.uuid
    # Republished: the placement device now shows the MIG uuid and still consumes the same counters.
    before = published(discover(load_backend("sim:dgx-h100", node=NODE), NODE))[name]
    after = published(node.inv)[name]
    assert after["attributes"]["uuid"] == {"string": mig.uuid} and "uuid" not in before["attributes"]
    assert after["consumesCounters"] == before["consumesCounters"]
    assert node.changes >= 1

    # Prepare is idempotent: no second instance.
    assert node.preparer.prepare([ref])["uid-1"] == result
    assert node.sim_instances(0) == [("3g.40gb", 4, 4, True)]

    assert node.preparer.unprepare([ref]) == {"uid-1": ""}
    assert node.sim_instances(0) == []
    assert node.gpu(0).mig_devices == ()
    assert "uuid" not in published(node.inv)[name]["attributes"]
    assert node.preparer.checkpoint.claim("uid-1") is None
    assert not (node.tmp / "cdi" / cdi.spec_file_name("uid-1")).exists()


@pytest.mark.parametrize("step", ["prepare-started", "mig-created", "cdi-written"])
def test_crash_between_create_and_complete_is_rolled_back(node: Node, step: str) -> None:
    name = placement_name(node.gpu(1), "2g.20gb", 2)
    ref = node.add_claim("c1", "uid-1", [name])
    node.preparer.checkpoint.close()
    node.preparer = node.new(crash_at=step)
    with pytest.raises(Crash):
        node.preparer.prepare([ref])
    record = node.preparer.checkpoint.claim("uid-1")
    assert record is not None and record.phase is ClaimPhase.PREPARE_STARTED
    assert record.devices[0].mig_created is not None
    assert node.sim_instances(1) == ([] if step == "prepare-started" else [("2g.20gb", 2, 2, True)])
    node.preparer.checkpoint.close()

    # Restart (same MIG state: the GPU kept its instances, as NVIDIA's driver does across a plugin restart).
    restarted = node.new()
    assert node.start_report.rolled_back == ["uid-1"] and node.start_report.problems == []
    assert node.sim_instances(1) == []
    assert restarted.checkpoint.claim("uid-1") is None
    assert restarted.ledger.holders_of(node.gpu(1).uuid) == ()
    assert not (node.tmp / "cdi" / cdi.spec_file_name("uid-1")).exists()
    # The kubelet asks again and gets it.
    assert restarted.prepare([ref])["uid-1"].error == ""
    assert node.sim_instances(1) == [("2g.20gb", 2, 2, True)]


def test_two_placements_on_one_gpu_and_in_one_claim(node: Node) -> None:
    gpu = node.gpu(2)
    a = node.add_claim("a", "uid-a", [placement_name(gpu, "3g.40gb", 0)])
    b = node.add_claim("b", "uid-b", [placement_name(gpu, "1g.10gb", 4), placement_name(gpu, "1g.10gb", 5)])
    results = node.preparer.prepare([a, b])
    assert {u: r.error for u, r in results.items()} == {"uid-a": "", "uid-b": ""}
    assert sorted(node.sim_instances(2)) == [("1g.10gb", 4, 1, True), ("1g.10gb", 5, 1, True), ("3g.40gb", 0, 4, True)]
    caps = [mig_cap_paths(node.gpu(2), m) for m in node.gpu(2).mig_devices]
    spec_b = spec_of(node, "uid-b")
    exposed = [next(c for c in caps if node_paths(d)[-2:] == c) for d in spec_b["devices"]]
    assert len(exposed) == 2 and exposed[0] != exposed[1]
    assert node.preparer.ledger.holders_of(gpu.uuid) == ("dra:uid-a", "dra:uid-b")

    assert node.preparer.unprepare([a]) == {"uid-a": ""}
    assert sorted(node.sim_instances(2)) == [("1g.10gb", 4, 1, True), ("1g.10gb", 5, 1, True)]
    assert node.preparer.unprepare([b]) == {"uid-b": ""}
    assert node.sim_instances(2) == []


def test_conflicting_placement_is_a_per_claim_error(node: Node) -> None:
    gpu = node.gpu(3)
    a = node.add_claim("a", "uid-a", [placement_name(gpu, "4g.40gb", 0)])
    b = node.add_claim("b", "uid-b", [placement_name(gpu, "2g.20gb", 2)])  # memory slices 2-3 overlap 0-3
    results = node.preparer.prepare([a, b])
    assert results["uid-a"].error == ""
    error = results["uid-b"].error
    assert "ResourceClaim ns/b" in error and "start=2 size=2" in error and "overlaps an existing MIG instance" in error
    assert node.sim_instances(3) == [("4g.40gb", 0, 4, True)]
    assert node.preparer.checkpoint.claim("uid-b") is None
    assert node.preparer.ledger.holders_of(gpu.uuid) == ("dra:uid-a",)
    assert not (node.tmp / "cdi" / cdi.spec_file_name("uid-b")).exists()


def test_full_gpu_and_placements_exclude_each_other(node: Node) -> None:
    gpu = node.gpu(4)
    full = node.add_claim("full", "uid-full", [gpu_device_name(gpu)])
    part = node.add_claim("part", "uid-part", [placement_name(gpu, "1g.10gb", 0)])

    assert node.preparer.prepare([full])["uid-full"].error == ""
    error = node.preparer.prepare([part])["uid-part"].error
    assert "prepared as a full GPU for ResourceClaim ns/full" in error
    assert node.mig_mode(4) == [0, 0] and node.sim_instances(4) == []
    assert node.preparer.unprepare([full]) == {"uid-full": ""}

    assert node.preparer.prepare([part])["uid-part"].error == ""
    assert node.mig_mode(4) == [1, 1]
    error = node.preparer.prepare([full])["uid-full"].error
    assert "has 1 MIG device(s)" in error and "only when MIG mode is off" in error
    assert node.preparer.unprepare([part]) == {"uid-part": ""}

    # With no instances left the full GPU is prepared again, MIG mode switched back off.
    assert node.preparer.prepare([full])["uid-full"].error == ""
    assert node.mig_mode(4) == [0, 0]
    spec = spec_of(node, "uid-full")
    assert node_paths(spec["devices"][0])[0] == f"/dev/nvidia{gpu.minor}"
    assert not any("nvidia-caps" in p for p in node_paths(spec["devices"][0]))


def test_failing_mig_mode_switch_is_a_per_claim_error(node: Node) -> None:
    gpu = node.gpu(5)
    node.nvml.fail_call("nvmlDeviceSetMigMode", gpu.uuid, "NO_PERMISSION")
    ref = node.add_claim("c", "uid-c", [placement_name(gpu, "7g.80gb", 0)])
    error = node.preparer.prepare([ref])["uid-c"].error
    assert "ResourceClaim ns/c" in error and "enabling MIG mode failed" in error
    assert node.preparer.checkpoint.claim("uid-c") is None and node.sim_instances(5) == []


# ---- through gRPC with the kubelet simulator -------------------------------------------------------------


@pytest.fixture
def short() -> Iterator[Path]:
    with short_tmp() as path:
        yield path


def _wait(condition: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _published_device(apiserver: Any, name: str) -> dict[str, Any] | None:
    slices, _ = apiserver.api.list("ResourceSlice")
    return next((d for s in slices for d in s["spec"].get("devices", []) if d["name"] == name), None)


@pytest.mark.slow
def test_placement_claim_over_grpc(short: Path, apiserver: Any) -> None:
    agent: NodeAgent = start_agent(short, apiserver.api, partitionable=True)
    kubelet = KubeletSim(short / "kubelet")
    try:
        kubelet.wait_for_plugin(DRIVER, timeout=60)
        gpu = agent.inventory().gpus[6]
        name = placement_name(gpu, "3g.40gb", 0)
        _wait(lambda: _published_device(apiserver, name) is not None, "the placement device published")
        claim = create_allocated_claim(apiserver.api, "mig-1", [("gpu", name)])
        info = ClaimInfo("default", claim["metadata"]["uid"], "mig-1")
        pod = Pod("pod-1", [info])
        kubelet.prepare_pod(DRIVER, pod)
        got = pod.prepared[info.uid]
        assert [(d.device_name, d.cdi_device_ids) for d in got] == [(name, (cdi.qualified_id(cdi.cdi_device_name(info.uid, name)),))]
        migs = agent.inventory().gpus[6].mig_devices
        assert [(m.profile, m.placement.start) for m in migs] == [("3g.40gb", 0)]
        spec = json.loads((short / "cdi" / cdi.spec_file_name(info.uid)).read_text())
        assert node_paths(spec["devices"][0])[-2:] == mig_cap_paths(agent.inventory().gpus[6], migs[0])
        # The republished slice shows the new MIG device's uuid on its placement, counters unchanged.
        _wait(
            lambda: ((_published_device(apiserver, name) or {}).get("attributes", {}).get("uuid") == {"string": migs[0].uuid}),
            "the placement device republished with its MIG uuid",
        )
        assert "consumesCounters" in (_published_device(apiserver, name) or {})

        kubelet.unprepare_pod(DRIVER, pod)
        assert agent.inventory().gpus[6].mig_devices == ()
        _wait(lambda: "uuid" not in (_published_device(apiserver, name) or {"attributes": {"uuid": 1}})["attributes"],
              "the placement device republished without a uuid")
    finally:
        kubelet.close()
        agent.stop()


def test_xid_on_a_created_mig_device_is_charged_to_it(node: Node) -> None:
    from driver.health import HealthMonitor
    from driver.inventory import Health

    changes: list[tuple[str, Health]] = []
    monitor = HealthMonitor(node.nvml, node.inv, lambda uuid, health: changes.append((uuid, health)))
    monitor.setup()
    ref = node.add_claim("c1", "uid-1", [placement_name(node.gpu(7), "1g.10gb", 3)])
    assert node.preparer.prepare([ref])["uid-1"].error == ""
    monitor.update_inventory(node.inv)  # what the agent does after rediscovery
    mig = node.gpu(7).mig_devices[0]
    node.nvml.inject_xid(mig.uuid, 94)
    assert monitor.poll_once(timeout_ms=30_000)
    assert changes == [(mig.uuid, Health(xids=(94,)))]
    assert monitor.health(node.gpu(7).uuid).healthy


def test_after_a_reboot_the_created_mig_device_is_created_again(node: Node) -> None:
    ref = node.add_claim("c1", "uid-1", [placement_name(node.gpu(0), "2g.20gb", 4)])
    assert node.preparer.prepare([ref])["uid-1"].error == ""
    node.preparer.checkpoint.close()
    # Reboot: a new boot id, and the GPUs come back without MIG instances (and here with MIG mode off too).
    node.nvml = load_backend("sim:dgx-h100", node=NODE)
    node.inv = discover(node.nvml, NODE)
    (node.tmp / "boot_id").write_text("boot-2")
    (node.tmp / "cdi" / cdi.spec_file_name("uid-1")).unlink()  # the CDI dir is tmpfs
    restarted = node.new()
    assert node.start_report.reapplied == ["uid-1"] and node.start_report.problems == []
    assert node.sim_instances(0) == [("2g.20gb", 4, 2, True)]
    mig = node.gpu(0).mig_devices[0]
    record = restarted.checkpoint.claim("uid-1")
    assert record is not None and record.phase is ClaimPhase.PREPARE_COMPLETED and record.devices[0].uuid == mig.uuid
    assert node_paths(spec_of(node, "uid-1")["devices"][0])[-2:] == mig_cap_paths(node.gpu(0), mig)
    assert restarted.unprepare([ref]) == {"uid-1": ""} and node.sim_instances(0) == []


# ---- MIG instances made beforehand (h100-mig: GPU 0 holds seven 1g.10gb, GPU 1 3g.40gb@0 + 2g.20gb@4 + 1g.10gb@6)


@pytest.fixture
def premade(tmp_path: Path) -> Node:
    return Node(tmp_path, "h100-mig")


def test_idle_instances_in_the_way_of_a_placement_are_destroyed(premade: Node) -> None:
    """Issue 37: the scheduler's counters know only allocated devices, so it may place a claim over instances no
    claim holds; creating the placement then failed for ever ("the placement is taken or overlaps ...")."""
    node = premade
    assert [m[:2] for m in node.sim_instances(0)] == [("1g.10gb", s) for s in range(7)]
    ref = node.add_claim("c1", "uid-1", [placement_name(node.gpu(0), "3g.40gb", 0)])
    result = node.preparer.prepare([ref])["uid-1"]
    assert result.error == ""
    # 3g.40gb@0 spans memory slices 0-3: the 1g.10gb instances there gave way, those at 4-6 stay.
    assert sorted(m[:2] for m in node.sim_instances(0)) == [("1g.10gb", 4), ("1g.10gb", 5), ("1g.10gb", 6),
                                                          ("3g.40gb", 0)]
    assert {m.profile for m in node.gpu(0).mig_devices} == {"1g.10gb", "3g.40gb"}


def test_an_instance_a_claim_holds_is_never_destroyed_to_make_room(premade: Node) -> None:
    node = premade
    held = next(m for m in node.gpu(0).mig_devices if m.placement.start == 1)
    a = node.add_claim("a", "uid-a", [mig_device_name(node.gpu(0), held)])
    assert node.preparer.prepare([a])["uid-a"].error == ""
    b = node.add_claim("b", "uid-b", [placement_name(node.gpu(0), "3g.40gb", 0)])
    error = node.preparer.prepare([b])["uid-b"].error
    assert (f"the placement start=0 size=4 overlaps an existing MIG instance, MIG device {held.uuid} (1g.10gb at "
            "memory slice 1), prepared for ResourceClaim ns/a") in error
    assert [m[:2] for m in node.sim_instances(0)] == [("1g.10gb", s) for s in range(7)]  # nothing destroyed
    assert node.preparer.checkpoint.claim("uid-b") is None


def test_a_full_gpu_over_idle_instances_gets_them_destroyed_and_mig_off(premade: Node) -> None:
    node = premade
    ref = node.add_claim("c1", "uid-1", [gpu_device_name(node.gpu(1))])
    result = node.preparer.prepare([ref])["uid-1"]
    assert result.error == ""
    assert node.sim_instances(1) == [] and node.mig_mode(1) == [0, 0]
