"""Writes: create, update, patch (merge, strategic, JSON patch; server-side apply is refused) and delete, with the
request's field validation (`fieldValidation`: Ignore, Warn, Strict) and bodies in any served version converted to
the storage version. Admission runs inside the store's write (controlplane.store), with the request's chain."""

from __future__ import annotations

import json
from typing import Any

from controlplane import status as st
from controlplane.podpriority import admit_pod_priority
from controlplane.podtolerations import default_tolerations
from controlplane.routing import CONVERTED_KINDS, RequestHandler, Route
from controlplane.security import ensure_default_account
from controlplane.store import FIELD_VALIDATION, FieldPolicy
from gpudra.conversion import split_api_version
from gpudra.validation import schema

_NO_SERVER_SIDE_APPLY = ("server-side apply is not supported by gpu-dra's embedded control plane (it keeps no "
                         "field managers); use client-side apply: kubectl apply without --server-side")


def stored(h: RequestHandler, r: Route, body: Any, policy: FieldPolicy) -> Any:
    """The body in storage form. One in another served version is checked against that version's schema
    first, so that unknown fields and wrong types are named as the client wrote them."""
    if isinstance(body, dict) and r.rt.kind in CONVERTED_KINDS:
        if body.get("apiVersion"):
            group, version = split_api_version(body.get("apiVersion"))
        else:
            group, version = r.rt.group, r.version or r.rt.version
        if group == r.rt.group and version != r.rt.version and version in r.rt.versions:
            body = h.ctx.store.clean_fields(r.rt, body, policy, version)
    return r.stored(body)


def field_policy(h: RequestHandler, query: dict[str, str], body: Any) -> FieldPolicy:
    mode = query.get("fieldValidation") or "Warn"
    if mode not in FIELD_VALIDATION:
        raise st.bad_request(f"fieldValidation: Unsupported value: {json.dumps(mode)}: supported values: "
                             '"Ignore", "Warn", "Strict"')
    policy = FieldPolicy(mode, list(getattr(h, "_duplicates", [])))
    h._warnings = policy.warnings
    return policy


def create(h: RequestHandler, r: Route, query: dict[str, str]) -> None:
    store = h.ctx.store
    body = h._body()
    policy = field_policy(h, query, body)
    body = stored(h, r, body, policy)
    if r.rt.kind == "Pod" and not r.rt.group and isinstance(body, dict):
        body = admit_pod_priority(store, h.ctx.registry, default_tolerations(body))
    obj = store.create(r.rt, r.namespace, body, policy)
    if r.rt.kind == "Namespace" and not store.in_dry_run:
        ensure_default_account(store, h.ctx.registry, obj["metadata"]["name"])
    h._send_json(201, r.shown(obj))


def update(h: RequestHandler, r: Route, query: dict[str, str]) -> None:
    assert r.name is not None  # an object's REST: the collection's is create and list
    store = h.ctx.store
    body = h._body()
    policy = field_policy(h, query, body)
    h._send_json(200, r.shown(store.update(r.rt, r.namespace, r.name, stored(h, r, body, policy),
                                           r.subresource, policy)))


def patch(h: RequestHandler, r: Route, query: dict[str, str]) -> None:
    assert r.name is not None  # an object's REST: the collection's is create and list
    store = h.ctx.store
    ctype = (h.headers.get("Content-Type") or "").split(";")[0].strip()
    if ctype == "application/merge-patch+json":
        kind = "merge"
    elif ctype == "application/strategic-merge-patch+json":
        kind = "strategic"
    elif ctype == "application/json-patch+json":
        kind = "json"
    elif ctype == "application/apply-patch+yaml":
        h._body()
        # 415 is what makes kubectl say "Server-side apply not available on the server".
        raise st.StatusError(415, "UnsupportedMediaType", _NO_SERVER_SIDE_APPLY)
    else:
        h._body()
        raise st.unsupported_media_type(ctype)
    body = h._body()
    policy = field_policy(h, query, body)
    codec = (r.shown, r.stored) if r.converts else None
    h._send_json(200, r.shown(store.patch(r.rt, r.namespace, r.name, kind, body, r.subresource,
                                          codec, policy, r.version or r.rt.version)))


def delete(h: RequestHandler, r: Route, query: dict[str, str]) -> None:
    assert r.name is not None  # an object's REST: the collection's is create and list
    store = h.ctx.store
    body = h._body()
    if body is not None and not isinstance(body, dict):
        raise st.bad_request("the body of a delete must be a DeleteOptions object")
    # As kube-apiserver's delete handler: DeleteOptions come from the body, or without one from the query
    # (`?gracePeriodSeconds=0`, what a force delete by URL sends).
    options = body if body is not None else _query_delete_options(query)
    report = schema.check_fields("V1DeleteOptions", options)
    if report.type_errors:
        raise st.bad_request(f"DeleteOptions in version \"v1\" cannot be handled as a DeleteOptions: json: "
                             f"{report.type_errors[0]}")
    if "propagationPolicy" in query:
        options = {**options, "propagationPolicy": query["propagationPolicy"]}
    propagation = options.get("propagationPolicy")
    if propagation not in (None, "Foreground", "Background", "Orphan"):
        raise st.bad_request(f"propagationPolicy: Unsupported value: {json.dumps(propagation)}: supported values: "
                             '"Foreground", "Background", "Orphan"')
    h._admit(r.rt, r.name, None, store.get(r.rt, r.namespace, r.name))
    deleted = store.delete(r.rt, r.namespace, r.name, options)
    h._send_json(200, r.shown(deleted) if deleted.get("kind") == r.rt.kind else deleted)


def _query_delete_options(query: dict[str, str]) -> dict[str, Any]:
    """DeleteOptions from query parameters (metav1's parameter codec): gracePeriodSeconds, orphanDependents and
    propagationPolicy; a value that does not parse is 400."""
    options: dict[str, Any] = {}
    if "gracePeriodSeconds" in query:
        text = query["gracePeriodSeconds"]
        try:
            options["gracePeriodSeconds"] = int(text)
        except ValueError:
            raise st.bad_request(f'strconv.ParseInt: parsing "{text}": invalid syntax') from None
    if "orphanDependents" in query:
        text = query["orphanDependents"]
        if text.lower() not in ("true", "false", "1", "0", "t", "f"):
            raise st.bad_request(f'strconv.ParseBool: parsing "{text}": invalid syntax')
        options["orphanDependents"] = text.lower() in ("true", "1", "t")
    return options
