"""The simulated cluster's pod garbage collector: orphans of a deleted node are marked Failed with PodGC's
DisruptionTarget condition and force-deleted after the 40 s quarantine (not before, and not when the node comes
back); unscheduled terminating pods and terminating pods on an out-of-service node are force-deleted."""

from __future__ import annotations

from typing import Any

from sim.cluster import podgc
from sim.cluster.podgc import PodGC, failed_status, plan


def _node(name: str, ready: bool = True, taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"taints": taints or []},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def _pod(name: str, node: str = "", terminating: bool = False, phase: str = "Running") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default", "uid": f"uid-{name}"}
    if terminating:
        meta["deletionTimestamp"] = "2026-12-02T10:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}, "status": {"phase": phase}}


def test_orphans_wait_out_the_quarantine_and_a_node_that_returns_keeps_its_pods() -> None:
    pods = [_pod("a", "gone"), _pod("b", "n1"), _pod("c", "gone")]
    first = plan(pods, [_node("n1")], {}, now=100.0)
    assert first.collect == [] and first.missing == {"gone": 100.0}
    early = plan(pods, [_node("n1")], first.missing, now=139.0)
    assert early.collect == [] and early.missing == {"gone": 100.0}
    due = plan(pods, [_node("n1")], early.missing, now=140.0)
    assert [(c.name, c.why, c.condition) for c in due.collect] == [("a", "orphaned", podgc.ORPHANED),
                                                                    ("c", "orphaned", podgc.ORPHANED)]
    back = plan(pods, [_node("n1"), _node("gone")], early.missing, now=140.0)
    assert back.collect == [] and back.missing == {}


def test_unscheduled_terminating_and_out_of_service_terminating_pods_are_collected() -> None:
    out_of_service = [{"key": podgc.OUT_OF_SERVICE, "value": "nodeshutdown", "effect": "NoExecute"}]
    nodes = [_node("down", ready=False, taints=out_of_service), _node("tainted-ready", taints=out_of_service),
             _node("not-ready", ready=False)]
    pods = [_pod("pending"), _pod("pending-deleted", terminating=True), _pod("on-down", "down", terminating=True),
            _pod("running-on-down", "down"), _pod("on-ready", "tainted-ready", terminating=True),
            _pod("on-not-ready", "not-ready", terminating=True)]
    assert [(c.name, c.why) for c in plan(pods, nodes, {}, now=0.0).collect] == [
        ("pending-deleted", "unscheduled-terminating"), ("on-down", "out-of-service")]


def test_failed_status_keeps_other_conditions_and_leaves_finished_pods_alone() -> None:
    pod = _pod("a", "gone")
    pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}, {"type": "DisruptionTarget", "status": "False"}]
    assert failed_status(pod, podgc.ORPHANED, "2026-12-02T10:00:00Z") == {"status": {"phase": "Failed", "conditions": [
        {"type": "Ready", "status": "True"},
        {**podgc.ORPHANED, "lastTransitionTime": "2026-12-02T10:00:00Z"}]}}
    assert failed_status(_pod("b", terminating=True), None, "t") == {"status": {"phase": "Failed"}}
    assert failed_status(_pod("c", "gone", phase="Succeeded"), podgc.ORPHANED, "t") is None


def test_a_deleted_nodes_pods_are_failed_and_force_deleted_on_the_api_server(apiserver: Any) -> None:
    api = apiserver.api
    api.create("Node", {"metadata": {"name": "n1"}})
    api.create("Pod", {"metadata": {"name": "web", "namespace": "default"},
                       "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]}})
    api.patch("Pod", "web", {"status": {"phase": "Running"}}, namespace="default", subresource="status")
    api.delete("Node", "n1")
    seen: list[dict[str, Any]] = []
    api_delete = api.delete

    def delete(kind: str, name: str, **kwargs: Any) -> bool:
        seen.append(api.get(kind, name, namespace=kwargs.get("namespace")))  # the pod as PodGC left it
        return api_delete(kind, name, **kwargs)

    api.delete = delete  # type: ignore[method-assign]
    now = [1000.0]
    gc = PodGC(api, clock=lambda: now[0])
    gc.reconcile()
    assert api.get("Pod", "web", namespace="default")["status"]["phase"] == "Running"  # quarantined
    now[0] += podgc.QUARANTINE_S
    gc.reconcile()
    assert api.list("Pod", namespace="default")[0] == []  # force-deleted: no grace period to wait out
    (last,) = seen
    assert last["status"]["phase"] == "Failed"
    (condition,) = [c for c in last["status"]["conditions"] if c["type"] == "DisruptionTarget"]
    assert (condition["status"], condition["reason"], condition["message"]) == (
        "True", "DeletionByPodGC", "PodGC: node no longer exists")
