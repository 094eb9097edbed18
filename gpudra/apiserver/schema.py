"""The known fields of every served kind, derived from the official `kubernetes` client's generated models.

The client's models are generated from Kubernetes' OpenAPI document: each has `openapi_types` (python
attribute -> type: a model name, `List[X]`, `Dict[str, X]`, `object` or a scalar) and `attribute_map` (python
attribute -> JSON field name). That is the schema kube-apiserver decodes built-in types against, so unknown
fields are found here rather than in hand-written per-field tables. `object` (RawExtension, IntOrString,
opaque driver parameters) accepts anything, as the real decoder does.

Used by the API server (`fieldValidation`) and by `gpu-dra validate`; also usable by an OpenAPI generator:
`fields_of(model)` and `model_name(group, version, kind)` are the whole interface.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import kubernetes.client as kclient

_SCALARS = frozenset({"str", "int", "bool", "float", "datetime", "date", "bytearray", "bytes"})


def _group_prefix(group: str) -> str:
    return "Core" if not group else group.split(".")[0].capitalize()


@functools.lru_cache(maxsize=None)
def model_name(group: str, version: str, kind: str) -> str | None:
    """The client model for a kind: `ResourceV1ResourceClaim`, `CoreV1Event`, `V1Pod`; None when unknown."""
    v = version[:1].upper() + version[1:]
    for candidate in (f"{_group_prefix(group)}{v}{kind}", f"{v}{kind}"):
        cls = getattr(kclient, candidate, None)
        if cls is not None and hasattr(cls, "openapi_types"):
            return candidate
    return None


@functools.lru_cache(maxsize=None)
def fields_of(model: str) -> dict[str, str]:
    """JSON field name -> type string, for one client model."""
    cls = getattr(kclient, model)
    types: dict[str, str] = cls.openapi_types
    names: dict[str, str] = cls.attribute_map
    return {names[attr]: typ for attr, typ in types.items()}


@dataclass(frozen=True)
class FieldReport:
    unknown: list[str]  # dotted paths, as Kubernetes' strict decoder names them: spec.devices.requests[0].foo
    pruned: Any  # the value with every unknown field removed


def _walk(typ: str, value: Any, path: str, unknown: list[str]) -> Any:
    if value is None or typ in _SCALARS or typ == "object":
        return value
    if typ.startswith("List[") and typ.endswith("]"):
        if not isinstance(value, list):
            return value
        inner = typ[5:-1]
        return [_walk(inner, item, f"{path}[{i}]", unknown) for i, item in enumerate(value)]
    if typ.startswith("Dict[") and typ.endswith("]"):
        if not isinstance(value, dict):
            return value
        inner = typ[5:-1].partition(",")[2].strip()
        return {k: _walk(inner, v, f"{path}.{k}" if path else k, unknown) for k, v in value.items()}
    if not isinstance(value, dict):
        return value
    known = fields_of(typ)
    out: dict[str, Any] = {}
    for key, item in value.items():
        where = f"{path}.{key}" if path else key
        field_type = known.get(key)
        if field_type is None:
            unknown.append(where)
            continue
        out[key] = _walk(field_type, item, where, unknown)
    return out


def check_fields(model: str, obj: Any) -> FieldReport:
    """Every unknown field of `obj` read as `model`, and `obj` without them (a new value; `obj` is untouched)."""
    unknown: list[str] = []
    pruned = _walk(model, obj, "", unknown)
    return FieldReport(unknown, pruned)


def check_object(obj: dict[str, Any]) -> FieldReport | None:
    """check_fields for an object naming its own apiVersion and kind; None when that kind has no known schema."""
    api_version = obj.get("apiVersion")
    kind = obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return None
    group, _, version = api_version.rpartition("/")
    model = model_name(group, version, kind)
    return check_fields(model, obj) if model else None
