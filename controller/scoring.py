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
or worse packing key; so does the first that reaches the best topology bound any node has (kept
as a count of nodes per largest-free-groups shape). Nodes with fewer free devices than the claims
need at least are never visited: the order is kept in buckets by free-device count, current across
commits, so a placement costs in proportion to the nodes it looks at, not to the cluster's size. For typical claims (no firstAvailable fallbacks, one device or
topology-aligned devices) this evaluates one or a few nodes per placement, where kube-scheduler
filters a percentage of all nodes; the result is still the best node by the score above.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from controller.allocator import AllocationError, Allocator, Claim, ClusterSnapshot, Unschedulable
from controller.allocator.model import UNKNOWN_ATTRIBUTE, Constraint, Device
from gpudra import DEFAULT_DRIVER_NAME
from gpudra.features import Features

Policy = Literal["binpack", "spread"]
MAX_SUBREQUESTS = 8  # resourceapi.FirstAvailableDeviceRequestMaxSize: the top firstAvailable score
TOPOLOGY_ATTRIBUTES = ("nvlinkDomain", "numaNode")
UNBOUNDED = 1 << 30


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


class _NodeOrder:
    """Nodes bucketed by their free-device count, names sorted within a bucket: the packing order of
    `Placer.place` kept current as allocations change instead of sorted for every claim. A placement
    visits buckets from the fewest free devices it can use (binpack) or the most (spread), so nodes
    that cannot fit the claims are never looked at."""

    def __init__(self) -> None:
        self.buckets: dict[int, list[str]] = {}
        self.free: dict[str, int] = {}

    def put(self, node: str, free: int) -> None:
        old = self.free.get(node)
        if old == free:
            return
        if old is not None:
            self._unbucket(node, old)
        self.free[node] = free
        insort(self.buckets.setdefault(free, []), node)

    def remove(self, node: str) -> None:
        free = self.free.pop(node, None)
        if free is not None:
            self._unbucket(node, free)

    def _unbucket(self, node: str, free: int) -> None:
        bucket = self.buckets[free]
        del bucket[bisect_left(bucket, node)]
        if not bucket:
            del self.buckets[free]

    def walk(self, policy: Policy, least: int | None) -> Iterator[str]:
        """Nodes in packing order (then name), only those with at least `least` free devices (None: all)."""
        keys = sorted(k for k in self.buckets if least is None or k >= least)
        if policy != "binpack":
            keys.reverse()
        for key in keys:
            yield from self.buckets[key]


class Placer:
    """Places claims on the best node of a snapshot, one placement after another.

    Per node it keeps the device counts and the largest free topology groups, and the node order by
    packing key, current across `commit()`; `invalidate()` drops them when the snapshot changed by other
    means (slices, nodes, allocations made elsewhere)."""

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
        # node -> attributes -> the most free devices sharing one value of each (see _shared_free)
        self._shared: dict[str, dict[tuple[str, ...], int]] = {}
        # node -> claims' signature -> why they did not fit: the allocator is deterministic, so the same claims
        # on an unchanged node fail the same way (a node changes only through commit() or invalidate()).
        self._failed: dict[str, dict[str, str]] = {}
        # Counter sets may be shared by the devices of several nodes: then any commit may change any node.
        self._nodes_independent = not any(sl.shared_counters for sl in snapshot.slices)
        self.features = features or Features()
        self.allocator = Allocator(snapshot, self.features, cel_env)
        self.policy = policy
        self._totals: dict[str, tuple[int, int]] = {}  # node -> (devices, in use)
        self._index: dict[tuple[str, str, str], Device] = {}
        self._order: _NodeOrder | None = None
        # How many nodes have each largest-groups tuple: bounds the topology score any node can reach.
        self._group_counts: Counter[tuple[int, ...]] | None = None
        self._prefilter = self._counts_bound()

    def invalidate(self, nodes: Iterable[str] | None = None) -> None:
        """Forget what is kept about `nodes` (None: every node, and the device index) after the snapshot changed."""
        if nodes is None:
            self._totals.clear()
            self._groups.clear()
            self._shared.clear()
            self._failed.clear()
            self._nodes_independent = not any(sl.shared_counters for sl in self.snapshot.slices)
            self._prefilter = self._counts_bound()
            self._index.clear()
            self._order = None
            self._group_counts = None
            return
        for node in nodes:
            self._totals.pop(node, None)
            self._forget_groups(node)
            if self._order is not None:
                if node in self.snapshot.nodes:
                    self._order.put(node, self._free(node))
                else:
                    self._order.remove(node)

    def _counts_bound(self) -> bool:
        """Whether a node's free-device count bounds what it can take: not when some device may be allocated
        several times (DRAConsumableCapacity's allowMultipleAllocations), since one device may then fill several
        requests and an allocated one may still be free."""
        if not self.features.consumable_capacity:
            return True
        return not any(d.allow_multiple for sl in self.snapshot.slices for d in sl.devices)

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

    def _free(self, node: str) -> int:
        total, used = self._counts(node)
        return total - used

    def _node_order(self) -> _NodeOrder:
        if self._order is None:
            order = _NodeOrder()
            for name in self.snapshot.node_names:
                order.put(name, self._free(name))
            self._order = order
        return self._order

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
        if not self._nodes_independent:
            self._failed.clear()
        if touches_other_nodes:
            self._totals.clear()
            self._groups.clear()
            self._shared.clear()
            self._failed.clear()
            self._order = None
            self._group_counts = None
            return
        self._forget_groups(node)
        if self._order is not None and node in self._order.free:
            self._order.put(node, self._free(node))

    def node_of(self, result: Mapping[str, Any]) -> str | None:
        """The node whose own slice holds the device of an allocation result; None when the device is not
        local to one node (or unknown)."""
        return self._slice_node(result)

    def _slice_node(self, result: Mapping[str, Any]) -> str | None:
        if not self._index:
            for sl in self.snapshot.slices:
                for d in sl.devices:
                    self._index[(sl.driver, sl.pool, d.name)] = d
        dev = self._index.get((result.get("driver"), result.get("pool"), result.get("device")))  # type: ignore[arg-type]
        return dev.slice.node_name if dev is not None and not dev.slice.per_device else None

    # ---- scoring ---------------------------------------------------------------------------------

    def _packing(self, node: str) -> int:
        free = self._free(node)
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
            if self._group_counts is not None:
                self._group_counts[found] += 1
        return found

    def _forget_groups(self, node: str) -> None:
        self._shared.pop(node, None)
        self._failed.pop(node, None)
        found = self._groups.pop(node, None)
        if found is not None and self._group_counts is not None:
            self._group_counts[found] -= 1
            if self._group_counts[found] <= 0:
                del self._group_counts[found]
        if self._group_counts is not None and node in self.snapshot.nodes:
            self._largest_groups(node)  # keep the counts complete

    def _topology_bound(self, node: str, needs: Sequence[int]) -> int:
        return _bound(self._largest_groups(node), needs)

    def _best_bound(self, needs: Sequence[int]) -> int:
        """The highest topology bound of any node: once a placement reaches it, no other node can beat it."""
        if self._group_counts is None:
            self._group_counts = Counter()
            self._groups.clear()
            for name in self.snapshot.node_names:
                self._largest_groups(name)
        return max((_bound(g, needs) for g in self._group_counts), default=0)

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

    def _shared_free(self, node: str, attrs: tuple[str, ...]) -> int:
        """The most free devices of the node that share one value of each of `attrs` (looked up as the
        allocator's matchAttribute does): an upper bound of the devices that constraints on them can take.
        Unbounded when a value cannot be counted (an attribute of unknown type is the allocator's to report)."""
        cache = self._shared.setdefault(node, {})
        found = cache.get(attrs)
        if found is None:
            counts: Counter[tuple[Any, ...]] = Counter()
            allocated = self.snapshot.allocated
            try:
                for pool in self.snapshot.pools(node, self.features):
                    for sl in pool.slices:
                        for dev in sl.devices:
                            if (sl.driver, sl.pool, dev.name) in allocated:
                                continue
                            values = tuple(dev.attribute(a) for a in attrs)
                            if None in values:
                                continue
                            if UNKNOWN_ATTRIBUTE in values:
                                raise TypeError(attrs)
                            counts[values] += 1
                found = max(counts.values(), default=0)
            except TypeError:
                found = UNBOUNDED
            cache[attrs] = found
        return found

    def _cannot_fit(self, node: str, scopes: Sequence[tuple[tuple[str, ...], int]]) -> bool:
        return any(need > self._shared_free(node, attrs) for attrs, need in scopes)

    def _allocate(self, node: str, variants: list[list[Claim]],
                  scopes: Sequence[Sequence[tuple[tuple[str, ...], int]]] = ()) -> list[dict[str, Any]] | Unschedulable:
        for i, variant in enumerate(variants[:-1]):
            if i < len(scopes) and self._cannot_fit(node, scopes[i]):
                continue  # the aligned variant has no solution on this node: the search would fail
            try:
                outcome = self.allocator.allocate(node, variant)
            except AllocationError:
                break  # the claims as written report their own error below
            if not isinstance(outcome, Unschedulable):
                return outcome
        return self.allocator.allocate(node, variants[-1])

    def place(self, claims: Sequence[Claim], nodes: Iterable[str] | None = None) -> Placement | NoPlacement:
        """Best node for the claims together (one Filter call per node). Raises AllocationError when fatal.

        `nodes` limits the candidates (a set is used as is); nodes unknown to the snapshot are not candidates."""
        allowed: Container[str] | None = None
        if nodes is not None:
            allowed = nodes if isinstance(nodes, (set, frozenset)) else set(nodes)
        need = min_devices(claims)
        top_prio, top_topo = max_scores(claims)
        needs = [min_devices([c]) for c in claims]
        variants = self._variants(claims)
        # Our own alignment variants are skipped on nodes without enough free devices sharing the values they
        # ask for (a search that must fail); the claims as written always run, so errors surface as before.
        scopes = [match_scopes(v) for v in variants[:-1]] if self._prefilter else []
        signature = repr([(c.requests, c.constraints) for c in claims])
        order = self._node_order()
        best: Placement | None = None
        tried: dict[str, str] = {}
        reachable: int | None = None  # the best topology bound over all nodes, computed when first needed
        for name in order.walk(self.policy, need if self._prefilter else None):
            if allowed is not None and name not in allowed:
                continue
            if best is not None and (top_prio, self._topology_bound(name, needs)) <= best.score[:2]:
                continue  # cannot beat the best node found so far, which also packs better
            known = self._failed.get(name)
            if known is not None and signature in known:
                tried[name] = known[signature]
                continue
            outcome = self._allocate(name, variants, scopes)
            if isinstance(outcome, Unschedulable):
                tried[name] = outcome.reason
                self._failed.setdefault(name, {})[signature] = outcome.reason
                continue
            score = (prioritized_score(claims, outcome), self.topology_score(outcome), self._packing(name))
            if best is None or score[:2] > best.score[:2]:
                best = Placement(name, outcome, score)
            if best.score[0] == top_prio:
                if best.score[1] == top_topo:
                    break
                if reachable is None:
                    reachable = self._best_bound(needs)
                if best.score[1] >= reachable:
                    break  # every other node would be skipped by the bound check above
        if best is not None:
            return best
        failure = NoPlacement()
        for name in order.walk(self.policy, None):
            if allowed is not None and name not in allowed:
                continue
            free = order.free[name]
            if name in tried:
                failure.reasons[name] = tried[name]
            elif self._prefilter and free < need:
                failure.reasons[name] = f"only {free} free devices, the claims need at least {need}"
        return failure


def match_scopes(claims: Sequence[Claim]) -> list[tuple[tuple[str, ...], int]]:
    """Per claim and request scope of its matchAttribute constraints: the attributes whose values all devices of
    the scope must share, and a lower bound of how many free devices that takes (one device needs no sharing)."""
    out: list[tuple[tuple[str, ...], int]] = []
    for claim in claims:
        by_scope: dict[frozenset[str], list[str]] = {}
        for c in claim.constraints:
            if c.kind == "match":
                by_scope.setdefault(c.requests, []).append(c.attribute)
        for scope, attrs in by_scope.items():
            need = 0
            for entry in claim.requests:
                if scope and entry.name not in scope:
                    continue
                reqs = entry.subrequests or ((entry.exact,) if entry.exact else ())
                counts = [0 if (r.admin or r.mode != "ExactCount") else max(r.count, 0) for r in reqs]
                need += min(counts) if counts else 0
            if need > 1:
                out.append((tuple(sorted(set(attrs))), need))
    return out


def _bound(groups: tuple[int, ...], needs: Sequence[int]) -> int:
    return sum(1 for n in needs for g in groups if n <= 1 or g >= n)


__all__ = ["AllocationError", "NoPlacement", "Placement", "Placer", "Policy", "max_scores", "min_devices"]
