"""kube-scheduler's FailedScheduling text (framework.FitError.Error, then the PostFilter plugins' messages).

`0/N nodes are available: <count reason, ...>. <post-filter>` where the counts are the nodes' Filter reasons
(a node rejected by NodeResourcesFit may count under several), sorted as strings; the PostFilter part is the
DynamicResources plugin's verdict (`no new claims to deallocate` for a pod without claims, `still not
schedulable` otherwise) and DefaultPreemption's own FitError: nodes no preemption could fix (rejected as
UnschedulableAndUnresolvable) are `Preemption is not helpful for scheduling`, the others `No preemption victims
found for incoming pod`. A pod that may not preempt (`preemptionPolicy: Never`) gets DefaultPreemption's
refusal instead. When preemption found victims, the PostFilter succeeded and the message has no PostFilter part.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller import objects as o

EVENT_REASON = "FailedScheduling"
SCHEDULER_NAME = "default-scheduler"
NOT_HELPFUL = "Preemption is not helpful for scheduling"
NO_VICTIMS = "No preemption victims found for incoming pod"


@dataclass(frozen=True)
class NodeStatus:
    reasons: tuple[str, ...]
    resolvable: bool  # Unschedulable (preemption may help) rather than UnschedulableAndUnresolvable


def _histogram(counts: Counter[str]) -> str:
    return ", ".join(sorted(f"{n} {reason}" for reason, n in counts.items()))


def fit_error(total_nodes: int, statuses: Iterable[NodeStatus], pod: Mapping[str, Any], *, prefilter: str = "",
              preemption: str | None = None) -> str:
    """The message of kube-scheduler's FailedScheduling event and PodScheduled condition. `prefilter`: a reason
    that rejected the pod before any node was looked at (every node then counts as unresolvable). `preemption`:
    DefaultPreemption's own message when it decided something ("" when it nominated a node), None when it found
    no victims."""
    statuses = list(statuses)
    text = f"0/{total_nodes} nodes are available:"
    if prefilter:
        text += f" {prefilter}."
        statuses = [NodeStatus((), False)] * total_nodes
    else:
        counts: Counter[str] = Counter()
        for status in statuses:
            counts.update(status.reasons)
        if counts:
            text += f" {_histogram(counts)}."
    # The DynamicResources plugin knows the pod's claims only once its PreFilter got them all.
    has_claims = not prefilter and bool(o.list_field(o.section(pod, "spec"), "resourceClaims"))
    if preemption == "":
        return text
    post = ["still not schedulable" if has_claims else "no new claims to deallocate",
            preemption or _preemption(total_nodes, statuses, pod)]
    return f"{text} {', '.join(post)}"


def _preemption(total_nodes: int, statuses: list[NodeStatus], pod: Mapping[str, Any]) -> str:
    if o.section(pod, "spec").get("preemptionPolicy") == "Never":
        return "not eligible due to preemptionPolicy=Never."
    verdicts: Counter[str] = Counter(NO_VICTIMS if s.resolvable else NOT_HELPFUL for s in statuses)
    missing = total_nodes - len(statuses)
    if missing > 0:
        verdicts[NOT_HELPFUL] += missing
    return f"preemption: 0/{total_nodes} nodes are available: {_histogram(verdicts)}."
