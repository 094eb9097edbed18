"""Pod priority as the embedded scheduler orders pending pods by it (sim.roles.schedqueue): the PriorityClass
values, and a pod's priority from them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from controller import objects as o


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
