"""The embedded scheduler's DefaultPreemption: a pod of higher priority that no node takes has pods of lower
priority deleted to make room, as kube-scheduler 1.37 chooses them, with its condition, Events and messages."""

from __future__ import annotations

from typing import Any

from sim.roles import preemption
from sim.roles.nodeusage import NodeLoad
from sim.roles.podresources import Demand
from controller_helpers import (create_all, events_for, gpu_class, kubelet_finishes_terminating_pods, manager, node, pod,
                                sim_slices, template, terminating)

# node() gives 64 CPUs.
NODE_CPU = 64


def _priority_class(name: str, value: int) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}, "value": value}


def _pod(name: str, cpu: int, priority_class: str, *, node_name: str | None = None, finalizer: bool = False,
         **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if finalizer:
        meta["finalizers"] = ["test.gpu-dra/hold"]
    body: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox",
                                            "resources": {"requests": {"cpu": str(cpu)}}}],
                            "priorityClassName": priority_class, **spec}
    if node_name:
        body["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}


def _get(api: Any, name: str) -> dict[str, Any] | None:
    items, _ = api.list("Pod", namespace="default", field_selector=f"metadata.name={name}")
    return items[0] if items else None


def _failed(api: Any, name: str) -> str:
    (event,) = [e for e in events_for(api, name) if e["reason"] == "FailedScheduling"]
    return str(event["message"])


def _cluster(api: Any) -> None:
    create_all(api, [_priority_class("low", 100), _priority_class("mid", 500), _priority_class("high", 1000),
                     node("node-a"), node("node-b")])


# -- the pure core ------------------------------------------------------------------------------------------------


def _victim(name: str, priority: int, cpu: int, started: str) -> preemption.Victim:
    pod = {"metadata": {"name": name, "namespace": "default", "uid": name}, "status": {"startTime": started}}
    return preemption.Victim(pod, priority, Demand((("cpu", cpu * 1000),)), ())


def test_victims_are_reprieved_most_important_first() -> None:
    # 64 CPUs: 40 + 16 + 8 in use by three pods of lower priority; the preemptor needs 16.
    a = _victim("a", 100, 40, "2026-01-01T00:00:00Z")
    b = _victim("b", 300, 16, "2026-01-01T00:00:00Z")
    c = _victim("c", 300, 8, "2026-01-02T00:00:00Z")
    load = NodeLoad(pods=3, requested=preemption.without(NodeLoad(), (), (a, b, c)).requested)

    def fits(after: NodeLoad) -> bool:
        return after.requested["cpu"] + 16_000 <= NODE_CPU * 1000

    # With all three gone, b (priority 300, started first) comes back, then c (16 + 8 in use, 40 free), not a.
    assert preemption.select_victims(load, [a, b, c], fits) == (a,)
    # Asking 48: b comes back (16 in use), c does not (24), nor a.
    assert preemption.select_victims(load, [a, b, c], lambda after: after.requested["cpu"] + 48_000 <= 64_000) == (c, a)
    assert preemption.select_victims(load, [a, b, c], lambda after: after.requested["cpu"] + 65_000 <= 64_000) is None


def test_the_node_with_the_least_important_victims_is_picked() -> None:
    early, late = "2026-01-01T00:00:00Z", "2026-01-05T00:00:00Z"
    by_priority = [preemption.Candidate("n1", (_victim("x", 500, 1, early),)),
                   preemption.Candidate("n2", (_victim("y", 100, 1, early), _victim("z", 100, 1, early)))]
    assert preemption.pick(by_priority).node == "n2"  # lower highest priority beats fewer victims
    by_sum = [preemption.Candidate("n1", (_victim("x", 100, 1, early), _victim("y", 100, 1, early))),
              preemption.Candidate("n2", (_victim("z", 100, 1, early),))]
    assert preemption.pick(by_sum).node == "n2"
    by_start = [preemption.Candidate("n1", (_victim("x", 100, 1, early),)),
                preemption.Candidate("n2", (_victim("y", 100, 1, late),))]
    assert preemption.pick(by_start).node == "n2"  # its highest-priority victim started last
    assert preemption.pick([preemption.Candidate("n1", (_victim("x", 100, 1, early),)),
                            preemption.Candidate("n2", (_victim("y", 100, 1, early),))]).node == "n1"


# -- the embedded scheduler ---------------------------------------------------------------------------------------


def test_a_higher_priority_pod_preempts_the_fewest_lower_priority_pods_and_then_runs(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api)
    # node-a: 40 low + 24 mid; node-b: 32 low + 32 mid. The preemptor needs 30: on either node the low pod alone
    # makes room (the mid one is reprieved). The candidates tie on priorities and counts; node-b's victim started
    # last (it has no start time: it counts as starting now), so node-b is chosen.
    create_all(api, [_pod("a-low", 40, "low", node_name="node-a"), _pod("a-mid", 24, "mid", node_name="node-a"),
                     _pod("b-low", 32, "low", node_name="node-b"), _pod("b-mid", 32, "mid", node_name="node-b")])
    api.patch("Pod", "a-low", {"status": {"startTime": "2026-01-01T00:00:00Z"}}, namespace="default", subresource="status")
    create_all(api, [_pod("urgent", 30, "high")])
    ctl = manager(api)
    ctl.step()
    urgent = _get(api, "urgent")
    assert urgent is not None and not urgent["spec"].get("nodeName")
    assert urgent["status"]["nominatedNodeName"] == "node-b"
    assert terminating(api, "b-low") and not any(terminating(api, n) for n in ("a-low", "a-mid", "b-mid"))
    # The PostFilter succeeded: kube-scheduler's message has no post-filter part.
    assert _failed(api, "urgent") == "0/2 nodes are available: 2 Insufficient cpu."
    (ours,) = [e for e in events_for(api, "urgent") if e["reason"] == "GpuDraUnschedulable"]
    assert ours["message"].endswith("; preempting 1 pod(s) of lower priority on node node-b (default/b-low)")
    (preempted,) = [e for e in events_for(api, "b-low") if e["reason"] == "Preempted"]
    assert preempted["message"] == f"Preempted by pod {urgent['metadata']['uid']} on node node-b"
    assert (preempted["type"], preempted["action"], preempted["reportingComponent"]) == ("Normal", "Preempting",
                                                                                       "default-scheduler")
    assert preempted["related"]["name"] == "urgent"
    ctl.step()
    assert "nodeName" not in _get(api, "urgent")["spec"]  # type: ignore[index]  # b-low still holds its CPUs
    assert kubelet_finishes_terminating_pods(api) == ["b-low"]
    ctl.step()
    assert _get(api, "urgent")["spec"]["nodeName"] == "node-b"  # type: ignore[index]


def test_a_victim_still_terminating_is_waited_for_not_preempted_again(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api)
    create_all(api, [_pod("a-low", 60, "low", node_name="node-a"),
                     _pod("b-mid", 60, "mid", node_name="node-b")])
    create_all(api, [_pod("urgent", 30, "high")])
    ctl = manager(api)
    ctl.step()
    victim = _get(api, "a-low")
    assert victim is not None and victim["metadata"].get("deletionTimestamp")
    (condition,) = [c for c in victim["status"]["conditions"] if c["type"] == "DisruptionTarget"]
    assert (condition["status"], condition["reason"], condition["message"]) == (
        "True", "PreemptionByScheduler", "default-scheduler: preempting to accommodate a higher priority pod")
    ctl.step()
    # The victim holds its CPUs until it is gone; the preemptor waits for it rather than taking b-mid too.
    assert _get(api, "b-mid") is not None
    assert _failed(api, "urgent") == ("0/2 nodes are available: 2 Insufficient cpu. no new claims to deallocate, "
                                      "not eligible due to a terminating pod on the nominated node.")
    assert kubelet_finishes_terminating_pods(api) == ["a-low"]
    ctl.step()
    assert _get(api, "urgent")["spec"]["nodeName"] == "node-a"  # type: ignore[index]


def test_no_preemption_among_equals_or_with_policy_never(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api)
    create_all(api, [_pod("a", 60, "high", node_name="node-a"), _pod("b", 60, "low", node_name="node-b")])
    create_all(api, [_pod("same", 30, "high"), _pod("polite", 40, "mid", preemptionPolicy="Never")])
    manager(api).step()
    assert _failed(api, "polite") == ("0/2 nodes are available: 2 Insufficient cpu. no new claims to deallocate, "
                                      "not eligible due to preemptionPolicy=Never.")
    # `same` ranks above b: it preempts b, never its equal a. polite, which may not preempt, does not take the room
    # made for `same` either (30 of node-b's 64 CPUs stay counted for it).
    assert _get(api, "same")["status"]["nominatedNodeName"] == "node-b"  # type: ignore[index]
    assert not terminating(api, "a") and terminating(api, "b")


def test_a_pod_too_big_for_any_node_preempts_nothing(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api)
    create_all(api, [_pod("a", 8, "low", node_name="node-a")])
    create_all(api, [_pod("huge", NODE_CPU + 1, "high")])
    manager(api).step()
    assert _get(api, "a") is not None
    assert _failed(api, "huge") == (
        "0/2 nodes are available: 2 Insufficient cpu. no new claims to deallocate, "
        "preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod.")
    assert not _get(api, "huge")["status"].get("nominatedNodeName")  # type: ignore[index]


def test_device_plugin_gpus_are_preempted_like_any_extended_resource(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [_priority_class("low", 100), _priority_class("high", 1000), node("gpu-node", gpus=2)])
    create_all(api, [{**pod("batch", gpus=2, priority_class="low"),
                      "spec": {**pod("batch", gpus=2, priority_class="low")["spec"], "nodeName": "gpu-node"}}])
    create_all(api, [pod("serving", gpus=1, priority_class="high")])
    ctl = manager(api)
    ctl.step()
    assert terminating(api, "batch")
    assert _failed(api, "serving") == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    kubelet_finishes_terminating_pods(api)
    ctl.step()
    assert _get(api, "serving")["spec"]["nodeName"] == "gpu-node"  # type: ignore[index]


def test_devices_allocated_to_lower_priority_pods_are_not_preempted_as_in_kube_scheduler(apiserver: Any) -> None:
    # kube-scheduler's DynamicResources plugin cannot simulate removing a pod, so preemption never frees devices.
    api = apiserver.api
    create_all(api, [_priority_class("low", 100), _priority_class("high", 1000), gpu_class(), node("n1"),
                     *sim_slices("n1"), template("all", 8), template("one", 1)])
    create_all(api, [pod("batch", templates={"gpu": "all"}, priority_class="low")])
    ctl = manager(api)
    ctl.step()
    assert _get(api, "batch")["spec"]["nodeName"] == "n1"  # type: ignore[index]
    create_all(api, [pod("serving", templates={"gpu": "one"}, priority_class="high")])
    ctl.step()
    ctl.step()
    assert _get(api, "batch") is not None
    assert _failed(api, "serving") == (
        "0/1 nodes are available: 1 cannot allocate all claims. still not schedulable, "
        "preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod.")


def test_victims_a_disruption_budget_protects_are_spared_first(apiserver: Any) -> None:
    api = apiserver.api
    _cluster(api)
    # Both nodes hold one low-priority pod of 40 CPUs; node-a's is protected by a budget that allows nothing.
    protected = _pod("a-low", 40, "low", node_name="node-a")
    protected["metadata"]["labels"] = {"app": "db"}
    create_all(api, [protected, _pod("b-low", 40, "low", node_name="node-b")])
    api.create("PodDisruptionBudget", {"metadata": {"name": "db", "namespace": "default"},
                                       "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}}},
               namespace="default")
    api.patch("PodDisruptionBudget", "db", {"status": {"observedGeneration": 1, "disruptionsAllowed": 0}},
              namespace="default", subresource="status")
    # Otherwise the two nodes tie (one victim each, same priority, neither started) and node-a, first, would win.
    create_all(api, [_pod("urgent", 30, "high")])
    manager(api).step()
    assert _get(api, "urgent")["status"]["nominatedNodeName"] == "node-b"  # type: ignore[index]
    assert not terminating(api, "a-low") and terminating(api, "b-low")


def test_budget_violations_are_counted_in_importance_order() -> None:
    budget = {"metadata": {"name": "web", "namespace": "default"}, "spec": {"selector": {"matchLabels": {"app": "w"}}},
              "status": {"disruptionsAllowed": 1, "disruptedPods": {"gone": "2026-12-01T00:00:00Z"}}}

    def victim(name: str, priority: int, app: str = "w") -> preemption.Victim:
        pod = {"metadata": {"name": name, "namespace": "default", "labels": {"app": app}}, "status": {}}
        return preemption.Victim(pod, priority, Demand(()), ())

    marked = preemption.with_budgets([victim("low", 1), victim("high", 5), victim("gone", 0), victim("other", 0, "x")],
                                     [budget])
    # The most important pod takes the one disruption allowed; the next violates; one the budget already counts
    # and one it does not select never do.
    assert [(v.pod["metadata"]["name"], v.violates) for v in marked] == [
        ("high", False), ("low", True), ("gone", False), ("other", False)]
