"""What `kubectl describe` reads on the embedded cluster: PodScheduled on pods the embedded scheduler cannot
place, DeviceTaintRules honoured by it, and nodes with conditions, addresses, version and a heartbeat Lease."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from conftest import RESOURCE_BETAS

from controller.explanation_writer import REASON_UNSCHEDULABLE
from sim.roles.podconditions import unschedulable_conditions
from controller_helpers import (FakeWall, create_all, events_for, gpu_class, manager, node, pod, sim_slices, template,
                                terminating)
from sim.demo.cluster import node_object, register_node
from sim.kubelet.heartbeat import heartbeat_loop


def _cluster(api: Any, nodes: tuple[str, ...] = ("node-a",)) -> None:
    create_all(api, [gpu_class()])
    for n in nodes:
        create_all(api, [node(n), *sim_slices(n)])


def _scheduled(api: Any, name: str) -> dict[str, Any] | None:
    conditions = api.get("Pod", name, "default")["status"].get("conditions") or []
    return next((c for c in conditions if c["type"] == "PodScheduled"), None)


def test_a_pod_that_cannot_fit_is_marked_unschedulable_as_kube_scheduler_does(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api)
    create_all(api, [template("nine", 9), pod("greedy", templates={"gpu": "nine"})])
    m = manager(api)
    m.step()
    cond = _scheduled(api, "greedy")
    (ours,) = [e for e in events_for(api, "greedy") if e["reason"] == REASON_UNSCHEDULABLE]
    (failed,) = [e for e in events_for(api, "greedy") if e["reason"] == "FailedScheduling"]
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", "Unschedulable")
    # The condition and FailedScheduling speak kube-scheduler's words; our explanation stands beside them.
    assert cond["message"] == failed["message"] == (
        "0/1 nodes are available: 1 cannot allocate all claims. still not schedulable, "
        "preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod.")
    assert (failed["type"], failed["source"]["component"]) == ("Warning", "default-scheduler")
    assert "needs 9 devices" in ours["message"]
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
    (event,) = [e for e in events_for(api, "p2") if e["reason"] == REASON_UNSCHEDULABLE]
    assert "from DeviceTaintRule drain-a" in event["message"]


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


@pytest.mark.apiserver_options(runtime_config=RESOURCE_BETAS)
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


# ----- device taint eviction (kube-controller-manager's devicetainteviction, in embedded mode) ---------------


def _running_pod_on_node_a(api: Any, wall: FakeWall | None = None) -> Any:
    _cluster(api)
    create_all(api, [template("one", 1), pod("worker", templates={"gpu": "one"})])
    m = manager(api, wall=wall)
    m.step()
    assert api.get("Pod", "worker", "default")["spec"]["nodeName"] == "node-a"
    return m


def _rule_condition(api: Any, name: str) -> dict[str, Any]:
    conditions = api.get("DeviceTaintRule", name)["status"]["conditions"]
    return next(c for c in conditions if c["type"] == "EvictionInProgress")


def test_a_no_execute_rule_evicts_the_pods_using_its_devices(apiserver: Any) -> None:
    api = apiserver.api
    wall = FakeWall()
    m = _running_pod_on_node_a(api, wall)
    api.create("DeviceTaintRule", {"metadata": {"name": "drain-a"}, "spec": {
        "deviceSelector": {"pool": "node-a"}, "taint": {"key": "example.com/drain", "effect": "NoExecute"}}})
    m.step()
    assert terminating(api, "worker")  # deleted: its kubelet (none here) would stop it
    assert _rule_condition(api, "drain-a")["reason"] == "PodsPendingEviction"
    wall.advance(5)  # the status is refreshed at most every 10 s, as upstream's controller does
    m.step()
    assert _rule_condition(api, "drain-a")["reason"] == "PodsPendingEviction"
    wall.advance(10)
    events = [e for e in events_for(api, "worker") if e["reason"] == "DeviceTaintManagerEviction"]
    assert events and events[0]["type"] == "Normal" and events[0]["message"] == "Marking for deletion"
    m.step()
    cond = _rule_condition(api, "drain-a")
    assert (cond["status"], cond["reason"]) == ("False", "Completed")
    assert cond["message"] == "1 pod evicted since starting the controller."


def test_a_tolerated_taint_keeps_the_pod_and_the_rule_says_not_started(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api)
    tolerant = template("one", 1)
    tolerant["spec"]["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [
        {"key": "example.com/drain", "operator": "Exists", "effect": "NoExecute"}]
    create_all(api, [tolerant, pod("worker", templates={"gpu": "one"})])
    m = manager(api)
    m.step()
    api.create("DeviceTaintRule", {"metadata": {"name": "drain-a"}, "spec": {
        "deviceSelector": {"pool": "node-a"}, "taint": {"key": "example.com/drain", "effect": "NoExecute"}}})
    m.step()
    assert api.get("Pod", "worker", "default")["spec"]["nodeName"] == "node-a"
    cond = _rule_condition(api, "drain-a")
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "NotStarted", "")


def test_effect_none_reports_what_no_execute_would_do(apiserver: Any) -> None:
    api = apiserver.api
    m = _running_pod_on_node_a(api)
    api.create("DeviceTaintRule", {"metadata": {"name": "preview"}, "spec": {
        "deviceSelector": {"pool": "node-a"}, "taint": {"key": "example.com/drain", "effect": "None"}}})
    m.step()
    assert api.get("Pod", "worker", "default")["spec"]["nodeName"] == "node-a"
    cond = _rule_condition(api, "preview")
    assert (cond["status"], cond["reason"]) == ("False", "NoEffect")
    assert cond["message"].startswith("8 published devices selected. 1 allocated device selected. 1 pod would be "
                                      "evicted in 1 namespace if the effect was NoExecute.")


def test_plan_honours_toleration_seconds() -> None:
    from datetime import datetime, timezone

    from sim.roles.taintevict import plan

    now = datetime(2026, 1, 1, 0, 1, 0, tzinfo=timezone.utc)
    slices = [{"spec": {"driver": "d", "pool": {"name": "p", "generation": 1}, "devices": [
        {"name": "x", "taints": [{"key": "k", "effect": "NoExecute", "timeAdded": "2026-01-01T00:00:00Z"}]}]}}]
    running = {"metadata": {"name": "p1", "namespace": "ns", "uid": "u1"}, "status": {"phase": "Running"}}

    def claim(seconds: int | None, effect: str = "NoExecute") -> dict[str, Any]:
        tol = {"key": "k", "operator": "Exists", "effect": effect}
        if seconds is not None:
            tol["tolerationSeconds"] = seconds  # type: ignore[assignment]
        return {"status": {"reservedFor": [{"resource": "pods", "name": "p1", "uid": "u1"}], "allocation": {
            "devices": {"results": [{"driver": "d", "pool": "p", "device": "x", "tolerations": [tol]}]}}}}

    assert plan([running], [claim(30)], slices, now).evict_now  # added 60 s ago, tolerated for 30 s: now
    later = plan([running], [claim(300)], slices, now)
    assert not later.evict_now and later.later[0].when == datetime(2026, 1, 1, 0, 5, 0, tzinfo=timezone.utc)
    forever = plan([running], [claim(None)], slices, now)
    assert not forever.evict_now and not forever.later
    # kube-controller-manager 1.37 evicts unless the toleration names NoExecute (found by bench differential).
    assert plan([running], [claim(None, effect="")], slices, now).evict_now


def test_a_no_execute_taint_published_on_a_slice_later_evicts_the_pod_using_the_device(apiserver: Any) -> None:
    """Passes without taints skip the walk over slices; a slice that changes (the node agent publishing a device
    taint, as for an XID error) is read again on the next pass."""
    api = apiserver.api
    m = _running_pod_on_node_a(api)
    m.step()  # a pass with nothing tainted and nothing changed
    (claim,) = api.list("ResourceClaim", namespace="default")[0]
    device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
    (sl,) = [s for s in api.list("ResourceSlice")[0] if s["spec"]["nodeName"] == "node-a"]
    for dev in sl["spec"]["devices"]:
        if dev["name"] == device:
            dev["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"}]
    api.replace("ResourceSlice", sl)
    m.step()
    assert terminating(api, "worker")  # deleted: its kubelet (none here) would stop it
