"""Explanations that name the real cause (each case here was once explained wrongly)."""

from __future__ import annotations

from typing import Any

import pytest

from controller.allocator import AllocationError, Allocator, ClusterSnapshot, parse_claim
from controller.cel import CelEnvironment
from controller.diagnosis import Diagnoser
from controller.explanation_writer import REASON_GANG_WAITING
from controller_helpers import DRIVER as CLUSTER_DRIVER
from gpudra.features import Features
from controller_helpers import create_all, events_for, gpu_class, manager, node, sim_slices, template
from tests.alloc_fixtures import DRIVER, allocation, claim, device, klass, request, slice_

CEL = CelEnvironment()
GPU_CLASS = klass("gpu", selectors=[f'device.attributes["{DRIVER}"].type == "gpu"'])


def _gpus_and_migs() -> list[dict[str, Any]]:
    """A node with 4 A100 GPUs and 4 MIG devices (which the GPU class does not select)."""
    gpus = [device(f"gpu-{i}", {"type": "gpu", "productName": "NVIDIA A100-SXM4-80GB"}) for i in range(4)]
    migs = [device(f"gpu-{i}-mig-1g", {"type": "mig", "productName": "NVIDIA A100-SXM4-80GB"}) for i in range(4)]
    return [slice_("s", "n1", "p", [*migs, *gpus])]


def test_b_a_request_selector_that_rejects_every_device_of_the_class_is_blamed_not_the_class() -> None:
    selector = f'device.attributes["{DRIVER}"].productName.contains("H100")'
    c = claim(requests=[request(cls="gpu", selectors=[{"cel": {"expression": selector}}])])
    r = Diagnoser(ClusterSnapshot(_gpus_and_migs(), [GPU_CLASS], []), cel_env=CEL).explain_node("n1", [parse_claim(c)])
    assert r.code == "selector"
    assert r.message == ("none of the 4 devices of class gpu matches selector #0 of request req-0 of claim default/claim-0: "
                         'productName "NVIDIA A100-SXM4-80GB" contains "H100" is false on all 4 devices')


def test_b_the_class_is_blamed_when_no_device_of_the_node_is_of_the_class() -> None:
    migs_only = [slice_("s", "n1", "p", [device(f"m{i}", {"type": "mig"}) for i in range(3)])]
    r = Diagnoser(ClusterSnapshot(migs_only, [GPU_CLASS], []), cel_env=CEL).explain_node("n1", [parse_claim(claim(requests=[request(cls="gpu")]))])
    assert r.code == "selector" and r.message == 'no device matches selector #0 of class gpu: type "mig" == "gpu" is false on all 3 devices'


def _shared_gpu(name: str) -> dict[str, Any]:
    return device(name, {"type": "gpu"}, allowMultipleAllocations=True, capacity={"memory": {"value": "80Gi"}})


def _capacity_claim(name: str, memory: str) -> dict[str, Any]:
    return claim(name, requests=[request(cls="gpu", capacity={"requests": {"memory": memory}})])


def test_c_capacity_no_device_has_is_not_called_capacity_left() -> None:
    snapshot = ClusterSnapshot([slice_("s", "n1", "p", [_shared_gpu("g0"), _shared_gpu("g1")])], [GPU_CLASS], [])
    r = Diagnoser(snapshot, cel_env=CEL).explain_node("n1", [parse_claim(_capacity_claim("big", "200Gi"))])
    assert r.code == "capacity-never"
    assert "left" not in r.message
    assert r.message.endswith("2 that can never give the requested capacity [memory: requested 200Gi, the device has 80Gi]")


def test_c_capacity_used_up_by_others_is_capacity_left() -> None:
    held = _capacity_claim("old", "60Gi")
    held["status"] = {"allocation": {"devices": {"results": [{
        "request": "req-0", "driver": DRIVER, "pool": "p", "device": "g0", "shareID": "8c3a2f7e-0000-4000-8000-000000000001",
        "consumedCapacity": {"memory": "60Gi"}}]}, "nodeSelector": allocation("n1")["nodeSelector"]}}
    snapshot = ClusterSnapshot([slice_("s", "n1", "p", [_shared_gpu("g0")])], [GPU_CLASS], [held])
    r = Diagnoser(snapshot, cel_env=CEL).explain_node("n1", [parse_claim(_capacity_claim("new", "40Gi"))])
    # The capacity is named, and said to be used up, with by how much.
    assert r.code == "capacity" and r.message.endswith(
        "usable: 0 of 1 matching: 1 whose capacity is used up by other claims [memory: 60Gi of 80Gi in use, 40Gi requested]")


def test_e_more_devices_than_the_node_has_does_not_suggest_freeing_some() -> None:
    devs = [device(f"d{i}", {"type": "gpu"}) for i in range(4)]
    held = claim("old", requests=[request(cls="gpu", count=3)],
                 allocation=allocation("n1", ("p", "d0"), ("p", "d1"), ("p", "d2")))
    snapshot = ClusterSnapshot([slice_("s", "n1", "p", devs)], [GPU_CLASS], [held])
    r = Diagnoser(snapshot, cel_env=CEL).explain_node("n1", [parse_claim(claim(requests=[request(cls="gpu", count=12)]))])
    assert r.code == "not-enough"
    # Not "3 in use": freeing them would not help, the node has too few in all.
    assert r.message == "request req-0 of claim default/claim-0 needs 12 devices; the node has only 4 matching devices in all"
    # With enough devices on the node, what is in use is what stands in the way.
    r = Diagnoser(snapshot, cel_env=CEL).explain_node("n1", [parse_claim(claim(requests=[request(cls="gpu", count=2)]))])
    assert r.code == "in-use" and r.message.endswith("usable: 1 of 4 matching: 3 in use by default/old")


@pytest.mark.parametrize(("key", "meant"), [("model", "productName"), ("prodcutName", "productName"),
                                            ("vram", f'device.capacity["{DRIVER}"].memory')])
def test_d_did_you_mean_by_meaning_and_by_spelling(key: str, meant: str) -> None:
    dev = device("gpu-0", {"type": "gpu", "productName": "NVIDIA A100", "numaNode": 0}, capacity={"memory": {"value": "80Gi"}})
    selector = f'device.attributes["{DRIVER}"].{key} == "A100"'
    c = claim(requests=[request(cls="gpu", selectors=[{"cel": {"expression": selector}}])])
    snapshot = ClusterSnapshot([slice_("s", "n1", "p", [dev])], [GPU_CLASS], [])
    with pytest.raises(AllocationError) as err:
        Allocator(snapshot, cel_env=CEL).allocate("n1", [parse_claim(c)])
    assert f"no such key: {key}" in str(err.value) and f"; did you mean {meant}? (device gpu-0 has " in str(err.value)


# -- (a) gangs -------------------------------------------------------------------------------------------


def _gang_cluster(api: Any) -> None:
    create_all(api, [gpu_class(), template("eight-gpus", 8)])
    for n in ("node-a", "node-b"):
        create_all(api, [node(n), *sim_slices(n)])


def _group_pod(name: str, group: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"schedulingGroup": {"podGroupName": group},
                     "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "eight-gpus"}],
                     "containers": [{"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpus"}]}}]}}


def _pod_group(name: str, min_count: int) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "metadata": {"name": name, "namespace": "default"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}}}


# The Workload API is beta and off by default in 1.37: served as the kind config turns it on.
@pytest.mark.apiserver_options(runtime_config="scheduling.k8s.io/v1beta1=true", features=Features.parse(["GenericWorkload"]))
def test_a_a_pod_group_gang_that_does_not_fit_says_why_and_a_forming_one_is_normal(apiserver: Any) -> None:
    api = apiserver.api
    _gang_cluster(api)
    ctl = manager(api, features=Features.parse(["GenericWorkload"]))
    create_all(api, [_pod_group("big", 3), _group_pod("big-0", "big")])
    ctl.step()
    (forming,) = [e for e in events_for(api, "big-0") if e["reason"] == REASON_GANG_WAITING]
    assert forming["type"] == "Normal" and "1 of minCount 3 pods exist" in forming["message"]
    # Three 8-GPU pods on two 8-GPU nodes: the complete gang cannot fit, and the pods say so.
    create_all(api, [_group_pod("big-1", "big"), _group_pod("big-2", "big")])
    for _ in range(4):
        ctl.step()
    claims, _ = api.list("ResourceClaim", namespace="default")
    verdicts = {c["metadata"]["annotations"][f"{CLUSTER_DRIVER}/explanation"] for c in claims}
    assert len(verdicts) == 1
    # The gang's one event on the pod now warns, with the gang controller's reason.
    (failed,) = [e for e in events_for(api, "big-0") if e["reason"] == REASON_GANG_WAITING]
    assert failed["type"] == "Warning"
    assert "waiting for" not in failed["message"] and verdicts.pop() in failed["message"]


def test_a_a_label_gang_that_does_not_fit_says_why(apiserver: Any) -> None:
    api = apiserver.api
    _gang_cluster(api)
    labels = {f"{CLUSTER_DRIVER}/gang": "trio", f"{CLUSTER_DRIVER}/gang-size": "3"}
    claims = [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": f"trio-{i}", "namespace": "default", "labels": labels},
               "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 8}}]}}}
              for i in range(3)]
    pods = [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"trio-{i}", "namespace": "default"},
             "spec": {"resourceClaims": [{"name": "gpus", "resourceClaimName": f"trio-{i}"}],
                      "containers": [{"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpus"}]}}]}}
            for i in range(3)]
    create_all(api, [claims[0], pods[0]])
    ctl = manager(api)
    ctl.step()
    (forming,) = [e for e in events_for(api, "trio-0") if e["reason"] == REASON_GANG_WAITING]
    assert forming["type"] == "Normal" and "1 of 3 claims exist" in forming["message"]
    create_all(api, [*claims[1:], *pods[1:]])
    for _ in range(4):
        ctl.step()
    verdict = api.get("ResourceClaim", "trio-0", "default")["metadata"]["annotations"][f"{CLUSTER_DRIVER}/explanation"]
    (failed,) = [e for e in events_for(api, "trio-0") if e["reason"] == REASON_GANG_WAITING]
    assert failed["type"] == "Warning" and verdict in failed["message"] and "once all its claims exist" not in failed["message"]
