"""Gathering the resource pools a node can use (Kubernetes' GatherPools, 1.35)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.allocator.model import Slice
from controller.allocator.nodes import Node, node_matches
from gpudra.features import Features


@dataclass(eq=False)
class Pool:
    driver: str
    name: str
    incomplete: bool = False
    invalid: bool = False
    invalid_reason: str = ""
    slices: list[Slice] = field(default_factory=list)  # device slices that target the node
    other_slices: list[Slice] = field(default_factory=list)  # same pool, not targeting the node (counters)
    counter_sets: dict[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.driver}/{self.name}"

    @property
    def has_binding_conditions(self) -> bool:
        return any(s.has_binding_conditions for s in self.slices)


def binding_enabled(features: Features) -> bool:
    # Kubernetes' DeviceBindingAndStatus: both gates are needed.
    return features.device_binding_conditions and features.resource_claim_device_status


def gather_pools(
    node: Node,
    candidates: Iterable[Slice],
    pool_slices: Mapping[tuple[str, str], Sequence[Slice]],
    features: Features,
) -> list[Pool]:
    """`candidates` are the slices that may target the node, in input order; `pool_slices` indexes all slices
    by (driver, pool) for the completeness check. Pools come back sorted by (driver, pool name), pools with
    binding conditions last (Kubernetes iterates a map here; sorting makes the search deterministic)."""
    by_pool: dict[tuple[str, str], list[Slice]] = {}
    late: list[Slice] = []
    binding = binding_enabled(features)
    for sl in candidates:
        if not features.partitionable_devices and (sl.per_device or sl.shared_counters):
            continue
        if sl.shared_counters:
            _add(by_pool, sl)
            continue
        if sl.node_name or sl.all_nodes or sl.node_selector is not None:
            matched = node_matches(node, sl.node_name, sl.all_nodes, sl.node_selector)
        elif sl.per_device:
            matched = any(node_matches(node, d.node_name, d.all_nodes, d.node_selector) for d in sl.devices)
        else:
            matched = False  # some future, unknown node selection: skip the slice
        if not matched:
            continue
        if binding and sl.has_binding_conditions:
            late.append(sl)
        else:
            _add(by_pool, sl)
    for sl in late:
        _add(by_pool, sl)

    result: list[Pool] = []
    for key in sorted(by_pool):
        slices = by_pool[key]
        count = slices[0].slice_count
        if len(slices) == count:
            result.append(_build(key, slices, features, None))
            continue
        obsolete, all_slices = _check_pool(pool_slices.get(key, ()), slices[0].generation)
        if obsolete:
            continue
        if len(all_slices) != count:
            result.append(Pool(key[0], key[1], incomplete=True))
            continue
        result.append(_build(key, slices, features, all_slices))
    if binding:
        result.sort(key=lambda p: p.has_binding_conditions)  # stable: keeps name order within each group
    return result


def _add(by_pool: dict[tuple[str, str], list[Slice]], sl: Slice) -> None:
    key = (sl.driver, sl.pool)
    current = by_pool.get(key)
    if current is None or sl.generation > current[0].generation:
        by_pool[key] = [sl]
    elif sl.generation == current[0].generation:
        current.append(sl)


def _check_pool(all_slices: Sequence[Slice], generation: int) -> tuple[bool, list[Slice]]:
    same: list[Slice] = []
    for sl in all_slices:
        if sl.generation == generation:
            same.append(sl)
        elif sl.generation > generation:
            return True, []
    return False, same


def _build(key: tuple[str, str], slices: list[Slice], features: Features, all_slices: list[Slice] | None) -> Pool:
    driver, name = key
    # 1.37's allocator searches a pool's slices sorted by name (before it, Go's map order: any order), so that a
    # driver can steer the first-fit search by how it names its slices.
    slices = sorted(slices, key=lambda s: s.name)
    if features.partitionable_devices:
        device_slices = [s for s in slices if not s.shared_counters]
        counter_slices = [s for s in slices if s.shared_counters]
    else:
        device_slices, counter_slices = slices, []
    seen: set[str] = set()
    for sl in device_slices:
        for d in sl.devices:
            if d.name in seen:
                return Pool(driver, name, invalid=True, invalid_reason=f"duplicate device name {d.name}")
            seen.add(d.name)
    if not features.partitionable_devices:
        return Pool(driver, name, slices=device_slices)
    counter_sets: dict[str, Mapping[str, Any]] = {}
    for sl in counter_slices:
        for set_name, counters in sl.shared_counters:
            if set_name in counter_sets:
                return Pool(driver, name, invalid=True, invalid_reason=f"duplicate counter set name {set_name}")
            counter_sets[set_name] = counters
    reason = _check_consumption(counter_sets, slices)
    if reason:
        return Pool(driver, name, invalid=True, invalid_reason=reason)
    if all_slices is None or len(slices) == len(all_slices):
        return Pool(driver, name, slices=device_slices, counter_sets=counter_sets)
    taken = {id(s) for s in slices}
    others = [s for s in all_slices if id(s) not in taken]
    reason = _check_consumption(counter_sets, others)
    if reason:
        return Pool(driver, name, invalid=True, invalid_reason=reason)
    return Pool(driver, name, slices=device_slices, other_slices=others, counter_sets=counter_sets)


def _check_consumption(counter_sets: Mapping[str, Mapping[str, Any]], slices: Iterable[Slice]) -> str:
    for sl in slices:
        for d in sl.devices:
            for set_name, counters in d.consumes_counters:
                cs = counter_sets.get(set_name)
                if cs is None:
                    return f"counter set {set_name} not found"
                for counter in counters:
                    if counter not in cs:
                        return f"counter {counter} not found in counter set {set_name}"
    return ""
