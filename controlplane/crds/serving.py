"""Requests on custom resources that differ from built-in kinds: the body's version and the scale subresource.
(Strategic merge patch is refused for them by the store, as by kube-apiserver: they have no patch strategies.)"""

from __future__ import annotations

import json
from typing import Any

from controlplane import status as st
from controlplane.crds.definition import CustomSchema
from controlplane.patch import PatchError, json_patch, merge_patch
from controlplane.resources import ResourceType
from controlplane.store import Store
from gpudra.conversion import split_api_version
from gpudra.jsoncopy import copy_json


def stored(rt: ResourceType, body: dict[str, Any], url_version: str) -> dict[str, Any]:
    """A custom resource's body in its storage version: its own apiVersion decides, else the URL's."""
    group, version = split_api_version(body.get("apiVersion"))
    if not body.get("apiVersion"):
        group, version = rt.group, url_version or rt.version
    if group != rt.group or version not in rt.versions:
        raise st.bad_request(f"the API version in the data ({body.get('apiVersion')}) does not match the expected API "
                             f"version ({rt.api_version_at(url_version or rt.version)}); {rt.kind} is served at "
                             + ", ".join(rt.api_version_at(v) for v in rt.versions))
    return {**body, "apiVersion": rt.api_version}


def _path(dotted: str) -> list[str]:
    return [p for p in dotted.split(".") if p]


def _read(obj: Any, dotted: str) -> Any:
    for part in _path(dotted):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def _write(obj: dict[str, Any], dotted: str, value: Any) -> None:
    parts = _path(dotted)
    for part in parts[:-1]:
        nxt = obj.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            obj[part] = nxt
        obj = nxt
    obj[parts[-1]] = value


def scale_of(rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
    """The autoscaling/v1 Scale a custom resource shows through its scale subresource."""
    custom = rt.custom
    assert isinstance(custom, CustomSchema)
    paths = custom.scale() or {}
    m = obj.get("metadata") or {}
    status: dict[str, Any] = {"replicas": _read(obj, paths.get("statusReplicasPath", "")) or 0}
    if paths.get("labelSelectorPath"):
        selector = _read(obj, paths["labelSelectorPath"])
        if isinstance(selector, str) and selector:
            status["selector"] = selector
    spec: dict[str, Any] = {}
    replicas = _read(obj, paths.get("specReplicasPath", ""))
    if replicas is not None:
        spec["replicas"] = replicas
    meta = {k: m[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if k in m}
    return {"kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": meta, "spec": spec, "status": status}


def serve_scale(store: Store, rt: ResourceType, namespace: str, name: str, method: str, query: dict[str, str],
                body: Any, content_type: str) -> dict[str, Any]:
    """GET, PUT or PATCH on `<plural>/NAME/scale`: the Scale after the request."""
    obj = store.get(rt, namespace, name)
    if method == "GET":
        return scale_of(rt, obj)
    current = scale_of(rt, obj)
    if method == "PUT":
        new_scale = body
    elif method == "PATCH":
        ctype = content_type.split(";")[0].strip()
        try:
            if ctype == "application/json-patch+json":
                new_scale = json_patch(current, body)
            elif ctype == "application/merge-patch+json":
                new_scale = merge_patch(current, body)
            else:
                raise st.unsupported_media_type(ctype)
        except PatchError as exc:
            raise st.StatusError(422, "Invalid", f'Scale.autoscaling "{name}" is invalid: {exc}') from exc
    else:
        raise st.method_not_allowed(f"{method} is not supported on {rt.plural}/scale; supported: GET, PUT, PATCH")
    if not isinstance(new_scale, dict):
        raise st.bad_request("the body of a scale update must be a Scale object")
    replicas = (new_scale.get("spec") or {}).get("replicas")
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        raise st.StatusError(422, "Invalid", f'Scale.autoscaling "{name}" is invalid: spec.replicas: Invalid value: '
                                             f'{json.dumps(replicas)}: must be greater than or equal to 0')
    want_rv = (new_scale.get("metadata") or {}).get("resourceVersion")
    if want_rv and want_rv != obj["metadata"].get("resourceVersion"):
        raise st.conflict(rt, name)
    custom = rt.custom
    assert isinstance(custom, CustomSchema)
    updated = copy_json(obj)
    _write(updated, (custom.scale() or {})["specReplicasPath"], replicas)
    return scale_of(rt, store.update(rt, namespace, name, updated))
