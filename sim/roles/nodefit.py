"""Which nodes a pod may run on, before any device is looked at: kube-scheduler's Filter plugins in their
default order (NodeUnschedulable, TaintToleration, NodeAffinity, NodePorts, NodeResourcesFit), then the node
selectors of claims that are already allocated (the DynamicResources plugin's first check).

Each rejection carries kube-scheduler's reasons (its FailedScheduling histogram counts them), whether
preemption could ever help on that node (`resolvable`: Unschedulable rather than UnschedulableAndUnresolvable),
and our own explanation, which names the value that did not fit.

Pods with `spec.nodeName` never reach a scheduler, so the NodeName plugin has nothing to reject here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller import objects as o
from controller.allocator import AllocationError, Node, NodeSelector
from sim.roles.nodeusage import NodeLoad
from sim.roles.podresources import CPU, EPHEMERAL, MEMORY, PODS, Demand, HostPort

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"

# kube-scheduler's reasons, word for word.
REASON_UNSCHEDULABLE = "node(s) were unschedulable"
REASON_TAINT = "node(s) had untolerated taint(s)"
REASON_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
REASON_PORTS = "node(s) didn't have free ports for the requested pod ports"
REASON_TOO_MANY_PODS = "Too many pods"
REASON_CLAIM_ELSEWHERE = "resourceclaim not available on the node"
REASON_CANNOT_ALLOCATE = "cannot allocate all claims"


@dataclass(frozen=True)
class Rejection:
    reasons: tuple[str, ...]
    explanation: str
    resolvable: bool


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if (toleration.get("operator") or "Equal") == "Exists":
        return not key or key == taint.get("key")
    return key == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


def _tolerations(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [t for t in o.list_field(o.section(pod, "spec"), "tolerations") if isinstance(t, Mapping)]


def required_affinity(pod: Mapping[str, Any]) -> NodeSelector | None:
    """The pod's requiredDuringSchedulingIgnoredDuringExecution node selector (AllocationError when malformed)."""
    affinity = o.section(o.section(o.section(pod, "spec"), "affinity"), "nodeAffinity")
    raw = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not isinstance(raw, Mapping):
        return None
    return NodeSelector.parse(raw, f"Pod {o.key(pod)}: spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution")


def static_rejects(pod: Mapping[str, Any], node: Mapping[str, Any], allocator_node: Node,
                   affinity: NodeSelector | None) -> Rejection | None:
    """The filters that read only the pod's spec and the Node object (the same verdict for pods alike in them)."""
    spec = o.section(node, "spec")
    tolerations = _tolerations(pod)
    if spec.get("unschedulable") and not any(
            tolerates(t, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}) for t in tolerations):
        return Rejection((REASON_UNSCHEDULABLE,), "node is unschedulable (cordoned)", False)
    for taint in o.list_field(spec, "taints"):
        if not isinstance(taint, Mapping) or taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            return Rejection((REASON_TAINT,), f"node has taint {{{taint.get('key')}: {taint.get('value') or ''}}} "
                             f"({taint.get('effect')}) that the pod does not tolerate", False)
    labels = allocator_node.labels
    for key, value in o.section(o.section(pod, "spec"), "nodeSelector").items():
        if labels.get(str(key)) != str(value):
            return Rejection((REASON_AFFINITY,), f"node does not match the pod's nodeSelector {key}={value}", False)
    if affinity is not None and not affinity.matches(allocator_node):
        return Rejection((REASON_AFFINITY,), "node does not match the pod's required node affinity", False)
    return None


def preferred_nodes(pod: Mapping[str, Any], candidates: Sequence[str], nodes: Mapping[str, Node]) -> list[str]:
    """The candidates that score highest on the pod's preferred node affinity (the sum of the weights of the
    terms they match), in order; empty when the pod states no preference or no candidate matches one. The
    scheduler tries them first: NodeAffinity's score outweighs what else tells feasible nodes apart here."""
    affinity = o.section(o.section(o.section(pod, "spec"), "affinity"), "nodeAffinity")
    terms: list[tuple[int, NodeSelector]] = []
    for raw in o.list_field(affinity, "preferredDuringSchedulingIgnoredDuringExecution"):
        weight = raw.get("weight") if isinstance(raw, Mapping) else None
        if not isinstance(weight, int) or isinstance(weight, bool) or weight <= 0 or not isinstance(raw.get("preference"), Mapping):
            continue
        try:
            terms.append((weight, NodeSelector.parse({"nodeSelectorTerms": [raw["preference"]]}, "preference")))
        except AllocationError:
            continue  # API validation refuses such a term; a preference never blocks a pod
    if not terms:
        return []
    scores = {n: sum(w for w, term in terms if term.matches(nodes[n])) for n in candidates}
    best = max(scores.values(), default=0)
    return [n for n in candidates if scores[n] == best] if best > 0 else []


def _show(name: str, value: int) -> str:
    if name == CPU:
        return f"{value // 1000}" if value % 1000 == 0 else f"{value}m"
    if name in (MEMORY, EPHEMERAL) or name.startswith("hugepages-"):
        for suffix, unit in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
            if value and value % unit == 0:
                return f"{value // unit}{suffix}"
    return str(value)


def dynamic_rejects(demand: Demand, ports: tuple[HostPort, ...], allocatable: Mapping[str, int], load: NodeLoad,
                    skip: frozenset[str] = frozenset()) -> Rejection | None:
    """NodePorts and NodeResourcesFit against what the node's bound pods already hold. `skip`: extended resources
    that DRA serves (DRAExtendedResource), which Fit leaves to the DynamicResources plugin."""
    for port in ports:
        if any(port.conflicts(used) for used in load.ports):
            return Rejection((REASON_PORTS,), f"host port {port.protocol}/{port.port} is already in use on this node", True)
    reasons: list[str] = []
    details: list[str] = []
    allowed = allocatable.get(PODS, 0)
    if load.pods + 1 > allowed:
        reasons.append(REASON_TOO_MANY_PODS)
        details.append(f"Too many pods ({load.pods} of {allowed} allowed)")
    for name, want in demand.amounts:
        if name in skip:
            continue
        have = allocatable.get(name, 0)
        used = load.requested.get(name, 0)
        if want > have - used:
            reasons.append(f"Insufficient {name}")
            details.append(f"Insufficient {name} (requested {_show(name, want)}, allocatable {_show(name, have)}, "
                           f"in use {_show(name, used)})")
    if not reasons:
        return None
    return Rejection(tuple(reasons), "; ".join(details), True)


def as_allocator_node(node: Mapping[str, Any]) -> Node:
    return Node(name=o.name(node), labels={str(k): str(v) for k, v in o.labels(node).items()})
