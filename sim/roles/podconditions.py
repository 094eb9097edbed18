"""The PodScheduled condition kube-scheduler writes on a pod it could not place.

A pending pod gets `PodScheduled=False` with reason `Unschedulable` and the explanation as its message, as
`kubectl describe pod` shows for a real cluster. The status is written only when the condition changes, so
repeated passes over a waiting pod do not churn its resourceVersion.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from controller import objects as o
from controller.writes import Writer
from gpudra.timestamps import rfc3339

REASON_UNSCHEDULABLE = "Unschedulable"
DISRUPTION_TARGET = "DisruptionTarget"


def unschedulable_conditions(pod: Mapping[str, Any], message: str, now: datetime | None = None) -> list[Any] | None:
    """The pod's new status.conditions, or None when it already says exactly this."""
    status = o.section(pod, "status")
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    current = next((c for c in conditions if c.get("type") == "PodScheduled"), None)
    if current is not None and current.get("status") == "False" and current.get("reason") == REASON_UNSCHEDULABLE \
            and current.get("message") == message:
        return None
    stamp = rfc3339(now)
    # The transition time moves only when the status changes, as Kubernetes' condition helpers keep it.
    if current is not None and current.get("status") == "False" and current.get("lastTransitionTime"):
        stamp = str(current["lastTransitionTime"])
    condition = {"type": "PodScheduled", "status": "False", "lastProbeTime": None, "lastTransitionTime": stamp,
                 "reason": REASON_UNSCHEDULABLE, "message": message}
    return [dict(c) for c in conditions if c.get("type") != "PodScheduled"] + [condition]


def mark_disrupted(writer: Writer, pod: Mapping[str, Any], condition: Mapping[str, Any]) -> None:
    """Give a pod about to be deleted its DisruptionTarget condition (`condition`: status, reason, message), as
    kube-controller-manager and kube-scheduler do before they delete it."""
    conditions = [dict(c) for c in o.list_field(o.section(pod, "status"), "conditions")
                  if isinstance(c, Mapping) and c.get("type") != DISRUPTION_TARGET]
    conditions.append({**condition, "type": DISRUPTION_TARGET, "lastTransitionTime": rfc3339()})
    writer.patch_status("Pod", pod, {"status": {"conditions": conditions}})


def mark_unschedulable(writer: Writer, pod: Mapping[str, Any], message: str, *, nominated_node: str | None = None) -> None:
    """`nominated_node`: the node preemption made room on ("" takes a nomination back, None leaves it)."""
    status: dict[str, Any] = {}
    conditions = unschedulable_conditions(pod, message)
    if conditions is not None:
        status["conditions"] = conditions
    current = o.section(pod, "status").get("nominatedNodeName") or ""
    if nominated_node is not None and nominated_node != current:
        status["nominatedNodeName"] = nominated_node or None
    if status:
        writer.patch_status("Pod", pod, {"status": status})
