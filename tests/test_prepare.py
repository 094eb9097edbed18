"""Claim preparation: checks against the API object, CDI + checkpoint two-phase, sharing, ledger, idempotency."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from driver import cdi
from driver.checkpoint import Checkpoint, ClaimPhase, Ledger
from driver.gputools import MpsDirs
from driver.inventory import Inventory
from driver.prepare import ClaimNotFound, ClaimRef, Preparer
from driver.sharing import COMPUTE_MODE_DEFAULT, COMPUTE_MODE_EXCLUSIVE_PROCESS, SharingError
from driver.slices import gpu_device_name, mig_device_name
from tests.gpu_fixtures import h100, inventory, t4, with_mig

DRIVER = "gpu.nvidia.com"
NODE = "node-a"
CFG = {"apiVersion": "gpu.nvidia.com/v1alpha1", "kind": "GpuConfig"}


class RecordingSharing:
    """A sharing backend that keeps the compute mode per GPU, like the hardware would."""

    def __init__(self) -> None:
        self.modes: dict[str, int] = {}
        self.timeslices: dict[str, int] = {}
        self.mps: dict[Path, list[str]] = {}  # running daemons: pipe dir -> commands received
        self.multi_user: dict[Path, bool] = {}

    def set_compute_mode(self, gpu_uuid: str, mode: int) -> None:
        self.modes[gpu_uuid] = mode

    def set_timeslice(self, gpu_uuid: str, level: int) -> None:
        self.timeslices[gpu_uuid] = level

    def mps_start(
        self, dirs: MpsDirs, device_uuids: Sequence[str], commands: Sequence[str] = (), *, multi_user: bool = False,
    ) -> None:
        self.mps[dirs.pipe] = list(commands)
        self.multi_user[dirs.pipe] = multi_user

    def mps_command(self, dirs: MpsDirs, command: str) -> str:
        self.mps[dirs.pipe].append(command)
        return ""

    def mps_stop(self, dirs: MpsDirs) -> None:
        self.mps.pop(dirs.pipe, None)

    def mps_running(self, dirs: MpsDirs) -> bool:
        return dirs.pipe in self.mps

    def mps_wait(self, dirs: MpsDirs) -> None:
        return None


class Claims:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads = 0

    def add(self, obj: dict[str, Any]) -> None:
        self.objects[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        self.reads += 1
        try:
            return self.objects[(namespace, name)]
        except KeyError:
            raise ClaimNotFound(f"{namespace}/{name}") from None


def claim(
    name: str, uid: str, devices: list[tuple[str, str]], *, pool: str = NODE, config: list[dict[str, Any]] | None = None,
    allocated: bool = True,
) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"namespace": "ns", "name": name, "uid": uid}, "spec": {}, "status": {}}
    if allocated:
        obj["status"]["allocation"] = {
            "devices": {
                "results": [{"request": r, "driver": DRIVER, "pool": pool, "device": d} for r, d in devices],
                "config": config or [],
            }
        }
    return obj


@pytest.fixture
def inv() -> Inventory:
    return inventory([h100(0), with_mig(h100(1), [("3g.40gb", 0), ("1g.10gb", 4)]), t4(2)], node=NODE)


class Env:
    def __init__(self, tmp_path: Path, inv: Inventory) -> None:
        self.tmp = tmp_path
        self.inv = inv
        self.claims = Claims()
        self.sharing = RecordingSharing()
        self.boot = tmp_path / "boot_id"
        self.boot.write_text("boot-1")
        self.cdi_dir = tmp_path / "cdi"
        self.api_down = False
        self.preparer = self.new()

    def list_claims(self) -> list[dict[str, Any]]:
        if self.api_down:
            raise ConnectionError("connection refused")
        return list(self.claims.objects.values())

    def new(self) -> Preparer:
        cp, report = Checkpoint.open(self.tmp / "plugin", boot_id_path=self.boot)
        self.load_report = report
        p = Preparer(
            driver_name=DRIVER, node_name=NODE, get_claim=self.claims.get, inventory=lambda: self.inv, checkpoint=cp,
            cdi_dir=self.cdi_dir, sharing_backend=self.sharing, mps_root=self.tmp / "mps", list_claims=self.list_claims,
        )
        self.start_report = p.start(report)
        return p


@pytest.fixture
def env(tmp_path: Path, inv: Inventory) -> Env:
    return Env(tmp_path, inv)


def test_prepare_full_gpu_and_mig(env: Env) -> None:
    g0, g1 = env.inv.gpus[0], env.inv.gpus[1]
    mig = g1.mig_devices[1]
    env.claims.add(claim("c1", "uid-1", [("gpus", gpu_device_name(g0)), ("gpus/small", mig_device_name(g1, mig))]))
    result = env.preparer.prepare([ClaimRef("uid-1", "ns", "c1")])["uid-1"]
    assert result.error == ""
    assert [(d.request_names, d.pool_name, d.device_name) for d in result.devices] == [
        (("gpus",), NODE, gpu_device_name(g0)),
        (("gpus",), NODE, mig_device_name(g1, mig)),  # subrequest "gpus/small" is served as request "gpus"
    ]
    assert result.devices[0].cdi_device_ids == (f"k8s.gpu.nvidia.com/claim=uid-1-{gpu_device_name(g0)}",)
    spec = json.loads((env.cdi_dir / "k8s.gpu.nvidia.com-claim_uid-1.json").read_text())
    assert cdi.validate_spec(spec) == []
    assert spec["devices"][1]["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert {"path": f"/dev/nvidia{g1.minor}"} in spec["devices"][1]["containerEdits"]["deviceNodes"]
    gi, ci = cdi.mig_cap_minors(g1.minor, mig.gpu_instance_id, mig.compute_instance_id)
    assert {"path": f"/dev/nvidia-caps/nvidia-cap{ci}"} in spec["devices"][1]["containerEdits"]["deviceNodes"]
    record = env.preparer.checkpoint.claim("uid-1")
    assert record is not None and record.phase is ClaimPhase.PREPARE_COMPLETED
    assert env.preparer.ledger.holders_of(g0.uuid) == ("dra:uid-1",)
    assert env.preparer.ledger.holders_of(g1.uuid) == ("dra:uid-1",)


def test_idempotent_prepare_returns_same_result_without_api(env: Env) -> None:
    g0 = env.inv.gpus[0]
    env.claims.add(claim("c1", "uid-1", [("gpu", gpu_device_name(g0))]))
    first = env.preparer.prepare([ClaimRef("uid-1", "ns", "c1")])
    reads = env.claims.reads
    second = env.preparer.prepare([ClaimRef("uid-1", "ns", "c1")])
    assert first == second and env.claims.reads == reads
    # A restarted plugin answers the same from its checkpoint.
    assert env.new().prepare([ClaimRef("uid-1", "ns", "c1")]) == first


@pytest.mark.parametrize(
    "obj,ref,expected",
    [
        (claim("c1", "other-uid", [("gpu", "x")]), ClaimRef("uid-1", "ns", "c1"), "got replaced"),
        (claim("c1", "uid-1", [], allocated=False), ClaimRef("uid-1", "ns", "c1"), "not allocated"),
        (claim("c1", "uid-1", [("gpu", "gpu-x")], pool="node-b"), ClaimRef("uid-1", "ns", "c1"), "allocated from pool(s) node-b, but this node serves pool node-a"),
        (claim("c1", "uid-1", [("gpu", "gpu-unknown")]), ClaimRef("uid-1", "ns", "c1"), "device gpu-unknown of pool node-a is not a device this node has"),
        (None, ClaimRef("uid-1", "ns", "missing"), "not found in the API server"),
    ],
)
def test_per_claim_errors(env: Env, obj: dict[str, Any] | None, ref: ClaimRef, expected: str) -> None:
    if obj is not None:
        env.claims.add(obj)
    g0 = env.inv.gpus[0]
    env.claims.add(claim("good", "uid-good", [("gpu", gpu_device_name(g0))]))
    results = env.preparer.prepare([ref, ClaimRef("uid-good", "ns", "good")])
    assert expected in results[ref.uid].error and "ResourceClaim ns/" in results[ref.uid].error
    assert results["uid-good"].error == ""  # one bad claim does not fail the others
    assert env.preparer.checkpoint.claim(ref.uid) is None
    assert not (env.cdi_dir / f"k8s.gpu.nvidia.com-claim_{ref.uid}.json").exists()


def test_invalid_config_is_a_per_claim_error(env: Env) -> None:
    g0 = env.inv.gpus[0]
    bad = [{"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": {**CFG, "sharing": {"strategy": "Nope"}}}}]
    env.claims.add(claim("c1", "uid-1", [("gpu", gpu_device_name(g0))], config=bad))
    error = env.preparer.prepare([ClaimRef("uid-1", "ns", "c1")])["uid-1"].error
    assert "status.allocation.devices.config[0].opaque.parameters.sharing.strategy: unsupported value 'Nope'" in error


def test_config_order_class_then_claim_and_per_request(env: Env) -> None:
    g0, t = env.inv.gpus[0], env.inv.gpus[2]
    config = [
        # Listed claim-first on purpose: class configs still apply first, so the claim's MPS wins for "a".
        {"source": "FromClaim", "requests": ["a"], "opaque": {"driver": DRIVER, "parameters": {**CFG, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 25}}}}},
        {"source": "FromClass", "requests": [], "opaque": {"driver": DRIVER, "parameters": {**CFG, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}}},
        {"source": "FromClaim", "requests": [], "opaque": {"driver": "other.example.com", "parameters": {"anything": True}}},
    ]
    env.claims.add(claim("c1", "uid-1", [("a", gpu_device_name(g0)), ("b", gpu_device_name(t))], config=config))
    result = env.preparer.prepare([ClaimRef("uid-1", "ns", "c1")])["uid-1"]
    assert result.error == ""
    assert env.sharing.modes == {g0.uuid: COMPUTE_MODE_EXCLUSIVE_PROCESS, t.uuid: COMPUTE_MODE_DEFAULT}
    assert env.sharing.timeslices == {t.uuid: 3}
    spec = json.loads((env.cdi_dir / "k8s.gpu.nvidia.com-claim_uid-1.json").read_text())
    mps_env = spec["devices"][0]["containerEdits"]["env"]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in mps_env and "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in mps_env
    assert spec["devices"][0]["containerEdits"]["mounts"][0]["hostPath"] == str(env.tmp / "mps" / "uid-1" / "pipe")
    assert (env.tmp / "mps" / "uid-1" / "pipe").is_dir()
    assert "mounts" not in spec["devices"][1]["containerEdits"]
    # Unprepare restores the default compute mode and removes the MPS dirs.
    assert env.preparer.unprepare([ClaimRef("uid-1", "ns", "c1")]) == {"uid-1": ""}
    assert env.sharing.modes[g0.uuid] == COMPUTE_MODE_DEFAULT
    assert not (env.tmp / "mps" / "uid-1").exists()


def test_unprepare_twice_and_unknown(env: Env) -> None:
    g0 = env.inv.gpus[0]
    env.claims.add(claim("c1", "uid-1", [("gpu", gpu_device_name(g0))]))
    env.preparer.prepare([ClaimRef("uid-1", "ns", "c1")])
    assert env.preparer.unprepare([ClaimRef("uid-1", "ns", "c1")]) == {"uid-1": ""}
    assert env.preparer.unprepare([ClaimRef("uid-1", "ns", "c1"), ClaimRef("nope", "ns", "x")]) == {"uid-1": "", "nope": ""}
    assert list(env.cdi_dir.iterdir()) == []
    assert env.preparer.ledger.held() == {}


def test_device_plugin_hold_blocks_prepare(env: Env) -> None:
    g0 = env.inv.gpus[0]
    env.preparer.ledger.hold(Ledger.device_plugin_holder("pod-x"), [g0.uuid])
    env.claims.add(claim("c1", "uid-1", [("gpu", gpu_device_name(g0))]))
    error = env.preparer.prepare([ClaimRef("uid-1", "ns", "c1")])["uid-1"].error
    assert f"{g0.uuid} is held by deviceplugin:pod-x" in error and "device plugin must release" in error
    assert env.preparer.checkpoint.claim("uid-1") is None


def test_start_rolls_back_started_claims_and_removes_orphans(env: Env) -> None:
    g0, t = env.inv.gpus[0], env.inv.gpus[2]
    env.claims.add(claim("c1", "uid-1", [("gpu", gpu_device_name(g0))]))
    env.claims.add(claim("c2", "uid-2", [("gpu", gpu_device_name(t))]))
    env.preparer.prepare([ClaimRef("uid-1", "ns", "c1"), ClaimRef("uid-2", "ns", "c2")])
    cp = env.preparer.checkpoint
    with cp.locked():
        record = cp.claim("uid-2")
        assert record is not None
        cp.commit([cp.put_claim_op(record.model_copy(update={"phase": ClaimPhase.PREPARE_STARTED}))])
    cdi.write_claim_spec(env.cdi_dir, "orphan", cdi.claim_spec("orphan", [cdi.DeviceEdits("d", "GPU-x", 0)]))
    (env.cdi_dir / "k8s.gpu.nvidia.com-claim_uid-1.json").unlink()  # e.g. /var/run wiped
    cp.close()
    again = env.new()
    assert env.start_report.rolled_back == ["uid-2"]
    assert env.start_report.orphans_removed == ["orphan"]
    assert env.start_report.specs_rewritten == ["uid-1"]
    assert sorted(p.name for p in env.cdi_dir.iterdir()) == ["k8s.gpu.nvidia.com-claim_uid-1.json"]
    assert again.ledger.held() == {g0.uuid: ("dra:uid-1",)}


def test_new_boot_reapplies_sharing(env: Env) -> None:
    g0 = env.inv.gpus[0]
    config = [{"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": {**CFG, "sharing": {"strategy": "MPS"}}}}]
    env.claims.add(claim("c1", "uid-1", [("gpu", gpu_device_name(g0))], config=config))
    env.preparer.prepare([ClaimRef("uid-1", "ns", "c1")])
    env.preparer.checkpoint.close()
    env.sharing.modes.clear()  # the GPU forgot its compute mode across the reboot
    env.boot.write_text("boot-2")
    env.new()
    assert env.start_report.reapplied == ["uid-1"]
    assert env.sharing.modes == {g0.uuid: COMPUTE_MODE_EXCLUSIVE_PROCESS}


def test_prepared_mig_spec_names_its_nodes_by_the_drivers_numbers(env: Env) -> None:
    """With the driver's procfs (a fake one here), the MIG device's capability nodes carry type c, the
    nvidia-caps major and the minors the driver publishes for exactly this GPU instance and compute instance."""
    g1 = env.inv.gpus[1]
    mig = g1.mig_devices[1]
    proc = env.tmp / "proc"
    proc.mkdir()
    (proc / "devices").write_text("Character devices:\n195 nvidia\n234 nvidia-uvm\n237 nvidia-caps\n\nBlock devices:\n")
    gi_dir = proc / f"driver/nvidia/capabilities/gpu{g1.minor}/mig/gi{mig.gpu_instance_id}"
    (gi_dir / f"ci{mig.compute_instance_id}").mkdir(parents=True)
    (gi_dir / "access").write_text("DeviceFileMinor: 147\nDeviceFileMode: 292\n")
    (gi_dir / f"ci{mig.compute_instance_id}" / "access").write_text("DeviceFileMinor: 148\nDeviceFileMode: 292\n")
    env.preparer.checkpoint.close()
    cp, report = Checkpoint.open(env.tmp / "plugin", boot_id_path=env.boot)
    preparer = Preparer(
        driver_name=DRIVER, node_name=NODE, get_claim=env.claims.get, inventory=lambda: env.inv, checkpoint=cp,
        cdi_dir=env.cdi_dir, sharing_backend=env.sharing, mps_root=env.tmp / "mps",
        device_numbers=lambda: cdi.DeviceNumbers.read(proc),
    )
    preparer.start(report)
    env.claims.add(claim("c1", "uid-1", [("gpus", mig_device_name(g1, mig))]))
    assert preparer.prepare([ClaimRef("uid-1", "ns", "c1")])["uid-1"].error == ""
    spec = json.loads((env.cdi_dir / cdi.spec_file_name("uid-1")).read_text())
    assert cdi.validate_spec(spec) == []
    nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
    assert nodes[0] == {"path": f"/dev/nvidia{g1.minor}", "type": "c", "major": 195, "minor": g1.minor}
    assert nodes[-2:] == [
        {"path": "/dev/nvidia-caps/nvidia-cap147", "type": "c", "major": 237, "minor": 147, "fileMode": 292},
        {"path": "/dev/nvidia-caps/nvidia-cap148", "type": "c", "major": 237, "minor": 148, "fileMode": 292},
    ]
    # The MIG device gone from the driver's capabilities: the prepare of another claim on it fails by name.
    (gi_dir / f"ci{mig.compute_instance_id}" / "access").unlink()
    preparer.unprepare([ClaimRef("uid-1", "ns", "c1")])
    env.claims.add(claim("c2", "uid-2", [("gpus", mig_device_name(g1, mig))]))
    error = preparer.prepare([ClaimRef("uid-2", "ns", "c2")])["uid-2"].error
    assert f"gi{mig.gpu_instance_id}/ci{mig.compute_instance_id}/access" in error
    assert preparer.checkpoint.claim("uid-2") is None


# ---- node-side exclusivity ------------------------------------------------------------------------------------

TIME_SLICING = [{"requests": [], "opaque": {"driver": DRIVER, "parameters": {**CFG, "sharing": {"strategy": "TimeSlicing"}}}}]


def _prepare(env: Env, name: str, uid: str, devices: list[tuple[str, str]], **kw: Any) -> str:
    env.claims.add(claim(name, uid, devices, **kw))
    return env.preparer.prepare([ClaimRef(uid, "ns", name)])[uid].error


def test_second_exclusive_claim_on_one_gpu_is_refused_naming_the_holder(env: Env) -> None:
    g0 = env.inv.gpus[0]
    assert _prepare(env, "first", "uid-1", [("gpu", gpu_device_name(g0))]) == ""
    error = _prepare(env, "second", "uid-2", [("gpu", gpu_device_name(g0))])
    assert f"GPU {g0.uuid} already prepared for ResourceClaim ns/first (uid uid-1" in error
    assert error.startswith("ResourceClaim ns/second (uid uid-2)")
    assert env.preparer.checkpoint.claim("uid-2") is None
    assert not (env.cdi_dir / "k8s.gpu.nvidia.com-claim_uid-2.json").exists()
    assert env.preparer.ledger.holders_of(g0.uuid) == ("dra:uid-1",)
    # Once the holder is unprepared, the GPU is free for the other claim.
    assert env.preparer.unprepare([ClaimRef("uid-1", "ns", "first")]) == {"uid-1": ""}
    assert env.preparer.prepare([ClaimRef("uid-2", "ns", "second")])["uid-2"].error == ""


def test_many_claims_on_one_gpu_only_the_first_is_prepared(env: Env) -> None:
    g0 = env.inv.gpus[0]
    errors = [_prepare(env, f"c{i}", f"uid-{i}", [("gpu", gpu_device_name(g0))]) for i in range(25)]
    assert errors[0] == "" and all("already prepared for ResourceClaim ns/c0" in e for e in errors[1:])


def test_full_gpu_and_its_mig_device_exclude_each_other(env: Env) -> None:
    g1 = env.inv.gpus[1]
    small, big = g1.mig_devices[1], g1.mig_devices[0]
    assert _prepare(env, "mig", "uid-1", [("m", mig_device_name(g1, small))]) == ""
    error = _prepare(env, "full", "uid-2", [("gpu", gpu_device_name(g1))])
    assert f"GPU {g1.uuid}, whose MIG device {small.uuid} is already prepared for ResourceClaim ns/mig" in error
    # Another MIG device of the same GPU is isolated from the first: allowed.
    assert _prepare(env, "mig2", "uid-3", [("m", mig_device_name(g1, big))]) == ""
    # The same MIG device twice: refused.
    assert "MIG device " + small.uuid + " already prepared for ResourceClaim ns/mig" in _prepare(
        env, "mig3", "uid-4", [("m", mig_device_name(g1, small))])


def test_legitimate_sharing_is_allowed(env: Env) -> None:
    g0, g2 = env.inv.gpus[0], env.inv.gpus[2]
    # Sharing config on both claims.
    assert _prepare(env, "ts1", "uid-1", [("gpu", gpu_device_name(g0))], config=TIME_SLICING) == ""
    assert _prepare(env, "ts2", "uid-2", [("gpu", gpu_device_name(g0))], config=TIME_SLICING) == ""
    # Sharing config on one side only is not enough.
    assert "already prepared for ResourceClaim ns/ts1" in _prepare(env, "ex", "uid-3", [("gpu", gpu_device_name(g0))])
    # adminAccess takes no exclusive hold, either way round.
    env.claims.add(claim("admin", "uid-4", [("gpu", gpu_device_name(g2))]))
    env.claims.objects[("ns", "admin")]["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    assert env.preparer.prepare([ClaimRef("uid-4", "ns", "admin")])["uid-4"].error == ""
    assert _prepare(env, "user", "uid-5", [("gpu", gpu_device_name(g2))]) == ""


def test_devices_with_multiple_allocations_share_by_share_id(env: Env) -> None:
    g0 = env.inv.gpus[0]
    for i in (1, 2):
        env.claims.add(claim(f"s{i}", f"uid-{i}", [("gpu", gpu_device_name(g0))]))
        env.claims.objects[("ns", f"s{i}")]["status"]["allocation"]["devices"]["results"][0]["shareID"] = f"00000000-0000-0000-0000-00000000000{i}"
        assert env.preparer.prepare([ClaimRef(f"uid-{i}", "ns", f"s{i}")])[f"uid-{i}"].error == ""


# ---- MPS daemons are waited for outside the node's lock -----------------------------------------------------

MPS_CONFIG = [{"requests": [], "opaque": {"driver": DRIVER, "parameters": {**CFG, "sharing": {"strategy": "MPS"}}}}]


class SlowDaemons(RecordingSharing):
    """MPS daemons that come up only when the test says so (or never: `fail`)."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()
        self.release = threading.Event()
        self.fail = ""

    def mps_wait(self, dirs: MpsDirs) -> None:
        self.waiting.set()
        assert self.release.wait(60), "the test never released the daemon"
        if self.fail:
            raise SharingError(self.fail)


def _in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.update(result=fn()), daemon=True)
    thread.start()
    return thread, out


def test_a_slow_mps_daemon_does_not_hold_up_other_claims(env: Env) -> None:
    env.sharing = slow = SlowDaemons()
    env.preparer = env.new()
    g0, g2 = env.inv.gpus[0], env.inv.gpus[2]
    mps, prepared = _in_thread(lambda: _prepare(env, "mps", "uid-m", [("gpu", gpu_device_name(g0))], config=MPS_CONFIG))
    try:
        assert slow.waiting.wait(30)
        # The MPS claim is recorded half-prepared while its daemon comes up ...
        assert env.preparer.checkpoint.claim("uid-m").phase is ClaimPhase.PREPARE_STARTED
        # ... and another claim on the node is prepared meanwhile (it would block here if the wait held the lock).
        other, out = _in_thread(lambda: _prepare(env, "plain", "uid-p", [("gpu", gpu_device_name(g2))]))
        other.join(30)
        assert not other.is_alive() and out["result"] == ""
        # An instance starting meanwhile (a rolling update) leaves the claim in flight alone.
        second = env.new()
        assert "uid-m" not in env.start_report.rolled_back
        assert second.checkpoint.claim("uid-m").phase is ClaimPhase.PREPARE_STARTED
        # An unprepare of the claim in flight waits for its prepare instead of undoing it halfway.
        unprepare, undone = _in_thread(lambda: second.unprepare([ClaimRef("uid-m", "ns", "mps")]))
        assert "result" not in undone
    finally:
        slow.release.set()
    mps.join(30)
    unprepare.join(30)
    assert prepared["result"] == "" and undone["result"] == {"uid-m": ""}
    with second.checkpoint.locked():
        assert second.checkpoint.claim("uid-m") is None and slow.mps == {}


def test_an_mps_daemon_that_times_out_is_kept_for_the_kubelets_retry(env: Env) -> None:
    env.sharing = slow = SlowDaemons()
    slow.fail = "the daemon did not start within 30s"
    slow.release.set()
    starts: list[Path] = []
    launch = slow.mps_start
    slow.mps_start = lambda dirs, *a, **k: (starts.append(dirs.pipe), launch(dirs, *a, **k))[1]  # type: ignore[method-assign]
    env.preparer = env.new()
    g0 = env.inv.gpus[0]
    error = _prepare(env, "mps", "uid-m", [("gpu", gpu_device_name(g0))], config=MPS_CONFIG)
    assert error.startswith("ResourceClaim ns/mps (uid uid-m): ") and "did not start within 30s" in error
    assert "Deployment is kept" in error
    # Not prepared for the kubelet (no CDI spec), but the daemon and the claim's holds stay for the retry.
    assert not (env.cdi_dir / "k8s.gpu.nvidia.com-claim_uid-m.json").exists()
    record = env.preparer.checkpoint.claim("uid-m")
    assert record is not None and record.mps_kept and record.phase is ClaimPhase.PREPARE_STARTED
    assert list(slow.mps) == starts and env.preparer.ledger.holders_of(g0.uuid) == ("dra:uid-m",)

    # The kubelet retries once the daemon is up: the same daemon is waited for, none is started again.
    slow.fail = ""
    assert _prepare(env, "mps", "uid-m", [("gpu", gpu_device_name(g0))], config=MPS_CONFIG) == ""
    assert len(starts) == 1 and list(slow.mps) == starts
    record = env.preparer.checkpoint.claim("uid-m")
    assert record is not None and record.phase is ClaimPhase.PREPARE_COMPLETED and not record.mps_kept
    assert (env.cdi_dir / "k8s.gpu.nvidia.com-claim_uid-m.json").exists()


def test_a_kept_mps_daemon_goes_with_its_claims_unprepare(env: Env) -> None:
    env.sharing = slow = SlowDaemons()
    slow.fail = "the daemon did not start within 30s"
    slow.release.set()
    env.preparer = env.new()
    g0 = env.inv.gpus[0]
    assert "did not start" in _prepare(env, "mps", "uid-m", [("gpu", gpu_device_name(g0))], config=MPS_CONFIG)
    assert slow.mps  # kept
    # The pod that needed it was deleted: the kubelet unprepares, and the kept daemon goes with the record.
    assert env.preparer.unprepare([ClaimRef("uid-m", "ns", "mps")]) == {"uid-m": ""}
    assert env.preparer.checkpoint.claim("uid-m") is None and env.preparer.ledger.holders_of(g0.uuid) == ()
    assert slow.mps == {} and slow.modes[g0.uuid] == COMPUTE_MODE_DEFAULT
    assert not (env.tmp / "mps" / "uid-m").exists()


def test_a_kept_mps_daemon_of_a_deleted_claim_is_swept(env: Env) -> None:
    """The kubelet never unprepares a claim whose prepare failed: the stale-claim sweep removes what was kept."""
    from driver.staleclaims import StaleClaimSweeper

    env.sharing = slow = SlowDaemons()
    slow.fail = "the daemon did not start within 30s"
    slow.release.set()
    env.preparer = env.new()
    g0 = env.inv.gpus[0]
    assert "did not start" in _prepare(env, "mps", "uid-m", [("gpu", gpu_device_name(g0))], config=MPS_CONFIG)
    del env.claims.objects[("ns", "mps")]  # its pod and claim were deleted meanwhile
    sweeper = StaleClaimSweeper(lambda ns, name: env.claims.objects.get((ns, name)), env.preparer, DRIVER, NODE)
    assert sweeper.sweep_once().suspected == ["ns/mps"]
    assert sweeper.sweep_once().unprepared == ["ns/mps"]
    assert env.preparer.checkpoint.claim("uid-m") is None and slow.mps == {}
    assert env.preparer.ledger.holders_of(g0.uuid) == ()


class _Crash(BaseException):
    """The agent process dying at a step (nothing after it runs)."""


def test_an_agent_dying_while_its_mps_daemon_comes_up_rolls_the_claim_back_at_restart(env: Env) -> None:
    def crash(step: str) -> None:
        if step == "cdi-written":  # everything applied, the daemon launched, the wait not begun
            raise _Crash(step)

    cp, report = Checkpoint.open(env.tmp / "plugin", boot_id_path=env.boot)
    dying = Preparer(driver_name=DRIVER, node_name=NODE, get_claim=env.claims.get, inventory=lambda: env.inv, checkpoint=cp,
                     cdi_dir=env.cdi_dir, sharing_backend=env.sharing, mps_root=env.tmp / "mps", fault_hook=crash)
    dying.start(report)
    g0 = env.inv.gpus[0]
    env.claims.add(claim("mps", "uid-m", [("gpu", gpu_device_name(g0))], config=MPS_CONFIG))
    with pytest.raises(_Crash):
        dying.prepare([ClaimRef("uid-m", "ns", "mps")])
    assert env.sharing.mps  # its daemon was launched
    restarted = env.new()
    assert env.start_report.rolled_back == ["uid-m"]
    assert restarted.checkpoint.claim("uid-m") is None and env.sharing.mps == {}
    # The kubelet's retry then prepares it afresh.
    assert restarted.prepare([ClaimRef("uid-m", "ns", "mps")])["uid-m"].error == ""
    assert restarted.checkpoint.claim("uid-m").phase is ClaimPhase.PREPARE_COMPLETED


def test_multi_user_mps_needs_volta(env: Env) -> None:
    multi = [{"requests": [], "opaque": {"driver": DRIVER, "parameters": {
        **CFG, "sharing": {"strategy": "MPS", "mpsConfig": {"multiUser": True}}}}}]
    g0 = env.inv.gpus[0]
    assert _prepare(env, "multi", "uid-1", [("gpu", gpu_device_name(g0))], config=multi) == ""
    assert env.sharing.multi_user == {env.tmp / "mps" / "uid-1" / "pipe": True}
    pascal = dataclasses.replace(env.inv.gpus[2], cuda_compute_capability="6.0")
    env.inv = dataclasses.replace(env.inv, gpus=[*env.inv.gpus[:2], pascal])
    error = _prepare(env, "old", "uid-2", [("gpu", gpu_device_name(pascal))], config=multi)
    assert (f"sharing.mpsConfig.multiUser: GPU {pascal.uuid} has CUDA compute capability 6.0; a multi-user MPS control "
            "daemon needs Volta (7.0) or newer") in error
    assert env.preparer.checkpoint.claim("uid-2") is None


# ---- a damaged checkpoint (issue 37: one flipped byte emptied the ledger while GPUs were in use) ----------------

MANY = [f"uid-{i:02d}" for i in range(40)]


def _prepare_many(env: Env) -> None:
    """A plain claim alone on the T4 first (its ledger hold is written by its PrepareStarted only), then 40 MPS
    claims sharing GPU 0: 82 transactions."""
    g0, t4_gpu = env.inv.gpus[0], env.inv.gpus[2]
    assert _prepare(env, "solo", "uid-solo", [("gpu", gpu_device_name(t4_gpu))]) == ""
    for uid in MANY:
        assert _prepare(env, f"mps-{uid}", uid, [("gpu", gpu_device_name(g0))], config=MPS_CONFIG) == ""


def _flip(path: Path, line: int) -> None:
    raw = bytearray(path.read_bytes())
    start = 0
    for _ in range(line):
        start = raw.index(b"\n", start) + 1
    raw[start + 90] ^= 0x04
    path.write_bytes(bytes(raw))


def _everything_held(env: Env, prepared: Preparer) -> None:
    g0, t4_gpu = env.inv.gpus[0], env.inv.gpus[2]
    claims = prepared.checkpoint.state.claims
    assert sorted(claims) == sorted([*MANY, "uid-solo"])
    assert all(r.phase is ClaimPhase.PREPARE_COMPLETED for r in claims.values())
    assert prepared.ledger.held() == {g0.uuid: tuple(f"dra:{u}" for u in MANY), t4_gpu.uuid: ("dra:uid-solo",)}


@pytest.mark.parametrize("damaged", [0, 1, 3])
def test_a_flipped_byte_early_in_the_journal_keeps_every_prepared_claim(env: Env, damaged: int) -> None:
    """Line 0: the solo claim's PrepareStarted (its only ledger hold); 1: its PrepareCompleted (the record falls
    back to PrepareStarted, with its spec written); 3: the first MPS claim's PrepareCompleted."""
    _prepare_many(env)
    env.preparer.checkpoint.close()
    _flip(env.tmp / "plugin" / "checkpoint.journal", damaged)
    again = env.new()
    assert env.load_report.corrupt and env.load_report.lost_transactions == 1
    assert again.recovery_pending is None and env.start_report.rolled_back == []
    _everything_held(env, again)
    assert sorted(cdi.claim_spec_uids(env.cdi_dir)) == sorted([*MANY, "uid-solo"])
    assert len(env.sharing.mps) == 40  # no daemon was stopped
    # Unprepare after the recovery undoes the MPS state: daemon, directories, and (last claim) the compute mode.
    first = MANY[0]
    assert (env.tmp / "mps" / first).is_dir()
    assert again.unprepare([ClaimRef(first, "ns", f"mps-{first}")]) == {first: ""}
    assert not (env.tmp / "mps" / first).exists() and len(env.sharing.mps) == 39


def test_a_damaged_snapshot_is_rebuilt_from_the_cdi_specs_mps_state_and_the_api(env: Env) -> None:
    g0 = env.inv.gpus[0]
    _prepare_many(env)
    cp = env.preparer.checkpoint
    with cp.locked():
        cp.compact()  # every claim is in the snapshot now, the journal is empty
    cp.close()
    snapshot = env.tmp / "plugin" / "checkpoint.json"
    snapshot.write_bytes(snapshot.read_bytes().replace(b'"uid-solo"', b'"uid-sol0"', 1))
    gone = MANY[-1]
    del env.claims.objects[("ns", f"mps-{gone}")]  # deleted from the API while the agent was down
    again = env.new()
    report = env.start_report
    assert env.load_report.corrupt and again.recovery_pending is None
    assert sorted(report.rebuilt) == sorted(u for u in [*MANY, "uid-solo"] if u != gone)
    assert report.cleaned == [gone]
    assert sorted(again.checkpoint.state.claims) == sorted(u for u in [*MANY, "uid-solo"] if u != gone)
    assert again.ledger.held()[g0.uuid] == tuple(f"dra:{u}" for u in MANY if u != gone)
    # The claim the API no longer has: its daemon stopped, its directories and spec gone.
    assert not (env.tmp / "mps" / gone).exists() and gone not in cdi.claim_spec_uids(env.cdi_dir)
    assert len(env.sharing.mps) == 39
    # A rebuilt MPS claim unprepares like any other, down to its directories and the GPU's compute mode.
    for uid in MANY[:-1]:
        assert again.unprepare([ClaimRef(uid, "ns", f"mps-{uid}")]) == {uid: ""}
        assert not (env.tmp / "mps" / uid).exists()
    assert env.sharing.mps == {} and env.sharing.modes[g0.uuid] == COMPUTE_MODE_DEFAULT


def test_without_the_api_a_damaged_node_refuses_to_serve_until_it_can_rebuild(env: Env) -> None:
    g0, g2 = env.inv.gpus[0], env.inv.gpus[2]
    assert _prepare(env, "mps", "uid-m", [("gpu", gpu_device_name(g0))], config=MPS_CONFIG) == ""
    cp = env.preparer.checkpoint
    with cp.locked():
        cp.compact()
    cp.close()
    (env.tmp / "plugin" / "checkpoint.json").write_text("{damaged")
    env.api_down = True
    env.preparer = again = env.new()
    assert again.recovery_pending is not None and "uid-m" in again.recovery_pending
    assert any("listing ResourceClaims failed: connection refused" in p for p in env.start_report.problems)
    assert cdi.claim_spec_uids(env.cdi_dir) == {"uid-m"}  # kept: a container may run on it
    # Nothing is prepared (the lost claim's GPU would look free) and the lost claim is not "unprepared" as nothing.
    error = _prepare(env, "other", "uid-o", [("gpu", gpu_device_name(g0))])
    assert "not prepared: the node checkpoint was damaged and 1 prepared claim(s) it lost (uid uid-m)" in error
    assert "(uid uid-m): not unprepared: the node checkpoint was damaged" in again.unprepare([ClaimRef("uid-m", "ns", "mps")])["uid-m"]
    assert (env.tmp / "mps" / "uid-m").is_dir()
    # The API answers again: the next request rebuilds first, then serves.
    env.api_down = False
    assert _prepare(env, "plain", "uid-p", [("gpu", gpu_device_name(g2))]) == ""
    assert again.recovery_pending is None and again.checkpoint.claim("uid-m") is not None
    assert again.ledger.held()[g0.uuid] == ("dra:uid-m",)
    assert again.unprepare([ClaimRef("uid-m", "ns", "mps")]) == {"uid-m": ""}
    assert not (env.tmp / "mps" / "uid-m").exists()
