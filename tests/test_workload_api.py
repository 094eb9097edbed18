"""The Workload API of Kubernetes 1.37 (`scheduling.k8s.io/v1beta1` Workload and PodGroup): validation, serving by
the embedded control plane, and PodGroup gangs honoured all-or-nothing by the embedded scheduler and the gang
controller, beside label-named gangs."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from controller_helpers import create_all, events_for, gpu_class, manager, node, sim_slices, template
from controller.explanation_writer import REASON_GANG_WAITING
from gpudra.features import Features
from gpudra.kubeapi import ApiError
from gpudra.validation.workloads import validate_workload_api_object

V1BETA1 = "scheduling.k8s.io/v1beta1"
# The Workload API is beta and off in 1.37: served as the kind config turns it on (manifests/kind/cluster.yaml).
WORKLOAD_API = Features.parse(["GenericWorkload"])
SHARED_CLAIMS = Features.parse(["GenericWorkload", "DRAWorkloadResourceClaims"])
pytestmark = pytest.mark.apiserver_options(runtime_config="scheduling.k8s.io/v1beta1=true", features=SHARED_CLAIMS)


def workload(**spec: Any) -> dict[str, Any]:
    body = {"podGroupTemplates": [{"name": "workers", "schedulingPolicy": {"gang": {"minCount": 4}}}]}
    body.update(spec)
    return {"apiVersion": V1BETA1, "kind": "Workload", "metadata": {"name": "train", "namespace": "default"},
            "spec": body}


def pod_group(name: str = "train-workers", min_count: int | None = 2, **spec: Any) -> dict[str, Any]:
    policy = {"gang": {"minCount": min_count}} if min_count is not None else {"basic": {}}
    body: dict[str, Any] = {"schedulingPolicy": policy, **spec}
    return {"apiVersion": V1BETA1, "kind": "PodGroup", "metadata": {"name": name, "namespace": "default"},
            "spec": body}


def errors(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    return [str(e) for e in validate_workload_api_object(obj, old)]


def test_valid_objects() -> None:
    assert errors(workload(controllerRef={"apiGroup": "batch", "kind": "Job", "name": "train"})) == []
    assert errors(pod_group(workloadRef={"workloadName": "train", "templateName": "workers"},
                            resourceClaims=[{"name": "shared", "resourceClaimTemplateName": "nvlink-pair"}],
                            disruptionMode={"all": {}})) == []
    assert errors(pod_group(min_count=None)) == []


@pytest.mark.parametrize(("obj", "message"), [
    (workload(podGroupTemplates=[]), "spec.podGroupTemplates: Required value"),
    (workload(podGroupTemplates=[{"name": f"t{i}", "schedulingPolicy": {"basic": {}}} for i in range(9)]),
     "spec.podGroupTemplates: Too many: 9: must have at most 8 items"),
    (workload(podGroupTemplates=[{"name": "a", "schedulingPolicy": {"basic": {}}}] * 2),
     'spec.podGroupTemplates[1]: Duplicate value: "a"'),
    (workload(podGroupTemplates=[{"name": "Bad_Name", "schedulingPolicy": {"basic": {}}}]), "spec.podGroupTemplates[0].name"),
    (workload(compositePodGroupTemplates=[{"name": "x"}]), "disabled by feature-gate CompositePodGroup"),
    (workload(controllerRef={"name": "train"}), "spec.controllerRef.kind: Required value"),
    (pod_group(schedulingPolicy={"basic": {}, "gang": {"minCount": 2}}), "must specify exactly one of: `basic`, `gang`"),
    (pod_group(min_count=0), "spec.schedulingPolicy.gang.minCount: Invalid value: 0: must be greater than zero"),
    (pod_group(resourceClaims=[{"name": "c", "resourceClaimName": "a", "resourceClaimTemplateName": "b"}]),
     "must specify one of: `resourceClaimName`, `resourceClaimTemplateName`"),
    (pod_group(resourceClaims=[{"name": f"c{i}", "resourceClaimName": "a"} for i in range(5)]),
     "spec.resourceClaims: Too many: 5: must have at most 4 items"),
    (pod_group(schedulingConstraints={"topology": []}), "disabled by feature-gate TopologyAwareWorkloadScheduling"),
    (pod_group(priority=2_000_000_000), "must be less than or equal to 1000000000"),
    (pod_group(disruptionMode={}), "must specify exactly one of: `single`, `all`"),
])
def test_invalid_objects(obj: dict[str, Any], message: str) -> None:
    assert any(message in e for e in errors(obj)), errors(obj)


def test_update_rules() -> None:
    old = pod_group(min_count=2)
    scaled = copy.deepcopy(old)
    scaled["spec"]["schedulingPolicy"]["gang"]["minCount"] = 3
    assert errors(scaled, old) == []
    assert errors(pod_group(min_count=None), old)  # gang -> basic: immutable
    w = workload()
    more = workload(podGroupTemplates=[*w["spec"]["podGroupTemplates"], {"name": "b", "schedulingPolicy": {"basic": {}}}])
    assert any("may not be added or removed" in e for e in errors(more, w))


def test_embedded_server_serves_and_validates(apiserver: Any) -> None:
    api = apiserver.api
    api.create("Workload", workload())
    api.create("PodGroup", pod_group())
    assert api.get("PodGroup", "train-workers", "default")["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
    with pytest.raises(ApiError) as bad:
        api.create("PodGroup", pod_group("broken", min_count=0))
    assert "spec.schedulingPolicy.gang.minCount: Invalid value: 0" in str(bad.value)
    group = api.get("PodGroup", "train-workers", "default")
    group["spec"]["schedulingPolicy"] = {"basic": {}}
    with pytest.raises(ApiError):
        api.replace("PodGroup", group)


def _gang_pod(name: str, group: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"schedulingGroup": {"podGroupName": group},
                     "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "eight-gpus"}],
                     "containers": [{"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpus"}]}}]}}


def _cluster(api: Any) -> None:
    create_all(api, [gpu_class(), template("eight-gpus", 8)])
    for n in ("node-a", "node-b"):
        create_all(api, [node(n), *sim_slices(n)])


def _steps(ctl: Any, n: int = 4) -> None:
    for _ in range(n):
        ctl.step()


def _bound(api: Any, *names: str) -> list[str | None]:
    return [api.get("Pod", n, "default")["spec"].get("nodeName") for n in names]


def _allocated_claims(api: Any) -> int:
    items, _ = api.list("ResourceClaim", namespace="default")
    return sum(1 for c in items if (c.get("status") or {}).get("allocation"))


@pytest.mark.slow
def test_pod_group_gang_is_all_or_nothing(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api)
    ctl = manager(api, features=WORKLOAD_API)
    # Three 8-GPU workers in a gang of three: two A100 nodes hold only two of them, so none runs.
    create_all(api, [pod_group("big", 3), *(_gang_pod(f"big-{i}", "big") for i in range(3))])
    _steps(ctl)
    assert _bound(api, "big-0", "big-1", "big-2") == [None, None, None]
    assert _allocated_claims(api) == 0  # holds nothing
    reasons = {e["reason"] for e in events_for(api, "big-0")}
    assert REASON_GANG_WAITING in reasons
    # A gang of two fits; it lands on both nodes at once, and the waiting gang still holds nothing.
    create_all(api, [pod_group("pair", 2), _gang_pod("pair-0", "pair")])
    _steps(ctl)
    assert _bound(api, "pair-0") == [None]  # 1 of minCount 2 pods
    msg = [e["message"] for e in events_for(api, "pair-0") if e["reason"] == REASON_GANG_WAITING]
    assert msg and "1 of minCount 2 pods exist" in msg[-1]
    create_all(api, [_gang_pod("pair-1", "pair")])
    _steps(ctl)
    assert sorted(_bound(api, "pair-0", "pair-1")) == ["node-a", "node-b"]
    assert _bound(api, "big-0", "big-1", "big-2") == [None, None, None]


def test_pod_waits_for_its_pod_group_to_exist_and_basic_groups_schedule_alone(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api)
    ctl = manager(api, features=WORKLOAD_API)
    create_all(api, [_gang_pod("lonely", "missing")])
    _steps(ctl, 3)
    assert _bound(api, "lonely") == [None]
    assert any('PodGroup "missing"' in e["message"] for e in events_for(api, "lonely"))
    create_all(api, [pod_group("missing", None)])  # a basic group: no gang semantics
    _steps(ctl, 3)
    assert _bound(api, "lonely")[0] in ("node-a", "node-b")


def test_validate_cli_checks_workload_api_objects(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    import yaml

    from cli.main import main

    path = tmp_path / "groups.yaml"
    path.write_text(yaml.safe_dump_all([pod_group("ok"), pod_group("bad", 0)]))
    assert main(["validate", "-f", str(path), "-o", "json"]) == 1
    results = json.loads(capsys.readouterr().out)["results"]
    assert [(r["object"], r["valid"]) for r in results] == [("PodGroup/default/ok", True), ("PodGroup/default/bad", False)]
    assert "spec.schedulingPolicy.gang.minCount" in results[1]["errors"][0]


@pytest.mark.parametrize(("variant", "pods"), [
    ("examples/gang-16gpu.yaml", ("gang-worker-0", "gang-worker-1")),
    ("workload-api/gang-16gpu.yaml", ("pretrain-worker-0", "pretrain-worker-1")),
])
@pytest.mark.slow
def test_the_readme_gang_both_ways_lands_in_embedded_mode(apiserver: Any, variant: str, pods: tuple[str, str]) -> None:
    """manifests/examples/gang-16gpu.yaml (labels) and manifests/workload-api/gang-16gpu.yaml (PodGroup) place the
    same way: both 8-GPU workers, one per A100 node."""
    from pathlib import Path

    from gpudra.manifests import load_objects

    api = apiserver.api
    api.create("Namespace", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpu-demo"}})
    create_all(api, [gpu_class()])
    for n in ("node-a", "node-b"):
        create_all(api, [node(n), *sim_slices(n)])
    root = Path(__file__).resolve().parent.parent / "manifests"
    create_all(api, load_objects([str(root / variant)]))
    _steps(manager(api, features=WORKLOAD_API), 5)
    nodes = [api.get("Pod", p, "gpu-demo")["spec"].get("nodeName") for p in pods]
    assert sorted(map(str, nodes)) == ["node-a", "node-b"], (variant, nodes)


def _shared_pod(name: str) -> dict[str, Any]:
    claim = {"name": "shared", "resourceClaimTemplateName": "two-gpus"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"schedulingGroup": {"podGroupName": "team"}, "resourceClaims": [claim],
                     "containers": [{"name": "main", "image": "cuda", "resources": {"claims": [{"name": "shared"}]}}]}}


def _manager_with(api: Any, *gates: str) -> Any:
    from controller.manager import ControllerConfig, ControllerManager
    from sim.roles.embedded import EmbeddedRoles
    from controller_helpers import DRIVER, FAST, FakeWall
    from gpudra.features import Features

    config = ControllerConfig(driver_name=DRIVER, gang_timeout=60.0, leader_elect=False, identity="test",
                              timings=FAST, tick=0.05, resync_period=5.0, features=Features.parse(list(gates)))
    return ControllerManager(api, config, wall=FakeWall(), roles=EmbeddedRoles)


@pytest.mark.slow
def test_pod_group_shares_one_claim_with_its_pods(apiserver: Any) -> None:
    """DRAWorkloadResourceClaims (beta, off in 1.37): the group's template becomes one claim, reserved for the
    PodGroup, and both pods run on its devices."""
    api = apiserver.api
    create_all(api, [gpu_class(), template("two-gpus", 2), node("node-a"), *sim_slices("node-a")])
    group = pod_group("team", None, resourceClaims=[{"name": "shared", "resourceClaimTemplateName": "two-gpus"}])
    create_all(api, [group, _shared_pod("team-0"), _shared_pod("team-1")])
    _steps(_manager_with(api, "GenericWorkload", "DRAWorkloadResourceClaims"), 4)
    claims, _ = api.list("ResourceClaim", namespace="default")
    assert len(claims) == 1
    (claim,) = claims
    stored_group = api.get("PodGroup", "team", "default")
    assert claim["metadata"]["ownerReferences"][0]["kind"] == "PodGroup"
    assert stored_group["status"]["resourceClaimStatuses"] == [{"name": "shared", "resourceClaimName": claim["metadata"]["name"]}]
    assert claim["status"]["reservedFor"] == [{"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "team",
                                              "uid": stored_group["metadata"]["uid"]}]
    for name in ("team-0", "team-1"):
        pod = api.get("Pod", name, "default")
        assert pod["spec"]["nodeName"] == "node-a"
        assert pod["status"]["resourceClaimStatuses"] == [{"name": "shared", "resourceClaimName": claim["metadata"]["name"]}]


def test_without_the_gate_each_pod_gets_its_own_claim(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [gpu_class(), template("two-gpus", 2), node("node-a"), *sim_slices("node-a")])
    group = pod_group("team", None, resourceClaims=[{"name": "shared", "resourceClaimTemplateName": "two-gpus"}])
    create_all(api, [group, _shared_pod("team-0"), _shared_pod("team-1")])
    _steps(_manager_with(api, "GenericWorkload"), 4)
    claims, _ = api.list("ResourceClaim", namespace="default")
    assert len(claims) == 2 and all(c["status"]["reservedFor"][0]["resource"] == "pods" for c in claims)
