"""The disruption controller of `gpu-dra cluster` (kube-controller-manager's pkg/controller/disruption), pure: a
PodDisruptionBudget's status from the pods it selects.

Facts followed: the healthy pods are the selected pods that are Ready and not terminating, less those the
eviction subresource recorded in `disruptedPods` within the last 2 minutes that are still there; the expected
count is the number of selected pods for an integer `minAvailable`, and the scale of their controllers (a
Deployment's or StatefulSet's replicas, a bare ReplicaSet's) for a percentage or `maxUnavailable`; desired healthy
is `minAvailable` (percentages rounded up), or the expected count less `maxUnavailable`; `disruptionsAllowed` is
healthy minus desired, never negative, and the `DisruptionAllowed` condition says whether it is above 0
(SufficientPods / InsufficientPods).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from gpudra.labelselector import selects
from gpudra.timestamps import parse_rfc3339, rfc3339
from sim.cluster.deployments import scaled_value
from sim.cluster import podstate
from sim.cluster.podstate import meta as _meta, controller_ref as _controller

DELETION_TIMEOUT = timedelta(minutes=2)


def _expected_by_scale(pods: Sequence[Mapping[str, Any]], workloads: Mapping[str, Sequence[Mapping[str, Any]]]) -> int:
    """The replicas of the controllers of `pods` (each counted once); pods without a known controller count one."""
    by_uid = {str(_meta(o).get("uid")): (kind, o) for kind, objs in workloads.items() for o in objs}
    scales: dict[str, int] = {}
    loose = 0
    for pod in pods:
        ref = _controller(pod)
        found = by_uid.get(str(ref.get("uid"))) if ref else None
        if found is None:
            loose += 1
            continue
        kind, owner = found
        if kind == "ReplicaSet":  # a Deployment's ReplicaSet counts as its Deployment
            parent_ref = _controller(owner)
            parent = by_uid.get(str(parent_ref.get("uid"))) if parent_ref else None
            if parent is not None:
                kind, owner = parent
        replicas = (owner.get("spec") or {}).get("replicas")
        scales[str(_meta(owner).get("uid"))] = replicas if isinstance(replicas, int) else 1
    return sum(scales.values()) + loose


def budget_status(pdb: Mapping[str, Any], pods: Sequence[Mapping[str, Any]],
                  workloads: Mapping[str, Sequence[Mapping[str, Any]]], now: datetime) -> dict[str, Any]:
    """The status the controller writes; `pods`: the budget's namespace's, `workloads`: kind -> its objects there."""
    spec = pdb.get("spec") or {}
    selector = spec.get("selector")
    selected = [p for p in pods if isinstance(selector, dict) and selects(selector, dict(
        _meta(p).get("labels") or {}))]
    old = pdb.get("status") or {}
    names = {str(_meta(p).get("name")) for p in selected if not podstate.terminating(p)}
    disrupted = {}
    for name, at in (old.get("disruptedPods") or {}).items():
        when = parse_rfc3339(at)
        if name in names and when is not None and now - when < DELETION_TIMEOUT:
            disrupted[name] = at
    healthy = sum(1 for p in selected
                  if podstate.ready_not_terminating(p) and str(_meta(p).get("name")) not in disrupted)
    min_available, max_unavailable = spec.get("minAvailable"), spec.get("maxUnavailable")
    if max_unavailable is None and isinstance(min_available, int):
        expected, desired = len(selected), min_available
    else:
        expected = _expected_by_scale(selected, workloads)
        if max_unavailable is not None:
            desired = max(0, expected - scaled_value(max_unavailable, expected, True, "0"))
        else:
            desired = scaled_value(min_available, expected, True, "0")
    allowed = max(0, healthy - desired)
    previous = next((c for c in old.get("conditions") or [] if isinstance(c, Mapping)
                     and c.get("type") == "DisruptionAllowed"), None)
    condition = {"type": "DisruptionAllowed", "status": "True" if allowed > 0 else "False",
                 "reason": "SufficientPods" if allowed > 0 else "InsufficientPods", "message": "",
                 "observedGeneration": int(_meta(pdb).get("generation") or 1)}
    unchanged = previous is not None and previous.get("status") == condition["status"]
    condition["lastTransitionTime"] = str(previous.get("lastTransitionTime")) if unchanged and previous else rfc3339(now)
    status: dict[str, Any] = {"observedGeneration": int(_meta(pdb).get("generation") or 1),
                              "disruptionsAllowed": allowed, "currentHealthy": healthy, "desiredHealthy": desired,
                              "expectedPods": expected, "conditions": [condition]}
    if disrupted:
        status["disruptedPods"] = disrupted
    return status


def same_status(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether writing `wanted` would change nothing but the conditions' transition times."""
    def plain(status: Mapping[str, Any]) -> dict[str, Any]:
        return {**status, "conditions": [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                                         for c in status.get("conditions") or [] if isinstance(c, Mapping)]}
    return plain(current) == plain(wanted)
