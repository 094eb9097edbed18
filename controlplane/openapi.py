"""OpenAPI documents for the served kinds, generated from the official client's models (gpudra.validation.schema).

kubectl reads them three ways:
- `kubectl explain` walks the OpenAPI v3 document of the kind's group-version (`/openapi/v3/apis/G/V`),
  from the schema carrying the kind's `x-kubernetes-group-version-kind` through `$ref`s, printing the
  descriptions;
- before `apply`/`create` it asks the v3 document whether PATCH of the kind takes `fieldValidation`; when it
  does (every kind here), it leaves validation to the server;
- a `kind: List` has no PATCH operation, so kubectl validates its items itself against the OpenAPI v2
  document (`/openapi/v2`, protobuf): unknown fields and wrong types are errors there, as on a real cluster.

Definitions are named as kube-apiserver names them (`io.k8s.api.resource.v1.DeviceClaim`,
`io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta`); field types and descriptions come from the client's
models (generated from Kubernetes' own OpenAPI), never from per-field tables written here.
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import Any

import kubernetes.client as kclient

from controlplane.resources import Registry, SERVER_VERSION
from gpudra.validation.schema import fields_of, model_name

_META_MODELS = frozenset({
    "V1ObjectMeta", "V1ListMeta", "V1OwnerReference", "V1ManagedFieldsEntry", "V1Condition", "V1LabelSelector",
    "V1LabelSelectorRequirement", "V1Status", "V1StatusDetails", "V1StatusCause", "V1DeleteOptions",
    "V1Preconditions", "V1MicroTime", "V1Time",
})
_SCALAR_SCHEMAS: dict[str, dict[str, Any]] = {
    "str": {"type": "string"},
    "int": {"type": "integer", "format": "int64"},
    "float": {"type": "number", "format": "double"},
    "bool": {"type": "boolean"},
    "datetime": {"type": "string", "format": "date-time"},
    "date": {"type": "string", "format": "date"},
    "bytearray": {"type": "string", "format": "byte"},
    "bytes": {"type": "string", "format": "byte"},
}
_VERSION_PREFIX = re.compile(r"^(?:[A-Z][a-z]+)?V\d+(?:(?:alpha|beta)\d+)?(?=[A-Z])")


def _package(group: str, version: str) -> str:
    if not group:
        return f"io.k8s.api.core.{version}"
    return f"io.k8s.api.{group.split('.')[0]}.{version}"


def _short(model: str) -> str:
    """`V1beta1DeviceRequest` -> `DeviceRequest`; `CoreV1Event` -> `Event`."""
    return _VERSION_PREFIX.sub("", model, count=1)


def _model_version(model: str) -> str | None:
    match = re.match(r"^(?:[A-Z][a-z]+)?V(\d+(?:(?:alpha|beta)\d+)?)", model)
    return f"v{match.group(1)}" if match else None


def _description(model: str) -> str:
    doc = inspect.getdoc(getattr(kclient, model)) or ""
    return doc.split("\n\n")[0].replace("\n", " ").strip() if not doc.startswith("Attributes:") else ""


def _field_descriptions(model: str) -> dict[str, str]:
    cls = getattr(kclient, model)
    out: dict[str, str] = {}
    names: dict[str, str] = cls.attribute_map
    for attr, info in getattr(cls, "model_fields", {}).items():
        if attr in names and info.description:
            out[names[attr]] = info.description
    return out


class Definitions:
    """Every schema reachable from the served kinds, named as kube-apiserver names them.

    A model is placed in the package of the first served group-version that reaches it (core types used by
    resource.k8s.io, like NodeSelector, stay in io.k8s.api.core.v1 because core kinds come first)."""

    def __init__(self, registry: Registry) -> None:
        self.names: dict[str, str] = {}  # client model -> definition name
        self.schemas: dict[str, dict[str, Any]] = {}  # definition name -> schema (refs as "#/definitions/...")
        self.roots: dict[tuple[str, str], list[str]] = {}  # (group, version) -> definition names of its kinds
        for rt in sorted(registry.types, key=lambda t: (t.group != "", t.group)):
            if rt.custom is not None:
                continue  # custom resources: controlplane.crds.openapi, from their CRD's schema
            for version in rt.versions:
                model = model_name(rt.group, version, rt.kind)
                if model is None:
                    continue
                name = self._visit(model, _package(rt.group, version))
                schema = self.schemas[name]
                schema["x-kubernetes-group-version-kind"] = [{"group": rt.group, "kind": rt.kind,
                                                              "version": version}]
                self.roots.setdefault((rt.group, version), []).append(name)

    def _visit(self, model: str, package: str) -> str:
        if model in self.names:
            return self.names[model]
        if model in _META_MODELS:
            package = "io.k8s.apimachinery.pkg.apis.meta.v1"
        else:
            own = _model_version(model)
            if own is not None and not package.endswith("." + own):
                package = package.rsplit(".", 1)[0] + "." + own
        name = f"{package}.{_short(model)}"
        self.names[model] = name
        schema: dict[str, Any] = {"type": "object"}
        description = _description(model)
        if description:
            schema["description"] = description
        docs = _field_descriptions(model)
        properties: dict[str, Any] = {}
        for field, typ in sorted(fields_of(model).items()):
            # apiextensions' JSON, JSONSchemaPropsOrBool and JSONSchemaPropsOrArray are any JSON value upstream
            # (no type), where the client models them as `object`.
            prop: dict[str, Any]
            if model in _ANY_JSON_MODELS and typ in ("object", "List[object]", "Dict[str, object]"):
                prop = {"object": {}, "List[object]": {"type": "array", "items": {}},
                        "Dict[str, object]": {"type": "object", "additionalProperties": {}}}[typ]
            else:
                prop = self._type(typ, package)
            if docs.get(field):
                prop = ({"description": docs[field], "allOf": [prop]} if "$ref" in prop
                        else {**prop, "description": docs[field]})
            properties[field] = prop
        schema["properties"] = properties
        self.schemas[name] = schema
        return name

    def _type(self, typ: str, package: str) -> dict[str, Any]:
        if typ in _SCALAR_SCHEMAS:
            return dict(_SCALAR_SCHEMAS[typ])
        if typ == "object":
            return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        if typ.startswith("List[") and typ.endswith("]"):
            return {"type": "array", "items": self._type(typ[5:-1], package)}
        if typ.startswith("Dict[") and typ.endswith("]"):
            inner = typ[5:-1].partition(",")[2].strip()
            return {"type": "object", "additionalProperties": self._type(inner, package)}
        if hasattr(kclient, typ):
            return {"$ref": "#/definitions/" + self._visit(typ, package)}
        return {}  # a type the client does not model: anything goes, as for RawExtension


_ANY_JSON_MODELS = frozenset({"V1JSONSchemaProps"})


def served_key(registry: Registry) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    """What the documents depend on: each type's versions. Registries compare by their types' routes only, so two
    servers with different --runtime-config would otherwise share one cached document."""
    return tuple((rt.group, rt.plural, rt.versions) for rt in registry.types)


def definitions(registry: Registry) -> Definitions:
    return _definitions(registry, served_key(registry))


@functools.lru_cache(maxsize=4)
def _definitions(registry: Registry, served: tuple[tuple[str, str, tuple[str, ...]], ...]) -> Definitions:
    return Definitions(registry)


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def _reachable(defs: Definitions, roots: list[str]) -> list[str]:
    seen: list[str] = []
    stack = list(roots)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.append(name)
        stack.extend(re.findall(r'"#/definitions/([^"]+)"', repr(defs.schemas[name]).replace("'", '"')))
    return sorted(seen)


def _v3(schema: Any) -> Any:
    """A v2 schema as OpenAPI v3 writes it: refs under components/schemas."""
    if isinstance(schema, dict):
        return {k: ("#/components/schemas/" + v[len("#/definitions/"):] if k == "$ref" else _v3(v))
                for k, v in schema.items()}
    if isinstance(schema, list):
        return [_v3(v) for v in schema]
    return schema


def openapi_root(registry: Registry) -> dict[str, Any]:
    paths = {}
    for group, versions in registry.group_versions().items():
        for version in versions:
            gv = _gv_path(group, version)
            paths[gv] = {"serverRelativeURL": f"/openapi/v3/{gv}"}
    return {"paths": paths}


def openapi_group_version(registry: Registry, gv_path: str) -> dict[str, Any] | None:
    types = [(rt, v) for rt in registry.types if rt.custom is None for v in rt.versions
             if _gv_path(rt.group, v) == gv_path]
    if not types:
        return None
    defs = definitions(registry)
    paths: dict[str, Any] = {}
    roots: list[str] = []
    for rt, version in types:
        model = model_name(rt.group, version, rt.kind)
        ref = {"$ref": "#/components/schemas/" + defs.names[model]} if model else {}
        if model:
            roots.append(defs.names[model])
        gvk = {"group": rt.group, "version": version, "kind": rt.kind}
        scope = "/namespaces/{namespace}" if rt.namespaced else ""
        body = {"content": {"application/json": {"schema": ref}}}
        # PATCH with fieldValidation tells kubectl the server validates fields, so it sends objects as they are.
        paths[f"/{gv_path}{scope}/{rt.plural}/{{name}}"] = {
            "get": {"operationId": f"read{rt.kind}", "x-kubernetes-action": "get",
                    "x-kubernetes-group-version-kind": gvk, "responses": {"200": {"description": "OK", **body}}},
            "patch": {"operationId": f"patch{rt.kind}", "x-kubernetes-action": "patch",
                      "x-kubernetes-group-version-kind": gvk,
                      "parameters": [
                          {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
                          {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
                          {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
                      ],
                      "responses": {"200": {"description": "OK", **body}}},
        }
    schemas = {name: _v3(defs.schemas[name]) for name in _reachable(defs, roots)}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": SERVER_VERSION["gitVersion"]},
            "paths": paths, "components": {"schemas": schemas}}


def openapi_v2(registry: Registry) -> dict[str, Any]:
    """The swagger 2.0 document (definitions only: kubectl's client-side validation reads nothing else)."""
    defs = definitions(registry)
    return {"swagger": "2.0", "info": {"title": "Kubernetes", "version": SERVER_VERSION["gitVersion"]},
            "paths": {}, "definitions": {name: defs.schemas[name] for name in sorted(defs.schemas)}}


# ----- protobuf encoding of the v2 document (gnostic's openapi_v2.Document, what kubectl asks for) ---------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


def _string(number: int, text: str) -> bytes:
    return _field(number, text.encode())


def _vendor_extension(name: str, value: Any) -> bytes:
    import yaml

    any_msg = _string(2, yaml.safe_dump(value, sort_keys=True))  # Any.yaml
    return _field(31, _string(1, name) + _field(2, any_msg))  # Schema.vendor_extension: NamedAny


def _schema_pb(schema: dict[str, Any]) -> bytes:
    """gnostic Schema: _ref 1, format 2, description 4, required 19, additional_properties 21, type 22, items 23,
    properties 25, vendor_extension 31."""
    if "allOf" in schema and len(schema["allOf"]) == 1 and "$ref" in schema["allOf"][0]:
        schema = {**{k: v for k, v in schema.items() if k != "allOf"}, "$ref": schema["allOf"][0]["$ref"]}
    out = bytearray()
    if "$ref" in schema:
        out += _string(1, schema["$ref"])
    if schema.get("format"):
        out += _string(2, schema["format"])
    if schema.get("description"):
        out += _string(4, schema["description"])
    for name in schema.get("required") or []:
        out += _string(19, name)
    if isinstance(schema.get("additionalProperties"), dict):
        out += _field(21, _field(1, _schema_pb(schema["additionalProperties"])))
    if schema.get("type"):
        out += _field(22, _string(1, schema["type"]))
    if isinstance(schema.get("items"), dict):
        out += _field(23, _field(1, _schema_pb(schema["items"])))
    if schema.get("properties"):
        props = b"".join(_field(1, _string(1, k) + _field(2, _schema_pb(v))) for k, v in schema["properties"].items())
        out += _field(25, props)
    for key in sorted(schema):
        if key.startswith("x-kubernetes-"):
            out += _vendor_extension(key, schema[key])
    return bytes(out)


def openapi_v2_protobuf(registry: Registry) -> bytes:
    return _openapi_v2_protobuf(registry, served_key(registry))


@functools.lru_cache(maxsize=4)
def _openapi_v2_protobuf(registry: Registry, served: tuple[tuple[str, str, tuple[str, ...]], ...]) -> bytes:
    doc = openapi_v2(registry)
    out = bytearray(_string(1, "2.0"))  # Document.swagger
    out += _field(2, _string(1, doc["info"]["title"]) + _string(2, doc["info"]["version"]))  # Document.info
    named = b"".join(_field(1, _string(1, name) + _field(2, _schema_pb(schema)))
                     for name, schema in doc["definitions"].items())
    out += _field(9, named)  # Document.definitions
    return bytes(out)
