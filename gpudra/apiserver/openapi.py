"""A minimal OpenAPI v3 index: enough for kubectl to learn that the server validates fields itself.

kubectl validates manifests before sending them. It first asks the OpenAPI v3 document of the object's
group-version whether the PATCH operation for that kind accepts the `fieldValidation` query parameter; when
it does, kubectl leaves validation to the server and needs no schemas. So we publish, per group-version, one
PATCH operation per kind carrying that parameter and the kind's `x-kubernetes-group-version-kind`.
"""

from __future__ import annotations

from typing import Any

from gpudra.apiserver.resources import Registry


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def openapi_root(registry: Registry) -> dict[str, Any]:
    paths = {}
    for group, versions in registry.group_versions().items():
        for version in versions:
            gv = _gv_path(group, version)
            paths[gv] = {"serverRelativeURL": f"/openapi/v3/{gv}"}
    return {"paths": paths}


def openapi_group_version(registry: Registry, gv_path: str) -> dict[str, Any] | None:
    types = [rt for rt in registry.types if _gv_path(rt.group, rt.version) == gv_path]
    if not types:
        return None
    paths: dict[str, Any] = {}
    for rt in types:
        scope = "/namespaces/{namespace}" if rt.namespaced else ""
        path = f"/{gv_path}{scope}/{rt.plural}/{{name}}"
        paths[path] = {"patch": {
            "operationId": f"patch{rt.kind}",
            "x-kubernetes-group-version-kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
            "x-kubernetes-action": "patch",
            "parameters": [
                {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
                {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
            ],
            "responses": {"200": {"description": "OK"}},
        }}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.35.0"}, "paths": paths,
            "components": {"schemas": {}}}
