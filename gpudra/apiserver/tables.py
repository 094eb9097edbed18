"""Server-side printing (`meta.k8s.io/v1` Table) so `kubectl get` shows useful columns."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from gpudra.apiserver.resources import ResourceType

Column = tuple[str, str, int, Callable[[dict[str, Any]], Any]]  # name, type, priority, cell


def wants_table(accept: str | None) -> bool:
    return bool(accept) and "as=Table" in accept  # type: ignore[operator]


def human_age(created: str | None, now: datetime | None = None) -> str:
    if not created:
        return "<unknown>"
    try:
        then = datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return "<invalid>"
    seconds = int(((now or datetime.now(timezone.utc)) - then).total_seconds())
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 48:
        return f"{hours}h{minutes % 60}m" if hours < 8 and minutes % 60 else f"{hours}h"
    return f"{hours // 24}d"


def _get(obj: dict[str, Any], *path: str) -> Any:
    cur: Any = obj
    for p in path:
        cur = cur.get(p) if isinstance(cur, dict) else None
    return cur


def _pod_ready(pod: dict[str, Any]) -> str:
    containers = _get(pod, "spec", "containers") or []
    statuses = _get(pod, "status", "containerStatuses") or []
    ready = sum(1 for s in statuses if isinstance(s, dict) and s.get("ready"))
    return f"{ready}/{len(containers)}"


def _pod_restarts(pod: dict[str, Any]) -> int:
    return sum(int(s.get("restartCount") or 0) for s in _get(pod, "status", "containerStatuses") or []
               if isinstance(s, dict))


def _claim_state(claim: dict[str, Any]) -> str:
    if _get(claim, "metadata", "deletionTimestamp"):
        return "deleted"
    allocated = _get(claim, "status", "allocation") is not None
    reserved = bool(_get(claim, "status", "reservedFor"))
    if allocated and reserved:
        return "allocated,reserved"
    return "allocated" if allocated else "pending"


def _or_none(value: Any) -> Any:
    return "<none>" if value in (None, "") else value


_EXTRA: dict[str, list[Column]] = {
    "Pod": [
        ("Ready", "string", 0, _pod_ready),
        ("Status", "string", 0, lambda o: _get(o, "status", "phase") or "Unknown"),
        ("Restarts", "integer", 0, _pod_restarts),
        ("Node", "string", 1, lambda o: _or_none(_get(o, "spec", "nodeName"))),
    ],
    "Node": [
        ("Status", "string", 0, lambda o: next((("Ready" if c.get("status") == "True" else "NotReady")
                                                for c in _get(o, "status", "conditions") or []
                                                if isinstance(c, dict) and c.get("type") == "Ready"), "Unknown")),
    ],
    "Namespace": [("Status", "string", 0, lambda o: _get(o, "status", "phase") or "Active")],
    "ResourceSlice": [
        ("Node", "string", 0, lambda o: _or_none(_get(o, "spec", "nodeName"))),
        ("Driver", "string", 0, lambda o: _get(o, "spec", "driver")),
        ("Pool", "string", 0, lambda o: _get(o, "spec", "pool", "name")),
        ("Devices", "integer", 1, lambda o: len(_get(o, "spec", "devices") or [])),
    ],
    "ResourceClaim": [("State", "string", 0, _claim_state)],
    "Lease": [("Holder", "string", 0, lambda o: _or_none(_get(o, "spec", "holderIdentity")))],
    "PriorityClass": [("Value", "integer", 0, lambda o: _get(o, "value")),
                      ("Global-Default", "boolean", 0, lambda o: bool(_get(o, "globalDefault")))],
    "Event": [("Type", "string", 0, lambda o: _get(o, "type")),
              ("Reason", "string", 0, lambda o: _get(o, "reason")),
              ("Object", "string", 0, lambda o: f"{str(_get(o, 'involvedObject', 'kind') or '').lower()}/"
                                                f"{_get(o, 'involvedObject', 'name') or ''}"),
              ("Message", "string", 0, lambda o: _get(o, "message"))],
}


def to_table(rt: ResourceType, items: list[dict[str, Any]], resource_version: str) -> dict[str, Any]:
    columns: list[Column] = [("Name", "string", 0, lambda o: _get(o, "metadata", "name"))]
    columns += _EXTRA.get(rt.kind, [])
    columns.append(("Age", "string", 0, lambda o: human_age(_get(o, "metadata", "creationTimestamp"))))
    definitions = [{"name": name, "type": typ, "format": "name" if name == "Name" else "", "description": "",
                    "priority": prio} for name, typ, prio, _ in columns]
    rows = []
    for obj in items:
        rows.append({
            "cells": [cell(obj) for _, _, _, cell in columns],
            "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                       "metadata": obj.get("metadata") or {}},
        })
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": definitions, "rows": rows}
