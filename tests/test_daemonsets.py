"""The simulated cluster's DaemonSet controller: one pod per fitting node, pinned by node affinity; status counts;
rolling update (maxUnavailable, maxSurge), OnDelete and the revision history; and the embedded scheduler
honouring the pin."""

from __future__ import annotations

from typing import Any

from sim.roles.nodefit import as_allocator_node, required_affinity, static_rejects
from sim.cluster.daemonhistory import plan_history, revision_name, snapshot
from sim.cluster.daemonsets import REVISION_LABEL, daemon_pod, plan


def _node(name: str, labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None,
          cordoned: bool = False) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}},
            "spec": {"taints": taints or [], **({"unschedulable": True} if cordoned else {})}}


def _ds(**pod_spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "imex", "namespace": "nvidia", "uid": "u1", "generation": 1},
            "spec": {"selector": {"matchLabels": {"app": "imex"}},
                     "template": {"metadata": {"labels": {"app": "imex"}},
                                  "spec": {"containers": [{"name": "c", "image": "busybox"}], **pod_spec}}}}


def test_one_pod_per_matching_node_honouring_selector_affinity_and_taints() -> None:
    nodes = [_node("a", {"rack": "1"}), _node("b", {"rack": "2"}), _node("c", {"rack": "1"}, cordoned=True),
             _node("d", {"rack": "1"}, [{"key": "gpu", "value": "x", "effect": "NoSchedule"}])]
    ds = _ds(nodeSelector={"rack": "1"})
    todo = plan([ds], nodes, [])
    assert sorted(p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                  ["nodeSelectorTerms"][0]["matchFields"][0]["values"][0] for p in todo.create) == ["a", "c"]
    ds_aff = _ds(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["2"]}]}]}}},
        tolerations=[{"key": "gpu", "operator": "Exists"}])
    assert plan([ds_aff], nodes, []).create == [daemon_pod(ds_aff, "b")]
    assert daemon_pod(ds_aff, "b")["metadata"]["generateName"] == "imex-"  # the API server adds 5 random characters
    tolerant = _ds(tolerations=[{"operator": "Exists"}])
    assert len(plan([tolerant], nodes, []).create) == 4
    assert todo.status[("nvidia", "imex")]["desiredNumberScheduled"] == 2


def test_daemon_pod_is_pinned_so_the_scheduler_places_it_only_on_its_node() -> None:
    pod = daemon_pod(_ds(), "a")
    affinity = required_affinity(pod)
    assert static_rejects(pod, _node("a"), as_allocator_node(_node("a")), affinity) is None
    rejection = static_rejects(pod, _node("b"), as_allocator_node(_node("b")), affinity)
    assert rejection is not None and rejection.explanation == "node does not match the pod's required node affinity"
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet"
    assert {"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
            "effect": "NoSchedule"} in pod["spec"]["tolerations"]


def _stored(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as the API server stores it: named from its generateName (here from its node, to stay readable)."""
    node = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchFields"][0]["values"][0]
    revision = pod["metadata"]["labels"][REVISION_LABEL]
    return {**pod, "metadata": {**pod["metadata"], "name": f"{pod['metadata']['generateName']}{node}-{revision[:4]}"}}


def _running(pod: dict[str, Any]) -> dict[str, Any]:
    return {**_stored(pod), "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}


def test_status_counts_and_pods_on_nodes_that_no_longer_fit_are_removed() -> None:
    ds = _ds(nodeSelector={"rack": "1"})
    pods = [_running(daemon_pod(ds, "a")), _running(daemon_pod(ds, "b"))]
    todo = plan([ds], [_node("a", {"rack": "1"}), _node("b", {"rack": "2"})], pods)
    assert todo.create == [] and todo.delete == [("nvidia", pods[1]["metadata"]["name"])]
    assert todo.status[("nvidia", "imex")] == {
        "desiredNumberScheduled": 1, "currentNumberScheduled": 1, "numberMisscheduled": 1, "numberReady": 1,
        "numberAvailable": 1, "numberUnavailable": 0, "updatedNumberScheduled": 1, "observedGeneration": 1}


def test_rolling_update_replaces_one_old_pod_at_a_time() -> None:
    old = _ds()
    nodes = [_node("a"), _node("b"), _node("c")]
    pods = [_running(daemon_pod(old, n)) for n in ("a", "b", "c")]
    new = _ds()
    new["spec"]["template"]["spec"]["containers"][0]["image"] = "busybox:2"
    todo = plan([new], nodes, pods)
    assert len(todo.delete) == 1 and todo.create == []
    assert todo.status[("nvidia", "imex")]["updatedNumberScheduled"] == 0
    # An old pod that is down already is replaced at once, beside the one the budget allows (the controller's
    # allowedReplacementPods) ...
    pods[1]["status"] = {"phase": "Pending"}
    assert sorted(plan([new], nodes, pods).delete) == sorted(("nvidia", p["metadata"]["name"]) for p in pods[:2])
    # ... while a new pod that is not yet available holds the budget: nothing more is taken down.
    starting = [pods[0], {**_stored(daemon_pod(new, "b")), "status": {"phase": "Pending"}}, pods[2]]
    assert plan([new], nodes, starting).delete == []
    on_delete = {**new, "spec": {**new["spec"], "updateStrategy": {"type": "OnDelete"}}}
    assert plan([on_delete], nodes, [_running(daemon_pod(old, n)) for n in ("a", "b", "c")]).delete == []
    assert daemon_pod(new, "a")["metadata"]["labels"][REVISION_LABEL] != daemon_pod(old, "a")["metadata"]["labels"][REVISION_LABEL]


def test_max_surge_starts_the_new_pod_beside_the_old_and_deletes_the_old_once_available() -> None:
    old = _ds()
    nodes = [_node("a"), _node("b"), _node("c")]
    pods = [_running(daemon_pod(old, n)) for n in ("a", "b", "c")]
    new = _ds()
    new["spec"]["template"]["spec"]["containers"][0]["image"] = "busybox:2"
    new["spec"]["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    first = plan([new], nodes, pods)
    assert first.delete == [] and len(first.create) == 1  # one surge pod, nothing down
    surge = _stored(first.create[0])
    assert surge["metadata"]["name"] not in {p["metadata"]["name"] for p in pods}
    node = surge["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchFields"][0]["values"][0]
    waiting = plan([new], nodes, [*pods, {**surge, "status": {"phase": "Pending"}}])
    assert waiting.create == [] and waiting.delete == []  # maxSurge 1 is in use
    assert waiting.status[("nvidia", "imex")]["updatedNumberScheduled"] == 1
    done = plan([new], nodes, [*pods, _running(surge)])
    old_on_node = next(p for p in pods if p["metadata"]["name"] == _stored(daemon_pod(old, node))["metadata"]["name"])
    assert done.delete == [("nvidia", old_on_node["metadata"]["name"])] and len(done.create) == 1


def test_revision_history_in_controller_revisions() -> None:
    v1 = _ds()
    v2 = _ds()
    v2["spec"]["template"]["spec"]["containers"][0]["image"] = "busybox:2"
    first = plan_history(v1, [], set())
    (rev1,) = first.create
    assert rev1["revision"] == 1 and rev1["metadata"]["name"] == revision_name(v1)
    assert rev1["data"]["spec"]["template"]["$patch"] == "replace"
    assert rev1["metadata"]["labels"] == {"app": "imex", REVISION_LABEL: daemon_pod(v1, "a")["metadata"]["labels"][
        REVISION_LABEL]}
    (rev2,) = plan_history(v2, [rev1], set()).create
    assert rev2["revision"] == 2
    # An undo to v1's template renumbers its revision; it is not copied.
    undo = plan_history(v1, [rev1, rev2], set())
    assert undo.create == [] and undo.renumber == [(revision_name(v1), 3)]
    # Beyond revisionHistoryLimit, the oldest revisions no pod runs go.
    limited = {**v2, "spec": {**v2["spec"], "revisionHistoryLimit": 1}}
    olds = [snapshot({**_ds(), "spec": {**_ds()["spec"], "template": {**_ds()["spec"]["template"], "metadata": {
        "labels": {"app": "imex", "v": str(i)}}}}}, i) for i in range(1, 4)]
    pruned = plan_history(limited, [*olds, {**rev2, "revision": 4}], set())
    assert pruned.delete == [olds[0]["metadata"]["name"], olds[1]["metadata"]["name"]]
    in_use = plan_history(limited, [*olds, {**rev2, "revision": 4}], {olds[0]["metadata"]["labels"][REVISION_LABEL]})
    assert in_use.delete == [olds[1]["metadata"]["name"]]


def test_a_deleted_pod_is_replaced_once_gone_or_at_once_with_surge() -> None:
    ds = _ds()
    nodes = [_node("a")]
    leaving = {**_running(daemon_pod(ds, "a"))}
    leaving["metadata"] = {**leaving["metadata"], "deletionTimestamp": "2026-12-02T00:00:00Z"}
    # As kube-controller-manager: the node still has a (terminating) daemon pod, so none is created beside it ...
    assert plan([ds], nodes, [leaving]).create == []
    # ... until it is gone, when the replacement gets a name of its own from the API server.
    assert plan([ds], nodes, []).create == [daemon_pod(ds, "a")]
    surging = {**ds, "spec": {**ds["spec"], "updateStrategy": {"type": "RollingUpdate",
                                                               "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}}}
    assert plan([surging], nodes, [leaving]).create == [daemon_pod(surging, "a")]
