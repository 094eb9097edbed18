"""The known fields of every served kind, derived from the official `kubernetes` client's generated models.

The client's models are generated from Kubernetes' OpenAPI document: each has `openapi_types` (python
attribute -> type: a model name, `List[X]`, `Dict[str, X]`, `object` or a scalar) and `attribute_map` (python
attribute -> JSON field name). That is the schema kube-apiserver decodes built-in types against, so unknown
fields are found here rather than in hand-written per-field tables. `object` (RawExtension, IntOrString,
opaque driver parameters) accepts anything, as the real decoder does.

Used by the API server (`fieldValidation`) and by `gpu-dra validate`; also usable by an OpenAPI generator:
`fields_of(model)` and `model_name(group, version, kind)` are the whole interface.

The client's models are pydantic classes, imported lazily, and importing the ~200 reachable from the served
kinds takes seconds; so the table derived from them for the served kinds is kept in `schema_fields.json`
(regenerate with `python -m controlplane.schematable`; a test checks it equals what the installed client
gives). A model missing from the file is read from the client itself.
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudra.jsoncopy import copy_json

_SCALARS = frozenset({"str", "int", "bool", "float", "datetime", "date", "bytearray", "bytes"})
TABLE = Path(__file__).with_name("schema_fields.json")
# Beyond the served kinds (every version of each): the bodies of binding and delete requests.
EXTRA_ROOTS: tuple[str, ...] = ("V1Binding", "V1DeleteOptions")


@functools.lru_cache(maxsize=1)
def _table() -> dict[str, dict[str, str]]:
    try:
        return json.loads(TABLE.read_text())
    except (OSError, ValueError):
        return {}


def _client_fields(model: str) -> dict[str, str] | None:
    """Read one model's fields from the installed `kubernetes` client (slow: imports the pydantic class)."""
    kclient = importlib.import_module("kubernetes.client")
    cls = getattr(kclient, model, None)
    if cls is None or not hasattr(cls, "openapi_types"):
        return None
    types: dict[str, str] = cls.openapi_types
    names: dict[str, str] = cls.attribute_map
    return {names[attr]: typ for attr, typ in types.items()}


def _group_prefix(group: str) -> str:
    return "Core" if not group else group.split(".")[0].capitalize()


@functools.cache
def model_name(group: str, version: str, kind: str) -> str | None:
    """The client model for a kind: `ResourceV1ResourceClaim`, `CoreV1Event`, `V1Pod`; None when unknown."""
    v = version[:1].upper() + version[1:]
    candidates = (f"{_group_prefix(group)}{v}{kind}", f"{v}{kind}")
    for candidate in candidates:
        if candidate in _table():
            return candidate
    for candidate in candidates:
        if _client_fields(candidate) is not None:
            return candidate
    return None


@functools.cache
def fields_of(model: str) -> dict[str, str]:
    """JSON field name -> type string, for one client model."""
    known = _table().get(model)
    if known is not None:
        return known
    fields = _client_fields(model)
    if fields is None:
        raise KeyError(f"the kubernetes client has no model {model}")
    return fields


def _inner(typ: str) -> str:
    while typ.startswith(("List[", "Dict[")):
        typ = typ[5:-1].partition(",")[2].strip() if typ.startswith("Dict[") else typ[5:-1]
    return typ


def roots(kinds: Iterable[tuple[str, Iterable[str], str]]) -> list[str]:
    """The models of `kinds` ((group, served versions, kind) each), in every version, and EXTRA_ROOTS."""
    out = list(EXTRA_ROOTS)
    for group, versions, kind in kinds:
        for version in versions:
            v = version[:1].upper() + version[1:]
            for candidate in (f"{_group_prefix(group)}{v}{kind}", f"{v}{kind}"):
                if _client_fields(candidate) is not None:
                    out.append(candidate)
                    break
    return out


def generate(models: list[str]) -> dict[str, dict[str, str]]:
    """The table for `models` and every model reachable from them, read from the client."""
    out: dict[str, dict[str, str]] = {}
    todo = list(models)
    while todo:
        model = todo.pop()
        if model in out:
            continue
        fields = _client_fields(model)
        if fields is None:
            raise KeyError(f"the kubernetes client has no model {model}")
        out[model] = fields
        todo.extend(t for t in map(_inner, fields.values()) if t not in _SCALARS and t != "object")
    return dict(sorted(out.items()))


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


def _type_error(errors: list[str], value: Any, struct: str, path: str, go_type: str) -> None:
    errors.append(f"cannot unmarshal {_json_type(value)} into Go struct field {_go_name(struct)}.{path} of type "
                  f"{go_type}")


# A type string compiled once into a node: (kind, ...) with kind "o" (object: anything), "s" (scalar: its type
# string and the exact Python types accepted without a closer look), "l"/"d" (list/map: the item node and the
# type string) or "m" (a model: its name). Every object written goes through the walk, so its per-field cost
# matters: no type-string parsing and no path strings unless something is reported.
_Node = tuple[Any, ...]
_EXACT_OK: dict[str, frozenset[type]] = {"str": frozenset({str, int, float}), "int": frozenset({int}),
                                         "bool": frozenset({bool}), "float": frozenset({int, float})}


@functools.cache
def _node(typ: str) -> _Node:
    if typ == "object":
        return ("o",)
    if typ in _SCALARS:
        return ("s", typ, _EXACT_OK.get(typ, frozenset({str})))
    if typ.startswith("List[") and typ.endswith("]"):
        return ("l", _node(typ[5:-1]), typ)
    if typ.startswith("Dict[") and typ.endswith("]"):
        return ("d", _node(typ[5:-1].partition(",")[2].strip()), typ)
    return ("m", typ)


@functools.cache
def _model_nodes(model: str) -> dict[str, _Node]:
    return {name: _node(typ) for name, typ in fields_of(model).items()}


def _walk(typ: str, value: Any, path: str, unknown: list[str], errors: list[str], struct: str) -> Any:
    return _walk_node(_node(typ), value, path, unknown, errors, struct)


def _walk_node(node: _Node, value: Any, path: str, unknown: list[str], errors: list[str], struct: str) -> Any:
    if value is None:
        return value
    kind = node[0]
    if kind == "m":
        return _walk_model(node[1], value, path, unknown, errors, struct)
    if kind == "s":
        if type(value) not in node[2] and not _scalar_ok(node[1], value):
            _type_error(errors, value, struct, path, _go_type(node[1]))
        return value
    if kind == "o":
        return copy_json(value)
    if kind == "l":
        if not isinstance(value, list):
            _type_error(errors, value, struct, path, _go_type(node[2]))
            return value
        inner = node[1]
        if inner[0] == "s":  # a list of strings and the like: no recursion for well-typed items
            ok = inner[2]
            if all(type(v) in ok for v in value):
                return list(value)
        elif inner[0] == "m":
            model = inner[1]
            return [_walk_model(model, item, f"{path}[{i}]", unknown, errors, struct) if item is not None else None
                    for i, item in enumerate(value)]
        return [_walk_node(inner, item, f"{path}[{i}]", unknown, errors, struct) for i, item in enumerate(value)]
    if not isinstance(value, dict):
        _type_error(errors, value, struct, path, _go_type(node[2]))
        return value
    inner = node[1]
    if inner[0] == "s":  # map[string]string and the like: no recursion for well-typed values
        ok = inner[2]
        if all(type(v) in ok for v in value.values()):
            return dict(value)
    return {k: _walk_node(inner, v, f"{path}.{k}" if path else k, unknown, errors, struct) for k, v in value.items()}


def _walk_model(typ: str, value: Any, path: str, unknown: list[str], errors: list[str], struct: str) -> Any:
    if not isinstance(value, dict):
        _type_error(errors, value, struct, path, _go_name(typ))
        return value
    known = _model_nodes(typ)
    out: dict[str, Any] = {}
    for key, item in value.items():
        node = known.get(key)
        if node is None:
            unknown.append(f"{path}.{key}" if path else key)
        elif item is None:
            out[key] = item
        elif node[0] == "s" and type(item) in node[2]:
            out[key] = item  # the common case, without building a path
        elif node[0] == "m":
            out[key] = _walk_model(node[1], item, f"{path}.{key}" if path else key, unknown, errors, typ)
        else:
            out[key] = _walk_node(node, item, f"{path}.{key}" if path else key, unknown, errors, typ)
    return out


@functools.cache
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
    """Every unknown field of `obj` read as `model`, and `obj` without them: a new value sharing no dict or
    list with `obj` (which is untouched), so the caller owns it."""
    unknown: list[str] = []
    errors: list[str] = []
    pruned = _walk(model, obj, "", unknown, errors, model)
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


def write_table(kinds: Iterable[tuple[str, Iterable[str], str]]) -> int:
    """Regenerates the table file for `kinds` (the embedded control plane's served kinds); the model count."""
    table = generate(roots(kinds))
    TABLE.write_text(json.dumps(table, indent=0, sort_keys=True) + "\n")
    return len(table)
