"""The offline allocation session behind `gpu-dra allocate` and `gpu-dra explain` (pure: objects in, results out)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from controller.allocator import AllocationError, ClusterSnapshot, Unschedulable, parse_claim
from controller.allocator.model import Claim
from controller.diagnosis import Diagnoser, NodeReason, summarize
from controller.scoring import Placement, Placer, Policy
from controller.objects import claim_key
from controller.workload import Unit, Workload, build_workload
from gpudra.features import Features

Outcome = Literal["allocated", "unschedulable", "error"]


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



class Session:
    def __init__(self, objects: Iterable[Mapping[str, Any]], features: Features | None = None, cel_env: Any = None,
                 policy: Policy = "binpack") -> None:
        self.features = features or Features()
        self.workload: Workload = build_workload(objects, self.features.extended_resource)
        w = self.workload
        self.snapshot = ClusterSnapshot(w.slices, w.classes, w.allocated, w.nodes or None)
        self.placer = Placer(self.snapshot, self.features, cel_env, policy)
        self.explainer = Diagnoser(self.snapshot, self.features, allocator=self.placer.allocator)

    def _parse(self, unit: Unit) -> list[Claim]:
        return [parse_claim(c) for c in unit.claims]

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
            return results + [ClaimResult(k, "unschedulable", None, None, msg) for k in keys]
        return results + [ClaimResult(k, "allocated", node, a, f"allocated on node {node}") for k, a in zip(keys, outcome)]

    def place_all(self) -> list[ClaimResult]:
        """Pods and standalone claims one after another on the best node; each placement holds its devices."""
        results: list[ClaimResult] = []
        all_nodes = [self.snapshot.nodes[n] for n in self.snapshot.node_names]
        placed_on: dict[str, str] = {}  # claims placed earlier in this run (several pods may share one claim)
        for unit in self.workload.units:
            results += [ClaimResult(k, "error", None, None, m) for k, m in unit.errors]
            pending = [c for c in unit.claims if claim_key(c) not in placed_on]
            if not pending:
                continue
            keys = [claim_key(c) for c in pending]
            # A pod whose shared claim is already allocated can only run where that claim's devices are.
            pinned = {placed_on[claim_key(c)] for c in unit.claims if claim_key(c) in placed_on}
            candidates = [n for n in self.workload.node_candidates(unit, all_nodes) if not pinned or n in pinned]
            try:
                claims = [parse_claim(c) for c in pending]
                if not candidates:
                    raise _NoNodes(f"{unit.owner}: no node matches the pod's nodeName, nodeSelector and allocated claims")
                placed = self.placer.place(claims, candidates)
            except AllocationError as exc:
                results += [ClaimResult(k, "error", None, None, str(exc)) for k in keys]
                continue
            except _NoNodes as exc:
                results += [ClaimResult(k, "unschedulable", None, None, str(exc)) for k in keys]
                continue
            if isinstance(placed, Placement):
                self.placer.commit(keys, placed.allocations, placed.node)
                placed_on.update({k: placed.node for k in keys})
                results += [ClaimResult(k, "allocated", placed.node, a, f"allocated on node {placed.node}")
                            for k, a in zip(keys, placed.allocations)]
                continue
            reasons = [self.explainer.explain_node(n, claims) for n in candidates]
            msg = f"0/{len(candidates)} nodes can allocate the claims of {unit.owner}: {summarize(reasons)}"
            results += [ClaimResult(k, "unschedulable", None, None, msg) for k in keys]
        return results

    def explain_all(self) -> list[dict[str, Any]]:
        """Per unit: per node reasons and a summary, without committing anything."""
        out: list[dict[str, Any]] = []
        all_nodes = [self.snapshot.nodes[n] for n in self.snapshot.node_names]
        for unit in self.workload.units:
            keys = [claim_key(c) for c in unit.claims]
            entry: dict[str, Any] = {"owner": unit.owner, "claims": keys, "errors": [m for _, m in unit.errors]}
            if unit.claims:
                candidates = self.workload.node_candidates(unit, all_nodes)
                try:
                    reasons: Sequence[NodeReason] = [self.explainer.explain_node(n, self._parse(unit)) for n in candidates]
                except AllocationError as exc:
                    reasons = [NodeReason(n, "error", str(exc)) for n in candidates]
                fits = [r.node for r in reasons if r.code == "fits"]
                entry["fits"] = fits
                entry["summary"] = (f"fits on {len(fits)} of {len(candidates)} nodes" + (f"; {summarize(reasons)}" if len(fits) < len(candidates) else "")) \
                    if candidates else "no node matches the pod's nodeName, nodeSelector and allocated claims"
                entry["nodes"] = [r.to_dict() for r in reasons]
            out.append(entry)
        return out


class _NoNodes(Exception):
    pass
