"""The embedded scheduler's bounded priority queue, and pods arriving during a pass joining it in their rank."""

from __future__ import annotations

from typing import Any

from sim.roles.schedqueue import SchedulingQueue
from controller_helpers import create_all, gpu_class, gpu_slice, manager, node, pod, roles, template


def _pod(name: str, created: str, priority_class: str | None = None) -> dict[str, Any]:
    obj = pod(name, priority_class=priority_class)
    obj["metadata"]["creationTimestamp"] = created
    return obj


def test_order_is_priority_then_age_then_name_and_duplicates_are_ignored() -> None:
    q = SchedulingQueue({"high": 100}, 0, capacity=10)
    for p in (_pod("b", "2026-01-01T00:00:02Z"), _pod("a", "2026-01-01T00:00:02Z"),
              _pod("old", "2026-01-01T00:00:01Z"), _pod("vip", "2026-01-01T00:00:09Z", "high")):
        assert q.push(p)
    assert not q.push(_pod("a", "2026-01-01T00:00:02Z"))
    assert [q.pop()["metadata"]["name"] for _ in range(len(q))] == ["vip", "old", "a", "b"]  # type: ignore[index]
    assert q.pop() is None


def test_a_full_queue_keeps_the_best_pods() -> None:
    q = SchedulingQueue({"high": 100}, 0, capacity=2)
    assert q.push(_pod("p1", "2026-01-01T00:00:01Z")) and q.push(_pod("p2", "2026-01-01T00:00:02Z"))
    assert not q.push(_pod("p3", "2026-01-01T00:00:03Z"))  # ranks below both: left for the next pass
    assert q.push(_pod("vip", "2026-01-01T00:00:04Z", "high"))  # pushes p2 out
    assert [q.pop()["metadata"]["name"] for _ in range(len(q))] == ["vip", "p1"]  # type: ignore[index]


def test_a_pod_created_during_a_pass_is_placed_in_its_rank_in_that_pass(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [gpu_class(), template("one", 1), node("n1"), gpu_slice("n1", [("gpu-0", "x"), ("gpu-1", "x")]),
                     {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "high"}, "value": 1000},
                     pod("first", templates={"gpu": "one"}), pod("second", templates={"gpu": "one"})])
    m = manager(api)
    expand = roles(m).scheduler._expand
    arrived: list[str] = []

    def expand_and_receive(p: Any, index: Any, templates: Any) -> Any:
        # While the first pod is handled (the second's expansion has started beside it), a high-priority pod is
        # created and seen by the cache. Only the first pod's expansion does it: expansions run on several threads.
        if p["metadata"]["name"] == "first":
            created = api.create("Pod", pod("vip", templates={"gpu": "one"}, priority_class="high"))
            m.stores["Pod"].upsert(created)
            arrived.append(p["metadata"]["name"])
        return expand(p, index, templates)  # type: ignore[misc]

    roles(m).scheduler._expand = expand_and_receive
    report = m.step()
    assert arrived == ["first"] and report.pods_bound == 2
    assert api.get("Pod", "vip", "default")["spec"].get("nodeName") == "n1"
    assert not api.get("Pod", "second", "default")["spec"].get("nodeName")  # the node was full by then
