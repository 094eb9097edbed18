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
    # Values of the wrong JSON type, as Go's decoder words them: "cannot unmarshal string into Go struct field
    # LeaseSpec.spec.leaseDurationSeconds of type int32". kube-apiserver refuses those (400) in every mode.
    type_errors: list[str]


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _go_type(typ: str) -> str:
    if typ.startswith("List["):
        return "[]" + _go_type(typ[5:-1])
    if typ.startswith("Dict["):
        return "map[string]" + _go_type(typ[5:-1].partition(",")[2].strip())
    return {"str": "string", "int": "int64", "bool": "bool", "float": "float64", "datetime": "v1.Time",
            "date": "v1.Time"}.get(typ, "struct")


def _scalar_ok(typ: str, value: Any) -> bool:
    if typ == "bool":
        return isinstance(value, bool)
    if typ == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if typ == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if typ == "str":
        # Quantities are strings in the client's models, but Kubernetes also takes them as JSON numbers.
        return isinstance(value, (str, int, float)) and not isinstance(value, bool)
    return isinstance(value, str)  # datetime, date: RFC 3339 text


def _walk(typ: str, value: Any, path: str, unknown: list[str], errors: list[str], struct: str) -> Any:
    if value is None or typ == "object":
        return value
    if typ in _SCALARS:
        if not _scalar_ok(typ, value):
            errors.append(f"cannot unmarshal {_json_type(value)} into Go struct field {struct}.{path} of type "
                          f"{_go_type(typ)}")
        return value
    if typ.startswith("List[") and typ.endswith("]"):
        if not isinstance(value, list):
            errors.append(f"cannot unmarshal {_json_type(value)} into Go struct field {struct}.{path} of type "
                          f"{_go_type(typ)}")
            return value
        inner = typ[5:-1]
        return [_walk(inner, item, f"{path}[{i}]", unknown, errors, struct) for i, item in enumerate(value)]
    if typ.startswith("Dict[") and typ.endswith("]"):
        if not isinstance(value, dict):
            errors.append(f"cannot unmarshal {_json_type(value)} into Go struct field {struct}.{path} of type "
                          f"{_go_type(typ)}")
            return value
        inner = typ[5:-1].partition(",")[2].strip()
        return {k: _walk(inner, v, f"{path}.{k}" if path else k, unknown, errors, struct) for k, v in value.items()}
    if not isinstance(value, dict):
        errors.append(f"cannot unmarshal {_json_type(value)} into Go struct field {struct}.{path} of type "
                      f"{_go_name(typ)}")
        return value
    known = fields_of(typ)
    out: dict[str, Any] = {}
    for key, item in value.items():
        field_type = known.get(key)
        if field_type is None:
            unknown.append(f"{path}.{key}" if path else key)
        elif field_type == "object" or item is None:
            out[key] = item
        elif field_type == "str" and isinstance(item, str):
            out[key] = item  # the common case, without building a path
        else:
            out[key] = _walk(field_type, item, f"{path}.{key}" if path else key, unknown, errors, _go_name(typ))
    return out


def _go_name(model: str) -> str:
    """`V1LeaseSpec` -> `LeaseSpec`, `ResourceV1ResourceClaim` -> `ResourceClaim`: the Go struct's name."""
    i = 0
    while i < len(model) and not (model[i] == "V" and i + 1 < len(model) and model[i + 1].isdigit()):
        i += 1
    i += 1
    while i < len(model) and (model[i].isdigit() or model[i].islower()):
        i += 1
    return model[i:] or model


def check_fields(model: str, obj: Any) -> FieldReport:
    """Every unknown field of `obj` read as `model`, and `obj` without them (a new value; `obj` is untouched)."""
    unknown: list[str] = []
    errors: list[str] = []
    pruned = _walk(model, obj, "", unknown, errors, _go_name(model))
    return FieldReport(unknown, pruned, errors)


def check_object(obj: dict[str, Any]) -> FieldReport | None:
    """check_fields for an object naming its own apiVersion and kind; None when that kind has no known schema."""
    api_version = obj.get("apiVersion")
    kind = obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return None
    group, _, version = api_version.rpartition("/")
    model = model_name(group, version, kind)
    return check_fields(model, obj) if model else None
