"""Embedded mode: template expansion, placement, reservations, release, explanations, priority, quota."""

from __future__ import annotations

from typing import Any

from controller.claims import generate_name
from controller.explanation_writer import REASON_UNSCHEDULABLE
from controller.objects import DELETE_PROTECTION_FINALIZER, POD_CLAIM_NAME_ANNOTATION
from controller_helpers import (
    claim,
    claims_of,
    create_all,
    devices_of,
    events_for,
    gpu_class,
    gpu_slice,
    manager,
    node,
    node_of,
    pod,
    sim_slices,
    template,
)


def _cluster(api: Any, nodes: tuple[str, ...] = ("node-a",)) -> None:
    create_all(api, [gpu_class()])
    for n in nodes:
        create_all(api, [node(n), *sim_slices(n)])


def test_generate_name_follows_kubernetes() -> None:
    assert generate_name("train", "gpu") == "train-gpu-"
    long = generate_name("p" * 60, "c" * 20)
    # Both parts are cut proportionally and no trailing dash is added, as the resourceclaim controller does.
    assert long == "p" * (60 * 57 // 82) + "-" + "c" * (20 * 57 // 82)
    assert len(long) <= 57


def test_template_expansion_creates_owned_claim_and_records_pod_status(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api)
    create_all(api, [template("two-gpus", 2), pod("trainer", templates={"gpu": "two-gpus"})])
    report = manager(api).step()
    assert report.claims_created == 1 and report.pods_bound == 1

    trainer = api.get("Pod", "trainer", "default")
    (generated,) = claims_of(api).values()
    meta = generated["metadata"]
    assert meta["generateName"] == "trainer-gpu-" and meta["name"].startswith("trainer-gpu-")
    assert meta["annotations"][POD_CLAIM_NAME_ANNOTATION] == "gpu"
    assert meta["labels"] == {"app": "train"}
    assert meta["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "trainer",
                                        "uid": trainer["metadata"]["uid"], "controller": True,
                                        "blockOwnerDeletion": True}]
    assert trainer["status"]["resourceClaimStatuses"] == [{"name": "gpu", "resourceClaimName": meta["name"]}]
    # Allocation: finalizer first, the devices, the consumer, and the pod bound where the devices are.
    assert DELETE_PROTECTION_FINALIZER in meta["finalizers"]
    assert len(devices_of(generated)) == 2
    assert generated["status"]["reservedFor"] == [{"resource": "pods", "name": "trainer", "uid": trainer["metadata"]["uid"]}]
    assert trainer["spec"]["nodeName"] == node_of(generated) == "node-a"


def test_expansion_is_idempotent_across_passes(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api)
    create_all(api, [template("one", 1), pod("p", templates={"a": "one", "b": "one"})])
    m = manager(api)
    m.step()
    m.step()
    claims = claims_of(api)
    assert sorted(c["metadata"]["annotations"][POD_CLAIM_NAME_ANNOTATION] for c in claims.values()) == ["a", "b"]
    assert len({d for c in claims.values() for d in devices_of(c)}) == 2


def test_nvlink_match_attribute_picks_the_node_with_one_domain_big_enough(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [
        gpu_class(),
        node("split"), gpu_slice("split", [("g0", "d1"), ("g1", "d1"), ("g2", "d2"), ("g3", "d2")]),
        node("whole"), gpu_slice("whole", [("g0", "d9"), ("g1", "d9"), ("g2", "d9"), ("g3", "d9")]),
        template("three-linked", 3, match_nvlink=True), pod("p", templates={"gpu": "three-linked"}),
    ])
    assert manager(api).step().pods_bound == 1
    (c,) = claims_of(api).values()
    assert node_of(c) == "whole"
    assert sorted(devices_of(c)) == ["g0", "g1", "g2"]
    assert api.get("Pod", "p", "default")["spec"]["nodeName"] == "whole"


def test_shared_claim_reserved_for_each_pod_and_released_when_last_pod_goes(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api)
    create_all(api, [claim("shared", 1), pod("a", claims={"gpu": "shared"}), pod("b", claims={"gpu": "shared"})])
    m = manager(api)
    assert m.step().pods_bound == 2
    shared = api.get("ResourceClaim", "shared", "default")
    assert sorted(r["name"] for r in shared["status"]["reservedFor"]) == ["a", "b"]
    assert api.get("Pod", "a", "default")["spec"]["nodeName"] == api.get("Pod", "b", "default")["spec"]["nodeName"]

    api.delete("Pod", "a", "default", grace_period_seconds=0)  # no kubelet here: removed at once
    m.step()
    shared = api.get("ResourceClaim", "shared", "default")
    assert [r["name"] for r in shared["status"]["reservedFor"]] == ["b"]
    assert devices_of(shared)

    api.delete("Pod", "b", "default", grace_period_seconds=0)
    m.step()
    shared = api.get("ResourceClaim", "shared", "default")
    assert "allocation" not in shared["status"] and "reservedFor" not in shared["status"]
    assert DELETE_PROTECTION_FINALIZER not in (shared["metadata"].get("finalizers") or [])


def test_generated_claim_goes_with_its_pod_and_frees_devices(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api)
    create_all(api, [template("all8", 8), pod("first", templates={"gpu": "all8"})])
    m = manager(api)
    assert m.step().pods_bound == 1
    create_all(api, [pod("second", templates={"gpu": "all8"})])
    assert m.step().pods_bound == 0  # all eight GPUs are held by the first pod

    api.delete("Pod", "first", "default", grace_period_seconds=0)
    m.step()  # reservation dropped, deallocated, finalizer removed, claim deleted (owner gone)
    m.step()
    names = list(claims_of(api))
    assert len(names) == 1 and names[0].startswith("second-gpu-")
    assert api.get("Pod", "second", "default")["spec"]["nodeName"] == "node-a"


def test_finished_pod_releases_its_claim(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api)
    create_all(api, [claim("c", 8), pod("job", claims={"gpu": "c"})])
    m = manager(api)
    m.step()
    api.patch("Pod", "job", {"status": {"phase": "Succeeded"}}, "default", subresource="status")
    m.step()
    c = api.get("ResourceClaim", "c", "default")
    assert "allocation" not in c["status"]
    create_all(api, [pod("next", claims={"gpu": "c"})])
    assert m.step().pods_bound == 1


def test_pod_that_cannot_fit_gets_an_event_and_claim_explanation_rate_limited(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api, ("node-a", "node-b"))
    create_all(api, [template("nine", 9), pod("greedy", templates={"gpu": "nine"})])
    m = manager(api)
    report = m.step()
    assert report.pods_bound == 0 and report.pods_unschedulable == 1
    (event,) = [e for e in events_for(api, "greedy") if e["reason"] == REASON_UNSCHEDULABLE]
    assert event["type"] == "Warning" and event["count"] == 1
    assert event["message"].startswith("0/2 nodes are available: 2 nodes: ")
    assert "needs 9 devices" in event["message"]
    (c,) = claims_of(api).values()
    assert c["metadata"]["annotations"]["gpu.nvidia.com/explanation"] == event["message"]

    m.step()  # same reason again: not re-posted within the repeat interval
    (event,) = [e for e in events_for(api, "greedy") if e["reason"] == REASON_UNSCHEDULABLE]
    assert event["count"] == 1


def test_unschedulable_pod_is_retried_when_devices_are_released(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api)
    create_all(api, [claim("big", 6), pod("holder", claims={"gpu": "big"}),
                     template("four", 4), pod("waiter", templates={"gpu": "four"})])
    m = manager(api)
    m.step()
    assert not api.get("Pod", "waiter", "default")["spec"].get("nodeName")
    api.delete("Pod", "holder", "default", grace_period_seconds=0)
    m.step()
    assert api.get("Pod", "waiter", "default")["spec"]["nodeName"] == "node-a"
    waiter_claim = next(c for n, c in claims_of(api).items() if n.startswith("waiter-"))
    assert "gpu.nvidia.com/explanation" not in (waiter_claim["metadata"].get("annotations") or {})


def test_pending_pods_are_placed_in_priority_order(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api)
    create_all(api, [
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "high"}, "value": 1000},
        template("all8", 8),
        pod("low-early", templates={"gpu": "all8"}),
        pod("high-late", templates={"gpu": "all8"}, priority_class="high"),
    ])
    m = manager(api)
    m.step()
    assert api.get("Pod", "high-late", "default")["spec"].get("nodeName") == "node-a"
    assert not api.get("Pod", "low-early", "default")["spec"].get("nodeName")


def test_device_quota_is_enforced_with_a_clear_reason(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api)
    create_all(api, [
        {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpus", "namespace": "default"},
         "spec": {"hard": {"gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "3"}}},
        template("two", 2), pod("first", templates={"gpu": "two"}), pod("second", templates={"gpu": "two"}),
    ])
    m = manager(api)
    report = m.step()
    assert report.pods_bound == 1
    bound = [p for p in ("first", "second") if api.get("Pod", p, "default")["spec"].get("nodeName")]
    blocked = "second" if bound == ["first"] else "first"
    # As with kube-apiserver's quota admission, the blocked pod's claim (2 more devices, 2 used of 3) is refused
    # when the claim controller creates it: the pod has no claim to allocate.
    claims = api.list("ResourceClaim", namespace="default")[0]
    assert [c["metadata"]["name"].split("-")[0] for c in claims] == bound
    assert not (api.get("Pod", blocked, "default").get("status") or {}).get("resourceClaimStatuses")


def test_legacy_extended_resource_pods_honour_node_allocatable(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [node("small", gpus=2), node("big", gpus=4),
                     pod("three", gpus=3), pod("two-a", gpus=2), pod("two-b", gpus=2)])
    m = manager(api)
    m.step()
    placed = {p: api.get("Pod", p, "default")["spec"].get("nodeName") for p in ("three", "two-a", "two-b")}
    assert placed["three"] == "big"
    assert sorted(n for n in (placed["two-a"], placed["two-b"]) if n) == ["small"]  # big has 1 left
    waiting = next(p for p in ("two-a", "two-b") if not placed[p])
    (event,) = [e for e in events_for(api, waiting) if e["reason"] == REASON_UNSCHEDULABLE]
    assert "Insufficient nvidia.com/gpu" in event["message"]


def test_missing_template_is_reported_on_the_pod(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api)
    create_all(api, [pod("orphan", templates={"gpu": "nope"})])
    report = manager(api).step()
    assert report.pods_bound == 0 and claims_of(api) == {}
    (event,) = [e for e in events_for(api, "orphan") if e["reason"] == REASON_UNSCHEDULABLE]
    assert event["message"] == (
        'spec.resourceClaims[gpu].resourceClaimTemplateName: resourceclaimtemplate "nope" not found in namespace default'
    )


def test_dra_extended_resource_pod_gets_its_special_claim(apiserver: Any) -> None:
    """DRAExtendedResource: `nvidia.com/gpu` backed by the gpu.nvidia.com class (extendedResourceName), as NVIDIA's
    Helm chart sets it; the node has no device plugin allocatable, so only DRA can serve the pod."""
    from controller.extended import EXTENDED_CLAIM_ANNOTATION
    from gpudra.features import Features

    api = apiserver.api
    cls = gpu_class("gpu.nvidia.com")
    cls["spec"]["extendedResourceName"] = "nvidia.com/gpu"
    create_all(api, [cls, node("node-a"), *sim_slices("node-a"), pod("legacy", gpus=2)])
    report = manager(api, features=Features(extended_resource=True)).step()
    assert report.pods_bound == 1
    legacy = api.get("Pod", "legacy", "default")
    (special,) = claims_of(api).values()
    meta = special["metadata"]
    assert meta["name"].startswith("legacy-extended-resources-") and meta["annotations"] == {EXTENDED_CLAIM_ANNOTATION: "true"}
    assert special["spec"]["devices"]["requests"] == [
        {"name": "container-0-request-0", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2}}
    ]
    assert len(devices_of(special)) == 2 and node_of(special) == legacy["spec"]["nodeName"] == "node-a"
    assert legacy["status"]["extendedResourceClaimStatus"] == {
        "resourceClaimName": meta["name"],
        "requestMappings": [{"containerName": "main", "resourceName": "nvidia.com/gpu", "requestName": "container-0-request-0"}],
    }
    assert special["status"]["reservedFor"] == [{"resource": "pods", "name": "legacy", "uid": legacy["metadata"]["uid"]}]


def test_cel_runtime_error_and_missing_class_are_in_the_claim_explanation(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api)
    typo = claim("typo")
    typo["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": 'device.attributes["gpu.nvidia.com"].prodcutName == "x"'}}]
    noclass = claim("noclass")
    noclass["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "gpu.nvidia.co"
    create_all(api, [typo, noclass, pod("p-typo", claims={"gpu": "typo"}), pod("p-noclass", claims={"gpu": "noclass"})])
    manager(api).step()
    claims = claims_of(api)
    why = claims["typo"]["metadata"]["annotations"]["gpu.nvidia.com/explanation"]
    assert "CEL runtime error: no such key: prodcutName" in why and "; did you mean productName? (device gpu-" in why
    assert "productName" in why.split("has attributes gpu.nvidia.com: ")[1]
    why = claims["noclass"]["metadata"]["annotations"]["gpu.nvidia.com/explanation"]
    assert 'deviceclass.resource.k8s.io "gpu.nvidia.co" not found; did you mean gpu.nvidia.com?' in why
    (event,) = [e for e in events_for(api, "p-typo") if e["reason"] == REASON_UNSCHEDULABLE]
    assert "did you mean productName?" in event["message"]


def test_a_failed_binding_gives_its_devices_back_and_the_pod_is_placed_on_the_next_pass(
    apiserver: Any, monkeypatch: Any
) -> None:
    """Bindings run beside placement (sim.roles.inflight): one that fails after its claim was allocated is undone
    through the API and in the pass's snapshot, so no device stays held for a pod that is not bound."""
    import sim.roles.scheduler as scheduler_module

    api = apiserver.api
    _cluster(api)
    create_all(api, [template("gpu-8", 8), pod("x", templates={"gpu": "gpu-8"})])
    real_bind = scheduler_module.bind_pod
    refused: list[str] = []

    def refuse_first(writer: Any, p: Any, node_name: str, **kwargs: Any) -> bool:
        if not refused:
            refused.append(p["metadata"]["name"])
            return False
        return real_bind(writer, p, node_name, **kwargs)

    monkeypatch.setattr(scheduler_module, "bind_pod", refuse_first)
    m = manager(api)
    report = m.step()
    assert (report.pods_bound, report.pods_unschedulable, refused) == (0, 1, ["x"])
    (claim_x,) = claims_of(api).values()
    assert "allocation" not in claim_x["status"] and not api.get("Pod", "x", "default")["spec"].get("nodeName")
    assert DELETE_PROTECTION_FINALIZER not in (claim_x["metadata"].get("finalizers") or [])
    # The snapshot holds nothing for it: all 8 GPUs are free for the retry.
    assert m.step().pods_bound == 1
    (claim_x,) = claims_of(api).values()
    assert len(devices_of(claim_x)) == 8 and api.get("Pod", "x", "default")["spec"]["nodeName"] == "node-a"


def test_claims_the_scheduler_expands_are_created_protected_and_lose_the_finalizer_while_unallocated(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api)
    create_all(api, [template("gpu-16", 16), pod("big", templates={"gpu": "gpu-16"})])
    m = manager(api)
    assert m.step().pods_unschedulable == 1
    (claim_big,) = claims_of(api).values()
    # Created for placement right away, so with kube-scheduler's finalizer already on it...
    assert claim_big["metadata"]["finalizers"] == [DELETE_PROTECTION_FINALIZER] and "allocation" not in claim_big.get("status", {})
    # ...which the release pass takes off a claim that stays unallocated, as for any claim nobody holds.
    m.step()
    (claim_big,) = claims_of(api).values()
    assert DELETE_PROTECTION_FINALIZER not in (claim_big["metadata"].get("finalizers") or [])


def test_event_memory_of_a_pod_goes_with_the_pod(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api)
    create_all(api, [template("nine", 9), pod("greedy", templates={"gpu": "nine"}), pod("other", templates={"gpu": "nine"})])
    m = manager(api)
    m.step()
    uids = {api.get("Pod", n, "default")["metadata"]["uid"] for n in ("greedy", "other")}
    remembered = lambda: {uid for uid, _ in m.explainer._posted}  # noqa: E731 - the rate limiter's memory
    assert remembered() == uids
    m.step()  # nothing went: the memory stays
    assert remembered() == uids
    api.delete("Pod", "greedy", "default", grace_period_seconds=0)
    m.step()
    assert remembered() == {api.get("Pod", "other", "default")["metadata"]["uid"]}


def test_a_generated_claim_is_an_orphan_once_its_pod_is_gone_done_or_replaced_by_a_namesake() -> None:
    from sim.roles.claimlifecycle import claims_to_delete

    claim = {"metadata": {"name": "p-gpu-abcde", "namespace": "default",
                          "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
                          "ownerReferences": [{"kind": "Pod", "name": "p", "uid": "u1", "controller": True}]}}

    def pod_obj(uid: str, phase: str = "Running") -> dict[str, Any]:
        return {"metadata": {"name": "p", "namespace": "default", "uid": uid}, "status": {"phase": phase}}

    assert claims_to_delete([claim], {"default/p": pod_obj("u1")}) == []
    assert claims_to_delete([claim], {"default/p": pod_obj("u1", "Succeeded")}) == [claim]
    assert claims_to_delete([claim], {"default/p": pod_obj("u2")}) == [claim]  # a new pod of the same name
    assert claims_to_delete([claim], {}) == [claim]


def test_a_refused_claim_creation_is_reported_on_the_pod_and_retried_with_back_off(apiserver: Any) -> None:
    from controller.claims import GeneratedClaims
    from sim.roles.claimlifecycle import ClaimLifecycle
    from controller.metrics import ControllerMetrics
    from gpudra.kubeapi import ApiError

    api = apiserver.api
    _cluster(api)
    api.create("ResourceQuota", {"metadata": {"name": "no-claims"}, "spec": {"hard": {
        "count/resourceclaims.resource.k8s.io": "0"}}}, namespace="default")
    create_all(api, [template("one", 1), pod("p", templates={"gpu": "one"})])
    manager(api).step()
    assert claims_of(api) == {}
    (event,) = [e for e in events_for(api, "p") if e["reason"] == "FailedResourceClaimCreation"]
    assert event["type"] == "Warning" and event["source"] == {"component": "resource_claim"}
    assert event["message"].startswith("PodResourceClaim gpu: create ResourceClaim : resourceclaims.resource.k8s.io ")
    assert "is forbidden: exceeded quota: no-claims" in event["message"]

    # the pod is tried again with the work queue's back-off (5 ms doubling), not on every pass
    attempts: list[float] = []
    now = [0.0]

    class Refusing:
        def create(self, kind: str, body: Any, *, refused: Any = None) -> None:
            attempts.append(now[0])
            refused(ApiError(403, "Forbidden", "exceeded quota"))

    reported: list[str] = []
    lifecycle = ClaimLifecycle(Refusing(), ControllerMetrics(), clock=lambda: now[0],  # type: ignore[arg-type]
                               report=lambda p, reason, message: reported.append(message))
    refused_pod = api.get("Pod", "p", "default")
    templates = {"default/one": api.get("ResourceClaimTemplate", "one", "default")}
    for step in range(200):
        now[0] = step * 0.01
        lifecycle.expand_pod(refused_pod, GeneratedClaims(), templates)
    assert [round(t, 2) for t in attempts] == [0.0, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28]
    assert reported[0] == "PodResourceClaim gpu: create ResourceClaim : exceeded quota"
