"""Why claims cannot be allocated on a node, as a structured reason, and a summary over many nodes.

Explanations are computed only after the allocator has failed, by classifying each device of the
node for each request (pool state, class and request selectors, use by other claims, taints,
counters, capacity) and, when enough devices are individually usable, by checking the claim's
constraints against the usable devices.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.allocator import AllocationError, Allocator, Claim, ClusterSnapshot, Unschedulable
from controller.allocator import capacity as cap
from controller.allocator.model import Device, Request
from controller.allocator.nodes import node_matches
from controller.allocator.pools import Pool, binding_enabled
from controller.cel.errors import CelCompileError, closest_attribute
from controller.cel.terms import Term, false_terms, top_level_terms
from controller.taintrules import RULE_KEY
from gpudra.features import Features


@dataclass(frozen=True)
class NodeReason:
    """`code` is one of: fits, error, no-devices, pool-incomplete, pool-invalid, selector, in-use, taint,
    counters, capacity (used up by others), capacity-never (no device could ever give it), not-enough,
    constraint, unschedulable."""

    node: str
    code: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    # kube-scheduler's Filter reasons for this node when they are not the DynamicResources plugin's, and whether
    # preemption could help there (Unschedulable rather than UnschedulableAndUnresolvable).
    scheduler: tuple[str, ...] = ()
    resolvable: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "code": self.code, "message": self.message, "details": self.details}


class Diagnoser:
    def __init__(self, snapshot: ClusterSnapshot, features: Features | None = None, cel_env: Any = None,
                 allocator: Allocator | None = None) -> None:
        self.snapshot = snapshot
        self.features = features or Features()
        self.allocator = allocator or Allocator(snapshot, self.features, cel_env)
        self._terms: dict[str, list[Term]] = {}  # a selector's top-level terms, by expression

    def explain_node(self, node: str, claims: Sequence[Claim], outcome: Unschedulable | None = None) -> NodeReason:
        if outcome is None:
            try:
                result = self.allocator.allocate(node, claims)
            except AllocationError as exc:
                return NodeReason(node, "error", str(exc))
            if not isinstance(result, Unschedulable):
                return NodeReason(node, "fits", "the claims fit on this node")
            outcome = result
        pools = self.snapshot.pools(node, self.features)
        usable_by_request: list[tuple[Claim, Request, list[Device]]] = []
        for claim in claims:
            for entry in claim.requests:
                # For firstAvailable the last alternative is the least demanding one by convention; explain the
                # first one that fails on its own, or the last one when all do.
                alternatives = entry.subrequests or ((entry.exact,) if entry.exact else ())
                reason: NodeReason | None = None
                for request in alternatives:
                    try:
                        reason, usable = self._request(node, claim, request, pools)
                    except AllocationError as exc:
                        return NodeReason(node, "error", str(exc))
                    if reason is None:
                        usable_by_request.append((claim, request, usable))
                        break
                if reason is not None:
                    return reason
        for claim in claims:
            found = self._constraints(node, claim, [(r, u) for c, r, u in usable_by_request if c is claim])
            if found is not None:
                return found
        if outcome.reason != "cannot allocate all claims":
            return NodeReason(node, "unschedulable", outcome.reason)
        needed = sum(_needed(r, len(u)) for _, r, u in usable_by_request)
        return NodeReason(node, "not-enough", f"the claims together need {needed} devices that are usable at the same time"
                          " (requests compete for the same devices)", {"needed": needed})

    def _request(self, node: str, claim: Claim, request: Request, pools: list[Pool]) -> tuple[NodeReason | None, list[Device]]:
        snap, f = self.snapshot, self.features
        klass = snap.classes.get(request.class_name)
        if klass is None:
            raise AllocationError(f"claim {claim.key}, request {request.name}: could not retrieve device class {request.class_name}")
        counts: Counter[str] = Counter()
        class_misses: Counter[str] = Counter()
        request_misses: Counter[str] = Counter()  # devices of the class that a request selector rejects
        rejected: dict[str, tuple[str, list[Device]]] = {}  # selector label -> (its expression, the devices it rejects)
        never_fits: list[str] = []  # why devices can never give the requested capacity, one per such device
        used_up: dict[str, list[str]] = {}  # "counters"/"capacity" -> what others used up, one per such device
        users: Counter[str] = Counter()
        taints_seen: Counter[str] = Counter()
        usable: list[Device] = []
        bad_pools = [p for p in pools if p.incomplete or p.invalid]
        binding = binding_enabled(f)
        for pool in pools:
            if pool.incomplete or pool.invalid:
                continue
            for sl in pool.slices:
                for dev in sl.devices:
                    counts["devices"] += 1
                    if not binding and dev.binding_conditions:
                        counts["binding"] += 1
                        continue
                    found = self._selector_miss(dev, klass.name, klass.selectors, request, claim)
                    if found is not None:
                        miss, expression, of_request = found
                        (request_misses if of_request else class_misses)[miss] += 1
                        rejected.setdefault(miss, (expression, []))[1].append(dev)
                        continue
                    if sl.per_device and not node_matches(snap.node(node), dev.node_name, dev.all_nodes, dev.node_selector):
                        counts["elsewhere"] += 1
                        continue
                    did = dev.id
                    if not request.admin and did in snap.allocated:
                        users[snap.allocated_by.get(did, "?")] += 1
                        continue
                    untolerated = [t for t in dev.taints if t.effect in ("NoSchedule", "NoExecute")
                                   and not any(tol.tolerates(t) for tol in request.tolerations)] \
                        if f.device_taints else []
                    if untolerated:
                        counts["taint"] += 1
                        for t in untolerated:
                            taints_seen[_taint_text(t)] += 1
                        continue
                    if dev.consumes_counters and not f.partitionable_devices:
                        counts["counters-gate"] += 1
                        continue
                    if dev.consumes_counters:
                        short = self._counters_short(dev, pool)
                        if short:
                            counts["counters"] += 1
                            used_up.setdefault("counters", []).append(short)
                            continue
                    if f.consumable_capacity and not self._capacity_fits(dev, request):
                        never = _capacity_never(dev, request, f.fractional_capacity_range)
                        if never:
                            never_fits.append(never)
                            counts["capacity-never"] += 1
                        else:
                            counts["capacity"] += 1
                            used_up.setdefault("capacity", []).append(self._capacity_used_up(dev, request))
                        continue
                    usable.append(dev)
        if request.mode == "All":
            # Every device that matches (selectors, node, capacity the device can give) must be allocatable.
            need = len(usable) + sum(users.values()) + counts["taint"] + counts["counters"] + counts["counters-gate"]
        else:
            need = _needed(request)
        if len(usable) >= max(need, 1):
            return None, usable
        details: dict[str, Any] = {"claim": claim.key, "request": request.full_name, "needed": need, "usable": len(usable)}
        if counts["devices"] == 0:
            if bad_pools:
                p = bad_pools[0]
                if p.incomplete:
                    return NodeReason(node, "pool-incomplete", f"resource pool {p.id} is incomplete (being updated)", details), usable
                return NodeReason(node, "pool-invalid", f"resource pool {p.id} is invalid: {p.invalid_reason}", details), usable
            return NodeReason(node, "no-devices", "no devices are published for this node", details), usable
        in_use = sum(users.values())
        blocked = ("taint", "counters", "counters-gate", "capacity", "capacity-never")
        if (class_misses or request_misses) and not usable and not in_use and not any(counts[k] for k in blocked):
            selectors = {**class_misses, **request_misses}
            if request_misses:
                # Devices of the class are there: the request's own selector is what rejects them.
                top, _ = request_misses.most_common(1)[0]
                of_class = sum(request_misses.values())
                text = f"none of the {of_class} device{'s' if of_class != 1 else ''} of class {klass.name} matches {top}"
            else:
                top, _ = class_misses.most_common(1)[0]
                text = f"no device matches {top}"
            why = self._why_false(*rejected[top])
            return NodeReason(node, "selector", f"{text}: {why}" if why else text, {**details, "selectors": selectors}), usable
        parts = []
        if in_use:
            owners = ", ".join(sorted(users)[:3]) + (", ..." if len(users) > 3 else "")
            parts.append(f"{in_use} in use by {owners}")
        for key, text in (("taint", "tainted (taint not tolerated)"),
                          ("counters", "whose shared counters are used up by allocated devices"),
                          ("counters-gate", "that consume shared counters, which need the DRAPartitionableDevices feature"),
                          ("capacity", "whose capacity is used up by other claims"),
                          ("capacity-never", "that can never give the requested capacity")):
            if counts[key]:
                parts.append(f"{counts[key]} {text}")
                if key == "taint":
                    parts[-1] += " [" + "; ".join(t for t, _ in taints_seen.most_common(3)) + \
                        ("; ..." if len(taints_seen) > 3 else "") + "]"
                if key in ("capacity-never", "capacity", "counters"):
                    seen = sorted(set(never_fits if key == "capacity-never" else used_up.get(key, [])))
                    parts[-1] += " [" + "; ".join(seen[:3]) + ("; ..." if len(seen) > 3 else "") + "]"
        code = "in-use" if in_use else next((k.removesuffix("-gate") for k in blocked if counts[k]), "not-enough")
        matching = len(usable) + in_use + sum(counts[k] for k in blocked)
        wanted = f"all {need} matching device{'s' if need != 1 else ''}" if request.mode == "All" and need else \
            f"{need} device{'s' if need != 1 else ''}"
        msg = f"request {request.full_name} of claim {claim.key} needs {wanted}; "
        if matching < need:
            # Freeing devices cannot help: the node does not have that many, so what holds some of them is no reason.
            code = "not-enough"
            msg += f"the node has only {matching} matching device{'s' if matching != 1 else ''} in all"
        else:
            msg += f"usable: {len(usable)} of {matching} matching"
            if parts:
                msg += ": " + ", ".join(parts)
        return NodeReason(node, code, msg, {**details, "inUseBy": dict(users), **{k: v for k, v in counts.items() if k != "devices"}}), usable

    def _selector_miss(self, dev: Device, class_name: str, class_selectors: Sequence[str | None], request: Request,
                       claim: Claim) -> tuple[str, str, bool] | None:
        """The first selector (class ones first) that rejects the device: its label, its expression, and whether it
        is the request's; None when the device matches them all."""
        i = self.allocator.first_selector_miss(dev, class_selectors, f"class {class_name}")
        if i is not None:
            return f"selector #{i} of class {class_name}", str(class_selectors[i]), False
        i = self.allocator.first_selector_miss(dev, request.selectors, f"claim {claim.key}")
        if i is not None:
            return f"selector #{i} of request {request.full_name} of claim {claim.key}", str(request.selectors[i]), True
        return None

    def _why_false(self, expression: str, devices: Sequence[Device]) -> str:
        """Which top-level term of the selector is false on the devices it rejects, with their values (see
        controller.cel.terms); empty when the CEL environment cannot tell."""
        env = self.allocator.cel_env
        if env is None or not hasattr(env, "parse"):
            return ""
        terms = self._terms.get(expression)
        if terms is None:
            # Parsed once per expression: the scheduler explains a pod on every candidate node.
            try:
                terms = top_level_terms(expression, env.parse(expression))
            except CelCompileError:
                terms = []
            self._terms[expression] = terms
        return false_terms(terms, env.compile, [d.cel_view(keep=False) for d in devices]) if terms else ""

    def _counters_short(self, dev: Device, pool: Pool) -> str:
        """The first shared counter the device needs more of than allocated devices left, as `counter set/name:
        HAVE of TOTAL left, NEED needed`; empty when all fit."""
        total: dict[tuple[str, str], Any] = {}
        for set_name, counters in pool.counter_sets.items():
            for n, c in counters.items():
                total[(set_name, n)] = cap._q((c or {}).get("value", "0"))
        avail = dict(total)
        for sl in [*pool.slices, *pool.other_slices]:
            for other in sl.devices:
                if other.id in self.snapshot.allocated:
                    for set_name, counters in other.consumes_counters:
                        for n, c in counters.items():
                            if (set_name, n) in avail:
                                avail[(set_name, n)] = avail[(set_name, n)] - cap._q((c or {}).get("value", "0"))
        for set_name, counters in dev.consumes_counters:
            for n, c in counters.items():
                have = avail.get((set_name, n))
                wanted = cap._q((c or {}).get("value", "0"))
                if have is None:
                    return f"{set_name}/{n}: no such counter in pool {pool.id}"
                if have < wanted:
                    return f"{set_name}/{n}: {have} of {total[(set_name, n)]} left, {wanted} needed"
        return ""

    def _consumed(self, dev: Device) -> dict[str, Any]:
        consumed: dict[str, Any] = {}
        for entry in self.snapshot.shared_consumed.get(dev.id, ()):
            cap.add_into(consumed, entry)
        return consumed

    def _capacity_fits(self, dev: Device, request: Request) -> bool:
        return cap.fits(dev.raw.get("capacity") or {}, request.capacity, self._consumed(dev), {},
                        self.features.fractional_capacity_range)

    def _capacity_used_up(self, dev: Device, request: Request) -> str:
        """Which capacity of a device that could give the request its amounts when idle others have used up:
        `memory: 60Gi of 80Gi in use, 40Gi requested`."""
        consumed = self._consumed(dev)
        fractional = self.features.fractional_capacity_range
        for name, c in sorted((dev.raw.get("capacity") or {}).items()):
            requested = (request.capacity or {}).get(name)
            used = {name: consumed[name]} if name in consumed else {}
            if not cap.fits({name: c}, {name: requested} if requested is not None else None, used, {}, fractional):
                charged = cap.consumed_amount(cap._q(requested) if requested is not None else None, c, fractional)
                return f"{name}: {consumed.get(name, 0)} of {(c or {}).get('value', '0')} in use, {charged} requested"
        return "its capacity is used up"

    def _constraints(self, node: str, claim: Claim, usable: list[tuple[Request, list[Device]]]) -> NodeReason | None:
        for i, c in enumerate(claim.constraints):
            if c.kind not in ("match", "distinct"):
                continue
            scoped = [(r, devs) for r, devs in usable if not c.requests or r.name in c.requests or
                      (r.parent is not None and (r.parent in c.requests or r.full_name in c.requests))]
            need = sum(_needed(r, len(devs)) for r, devs in scoped)
            devices = {d.uid: d for _, devs in scoped for d in devs}
            if need < 1 or not devices:
                continue
            groups: Counter[Any] = Counter()
            for d in devices.values():
                value = d.attribute(c.attribute)
                if value is not None:
                    groups[value] += 1
            details = {"claim": claim.key, "attribute": c.attribute, "needed": need}
            if not groups:
                # A device without the attribute never satisfies the constraint: most often a misspelt name.
                field_name = "matchAttribute" if c.kind == "match" else "distinctAttribute"
                best_name = closest_attribute(c.attribute, {n for d in devices.values() for n in d.attribute_names()})
                return NodeReason(node, "constraint", f"constraint #{i} of claim {claim.key} ({field_name}: {c.attribute}): "
                                  f"none of the {len(devices)} free device{'s' if len(devices) != 1 else ''} has attribute "
                                  f"{c.attribute}" + (f"; did you mean {best_name}?" if best_name else ""),
                                  {**details, "largestGroup": 0, **({"didYouMean": best_name} if best_name else {})})
            # distinctAttribute compares a device only with the last one of each other request (Kubernetes keys what
            # it has seen by request), so counting values says nothing about it.
            if need <= 1 or c.kind != "match":
                continue
            best = max(groups.values(), default=0)
            if best < need:
                return NodeReason(node, "constraint", f"only {best} of {need} free devices share {c.attribute}",
                                  {**details, "largestGroup": best})
        return None


def _capacity_never(dev: Device, request: Request, fractional: bool) -> str:
    """Why the device could not give the request its capacity even idle (a capacity it lacks, or has too little
    of); empty when it could, and only what others consume is in the way."""
    capacity = dev.raw.get("capacity") or {}
    if cap.fits(capacity, request.capacity, {}, {}, fractional):
        return ""
    for name, wanted in sorted((request.capacity or {}).items()):
        have = capacity.get(name)
        if have is None:
            return f"no capacity {name}"
        if not cap.fits({name: have}, {name: wanted}, {}, {}, fractional):
            return f"{name}: requested {wanted}, the device has {(have or {}).get('value', '0')}"
    return "the device's request policy refuses the requested amounts"


def _needed(request: Request, usable: int = 0) -> int:
    """Devices the request takes; with allocationMode All, every usable one (`usable`: how many that is)."""
    return usable if request.mode == "All" else max(request.count, 0)


def summarize(reasons: Iterable[NodeReason], limit: int = 5) -> str:
    """'412 nodes: no device matches selector #0 of class gpu; 88 nodes: only 3 of 4 free devices share ...'."""
    counts = Counter(r.message for r in reasons if r.code != "fits")
    total = sum(counts.values())
    if not total:
        return "no nodes"
    parts = [f"{n} node{'s' if n != 1 else ''}: {msg}" for msg, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    if len(parts) > limit:
        rest = sum(n for msg, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[limit:])
        parts = parts[:limit] + [f"{rest} more nodes for other reasons"]
    return "; ".join(parts)


def explain(snapshot: ClusterSnapshot, claims: Sequence[Claim], nodes: Iterable[str] | None = None,
            features: Features | None = None, cel_env: Any = None, explainer: Diagnoser | None = None) -> list[NodeReason]:
    ex = explainer or Diagnoser(snapshot, features, cel_env)
    return [ex.explain_node(n, claims) for n in (nodes if nodes is not None else snapshot.node_names)]


def _taint_text(taint: Any) -> str:
    """`key=value:Effect`, as Kubernetes prints a taint, naming the DeviceTaintRule that added it."""
    text = f"{taint.key}={taint.value}:{taint.effect}" if taint.value else f"{taint.key}:{taint.effect}"
    rule = taint.raw.get(RULE_KEY) if isinstance(taint.raw, dict) else None
    return f"{text} from DeviceTaintRule {rule}" if rule else text
