"""What `kubectl describe` reads on the embedded cluster: PodScheduled on pods the embedded scheduler cannot
place, DeviceTaintRules honoured by it, and nodes with conditions, addresses, version and a heartbeat Lease."""

from __future__ import annotations

import threading
from typing import Any

from controller.explanation_writer import REASON_UNSCHEDULABLE
from controller.podconditions import unschedulable_conditions
from controller_helpers import create_all, events_for, gpu_class, manager, node, pod, sim_slices, template
from sim.demo.cluster import node_object, register_node
from sim.kubelet.heartbeat import heartbeat_loop


def _cluster(api: Any, nodes: tuple[str, ...] = ("node-a",)) -> None:
    create_all(api, [gpu_class()])
    for n in nodes:
        create_all(api, [node(n), *sim_slices(n)])


def _scheduled(api: Any, name: str) -> dict[str, Any] | None:
    conditions = api.get("Pod", name, "default")["status"].get("conditions") or []
    return next((c for c in conditions if c["type"] == "PodScheduled"), None)


def test_a_pod_that_cannot_fit_is_marked_unschedulable_with_the_explanation(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api)
    create_all(api, [template("nine", 9), pod("greedy", templates={"gpu": "nine"})])
    m = manager(api)
    m.step()
    cond = _scheduled(api, "greedy")
    (event,) = [e for e in events_for(api, "greedy") if e["reason"] == REASON_UNSCHEDULABLE]
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", "Unschedulable")
    assert cond["message"] == event["message"] and "needs 9 devices" in cond["message"]
    rv = api.get("Pod", "greedy", "default")["metadata"]["resourceVersion"]
    m.step()  # the same verdict again writes nothing
    assert api.get("Pod", "greedy", "default")["metadata"]["resourceVersion"] == rv


def test_binding_turns_pod_scheduled_true(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api)
    create_all(api, [template("one", 1), pod("small", templates={"gpu": "one"})])
    manager(api).step()
    cond = _scheduled(api, "small")
    assert cond is not None and cond["status"] == "True"


def test_a_device_taint_rule_keeps_the_embedded_scheduler_off_its_devices(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api, ("node-a", "node-b"))
    api.create("DeviceTaintRule", {"metadata": {"name": "drain-a"}, "spec": {
        "deviceSelector": {"pool": "node-a"}, "taint": {"key": "example.com/drain", "effect": "NoSchedule"}}})
    create_all(api, [template("eight", 8), pod("p1", templates={"gpu": "eight"}),
                     pod("p2", templates={"gpu": "eight"})])
    manager(api).step()
    assert api.get("Pod", "p1", "default")["spec"].get("nodeName") == "node-b"
    assert not api.get("Pod", "p2", "default")["spec"].get("nodeName")
    cond = _scheduled(api, "p2")
    assert cond is not None and "from DeviceTaintRule drain-a" in cond["message"]


def test_unschedulable_conditions_keep_the_transition_time() -> None:
    first = unschedulable_conditions({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}, "full")
    assert first is not None and [c["type"] for c in first] == ["Ready", "PodScheduled"]
    pod_now = {"status": {"conditions": first}}
    assert unschedulable_conditions(pod_now, "full") is None
    again = unschedulable_conditions(pod_now, "still full")
    assert again is not None and again[1]["lastTransitionTime"] == first[1]["lastTransitionTime"]


def test_registered_nodes_report_what_describe_shows_and_keep_a_lease(apiserver: Any) -> None:
    api = apiserver.api
    stored = register_node(api, node_object("n1"))
    status = stored["status"]
    assert [c["type"] for c in status["conditions"]] == ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
    assert {a["type"] for a in status["addresses"]} == {"InternalIP", "Hostname"}
    assert status["nodeInfo"]["kubeletVersion"] == "v1.37.0"
    lease = api.get("Lease", "n1", "kube-node-lease")
    assert lease["spec"]["holderIdentity"] == "n1" and lease["spec"]["leaseDurationSeconds"] == 40
    assert lease["metadata"]["ownerReferences"][0]["uid"] == stored["metadata"]["uid"]
    stop = threading.Event()
    beat = threading.Thread(target=heartbeat_loop, args=(api, "n1", stop, 0.05), daemon=True)
    beat.start()
    try:
        deadline = threading.Event()
        for _ in range(200):
            if api.get("Lease", "n1", "kube-node-lease")["spec"]["renewTime"] != lease["spec"]["renewTime"]:
                break
            deadline.wait(0.05)
        assert api.get("Lease", "n1", "kube-node-lease")["spec"]["renewTime"] != lease["spec"]["renewTime"]
    finally:
        stop.set()
        beat.join(timeout=5)


def test_v1beta1_objects_created_through_the_server_are_scheduled(apiserver: Any) -> None:
    import json
    import urllib.request

    api = apiserver.api
    _cluster(api)
    template = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "single-gpu", "namespace": "default"},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu.nvidia.com"}]}}}}
    req = urllib.request.Request(
        apiserver.url + "/apis/resource.k8s.io/v1beta1/namespaces/default/resourceclaimtemplates",
        data=json.dumps(template).encode(), method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as resp:
        assert resp.status == 201
    create_all(api, [pod("pod1", templates={"gpu": "single-gpu"})])
    manager(api).step()
    assert api.get("Pod", "pod1", "default")["spec"].get("nodeName") == "node-a"
