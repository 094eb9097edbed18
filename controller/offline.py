"""The offline allocation session behind `gpu-dra allocate` and `gpu-dra explain` (pure: objects in, results out).

Both commands run the same pass, in the order the cluster would: first every gang (claims labelled
`<driver>/gang` and `<driver>/gang-size`) is placed all-or-nothing with the gang controller's planner, then pods and
standalone claims are placed one after another on the best node, each placement holding its devices. A claim
shared by several pods is allocated with the first and followed by the others. `allocate` reports per claim;
`explain` reports per unit, with each candidate node's reason at the moment the unit was judged, so that the
two always agree on what fits. Claims no pod references come last: `allocate` places them (its contract),
`explain` only says whether they would fit, as no scheduler allocates a claim before a pod uses it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from controller.allocator import INVALID_POOLS, AllocationError, ClusterSnapshot, Unschedulable, parse_claim
from controller.allocator.model import Claim
from controller.allocator.nodes import NodeSelector
from controller.diagnosis import Diagnoser, NodeReason, summarize
from controller.gang import GangPlan, plan_gang
from controller.ganggroups import group_gangs
from controller.podgroups import min_count, pod_group_gangs, pod_group_name, wait_reason
from controller.objects import claim_key
from controller.scoring import Placement, Placer, Policy
from controller.view import View
from controller.workload import Unit, Workload, build_workload
from gpudra import DEFAULT_DRIVER_NAME
from gpudra.features import Features

Outcome = Literal["allocated", "unschedulable", "error"]
UNREFERENCED = "no pod references this claim, so no scheduler allocates it until one does"


@dataclass(frozen=True)
class ClaimResult:
    claim: str
    outcome: Outcome
    node: str | None
    allocation: dict[str, Any] | None
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"claim": self.claim, "outcome": self.outcome, "node": self.node, "allocation": self.allocation,
                "message": self.message}


@dataclass
class Pass:
    """One run over the input: per-claim results (allocate) and per-unit entries (explain)."""

    results: list[ClaimResult] = field(default_factory=list)
    units: list[dict[str, Any]] = field(default_factory=list)
    decided: dict[str, ClaimResult] = field(default_factory=dict)

    def add(self, results: Iterable[ClaimResult]) -> None:
        for r in results:
            self.results.append(r)
            self.decided[r.claim] = r


class Session:
    def __init__(self, objects: Iterable[Mapping[str, Any]], features: Features | None = None, cel_env: Any = None,
                 policy: Policy = "binpack", driver_name: str = DEFAULT_DRIVER_NAME) -> None:
        self.features = features or Features()
        self.workload: Workload = build_workload(objects, self.features.extended_resource)
        self.cel_env = cel_env
        self.driver_name = driver_name
        w = self.workload
        self.snapshot = ClusterSnapshot(w.slices, w.classes, w.allocated, w.nodes or None)
        self.placer = Placer(self.snapshot, self.features, cel_env, policy)
        self.explainer = Diagnoser(self.snapshot, self.features, allocator=self.placer.allocator)

    def _parse(self, claims: Sequence[Mapping[str, Any]]) -> list[Claim]:
        return [parse_claim(c) for c in claims]

    def allocate_on(self, node: str) -> list[ClaimResult]:
        """--node: every pending claim together on one node, in input order (one Filter call)."""
        results: list[ClaimResult] = []
        pending: list[dict[str, Any]] = []
        for unit in self.workload.units:
            results += [ClaimResult(k, "error", None, None, m) for k, m in unit.errors]
            pending += unit.claims
        keys = [claim_key(c) for c in pending]
        try:
            claims = [parse_claim(c) for c in pending]
            outcome = self.placer.allocator.allocate(node, claims) if claims else []
        except AllocationError as exc:
            return results + [ClaimResult(k, "error", None, None, str(exc)) for k in keys]
        if isinstance(outcome, Unschedulable):
            reason = self.explainer.explain_node(node, claims, outcome)
            msg = f"{outcome.reason} on node {node}: {reason.message}" if reason.message != outcome.reason else \
                f"{outcome.reason} on node {node}"
            # Kubernetes' allocator returns an error (not "cannot allocate") when it saw an invalid pool.
            verdict: Outcome = "error" if outcome.reason == INVALID_POOLS else "unschedulable"
            return results + [ClaimResult(k, verdict, None, None, msg) for k in keys]
        return results + [ClaimResult(k, "allocated", node, a, f"allocated on node {node}") for k, a in zip(keys, outcome)]

    def place_all(self) -> list[ClaimResult]:
        """Gangs, then pods and standalone claims one after another on the best node."""
        return self.run(explain=False).results

    def explain_all(self) -> list[dict[str, Any]]:
        """Per unit (gangs first): the verdict of the same pass `place_all` makes, with per-node reasons."""
        return self.run(explain=True).units

    # ---- the pass -----------------------------------------------------------------------------------------

    def run(self, *, explain: bool) -> Pass:
        out = Pass()
        gang_keys = self._gangs(out)
        all_nodes = [self.snapshot.nodes[n] for n in self.snapshot.node_names]
        for unit in self.workload.units:
            out.add(ClaimResult(k, "error", None, None, m) for k, m in unit.errors)
            own = [c for c in unit.claims if claim_key(c) not in gang_keys]
            keys = [claim_key(c) for c in own]
            entry: dict[str, Any] = {"owner": unit.owner, "claims": keys, "errors": [m for _, m in unit.errors]}
            follows = [*unit.shared, *(claim_key(c) for c in unit.claims if claim_key(c) in gang_keys)]
            pins, blocked = self._follow(unit, follows, out)
            # A pod with nothing left to place (running, or its claims allocated) is not reported; one that follows a
            # claim another pod places is (with why it cannot start when that failed).
            if own or entry["errors"] or follows:
                out.units.append(entry)
            if not own:
                if blocked:
                    entry.update(fits=[], summary=blocked, nodes=[])
                continue
            if blocked:
                out.add(ClaimResult(k, "unschedulable", None, None, blocked) for k in keys)
                entry.update(fits=[], summary=blocked, nodes=[])
                continue
            candidates = self.workload.node_candidates(unit, all_nodes, pins)
            try:
                claims = self._parse(own)
            except AllocationError as exc:
                out.add(ClaimResult(k, "error", None, None, str(exc)) for k in keys)
                entry.update(fits=[], summary=str(exc), nodes=[])
                continue
            if not candidates:
                msg = f"{unit.owner}: no node matches the pod's nodeName, nodeSelector and allocated claims"
                out.add(ClaimResult(k, "unschedulable", None, None, msg) for k in keys)
                entry.update(fits=[], summary="no node matches the pod's nodeName, nodeSelector and allocated claims",
                             nodes=[])
                continue
            reasons: list[NodeReason] | None = None
            if explain:
                reasons = self._reasons(candidates, claims)
                if unit.unreferenced:
                    # Nothing allocates a claim before a pod uses it: say whether it could fit, place nothing.
                    fits = [r.node for r in reasons if r.code == "fits"]
                    entry.update(unreferenced=True, fits=fits, nodes=[r.to_dict() for r in reasons],
                                 summary=f"{UNREFERENCED}; it would fit on {len(fits)} of {len(candidates)} nodes"
                                 + (f"; {summarize(reasons)}" if len(fits) < len(candidates) else ""))
                    continue
            try:
                placed = self.placer.place(claims, candidates)
            except AllocationError as exc:
                out.add(ClaimResult(k, "error", None, None, str(exc)) for k in keys)
                entry.update(fits=[], summary=str(exc), nodes=[r.to_dict() for r in reasons or []])
                continue
            if isinstance(placed, Placement):
                self.placer.commit(keys, placed.allocations, placed.node)
                out.add(ClaimResult(k, "allocated", placed.node, a, f"allocated on node {placed.node}")
                        for k, a in zip(keys, placed.allocations))
                if reasons is not None:
                    fits = [r.node for r in reasons if r.code == "fits"]
                    entry.update(fits=fits, node=placed.node, summary=self._summary(fits, candidates, reasons, placed.node),
                                 nodes=[r.to_dict() for r in reasons])
                continue
            if reasons is None:
                reasons = self._reasons(candidates, claims)
            msg = f"0/{len(candidates)} nodes can allocate the claims of {unit.owner}: {summarize(reasons)}"
            # The allocator's invalid-pools error is not fatal per node, but surfaces when every node failed.
            verdict: Outcome = "error" if any(r.code == "pool-invalid" for r in reasons) else "unschedulable"
            out.add(ClaimResult(k, verdict, None, None, msg) for k in keys)
            entry.update(fits=[], summary=f"fits on 0 of {len(candidates)} nodes; {summarize(reasons)}",
                         nodes=[r.to_dict() for r in reasons])
        return out

    def _reasons(self, candidates: Sequence[str], claims: Sequence[Claim]) -> list[NodeReason]:
        return [self.explainer.explain_node(n, claims) for n in candidates]

    @staticmethod
    def _summary(fits: Sequence[str], candidates: Sequence[str], reasons: Sequence[NodeReason], node: str) -> str:
        text = f"fits on {len(fits)} of {len(candidates)} nodes; placed on {node}"
        return text + (f"; {summarize(reasons)}" if len(fits) < len(candidates) else "")

    def _follow(self, unit: Unit, keys: Sequence[str], out: Pass) -> tuple[list[NodeSelector], str]:
        """Node selectors of claims placed before this unit (shared claims, gang claims), or why it cannot start."""
        pins: list[NodeSelector] = []
        for key in keys:
            done = out.decided.get(key)
            if done is None:
                continue
            if done.outcome != "allocated":
                return [], f"{unit.owner}: ResourceClaim {key} is not allocated: {done.message}"
            selector = (done.allocation or {}).get("nodeSelector")
            if selector:
                pins.append(NodeSelector.parse(selector, f"ResourceClaim {key}: status.allocation.nodeSelector"))
        return pins, ""

    def _group_waits(self, view: View, claims: Mapping[str, Mapping[str, Any]], out: Pass) -> set[str]:
        """Claims of pods the scheduler holds back for their PodGroup (missing, or fewer than minCount pods)."""
        waited: set[str] = set()
        for pod in view.pods.values():
            group = pod_group_name(pod)
            if group is None:
                continue
            pg = view.pod_groups.get(f"{claim_key(pod).split('/')[0]}/{group}")
            members = [p for p in view.pods.values() if pod_group_name(p) == group]
            if pg is not None and (min_count(pg) is None or len(members) >= (min_count(pg) or 0)):
                continue
            wait = wait_reason(pod, view, claims)
            if wait is not None:
                why = wait.message
                owner = f"Pod {claim_key(pod)}"
                for unit in self.workload.units:
                    if unit.owner == owner:
                        held = [claim_key(c) for c in unit.claims if claim_key(c) not in out.decided]
                        out.add(ClaimResult(k, "unschedulable", None, None, why) for k in held)
                        waited.update(held)
        return waited

    def _gangs(self, out: Pass) -> set[str]:
        """Place every gang all-or-nothing, as the gang controller does before pods are scheduled; the gang
        claims' keys."""
        w = self.workload
        claims = {claim_key(c): c for c in [*w.allocated, *(c for u in w.units for c in u.claims)]}
        view = View(slices={str((s.get("metadata") or {}).get("name") or i): s for i, s in enumerate(w.slices)},
                    classes={str((c.get("metadata") or {}).get("name")): c for c in w.classes},
                    nodes={str((n.get("metadata") or {}).get("name")): n for n in w.nodes},
                    pods={claim_key(p): p for p in w.pods}, claims=claims,
                    pod_groups={claim_key(g): g for g in w.pod_groups})
        # Label-named gangs, then PodGroup (Workload API) gangs whose minCount pods exist, as the gang controller.
        gangs = group_gangs(claims.values(), self.driver_name) + pod_group_gangs(view)
        waited = self._group_waits(view, claims, out)
        if not gangs:
            return waited
        allocated = list(w.allocated)
        keys: set[str] = set()
        for gang in gangs:
            members = [claim_key(c) for c in gang.claims]
            keys.update(members)
            pending = [claim_key(c) for c in gang.claims if not (c.get("status") or {}).get("allocation")]
            entry: dict[str, Any] = {"owner": f"Gang {gang.key}", "claims": pending, "errors": []}
            out.units.append(entry)
            if not pending:
                continue
            if gang.size is None or len(gang.claims) < gang.size:
                msg = gang.problem or (f"gang {gang.key}: {len(gang.claims)} of {gang.size} claims exist; "
                                       "allocation waits for all of them")
                out.add(ClaimResult(k, "unschedulable", None, None, msg) for k in pending)
                entry.update(fits=[], summary=msg, nodes=[])
                continue
            others = [c for c in allocated if claim_key(c) not in members]
            try:
                plan: GangPlan | str = plan_gang(view, gang,
                                                 others + [c for c in gang.claims if (c.get("status") or {}).get("allocation")],
                                                 self.features, self.cel_env)
            except AllocationError as exc:
                out.add(ClaimResult(k, "error", None, None, f"gang {gang.key}: {exc}") for k in pending)
                entry.update(fits=[], summary=f"gang {gang.key}: {exc}", nodes=[])
                continue
            if isinstance(plan, str):
                out.add(ClaimResult(k, "unschedulable", None, None, plan) for k in pending)
                entry.update(fits=[], summary=plan, nodes=[])
                continue
            for key in pending:
                node, alloc = plan.placements[key]
                self.placer.commit([key], [alloc], node)
                done = dict(claims[key])
                done["status"] = {**(done.get("status") or {}), "allocation": alloc}
                allocated.append(done)
                out.add([ClaimResult(key, "allocated", node, alloc, f"allocated on node {node} (gang {gang.key}, "
                                                                     "all-or-nothing)")])
            entry.update(fits=plan.nodes, summary=f"gang {gang.key}: all {len(pending)} claims placed on "
                                                  f"{', '.join(plan.nodes)}", nodes=[])
        return keys | waited
