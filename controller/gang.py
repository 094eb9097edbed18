"""Gang pre-allocation: claims labelled `<driver>/gang: NAME` and `<driver>/gang-size: "N"` are allocated
all-or-nothing once all N exist, so that kube-scheduler (or the embedded scheduler) then places their pods
where the devices are.

- Planning happens on a private snapshot: nothing is written unless every claim of the gang has a place,
  so a gang that does not fit holds no device and blocks nobody.
- Placement prefers one node for the whole gang; otherwise it spreads claims over nodes, trying first the
  nodes of one multi-node NVLink domain (same fabricClusterUUID and fabricCliqueID), largest domain first,
  then any nodes. Within a node, scoring already prefers devices that share an nvlinkDomain.
- Only claims carrying both labels are touched. Gang allocations are marked `<driver>/gang-allocated-at`;
  a gang nobody uses (no pod references its claims and none is reserved) is released after the timeout and
  marked `<driver>/gang-released-at`; it is allocated again only once a pod references one of its claims.
  Claims kube-controller-manager deallocated after use (their pods finished) are marked released the same way.

The race with kube-scheduler. The scheduler allocates a pod's claims in memory at Reserve (its "in-flight"
allocations, counted as in use by its own later cycles) and writes them at PreBind; it never re-checks at PreBind
whether another claim holds the same device. A pre-allocation written here is invisible to a scheduler cycle
that started before the claim informer delivered it, and the scheduler's in-flight allocations are invisible
here. So, both ways:
- Conflict sweep, every pass: a gang claim we allocated that is not reserved yet and shares a device with any
  other claim's allocation loses: the whole gang's unreserved allocations are undone (the other claim belongs
  to a pod being bound) and the gang is planned again.
- Settle, then admit: gang pods may carry the scheduling gate `<driver>/gang` (KEP-3521; the scheduler does
  not consider gated pods at all). The gate is lifted only after the gang has been allocated for
  `settle_seconds` without a conflict, i.e. after every scheduler cycle that could have missed our write has
  reached PreBind and shown up in the sweep. With gated pods nothing can use a gang claim before a conflict is
  seen, which closes the race except for binding cycles held up longer than the settle time between Reserve
  and PreBind (Permit waits, slow volume binding). Without the gate the sweep alone narrows the window to the
  time between our write and the first gang pod's reservation.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from controller import objects as o
from controller.allocator import AllocationError, parse_claim
from controller.cel import CelEnvironment
from controller.commit import AllocationCommitter, allocation_devices, used_devices
from controller.diagnosis import explain, summarize
from controller.explanation_writer import ExplanationWriter
from controller.ganggroups import Gang, allocated_at_annotation, gang_gate, group_gangs, released_at_annotation
from controller.metrics import GANG_STATES, ControllerMetrics
from controller.objects import Obj
from controller.podgroups import pod_group_gangs
from controller.scoring import NoPlacement, Placer
from controller.snapshots import build_snapshot
from controller.view import View
from controller.writes import Writer
from gpudra.timestamps import parse_rfc3339, rfc3339
from gpudra.features import Features

log = logging.getLogger("gpudra.controller.gang")

CLIQUE_ATTRIBUTES = ("fabricClusterUUID", "fabricCliqueID")


def referenced_claims(pods: Iterable[Mapping[str, Any]]) -> set[str]:
    """`namespace/name` of every claim some live pod refers to (directly or through its status)."""
    refs: set[str] = set()
    for pod in pods:
        if o.pod_done(pod):
            continue
        ns = o.namespace(pod)
        for entry in o.list_field(o.section(pod, "spec"), "resourceClaims"):
            if isinstance(entry, Mapping) and entry.get("resourceClaimName"):
                refs.add(f"{ns}/{entry['resourceClaimName']}")
        for entry in o.list_field(o.section(pod, "status"), "resourceClaimStatuses"):
            if isinstance(entry, Mapping) and entry.get("resourceClaimName"):
                refs.add(f"{ns}/{entry['resourceClaimName']}")
    return refs


def clique_domains(view: View) -> dict[tuple[Any, ...], list[str]]:
    """Multi-node NVLink domains: (fabricClusterUUID, fabricCliqueID) -> nodes with devices in it."""
    domains: dict[tuple[Any, ...], set[str]] = {}
    for sl in view.slices.values():
        spec = o.section(sl, "spec")
        node = spec.get("nodeName")
        driver = spec.get("driver")
        if not node:
            continue
        for dev in o.list_field(spec, "devices"):
            attrs = o.section(dev, "attributes") if isinstance(dev, Mapping) else {}
            values = []
            for attr in CLIQUE_ATTRIBUTES:
                raw = attrs.get(attr) or attrs.get(f"{driver}/{attr}")
                values.append(next(iter(raw.values())) if isinstance(raw, Mapping) and raw else None)
            if all(v is not None for v in values):
                domains.setdefault(tuple(values), set()).add(str(node))
    return {k: sorted(v) for k, v in sorted(domains.items(), key=lambda kv: (-len(kv[1]), str(kv[0])))}


def _shareable_devices(view: View) -> set[tuple[str, str, str]]:
    """Devices published with allowMultipleAllocations: several claims holding one is no conflict."""
    out: set[tuple[str, str, str]] = set()
    for sl in view.slices.values():
        spec = o.section(sl, "spec")
        pool = str(o.section(spec, "pool").get("name", ""))
        for dev in o.list_field(spec, "devices"):
            if isinstance(dev, Mapping) and dev.get("allowMultipleAllocations"):
                out.add((str(spec.get("driver", "")), pool, str(dev.get("name", ""))))
    return out


@dataclass(frozen=True)
class GangPlan:
    placements: dict[str, tuple[str, dict[str, Any]]]  # claim key -> (node, allocation)

    @property
    def nodes(self) -> list[str]:
        return sorted({node for node, _ in self.placements.values()})


@dataclass(frozen=True)
class GangSummary:
    states: dict[str, int] = field(default_factory=dict)
    changed: int = 0
    by_gang: dict[str, str] = field(default_factory=dict)


def plan_gang(view: View, gang: Gang, allocated: list[Obj], features: Features, cel: Any) -> GangPlan | str:
    """Places the gang's unallocated claims all-or-nothing (pure: nothing is written); the explanation text when
    they do not all fit. Shared by the controller and the offline tools, so both place gangs the same way."""
    pending = [c for c in gang.claims if o.allocation(c) is None]
    if gang.topology == "clique":
        return _plan_in_one_clique(view, gang, pending, allocated, features, cel)
    attempts: list[list[str] | None] = [None]  # None: the whole gang on one node, any node
    attempts += [nodes for nodes in clique_domains(view).values() if len(nodes) > 1]
    attempts.append([])  # []: spread over all nodes
    reasons = ""
    for nodes in attempts:
        snapshot, _ = build_snapshot(view, allocated)
        placer = Placer(snapshot, features, cel)
        parsed = [parse_claim(c) for c in pending]
        if nodes is None:
            result = placer.place(parsed)
            if not isinstance(result, NoPlacement):
                return GangPlan({c.key: (result.node, alloc) for c, alloc in zip(parsed, result.allocations)})
            reasons = summarize(explain(snapshot, parsed, features=features, cel_env=cel))
            continue
        plan = _spread(placer, parsed, nodes or snapshot.node_names)
        if plan is not None:
            return plan
    return f"gang {gang.key}: its {len(pending)} unallocated claims do not fit together: {reasons}"


def _clique_name(key: tuple[Any, ...]) -> str:
    return ".".join(str(k) for k in key)


def _plan_in_one_clique(view: View, gang: Gang, pending: list[Obj], allocated: list[Obj], features: Features,
                        cel: Any) -> GangPlan | str:
    """All of the gang within one NVLink clique (largest first), never across cliques; when none can take it,
    which cliques were too small (fewer nodes than the gang needs) and which too busy (how many claims fit)."""
    cliques = clique_domains(view)
    # Claims the gang already holds pin it to their clique.
    held = {node for c in gang.claims if o.allocation(c) is not None
            for node in _allocation_nodes(view, c)}
    reasons: list[str] = []
    for key, nodes in cliques.items():
        if held and not held <= set(nodes):
            reasons.append(f"clique {_clique_name(key)}: the gang already holds devices outside it")
            continue
        snapshot, _ = build_snapshot(view, allocated)
        placer = Placer(snapshot, features, cel)
        parsed = [parse_claim(c) for c in pending]
        plan = _spread(placer, parsed, nodes)
        if plan is not None:
            return plan
        fits = _count_fitting(view, allocated, pending, nodes, features, cel)
        size = gang.size or len(gang.claims)
        if len(nodes) < size:
            busy = f"; busy too: only {fits} fit" if fits < len(nodes) else ""
            reasons.append(f"clique {_clique_name(key)}: too small ({len(nodes)} nodes for {size} claims{busy})")
        else:
            reasons.append(f"clique {_clique_name(key)}: too busy (only {fits} of {len(pending)} claims fit on its "
                           f"{len(nodes)} nodes)")
    if not cliques:
        reasons.append("no node publishes devices in an NVLink clique (fabricClusterUUID, fabricCliqueID)")
    return (f"gang {gang.key}: its {len(pending)} unallocated claims must share one NVLink clique and fit in none: "
            + "; ".join(reasons))


def _allocation_nodes(view: View, claim: Obj) -> set[str]:
    pools = {str(r.get("pool")) for r in o.list_field(o.section(o.section(o.section(claim, "status"), "allocation"),
                                                                 "devices"), "results") if isinstance(r, Mapping)}
    nodes = set()
    for sl in view.slices.values():
        spec = o.section(sl, "spec")
        if spec.get("nodeName") and str(o.section(spec, "pool").get("name")) in pools:
            nodes.add(str(spec["nodeName"]))
    return nodes


def _count_fitting(view: View, allocated: list[Obj], pending: list[Obj], nodes: list[str], features: Features,
                   cel: Any) -> int:
    """How many of `pending` fit on `nodes` together, placed one after another."""
    snapshot, _ = build_snapshot(view, allocated)
    placer = Placer(snapshot, features, cel)
    count = 0
    for claim in (parse_claim(c) for c in pending):
        result = placer.place([claim], nodes)
        if isinstance(result, NoPlacement):
            continue
        placer.commit([claim.key], result.allocations, result.node)
        count += 1
    return count


def _spread(placer: Placer, claims: list[Any], nodes: list[str]) -> GangPlan | None:
    placements: dict[str, tuple[str, dict[str, Any]]] = {}
    used: list[str] = []
    for claim in claims:
        # Fill nodes the gang already uses before opening another one.
        result = placer.place([claim], used) if used else NoPlacement()
        if isinstance(result, NoPlacement):
            result = placer.place([claim], [n for n in nodes if n not in used])
        if isinstance(result, NoPlacement):
            return None
        placer.commit([claim.key], result.allocations, result.node)
        placements[claim.key] = (result.node, result.allocations[0])
        if result.node not in used:
            used.append(result.node)
    return GangPlan(placements)


class GangController:
    def __init__(
        self,
        writer: Writer,
        explainer: ExplanationWriter,
        metrics: ControllerMetrics,
        *,
        driver_name: str,
        timeout: float,
        features: Features,
        settle_seconds: float = 5.0,
        wall: Callable[[], datetime],
        fresh_claims: Callable[[], list[Obj]],
    ) -> None:
        self._writer = writer
        self._explainer = explainer
        self._metrics = metrics
        self.driver = driver_name
        self.timeout = timeout
        self.settle_seconds = settle_seconds
        self._features = features
        self._wall = wall
        self._fresh_claims = fresh_claims
        self._cel = CelEnvironment(features=features)
        self._committer = AllocationCommitter(
            writer,
            drop_annotations=(explainer.annotation, released_at_annotation(driver_name)),
        )
        # gang key -> fingerprint of the inputs of its last failed plan (do not re-plan an unchanged world).
        self._failed: dict[str, tuple[Any, ...]] = {}

    # -- planning (no writes) ----------------------------------------------------------------------

    def plan(self, view: View, gang: Gang, allocated: list[Obj]) -> GangPlan | str:
        """Places the gang's unallocated claims; the explanation text when they do not all fit."""
        return plan_gang(view, gang, allocated, self._features, self._cel)

    # -- the pass ----------------------------------------------------------------------------------

    def reconcile(self, view: View) -> GangSummary:
        # Label-named gangs, then the gangs of PodGroups (Workload API) whose minCount pods exist.
        gangs = group_gangs(view.claims.values(), self.driver) + pod_group_gangs(view)
        states: Counter[str] = Counter(dict.fromkeys(GANG_STATES, 0))
        by_gang: dict[str, str] = {}
        changed = 0
        refs = referenced_claims(view.pods.values()) if gangs else set()
        live = {g.key for g in gangs}
        for stale in [k for k in self._failed if k not in live]:
            del self._failed[stale]
        for gang in gangs:
            state, did_change = self._reconcile_gang(view, gang, refs)
            states[state] += 1
            by_gang[gang.key] = state
            changed += int(did_change)
        return GangSummary(dict(states), changed, by_gang)

    def _reconcile_gang(self, view: View, gang: Gang, refs: set[str]) -> tuple[str, bool]:
        if gang.size is None:
            self._explainer.annotate(gang.claims, gang.problem)
            return "unschedulable", False
        claims = list(gang.claims)
        allocated = [c for c in claims if o.allocation(c) is not None]
        referenced = any(o.key(c) in refs for c in claims)
        if len(claims) < gang.size:
            self._explainer.annotate(
                claims, f"gang {gang.key}: {len(claims)} of {gang.size} claims exist; allocation waits for all of them"
            )
            return "waiting", False
        if any(o.deleting(c) for c in claims):
            return "waiting", False
        if len(allocated) == len(claims):
            if any(o.reserved_for(c) for c in claims):
                return "bound", False
            conflicts = self._conflicts(view, gang)
            if conflicts:
                return self._undo_conflicting(gang, conflicts)
            if referenced:
                return "allocated", self._lift_gates_when_settled(view, gang)
            return self._maybe_release(gang)
        conflicts = self._conflicts(view, gang)
        if conflicts:
            return self._undo_conflicting(gang, conflicts)
        # Only the unallocated members count from here on: members still in use by running pods must not make
        # the finished ones allocatable again.
        pending = [c for c in claims if o.allocation(c) is None]
        pending_referenced = any(o.key(c) in refs for c in pending)
        finished = [c for c in pending if allocated_at_annotation(self.driver) in o.annotations(c)]
        if finished and not pending_referenced:
            return self._mark_finished(gang, finished)
        released = any(released_at_annotation(self.driver) in o.annotations(c) for c in pending)
        if released and not pending_referenced:
            return "released", False
        return self._allocate(view, gang)

    def _ours(self, gang: Gang) -> list[Obj]:
        return [
            c for c in gang.claims
            if allocated_at_annotation(self.driver) in o.annotations(c) and o.allocation(c) is not None
        ]

    def _conflicts(self, view: View, gang: Gang) -> list[str]:
        """`claim: device held by other claim` for each device of our unreserved gang allocations that another
        claim's allocation also holds."""
        ours = [c for c in self._ours(gang) if not o.reserved_for(c)]
        if not ours:
            return []
        members = {o.key(c) for c in gang.claims}
        shareable = _shareable_devices(view)
        holders: dict[tuple[str, ...], str] = {}
        for other in view.claims.values():
            if o.key(other) in members or o.allocation(other) is None:
                continue
            for device in o.allocated_devices(other):
                if tuple(device) not in shareable:
                    holders.setdefault(tuple(device), o.key(other))
        out = []
        for claim in ours:
            for device in o.allocated_devices(claim):
                holder = holders.get(tuple(device))
                if holder is not None:
                    out.append(f"{o.key(claim)}: {'/'.join(device)} also allocated to {holder}")
        return out

    def _undo_conflicting(self, gang: Gang, conflicts: list[str]) -> tuple[str, bool]:
        for claim in self._ours(gang):
            if o.reserved_for(claim):
                continue
            self._committer.undo(claim, None, deallocate=True)
            self._writer.patch("ResourceClaim", claim, {"metadata": {"annotations": {allocated_at_annotation(self.driver): None}}})
        self._failed.pop(gang.key, None)
        self._metrics.failures.labels(reason="conflict").inc()
        log.warning("gang allocation lost a race with another allocation; undone", extra={"gang": gang.key, "conflicts": "; ".join(conflicts)})
        return "unschedulable", True

    def _lift_gates_when_settled(self, view: View, gang: Gang) -> bool:
        """Remove the `<driver>/gang` scheduling gate from the gang's pods once the allocation has settled."""
        stamps = [parse_rfc3339(o.annotations(c).get(allocated_at_annotation(self.driver))) for c in self._ours(gang)]
        started = min((s for s in stamps if s is not None), default=None)
        if started is not None and (self._wall() - started).total_seconds() < self.settle_seconds:
            return False
        gate = gang_gate(self.driver)
        members = {o.key(c) for c in gang.claims}
        lifted = False
        for pod in view.pods.values():
            gates = o.list_field(o.section(pod, "spec"), "schedulingGates")
            if not any(isinstance(g, Mapping) and g.get("name") == gate for g in gates):
                continue
            if not referenced_claims([pod]) & members:
                continue
            remaining = [g for g in gates if not (isinstance(g, Mapping) and g.get("name") == gate)]
            # A merge patch replaces the list: the pod keeps every other gate.
            if self._writer.patch("Pod", pod, {"spec": {"schedulingGates": remaining or None}}) is not None:
                lifted = True
                log.info("gang pod admitted to scheduling", extra={"gang": gang.key, "pod": o.key(pod)})
        return lifted

    def _mark_finished(self, gang: Gang, claims: list[Obj]) -> tuple[str, bool]:
        """Claims we allocated that someone else deallocated: kube-controller-manager's claim controller does so
        when their last consumer is gone (reservedFor emptied after use). The gang has run; allocating it again
        would hold its GPUs for nobody until the timeout. It is marked released, like a timed-out gang, and is
        allocated again only for a live pod that references one of these claims."""
        stamp = rfc3339(self._wall())
        for claim in claims:
            self._writer.patch(
                "ResourceClaim",
                claim,
                {"metadata": {"annotations": {released_at_annotation(self.driver): stamp, allocated_at_annotation(self.driver): None}}},
            )
        log.info("gang finished: its claims were deallocated after use", extra={"gang": gang.key, "claims": len(claims)})
        return "released", True

    def _maybe_release(self, gang: Gang) -> tuple[str, bool]:
        ours = [c for c in gang.claims if allocated_at_annotation(self.driver) in o.annotations(c)]
        if not ours:
            return "allocated", False  # allocated by someone else: not ours to release
        stamps = [parse_rfc3339(o.annotations(c).get(allocated_at_annotation(self.driver))) for c in ours]
        started = min((s for s in stamps if s is not None), default=None)
        if started is None or (self._wall() - started).total_seconds() < self.timeout:
            return "allocated", False
        stamp = rfc3339(self._wall())
        for claim in ours:
            self._committer.undo(claim, None, deallocate=True)
            self._writer.patch(
                "ResourceClaim",
                claim,
                {"metadata": {"annotations": {released_at_annotation(self.driver): stamp, allocated_at_annotation(self.driver): None}}},
            )
        self._metrics.deallocations.labels(cause="gang-timeout").inc(len(ours))
        log.info("gang released", extra={"gang": gang.key, "claims": len(ours), "timeoutSeconds": self.timeout})
        return "released", True

    def _fingerprint(self, view: View, gang: Gang) -> tuple[Any, ...]:
        def rvs(objs: Iterable[Mapping[str, Any]]) -> tuple[tuple[str, str], ...]:
            return tuple(sorted((o.key(x), str(o.meta(x).get("resourceVersion"))) for x in objs))

        return (
            rvs(gang.claims),
            rvs(view.slices.values()),
            rvs(view.classes.values()),
            rvs(view.nodes.values()),
            tuple(sorted(o.key(c) for c in view.claims.values() if o.allocation(c) is not None)),
        )

    def _allocate(self, view: View, gang: Gang) -> tuple[str, bool]:
        fingerprint = self._fingerprint(view, gang)
        if self._failed.get(gang.key) == fingerprint:
            return "unschedulable", False
        fresh = self._fresh_claims()
        gang_keys = {o.key(c) for c in gang.claims}
        fresh_by_key = {o.key(c): c for c in fresh}
        members = [fresh_by_key[k] for k in sorted(gang_keys) if k in fresh_by_key]
        if len(members) != len(gang.claims):
            return "waiting", False
        others = [c for c in fresh if o.key(c) not in gang_keys and o.allocation(c) is not None]
        allocated_members = [c for c in members if o.allocation(c) is not None]
        try:
            plan = self.plan(view, replace(gang, claims=tuple(members)), others + allocated_members)
        except AllocationError as err:
            plan = f"gang {gang.key}: {err}"
        if isinstance(plan, str):
            self._failed[gang.key] = fingerprint
            self._metrics.failures.labels(reason="gang-unschedulable").inc()
            self._explainer.annotate(members, plan)
            log.info("gang does not fit", extra={"gang": gang.key, "reason": plan})
            return "unschedulable", False
        self._failed.pop(gang.key, None)
        # Re-check against the fresh list: no planned device may be held by any other claim.
        busy = used_devices(fresh, exclude=gang_keys)
        planned = [d for _, alloc in plan.placements.values() for d in allocation_devices(alloc)]
        if busy.intersection(planned) or len(set(planned)) != len(planned):
            self._metrics.failures.labels(reason="conflict").inc()
            log.warning("gang plan conflicts with a fresh list; retrying", extra={"gang": gang.key})
            return "unschedulable", False
        stamp = rfc3339(self._wall())
        written: list[Obj] = []
        for claim in members:
            if o.allocation(claim) is not None:
                continue
            node, alloc = plan.placements[o.key(claim)]
            stored = self._committer.allocate(claim, alloc, None, {allocated_at_annotation(self.driver): stamp})
            if stored is None:
                # Someone else allocated or removed a member: undo, so the gang stays all-or-nothing. Our mark
                # goes too: on an unallocated claim it means "allocated by us, then deallocated after use".
                for done in written:
                    self._committer.undo(done, None, deallocate=True)
                for member in [*written, claim]:
                    self._writer.patch(
                        "ResourceClaim", member, {"metadata": {"annotations": {allocated_at_annotation(self.driver): None}}}
                    )
                self._metrics.failures.labels(reason="conflict").inc()
                log.warning("gang allocation interrupted; undone", extra={"gang": gang.key, "claim": o.key(claim)})
                return "unschedulable", bool(written)
            written.append(stored)
        self._metrics.allocations.labels(path="gang").inc(len(written))
        log.info("gang allocated", extra={"gang": gang.key, "claims": len(written), "nodes": ",".join(plan.nodes)})
        return "allocated", True
