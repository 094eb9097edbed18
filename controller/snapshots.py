"""Building the allocator's ClusterSnapshot from the caches without letting one bad object stop the rest, and
keeping one current from the caches' deltas (LiveSnapshot)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from controller import objects as o
from controller.allocator import AllocationError, ClusterSnapshot, Node
from controller.allocator.model import parse_class, parse_slice
from controller.informer import Store
from controller.objects import Obj
from controller.scoring import Placer, Policy
from controller.view import View
from gpudra.features import Features

log = logging.getLogger("gpudra.controller.snapshots")


def _usable(
    items: Iterable[Mapping[str, Any]], parse: Callable[[Mapping[str, Any], int], object], problems: list[str]
) -> list[Mapping[str, Any]]:
    good = []
    for i, item in enumerate(items):
        try:
            parse(item, i)
        except AllocationError as err:
            problems.append(str(err))
            continue
        good.append(item)
    return good


def build_snapshot(view: View, allocated_claims: Iterable[Mapping[str, Any]]) -> tuple[ClusterSnapshot, list[str]]:
    """A snapshot over the view's slices, classes and nodes, with the given claims' devices in use.

    Objects the allocator cannot parse are left out (and reported), so a single malformed slice from some
    other driver does not stop placement everywhere.
    """
    problems: list[str] = []
    slices: Sequence[Mapping[str, Any]] = view.sorted_slices()
    classes: Sequence[Mapping[str, Any]] = [view.classes[k] for k in sorted(view.classes)]
    nodes: list[Node] = []
    for key in sorted(view.nodes):
        try:
            nodes.append(Node.from_dict(view.nodes[key]))
        except AllocationError as err:
            problems.append(str(err))
    allocated = [c for c in allocated_claims if o.allocation(c) is not None]
    try:
        snapshot = ClusterSnapshot(slices, classes, allocated, nodes=nodes or None)
    except AllocationError:
        slices = _usable(slices, parse_slice, problems)
        classes = _usable(classes, lambda item, _: parse_class(item), problems)
        snapshot = ClusterSnapshot(slices, classes, allocated, nodes=nodes or None)
    for problem in problems:
        log.warning("object left out of allocation", extra={"problem": problem})
    return snapshot, problems


# Changes to these rebuild the snapshot (DeviceTaintRules put taints on slices' devices).
STRUCTURE_KINDS = ("ResourceSlice", "DeviceClass", "Node", "DeviceTaintRule")


class LiveSnapshot:
    """The allocator snapshot and its Placer, kept current from the informer stores' deltas.

    Slices, classes, nodes and device taint rules change rarely: any change to them rebuilds the snapshot (and drops the selector
    cache, which is keyed by device). Claims change all the time: each changed claim's allocation is released
    and committed again on the snapshot, and only the nodes whose devices moved are re-indexed by the Placer,
    so a pass costs in proportion to what changed, not to the cluster. Allocations this controller makes go
    through `commit()` at once (before the watch brings them back, which is then a no-op).
    """

    def __init__(self, stores: Mapping[str, Store], features: Features, cel_env: Any, policy: Policy = "binpack") -> None:
        self._stores = stores
        self._features = features
        self._cel = cel_env
        self._policy = policy
        self._trackers = {kind: stores[kind].track() for kind in (*STRUCTURE_KINDS, "ResourceClaim") if kind in stores}
        self._snapshot: ClusterSnapshot | None = None
        self._placer: Placer | None = None
        self._held: dict[str, Mapping[str, Any]] = {}  # claim key -> the allocation the snapshot holds for it
        self.rebuilds = 0
        # The Node objects the current snapshot was built from (a Node change rebuilds it), by name.
        self.nodes: dict[str, Obj] = {}

    @property
    def cel_env(self) -> Any:
        return self._cel

    def current(self) -> tuple[ClusterSnapshot, Placer]:
        """The snapshot with every change seen by the stores so far applied."""
        structural = False
        for kind in STRUCTURE_KINDS:
            tracker = self._trackers.get(kind)
            if tracker is not None and self._stores[kind].drain(tracker):
                structural = True
        claims_tracker = self._trackers.get("ResourceClaim")
        changed = self._stores["ResourceClaim"].drain(claims_tracker) if claims_tracker is not None else set()
        if self._snapshot is None or self._placer is None or structural:
            return self._rebuild()
        snapshot, placer = self._snapshot, self._placer
        snapshot.forget_device_views()
        store = self._stores["ResourceClaim"]
        moved: list[Mapping[str, Any]] = []
        for key in changed:
            claim = store.get(key)
            alloc = o.allocation(claim) if claim is not None else None
            old = self._held.get(key)
            if old == alloc:
                continue
            if old is not None:
                moved.append(old)
                snapshot.release(key, old)
                del self._held[key]
            if alloc is not None:
                moved.append(alloc)
                snapshot.commit(key, alloc)
                self._held[key] = alloc
        self._reindex(placer, moved)
        return snapshot, placer

    @staticmethod
    def _reindex(placer: Placer, moved: Iterable[Mapping[str, Any]]) -> None:
        """Tell the Placer which nodes' devices moved (all of them when a result names no node it knows)."""
        touched: set[str] = set()
        for alloc in moved:
            for r in (alloc.get("devices") or {}).get("results") or []:
                node = placer.node_of(r) if isinstance(r, Mapping) else None
                if node is None:
                    placer.invalidate()
                    return
                touched.add(node)
        if touched:
            placer.invalidate(touched)

    def release(self, claim_keys: Iterable[str]) -> None:
        """Give back what `commit` holds for these claims (their writes did not happen). A claim the API does show
        allocated after all comes back through the stores' deltas on the next `current()`."""
        if self._snapshot is None or self._placer is None:
            return
        moved = []
        for key in claim_keys:
            old = self._held.pop(key, None)
            if old is not None:
                self._snapshot.release(key, old)
                moved.append(old)
        self._reindex(self._placer, moved)

    def commit(self, claim_keys: Sequence[str], allocations: Sequence[Mapping[str, Any]], node: str) -> None:
        """Record allocations this controller is writing (the Placer holds their devices from now on)."""
        if self._placer is None:
            return
        self._placer.commit(claim_keys, allocations, node)
        for key, alloc in zip(claim_keys, allocations):
            self._held[key] = alloc

    def _rebuild(self) -> tuple[ClusterSnapshot, Placer]:
        def grab(kind: str) -> dict[str, Obj]:
            store = self._stores.get(kind)
            return store.by_key() if store is not None else {}

        view = View(claims=grab("ResourceClaim"), slices=grab("ResourceSlice"), classes=grab("DeviceClass"),
                    nodes=grab("Node"), taint_rules=grab("DeviceTaintRule"))
        allocated = view.allocated_claims()
        snapshot, _ = build_snapshot(view, allocated)
        self._snapshot = snapshot
        self.nodes = {o.name(n): n for n in view.nodes.values()}
        self._placer = Placer(snapshot, self._features, self._cel, self._policy)
        self._held = {o.key(c): alloc for c in allocated if (alloc := o.allocation(c)) is not None}
        self.rebuilds += 1
        return snapshot, self._placer
