"""The demo's expectations fail when the outcome is wrong (so that a passing demo means something)."""

from __future__ import annotations

from typing import Any

from sim.demo import expect
from sim.demo.cluster import apply_order, node_object
from sim.demo.disk import NodeDisk
from sim.kubelet.pods import pod_claim_names
from sim.demo.observe import ApiState, ClaimRow, DeviceRow, Observed, WorkloadRow

DRIVER = "gpu.nvidia.com"


def _dev(pool: str, name: str, **attrs: Any) -> DeviceRow:
    cdi = (f"k8s.gpu.nvidia.com/claim=uid-{pool}-{name}",)
    return DeviceRow(DRIVER, pool, name, cdi, False, "", attrs)


def _row(name: str, phase: str, devices: list[DeviceRow], *, uid: str = "", reason: str = "", message: str = "") -> WorkloadRow:
    node = ",".join(sorted({d.pool for d in devices}))
    return WorkloadRow(name, f"pod-{name}", phase, reason, message, node,
                       (ClaimRow(f"{name}-claim", uid or f"uid-{name}", node, tuple(devices)),) if devices else ())


def _a100s(pool: str, domain: str, n: int = 4, start: int = 0) -> list[DeviceRow]:
    return [_dev(pool, f"gpu-{i}", productName="NVIDIA A100-SXM4-80GB", nvlinkDomain=domain) for i in range(start, start + n)]


def _observed(disk: dict[str, NodeDisk] | None = None, act1: ApiState | None = None) -> Observed:
    empty = ApiState({}, {}, [], [])
    return Observed(act1 or empty, empty, {}, disk or {}, {"a100-1": 8}, "gpu-demo", DRIVER)


def test_trainings_on_one_node_and_domain_pass() -> None:
    rows = [_row("train-llama", "Succeeded", _a100s("a100-1", "d1")), _row("train-bert", "Running", _a100s("a100-2", "d2"))]
    assert expect.trainings(rows).ok


def test_training_split_over_two_nodes_or_domains_fails() -> None:
    split = _a100s("a100-1", "d1", 2) + _a100s("a100-2", "d2", 2)
    rows = [_row("train-llama", "Running", split), _row("train-bert", "Running", _a100s("a100-1", "d1"))]
    result = expect.trainings(rows)
    assert not result.ok and "a100-1,a100-2" in result.detail
    two_domains = _a100s("a100-1", "d1", 2) + _a100s("a100-1", "d9", 2, start=2)
    assert not expect.trainings([_row("train-llama", "Running", two_domains), rows[1]]).ok


def test_cannot_fit_needs_pending_and_an_explanation() -> None:
    explained = _row(expect.CANNOT_FIT, "Pending", [], reason="GpuDraUnschedulable",
                     message="0/4 nodes are available: 4 nodes: too few devices")
    assert expect.cannot_fit([explained]).ok
    silent = _row(expect.CANNOT_FIT, "Pending", [])
    assert not expect.cannot_fit([silent]).ok
    assert not expect.cannot_fit([]).ok


def test_gang_that_held_devices_in_act_1_fails() -> None:
    allocated = {"gang-worker-0-gpus": {"status": {"allocation": {"devices": {"results": []}}}}}
    act1 = ApiState({}, allocated, [], [])
    rows = [_row("gang-worker-0", "Running", _a100s("a100-1", "d1", 8)), _row("gang-worker-1", "Running", _a100s("a100-2", "d2", 8))]
    result = expect.gang(rows, _observed(act1=act1))
    assert not result.ok and "1 of 2 gang claims allocated" in result.detail


def test_disk_must_hold_exactly_the_running_claims() -> None:
    rows = [_row("notebook", "Running", [_dev("a100-1", "gpu-0")], uid="u1")]
    spec = {"cdiVersion": "0.5.0", "kind": "k8s.gpu.nvidia.com/claim",
            "devices": [{"name": "uid-a100-1-gpu-0", "containerEdits": {"env": ["A=1"]}}]}
    record = {"phase": "PrepareCompleted", "devices": [{"cdi_device_ids": ["k8s.gpu.nvidia.com/claim=uid-a100-1-gpu-0"]}]}
    good = NodeDisk(specs={"u1": spec}, claims={"u1": record})
    assert expect.disk_matches(rows, _observed({"a100-1": good})).ok
    leftover = NodeDisk(specs={"u1": spec, "u2": spec}, claims={"u1": record})
    result = expect.disk_matches(rows, _observed({"a100-1": leftover}))
    assert not result.ok and "u2" in result.detail
    half = NodeDisk(specs={"u1": spec}, claims={"u1": {**record, "phase": "PrepareStarted"}})
    assert not expect.disk_matches(rows, _observed({"a100-1": half})).ok


def test_pod_claim_names_wait_for_generated_names() -> None:
    pod = {"spec": {"resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "t"},
                                       {"name": "shared", "resourceClaimName": "fixed"}]}}
    assert pod_claim_names(pod) is None
    pod["status"] = {"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "p-gpus-abcde"}]}
    assert pod_claim_names(pod) == ["p-gpus-abcde", "fixed"]
    # DRAExtendedResource: the scheduler's special claim is named in the pod's status.
    pod["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": "p-extended-resources-xyz12", "requestMappings": []}
    assert pod_claim_names(pod) == ["p-gpus-abcde", "fixed", "p-extended-resources-xyz12"]


def test_apply_order_and_node_object() -> None:
    objs = [{"kind": "Pod"}, {"kind": "ResourceClaim"}, {"kind": "Namespace"}, {"kind": "ResourceClaimTemplate"}]
    assert [o["kind"] for o in apply_order(objs)] == ["Namespace", "ResourceClaimTemplate", "ResourceClaim", "Pod"]
    node = node_object("v100-1", gpu_allocatable=3)
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "v100-1"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "3"
    assert "nvidia.com/gpu" not in node_object("a100-1")["status"]["allocatable"]
