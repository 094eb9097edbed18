"""Building the allocator's ClusterSnapshot from the caches without letting one bad object stop the rest."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from controller import objects as o
from controller.allocator import AllocationError, ClusterSnapshot, Node
from controller.allocator.model import parse_class, parse_slice
from controller.view import View

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
    slices = view.sorted_slices()
    classes = [view.classes[k] for k in sorted(view.classes)]
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
