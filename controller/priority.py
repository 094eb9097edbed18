"""The order in which the embedded scheduler considers pending pods: PriorityClass value, then age."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from controller import objects as o
from controller.objects import Obj


def priority_values(priority_classes: Iterable[Mapping[str, Any]]) -> tuple[dict[str, int], int]:
    """PriorityClass name -> value, and the value of the globalDefault class (0 without one)."""
    values: dict[str, int] = {}
    default = 0
    for pc in priority_classes:
        value = pc.get("value")
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        values[o.name(pc)] = value
        if pc.get("globalDefault") is True:
            default = value
    return values, default


def pod_priority(pod: Mapping[str, Any], values: Mapping[str, int], default: int) -> int:
    spec = o.section(pod, "spec")
    explicit = spec.get("priority")
    if isinstance(explicit, int) and not isinstance(explicit, bool):
        return explicit  # set by the Priority admission plugin on a real API server
    class_name = spec.get("priorityClassName")
    if class_name:
        return values.get(str(class_name), default)
    return default


def scheduling_order(pods: Iterable[Mapping[str, Any]], priority_classes: Iterable[Mapping[str, Any]]) -> list[Obj]:
    """Highest priority first; ties by creation time, then namespace/name (deterministic)."""
    values, default = priority_values(priority_classes)
    return sorted(
        (dict(p) for p in pods),
        key=lambda p: (-pod_priority(p, values, default), str(o.meta(p).get("creationTimestamp") or ""), o.key(p)),
    )
