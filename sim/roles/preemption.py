"""kube-scheduler's DefaultPreemption, as the embedded scheduler applies it to a pod no node takes.

A pod that may preempt (`preemptionPolicy` is not `Never`) and is not already waiting for victims on its nominated
node looks at every node whose only objections were NodeResourcesFit or NodePorts: with all pods of lower
priority removed it must fit there (its claims must still allocate on that node, since the DynamicResources plugin
has no PreFilter extensions: removing a victim frees no device in kube-scheduler either). Then the victims are
reprieved one by one, most important first (higher priority, then the one that started earlier), while the pod
still fits without the rest; pods whose loss a PodDisruptionBudget does not allow (its `disruptionsAllowed`,
counted down victim by victim, pods it already lists in `disruptedPods` aside) are reprieved first. The search
stops at 10% of the nodes as candidates (at least 100). Of the nodes left, the one with the fewest budget
violations wins, then the lowest highest-priority victim, the lowest sum of priorities, the fewest victims, the
latest start among its highest-priority victims, the first name.

The victims get the `DisruptionTarget` condition and are deleted, each with a `Preempted` Event naming the
preemptor's UID; the preemptor is nominated to the node (`status.nominatedNodeName`) and scheduled there once the
victims are gone. Everything but the writes is pure: the scheduler passes the node's load and a fit check.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from controller import objects as o
from sim.roles.nodeusage import NodeLoad
from sim.roles.podresources import Demand, HostPort
from gpudra.labelselector import selects

EVENT_REASON = "Preempted"
EVENT_ACTION = "Preempting"
CONDITION_TYPE = "DisruptionTarget"  # as podconditions.DISRUPTION_TARGET: its importers are held to a list (tests/test_deployment.py)
CONDITION_REASON = "PreemptionByScheduler"
NOT_ELIGIBLE_TERMINATING = "not eligible due to a terminating pod on the nominated node."
# Pods without a start time (bound, not yet started) count as started now: after every pod that has one.
_NOT_STARTED = "9999"
# kube-scheduler adds MaxInt32+1 to each priority before summing, so that negative priorities count too.
_PRIORITY_OFFSET = 2**31


@dataclass(frozen=True)
class Victim:
    """A pod as preemption weighs it (a victim, or a pod nominated to a node)."""

    pod: Mapping[str, Any]
    priority: int
    demand: Demand
    ports: tuple[HostPort, ...]
    violates: bool = False  # deleting it would take a PodDisruptionBudget below what it allows

    @property
    def started(self) -> str:
        return str(o.section(self.pod, "status").get("startTime") or _NOT_STARTED)


@dataclass(frozen=True)
class Candidate:
    node: str
    victims: tuple[Victim, ...]

    @property
    def violations(self) -> int:
        return sum(1 for v in self.victims if v.violates)


def with_budgets(lower: Sequence[Victim], budgets: Sequence[Mapping[str, Any]]) -> list[Victim]:
    """`lower` marked with the budget violations their deletion would cause, counted in importance order as
    kube-scheduler's filterPodsWithPDBViolation does (`budgets`: the cluster's PodDisruptionBudgets)."""
    allowed = [int(o.section(b, "status").get("disruptionsAllowed") or 0) for b in budgets]
    out = []
    for victim in sorted(lower, key=_importance):
        labels = {str(k): str(v) for k, v in o.labels(victim.pod).items()}
        violates = False
        for i, budget in enumerate(budgets):
            selector = o.section(budget, "spec").get("selector")
            if o.namespace(budget) != o.namespace(victim.pod) or not isinstance(selector, Mapping) or not selector \
                    or not selects(selector, labels):
                continue  # kube-scheduler skips budgets with an empty selector too
            if o.name(victim.pod) in (o.section(budget, "status").get("disruptedPods") or {}):
                continue  # already counted by the budget
            allowed[i] -= 1
            violates = violates or allowed[i] < 0
        out.append(replace(victim, violates=violates))
    return out


def candidates_wanted(nodes: int) -> int:
    """How many candidate nodes kube-scheduler looks for before it picks one (10% of the nodes, at least 100)."""
    return max(nodes // 10, 100)


def condition_message(scheduler_name: str) -> str:
    return f"{scheduler_name}: preempting to accommodate a higher priority pod"


def event_message(preemptor: Mapping[str, Any], node: str) -> str:
    return f"Preempted by pod {o.uid(preemptor)} on node {node}"


def terminating_by_preemption(pod: Mapping[str, Any]) -> bool:
    if not o.meta(pod).get("deletionTimestamp"):
        return False
    return any(isinstance(c, Mapping) and c.get("type") == CONDITION_TYPE and c.get("reason") == CONDITION_REASON
               for c in o.list_field(o.section(pod, "status"), "conditions"))


def without(load: NodeLoad, removed: Iterable[Victim], added: Iterable[Victim] = ()) -> NodeLoad:
    """The node's load once `removed` are gone and `added` (pods nominated to it) are there."""
    requested = Counter(load.requested)
    ports = Counter(load.ports)
    pods = load.pods
    for sign, group in ((-1, removed), (1, added)):
        for pod in group:
            pods += sign
            for name, value in pod.demand.amounts:
                requested[name] += sign * value
            for port in pod.ports:
                ports[port] += sign
    return NodeLoad(pods=pods, requested=requested, ports=+ports)


def _importance(victim: Victim) -> tuple[int, str]:
    return (-victim.priority, victim.started)


def select_victims(load: NodeLoad, lower: Sequence[Victim], fits: Callable[[NodeLoad], bool]) -> tuple[Victim, ...] | None:
    """The fewest of `lower` (the node's pods of lower priority) whose removal lets the pod fit, reprieving the most
    important first; None when removing them all is not enough."""
    if not lower or not fits(without(load, lower)):
        return None
    # The pods a budget protects are given back first (the sort is stable: importance order within each group).
    removed = sorted(sorted(lower, key=_importance), key=lambda v: not v.violates)
    victims: list[Victim] = []
    for victim in list(removed):
        rest = [r for r in removed if r is not victim]
        if fits(without(load, rest)):
            removed = rest  # reprieved: the pod fits with this one staying
        else:
            victims.append(victim)
    return tuple(victims)


def pick(candidates: Sequence[Candidate]) -> Candidate:
    """kube-scheduler's pickOneNodeForPreemption over candidates in node order."""
    for candidate in candidates:
        if not candidate.victims:
            return candidate
    left = list(candidates)
    for score in (lambda c: c.violations,
                  lambda c: max(v.priority for v in c.victims),
                  lambda c: sum(v.priority + _PRIORITY_OFFSET for v in c.victims),
                  lambda c: len(c.victims)):
        best = min(score(c) for c in left)
        left = [c for c in left if score(c) == best]
    latest = max(_earliest_top_start(c) for c in left)
    return next(c for c in left if _earliest_top_start(c) == latest)


def _earliest_top_start(candidate: Candidate) -> str:
    top = max(v.priority for v in candidate.victims)
    return min(v.started for v in candidate.victims if v.priority == top)
