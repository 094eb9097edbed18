"""Which nodes a pod may run on, before any device is looked at: the pod's nodeSelector and required node
affinity (what DaemonSet pods are pinned with), node taints
(NoSchedule / NoExecute need a toleration), `spec.unschedulable`, and the node selectors of claims that
are already allocated."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from controller import objects as o
from controller.allocator import AllocationError, Node, NodeSelector


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if (toleration.get("operator") or "Equal") == "Exists":
        return not key or key == taint.get("key")
    return key == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


def node_rejects(pod: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
    """Why the node cannot take the pod regardless of devices, or None."""
    spec = o.section(node, "spec")
    if spec.get("unschedulable"):
        return "node is unschedulable (cordoned)"
    wanted = o.section(o.section(pod, "spec"), "nodeSelector")
    labels = o.labels(node)
    for key, value in wanted.items():
        if labels.get(key) != value:
            return f"node does not match the pod's nodeSelector {key}={value}"
    required = o.section(o.section(o.section(o.section(pod, "spec"), "affinity"), "nodeAffinity"),
                         "requiredDuringSchedulingIgnoredDuringExecution")
    if required:
        try:
            selector = NodeSelector.parse(required, f"Pod {o.key(pod)}: spec.affinity.nodeAffinity."
                                                    "requiredDuringSchedulingIgnoredDuringExecution")
        except AllocationError as err:
            return str(err)
        if not selector.matches(as_allocator_node(node)):
            return "node does not match the pod's required node affinity"
    tolerations = [t for t in o.list_field(o.section(pod, "spec"), "tolerations") if isinstance(t, Mapping)]
    for taint in o.list_field(spec, "taints"):
        if not isinstance(taint, Mapping) or taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_tolerates(t, taint) for t in tolerations):
            return f"node has taint {{{taint.get('key')}: {taint.get('value') or ''}}} that the pod does not tolerate"
    return None


def as_allocator_node(node: Mapping[str, Any]) -> Node:
    return Node(name=o.name(node), labels={str(k): str(v) for k, v in o.labels(node).items()})


def allocation_rejects(claims: Iterable[Mapping[str, Any]], node: Node) -> str | None:
    """An allocated claim pins its pod to the nodes its allocation's nodeSelector matches."""
    for claim in claims:
        alloc = o.allocation(claim)
        if alloc is None or alloc.get("nodeSelector") is None:
            continue
        try:
            selector = NodeSelector.parse(alloc["nodeSelector"], f"ResourceClaim {o.key(claim)}: status.allocation.nodeSelector")
        except AllocationError as err:
            return str(err)
        if not selector.matches(node):
            return f"claim {o.key(claim)} is allocated on devices that this node cannot reach"
    return None
