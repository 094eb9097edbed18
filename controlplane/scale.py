"""The `scale` subresource (autoscaling/v1 Scale) of Deployments, ReplicaSets and StatefulSets, as kube-apiserver
serves it: GET shows spec.replicas, status.replicas and the selector as text; PUT and PATCH (merge, strategic or
JSON patch of the Scale) change only the parent's spec.replicas, with optimistic concurrency on resourceVersion."""

from __future__ import annotations

import copy
from typing import Any

from controlplane import status as st
from controlplane.patch import PatchError, json_patch, merge_patch
from controlplane.resources import ResourceType
from controlplane.workloadtables import format_label_selector

SCALABLE = ("Deployment", "ReplicaSet", "StatefulSet")
_CONFLICT_RETRIES = 5


def scale_of(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    replicas = spec.get("replicas")
    selector = format_label_selector(spec.get("selector"))
    return {
        "kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                     if k in meta},
        "spec": {"replicas": replicas if isinstance(replicas, int) else 1},
        "status": {"replicas": int((obj.get("status") or {}).get("replicas") or 0),
                   **({"selector": selector} if selector != "<none>" else {})},
    }


def _replicas(rt: ResourceType, name: str, scale: Any) -> int:
    if not isinstance(scale, dict):
        raise st.bad_request("the body of a scale update must be an autoscaling/v1 Scale object")
    if scale.get("kind") not in (None, "Scale"):
        raise st.bad_request(f"the body's kind is {scale.get('kind')!r}: expected Scale")
    value = (scale.get("spec") or {}).get("replicas", 0)
    if not isinstance(value, int) or isinstance(value, bool):
        raise st.bad_request(f"Scale in version \"v1\" cannot be handled as a Scale: spec.replicas: expected an "
                             f"integer, got {value!r}")
    if value < 0:
        raise st.StatusError(422, "Invalid", f'Scale.autoscaling "{name}" is invalid: spec.replicas: Invalid value: '
                                             f"{value}: must be greater than or equal to 0",
                             {"name": name, "group": "autoscaling", "kind": "Scale"})
    return value


def _patch_type(content_type: str | None) -> str:
    ctype = (content_type or "").split(";")[0].strip()
    if ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
        return "merge"
    if ctype == "application/json-patch+json":
        return "json"
    raise st.unsupported_media_type(ctype)


def serve(store: Any, rt: ResourceType, namespace: str, name: str, method: str, body: Any = None,
          content_type: str | None = None) -> dict[str, Any]:
    """GET, PUT or PATCH of <rt>/<name>/scale; returns the Scale after the change."""
    if rt.kind not in SCALABLE:
        raise st.StatusError(404, "NotFound", f"{rt.plural} has no subresource 'scale'")
    if method == "GET":
        return scale_of(store.get(rt, namespace, name))
    if method not in ("PUT", "PATCH"):
        raise st.method_not_allowed(f"{method} is not supported on {rt.plural}/scale; supported: GET, PUT, PATCH")
    patch_type = _patch_type(content_type) if method == "PATCH" else ""
    for _ in range(_CONFLICT_RETRIES):
        current = store.get(rt, namespace, name)
        scale = scale_of(current)
        if method == "PUT":
            wanted = body
            want_rv = ((body or {}).get("metadata") or {}).get("resourceVersion") if isinstance(body, dict) else None
        else:
            try:
                wanted = json_patch(scale, body) if patch_type == "json" else merge_patch(scale, body)
            except PatchError as exc:
                raise st.StatusError(422, "Invalid", f'Scale.autoscaling "{name}" is invalid: {exc}') from exc
            want_rv = ((wanted or {}).get("metadata") or {}).get("resourceVersion") if isinstance(wanted, dict) else None
        if want_rv and want_rv != scale["metadata"].get("resourceVersion"):
            raise st.conflict(rt, name)
        replicas = _replicas(rt, name, wanted)
        new = copy.deepcopy(current)
        new.setdefault("spec", {})["replicas"] = replicas
        try:
            return scale_of(store.update(rt, namespace, name, new))
        except st.StatusError as exc:
            if exc.code != 409 or want_rv:
                raise
    raise st.conflict(rt, name)
