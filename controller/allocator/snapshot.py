"""The cluster state one or many allocations run against: slices, classes, nodes and what is in use."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from controller.allocator.errors import AllocationError
from controller.allocator.model import DeviceClass, DeviceID, Slice, parse_class, parse_slice
from controller.allocator.nodes import Node
from controller.allocator.pools import Pool, gather_pools
from controller.objects import claim_key
from gpudra.features import Features


class ClusterSnapshot:
    """Parsed once; pools are gathered once per (node, feature set) and reused.

    `commit()` records a new allocation so that later placements see its devices in use, `release()` takes
    one back (a claim deallocated or deleted); slices, classes and nodes are immutable after construction.
    """

    def __init__(
        self,
        slices: Iterable[Mapping[str, Any]],
        classes: Iterable[Mapping[str, Any]],
        allocated_claims: Iterable[Mapping[str, Any]] = (),
        nodes: Iterable[Mapping[str, Any] | Node] | None = None,
    ) -> None:
        self.slices: list[Slice] = [parse_slice(s, i) for i, s in enumerate(slices)]
        self.classes: dict[str, DeviceClass] = {}
        for c in classes:
            dc = parse_class(c)
            self.classes[dc.name] = dc
        node_list = [n if isinstance(n, Node) else Node.from_dict(n) for n in (nodes or ())]
        if not node_list:
            # Offline inputs often carry no Node objects: the nodes are those the slices name.
            names = dict.fromkeys(s.node_name for s in self.slices if s.node_name)
            for s in self.slices:
                for d in s.devices:
                    if d.node_name:
                        names.setdefault(d.node_name, None)
            node_list = [Node.inferred(n) for n in names]
        self.nodes: dict[str, Node] = {n.name: n for n in node_list}
        self.node_names: list[str] = sorted(self.nodes)
        self._by_node: dict[str, list[Slice]] = {}
        self._global: list[Slice] = []
        self.pool_slices: dict[tuple[str, str], list[Slice]] = {}
        for s in self.slices:
            self.pool_slices.setdefault((s.driver, s.pool), []).append(s)
            if s.node_name and not s.shared_counters:
                self._by_node.setdefault(s.node_name, []).append(s)
            else:
                self._global.append(s)
        self.allocated: set[DeviceID] = set()
        # Consumed capacity of shared devices (DRAConsumableCapacity): device -> capacity name -> [quantity text].
        self.shared_consumed: dict[DeviceID, list[Mapping[str, Any]]] = {}
        self.allocated_by: dict[DeviceID, str] = {}
        # Devices held through at least one share (shareID): they consume their counters like dedicated ones.
        self.shared_allocated: set[DeviceID] = set()
        for claim in allocated_claims:
            alloc = ((claim.get("status") or {}).get("allocation")) or {}
            self.commit(claim_key(claim), alloc)
        self._pools: dict[tuple[str, Features], list[Pool]] = {}
        self.selector_cache: dict[tuple[int, str], bool | AllocationError] = {}
        # (device uid, fractional ranges on) -> whether a request for no capacity fits the idle device.
        self.idle_capacity_fits: dict[tuple[int, bool], bool] = {}

    def node(self, name: str) -> Node:
        node = self.nodes.get(name)
        if node is None:
            raise KeyError(name)
        return node

    def candidate_slices(self, node_name: str) -> list[Slice]:
        own = self._by_node.get(node_name, [])
        if not self._global:
            return own
        return sorted([*own, *self._global], key=lambda s: s.order)

    def pools(self, node_name: str, features: Features) -> list[Pool]:
        key = (node_name, features)
        found = self._pools.get(key)
        if found is None:
            found = gather_pools(self.node(node_name), self.candidate_slices(node_name), self.pool_slices, features)
            self._pools[key] = found
        return found

    def commit(self, owner: str, allocation: Mapping[str, Any]) -> None:
        """Mark the devices of an allocation result as in use (adminAccess results never are)."""
        for did, r in _counted_results(allocation):
            if r.get("shareID"):
                if r.get("consumedCapacity"):
                    self.shared_consumed.setdefault(did, []).append(r["consumedCapacity"])
                self.shared_allocated.add(did)
                self.allocated_by.setdefault(did, owner)
                continue
            self.allocated.add(did)
            self.allocated_by[did] = owner

    def release(self, owner: str, allocation: Mapping[str, Any]) -> None:
        """Undo `commit(owner, allocation)`: the devices of that allocation are free again."""
        for did, r in _counted_results(allocation):
            if r.get("shareID"):
                consumed = self.shared_consumed.get(did)
                if consumed and r.get("consumedCapacity") in consumed:
                    consumed.remove(r["consumedCapacity"])
                    if not consumed:
                        del self.shared_consumed[did]
            else:
                self.allocated.discard(did)
            if self.allocated_by.get(did) == owner:
                del self.allocated_by[did]

    def forget_device_views(self) -> None:
        """Drop the devices' CEL views (about 7 KB each). Selector results stay cached per (device, expression), so
        a view is only rebuilt for an expression not evaluated on that device yet; a long-lived snapshot calls
        this between passes so that it does not keep a view of every device it ever looked at."""
        for sl in self.slices:
            for dev in sl.devices:
                dev._view = None


def _counted_results(allocation: Mapping[str, Any]) -> Iterator[tuple[DeviceID, Mapping[str, Any]]]:
    """(driver, pool, device) and the result, for each result of an allocation that holds its device (adminAccess
    results never do)."""
    for r in ((allocation.get("devices") or {}).get("results")) or []:
        if isinstance(r, Mapping) and not r.get("adminAccess"):
            yield (str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", ""))), r
