"""OpenAPI v3 documents for custom resources (`/openapi/v3/apis/GROUP/VERSION`), as kube-apiserver publishes
them from each CRD's schema: what `kubectl explain` reads."""

from __future__ import annotations

from typing import Any

from controlplane import openapi
from controlplane.crds.definition import CustomSchema
from controlplane.resources import SERVER_VERSION, Registry, ResourceType
from gpudra.jsoncopy import copy_json

_META_REF = "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


def schema_name(group: str, version: str, kind: str) -> str:
    """`com.nvidia.resource.v1beta1.ComputeDomain`: the reversed group, as kube-openapi names CRD schemas."""
    return ".".join([*reversed(group.split(".")), version, kind])


def _with_refs(schema: dict[str, Any], rt: ResourceType, version: str) -> dict[str, Any]:
    doc = copy_json(schema)
    props = doc.setdefault("properties", {})
    meta = props.get("metadata") if isinstance(props.get("metadata"), dict) else {}
    props["metadata"] = {"description": meta.get("description") or "Standard object's metadata. More info: "
                         "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata",
                         "allOf": [{"$ref": _META_REF}]}
    for key, text in (("apiVersion", "APIVersion defines the versioned schema of this representation of an object."),
                      ("kind", "Kind is a string value representing the REST resource this object represents.")):
        props.setdefault(key, {"type": "string", "description": text})
    doc["x-kubernetes-group-version-kind"] = [{"group": rt.group, "kind": rt.kind, "version": version}]
    return doc


def group_version(registry: Registry, gv_path: str) -> dict[str, Any] | None:
    """The v3 document of one group-version that has custom resources; None when it has none."""
    types = [(rt, v) for rt in registry.types if rt.custom is not None for v in rt.versions
             if gv_path == f"apis/{rt.group}/{v}"]
    if not types:
        return None
    base = openapi.openapi_group_version(registry, gv_path) or {}
    paths: dict[str, Any] = {k: v for k, v in (base.get("paths") or {}).items()
                             if not any(f"/{rt.plural}/" in k for rt, _ in types)}
    schemas: dict[str, Any] = dict((base.get("components") or {}).get("schemas") or {})
    defs = openapi.definitions(registry)
    meta_name = defs.names.get("V1ObjectMeta")
    if meta_name:
        for name in openapi._reachable(defs, [meta_name]):
            schemas[name] = openapi._v3(defs.schemas[name])
    for rt, version in types:
        custom = rt.custom
        assert isinstance(custom, CustomSchema)
        name = schema_name(rt.group, version, rt.kind)
        schemas[name] = _with_refs(custom.versions[version].schema, rt, version)
        gvk = {"group": rt.group, "version": version, "kind": rt.kind}
        scope = "/namespaces/{namespace}" if rt.namespaced else ""
        body = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/" + name}}}}
        paths[f"/{gv_path}{scope}/{rt.plural}/{{name}}"] = {
            "get": {"operationId": f"read{rt.kind}", "x-kubernetes-action": "get",
                    "x-kubernetes-group-version-kind": gvk, "responses": {"200": {"description": "OK", **body}}},
            "patch": {"operationId": f"patch{rt.kind}", "x-kubernetes-action": "patch",
                      "x-kubernetes-group-version-kind": gvk,
                      "parameters": [{"name": p, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
                                     for p in ("fieldValidation", "dryRun", "fieldManager")],
                      "responses": {"200": {"description": "OK", **body}}},
        }
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes CRD Swagger", "version": SERVER_VERSION["gitVersion"]},
            "paths": paths, "components": {"schemas": schemas}}
