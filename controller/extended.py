"""Pods that ask for the legacy extended resource `nvidia.com/gpu` (the device plugin path, no DRA claims).

A node's capacity is `status.allocatable["nvidia.com/gpu"]` (what its node agent's device plugin reports)
minus what pods already bound to it request.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from controller import objects as o
from controller.objects import EXTENDED_GPU_RESOURCE
from gpudra.quantity import Quantity


def _amount(raw: Any) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    try:
        quantity = Quantity.parse(str(raw))
    except ValueError:
        return 0
    return quantity.as_int() if quantity.is_integer() else 0


def _container_request(container: Mapping[str, Any], resource: str) -> int:
    resources = o.section(container, "resources")
    # For extended resources a limit implies an equal request.
    for part in ("requests", "limits"):
        value = o.section(resources, part).get(resource)
        if value is not None:
            return _amount(value)
    return 0


def pod_request(pod: Mapping[str, Any], resource: str = EXTENDED_GPU_RESOURCE) -> int:
    """Effective request: the larger of the containers' sum and any single init container."""
    spec = o.section(pod, "spec")
    regular = sum(_container_request(c, resource) for c in o.list_field(spec, "containers") if isinstance(c, Mapping))
    init = max(
        (_container_request(c, resource) for c in o.list_field(spec, "initContainers") if isinstance(c, Mapping)),
        default=0,
    )
    return max(regular, init)


def node_allocatable(node: Mapping[str, Any], resource: str = EXTENDED_GPU_RESOURCE) -> int:
    raw = o.section(o.section(node, "status"), "allocatable").get(resource)
    return 0 if raw is None else _amount(raw)


def free_by_node(
    nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], resource: str = EXTENDED_GPU_RESOURCE
) -> dict[str, int]:
    free = {o.name(n): node_allocatable(n, resource) for n in nodes}
    for pod in pods:
        node_name = o.section(pod, "spec").get("nodeName")
        if node_name in free and not o.pod_done(pod):
            free[str(node_name)] -= pod_request(pod, resource)
    return free
