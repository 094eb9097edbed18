"""additionalPrinterColumns: the Table columns `kubectl get` shows for custom resources.

Name first, then the CRD version's columns (or Age when it declares none), each cell read with the column's
JSONPath (the subset CRDs use: `.a.b`, `.a[0]`, `.a[*].b`, `.a['key.with.dots']`) and typed as declared: a date
becomes an age, a missing value an empty (None) cell, as kube-apiserver's CRD table convertor does.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from controlplane.crds.definition import CustomSchema
from controlplane.resources import ResourceType

_TOKEN = re.compile(r"\.([A-Za-z0-9_\-$]+)|\[(\d+|\*)\]|\['([^']*)'\]|\[\"([^\"]*)\"\]")
_NAME_DOC = ("Name must be unique within a namespace. Is required when creating resources, although some resources "
             "may allow a client to request the generation of an appropriate name automatically. Name is primarily "
             "intended for creation idempotence and configuration definition. Cannot be updated. More info: "
             "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names")
_AGE_COLUMN = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp",
               "description": "CreationTimestamp is a timestamp representing the server time when this object was "
                              "created."}


def json_path(obj: Any, path: str) -> list[Any]:
    """Every value `path` selects in `obj` (empty when it selects nothing)."""
    text = path.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    values = [obj]
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            return []
        pos = m.end()
        key = m.group(1) or m.group(3) or m.group(4)
        index = m.group(2)
        nxt: list[Any] = []
        for v in values:
            if key is not None and isinstance(v, dict) and key in v:
                nxt.append(v[key])
            elif index == "*" and isinstance(v, list):
                nxt.extend(v)
            elif index is not None and index != "*" and isinstance(v, list) and int(index) < len(v):
                nxt.append(v[int(index)])
        values = nxt
    return values


def columns(rt: ResourceType, version: str) -> list[dict[str, Any]]:
    custom = rt.custom
    assert isinstance(custom, CustomSchema)
    return list(custom.columns(version or rt.version)) or [_AGE_COLUMN]


def column_definitions(rt: ResourceType, version: str) -> list[dict[str, Any]]:
    out = [{"name": "Name", "type": "string", "format": "name", "description": _NAME_DOC, "priority": 0}]
    for col in columns(rt, version):
        typ = col.get("type", "string")
        out.append({"name": col.get("name", ""), "type": "string" if typ == "date" else typ,
                    "format": col.get("format", "date" if typ == "date" else ""),
                    "description": col.get("description", ""), "priority": int(col.get("priority", 0) or 0)})
    return out


def cells(rt: ResourceType, version: str, obj: dict[str, Any], now: datetime, since: Any) -> list[Any]:
    row: list[Any] = [(obj.get("metadata") or {}).get("name")]
    for col in columns(rt, version):
        found = json_path(obj, str(col.get("jsonPath", "")))
        if not found or found == [None]:
            row.append(None)
            continue
        value: Any = found[0] if len(found) == 1 else ",".join(str(v) for v in found)
        typ = col.get("type")
        if typ == "date":
            value = since(value, now) if isinstance(value, str) else None
        elif typ == "integer":
            value = value if isinstance(value, int) and not isinstance(value, bool) else None
        elif typ == "number":
            value = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        elif typ == "boolean":
            value = value if isinstance(value, bool) else None
        elif not isinstance(value, str):
            value = value if isinstance(value, (int, float, bool)) else str(value)
        row.append(value)
    return row
