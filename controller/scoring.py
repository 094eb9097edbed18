"""Multi-node placement: run the allocator per node, score the feasible nodes, pick the best.

Score of a node for a set of claims, compared lexicographically, higher is better:
1. the DRAPrioritizedList score Kubernetes 1.35 adds: per request with firstAvailable, 8 minus the
   index of the chosen subrequest;
2. topology: per claim, +1 when all its devices share an nvlinkDomain and +1 when they share a NUMA
   node (a one-device claim gets both);
3. packing: binpack prefers nodes with the most devices already in use (fewest free), spread the
   fewest in use; measured before placement, so it is known before the allocator runs;
then the node name (ascending) breaks ties.

Finding the best node without running the allocator on every node: nodes are visited in order of
their packing key (then name), and components 1 and 2 have a known maximum for the claims. The
first feasible node that reaches that maximum wins outright, since every later node has an equal
or worse packing key. Nodes with fewer free devices than the claims need at least are skipped
without running the allocator. For typical claims (no firstAvailable fallbacks, one device or
topology-aligned devices) this evaluates one or a few nodes per placement, where kube-scheduler
filters a percentage of all nodes; the result is still the best node by the score above.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from controller.allocator import AllocationError, Allocator, Claim, ClusterSnapshot, Unschedulable
from controller.allocator.model import Constraint, Device
from gpudra import DEFAULT_DRIVER_NAME
from gpudra.features import Features

Policy = Literal["binpack", "spread"]
MAX_SUBREQUESTS = 8  # resourceapi.FirstAvailableDeviceRequestMaxSize: the top firstAvailable score
TOPOLOGY_ATTRIBUTES = ("nvlinkDomain", "numaNode")


@dataclass(frozen=True)
class Placement:
    node: str
    allocations: list[dict[str, Any]]
    score: tuple[int, int, int]


@dataclass
class NoPlacement:
    """No node fits; `reasons` maps the nodes that were tried to why not (nodes skipped by the free-device
    prefilter are listed with the reason too)."""

    reasons: dict[str, str] = field(default_factory=dict)


def min_devices(claims: Sequence[Claim]) -> int:
    """A lower bound of the devices the claims take out of the free pool (admin access takes none)."""
    total = 0
    for claim in claims:
        for entry in claim.requests:
            reqs = entry.subrequests or ((entry.exact,) if entry.exact else ())
            counts = [0 if (r.admin or r.mode != "ExactCount") else max(r.count, 0) for r in reqs]
            total += min(counts) if counts else 0
    return total


def max_scores(claims: Sequence[Claim]) -> tuple[int, int]:
    prio = sum(MAX_SUBREQUESTS for c in claims for e in c.requests if e.subrequests)
    return prio, 2 * len(claims)


def prioritized_score(claims: Sequence[Claim], allocations: Sequence[Mapping[str, Any]]) -> int:
    score = 0
    for claim, alloc in zip(claims, allocations):
        chosen = {r["request"] for r in alloc["devices"]["results"]}
        for entry in claim.requests:
            if not entry.subrequests:
                continue
            for i, sub in enumerate(entry.subrequests):
                if sub.full_name in chosen:
                    score += MAX_SUBREQUESTS - i
                    break
    return score


class Placer:
    """Places claims on the best node of a snapshot, one placement after another."""

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        features: Features | None = None,
        cel_env: Any = None,
        policy: Policy = "binpack",
        topology_domain: str = DEFAULT_DRIVER_NAME,
    ) -> None:
        self.snapshot = snapshot
        self.topology_domain = topology_domain
        self._groups: dict[str, tuple[int, ...]] = {}  # node -> largest free group per topology attribute
        self.features = features or Features()
        self.allocator = Allocator(snapshot, self.features, cel_env)
        self.policy = policy
        self._totals: dict[str, tuple[int, int]] = {}  # node -> (devices, in use)
        self._index: dict[tuple[str, str, str], Device] = {}
        # Shared devices (DRAConsumableCapacity) may fill several slots, so free counts bound nothing then.
        self._prefilter = not self.features.consumable_capacity

    # ---- per-node device counts ------------------------------------------------------------------

    def _counts(self, node: str) -> tuple[int, int]:
        found = self._totals.get(node)
        if found is None:
            total = used = 0
            allocated = self.snapshot.allocated
            for pool in self.snapshot.pools(node, self.features):
                for sl in pool.slices:
                    for dev in sl.devices:
                        total += 1
                        if (sl.driver, sl.pool, dev.name) in allocated:
                            used += 1
            found = (total, used)
            self._totals[node] = found
        return found

    def commit(self, claim_keys: Sequence[str], allocations: Sequence[Mapping[str, Any]], node: str) -> None:
        """Hold the devices of a placement for the placements that follow."""
        touches_other_nodes = False
        for key, alloc in zip(claim_keys, allocations):
            before = len(self.snapshot.allocated)
            self.snapshot.commit(key, alloc)
            added = len(self.snapshot.allocated) - before
            own = all(self._slice_node(r) == node for r in alloc["devices"]["results"])
            if own and node in self._totals:
                total, used = self._totals[node]
                self._totals[node] = (total, used + added)
            elif added:
                touches_other_nodes = True
            self._groups.pop(node, None)
        if touches_other_nodes:
            self._totals.clear()
            self._groups.clear()

    def _slice_node(self, result: Mapping[str, Any]) -> str | None:
        if not self._index:
            for sl in self.snapshot.slices:
                for d in sl.devices:
                    self._index[(sl.driver, sl.pool, d.name)] = d
        dev = self._index.get((result["driver"], result["pool"], result["device"]))
        return dev.slice.node_name if dev is not None and not dev.slice.per_device else None

    # ---- scoring ---------------------------------------------------------------------------------

    def _packing(self, node: str) -> int:
        total, used = self._counts(node)
        free = total - used
        return -free if self.policy == "binpack" else free

    def topology_score(self, allocations: Sequence[Mapping[str, Any]]) -> int:
        if not self._index:
            self._slice_node({"driver": "", "pool": "", "device": ""})
        score = 0
        for alloc in allocations:
            devices = [self._index.get((r["driver"], r["pool"], r["device"])) for r in alloc["devices"]["results"]
                       if not r.get("adminAccess")]
            for attr in ("nvlinkDomain", "numaNode"):
                values = {d.attribute(f"{d.slice.driver}/{attr}") if d else None for d in devices}
                if len(devices) <= 1 or (len(values) == 1 and None not in values):
                    score += 1
        return score

    def _largest_groups(self, node: str) -> tuple[int, ...]:
        """Per topology attribute: the most free devices of the node that share one value (an upper bound
        of what any allocation on the node can align)."""
        found = self._groups.get(node)
        if found is None:
            allocated = self.snapshot.allocated
            counters: list[Counter[Any]] = [Counter() for _ in TOPOLOGY_ATTRIBUTES]
            for pool in self.snapshot.pools(node, self.features):
                for sl in pool.slices:
                    for dev in sl.devices:
                        if (sl.driver, sl.pool, dev.name) in allocated:
                            continue
                        for i, attr in enumerate(TOPOLOGY_ATTRIBUTES):
                            value = dev.attribute(f"{sl.driver}/{attr}")
                            if value is not None:
                                counters[i][(sl.driver, value)] += 1
            found = tuple(max(c.values(), default=0) for c in counters)
            self._groups[node] = found
        return found

    def _topology_bound(self, node: str, needs: Sequence[int]) -> int:
        groups = self._largest_groups(node)
        return sum(1 for n in needs for g in groups if n <= 1 or g >= n)

    def _variants(self, claims: Sequence[Claim]) -> list[list[Claim]]:
        """The claims with extra matchAttribute constraints that align devices (NVLink domain and NUMA node, then
        NVLink domain only), before the claims as written: any solution of a variant is a solution of the
        claims, so this only prefers aligned solutions among valid ones."""
        eligible = [min_devices([c]) > 1 and all(e.exact is None or e.exact.mode == "ExactCount" for e in c.requests)
                    and all(s.mode == "ExactCount" for e in c.requests for s in e.subrequests) for c in claims]
        if not any(eligible):
            return [list(claims)]
        out: list[list[Claim]] = []
        for attrs in (TOPOLOGY_ATTRIBUTES, TOPOLOGY_ATTRIBUTES[:1]):
            extra = tuple(Constraint("match", f"{self.topology_domain}/{a}", frozenset()) for a in attrs)
            out.append([replace(c, constraints=c.constraints + extra) if ok else c for c, ok in zip(claims, eligible)])
        out.append(list(claims))
        return out

    def _allocate(self, node: str, variants: list[list[Claim]]) -> list[dict[str, Any]] | Unschedulable:
        for variant in variants[:-1]:
            try:
                outcome = self.allocator.allocate(node, variant)
            except AllocationError:
                break  # the claims as written report their own error below
            if not isinstance(outcome, Unschedulable):
                return outcome
        return self.allocator.allocate(node, variants[-1])

    def place(self, claims: Sequence[Claim], nodes: Iterable[str] | None = None) -> Placement | NoPlacement:
        """Best node for the claims together (one Filter call per node). Raises AllocationError when fatal."""
        names = list(nodes) if nodes is not None else self.snapshot.node_names
        need = min_devices(claims)
        top_prio, top_topo = max_scores(claims)
        order = sorted(names, key=lambda n: (-self._packing(n), n))
        needs = [min_devices([c]) for c in claims]
        variants = self._variants(claims)
        best: Placement | None = None
        failure = NoPlacement()
        for name in order:
            total, used = self._counts(name)
            if self._prefilter and total - used < need:
                failure.reasons[name] = f"only {total - used} free devices, the claims need at least {need}"
                continue
            if best is not None and (top_prio, self._topology_bound(name, needs)) <= best.score[:2]:
                continue  # cannot beat the best node found so far, which also packs better
            outcome = self._allocate(name, variants)
            if isinstance(outcome, Unschedulable):
                failure.reasons[name] = outcome.reason
                continue
            score = (prioritized_score(claims, outcome), self.topology_score(outcome), self._packing(name))
            if best is None or score[:2] > best.score[:2]:
                best = Placement(name, outcome, score)
            if best.score[:2] == (top_prio, top_topo):
                break
        return best if best is not None else failure


__all__ = ["AllocationError", "NoPlacement", "Placement", "Placer", "Policy", "max_scores", "min_devices"]
