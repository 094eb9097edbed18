"""Reads: get one object, list a collection (with label and field selectors, limit and continue), as JSON, a
Table or protobuf. A watch is controlplane.watchserve, which selects what it sends the same way (`selection`)."""

from __future__ import annotations

import base64
import json
from typing import Any

from controlplane import status as st
from controlplane.params import int_param
from controlplane.routing import RequestHandler, Route, encode
from controlplane.selectors import FieldSelector, LabelSelector, SelectorError
from controlplane.store import Filter
from controlplane.tables import INCLUDE_OBJECT, to_table, wants_table


def get_object(h: RequestHandler, r: Route, query: dict[str, str]) -> None:
    assert r.name is not None  # an object's REST: the collection's is create and list
    store = h.ctx.store
    obj = store.get(r.rt, r.namespace, r.name)
    store.await_durable(obj["metadata"].get("resourceVersion"))
    send_object(h, 200, r, obj, query)


def include_object(query: dict[str, str]) -> str:
    include = query.get("includeObject") or "Metadata"
    if include not in INCLUDE_OBJECT:
        raise st.bad_request(f"includeObject: Unsupported value: {include!r}: supported values: "
                             + ", ".join(f'"{v}"' for v in INCLUDE_OBJECT))
    return include


def send_object(h: RequestHandler, code: int, r: Route, obj: dict[str, Any], query: dict[str, str] | None = None) -> None:
    if wants_table(h.headers.get("Accept")):
        include = include_object(query or {})
        h._send_json(code, to_table(r.rt, [obj], obj["metadata"].get("resourceVersion", ""), include,
                                    r.shown))
    else:
        h._send_json(code, r.shown(obj))


def selection(r: Route, query: dict[str, str]) -> Filter:
    try:
        labels = LabelSelector.parse(query.get("labelSelector"))
        fields = FieldSelector.parse(query.get("fieldSelector"))
        fields.check_fields(lambda f: r.rt.field_value({}, f) is not None, r.rt.selectable_fields,
                            f'"{r.rt.kind}" in version "{r.rt.api_version_at(r.version or r.rt.version)}"')
    except SelectorError as exc:
        raise st.bad_request(str(exc)) from exc
    return Filter(r.rt, r.namespace or None, labels, fields)


def list_objects(h: RequestHandler, r: Route, query: dict[str, str]) -> None:
    flt = selection(r, query)
    int_param(query, "resourceVersion")
    int_param(query, "timeoutSeconds")
    limit = int_param(query, "limit") or 0
    items, rv = h.ctx.store.list(flt)
    h.ctx.store.await_durable(rv)
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    start = 0
    token = query.get("continue")
    if token:
        try:
            decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
            after = (decoded["ns"], decoded["name"])
        except (ValueError, KeyError, TypeError):
            raise st.StatusError(400, "BadRequest", "continue: invalid token; pass back the metadata.continue "
                                                "value of the previous list unchanged") from None
        start = next((i for i, obj in enumerate(items) if _sort_key(obj) > after), len(items))
    if limit > 0 and start + limit < len(items):
        last = items[start + limit - 1]
        ns, name = _sort_key(last)
        meta["continue"] = base64.urlsafe_b64encode(encode({"ns": ns, "name": name})).decode()
        meta["remainingItemCount"] = len(items) - start - limit
        items = items[start:start + limit]
    else:
        items = items[start:]
    if wants_table(h.headers.get("Accept")):
        include = include_object(query)
        extra = {k: v for k, v in meta.items() if k != "resourceVersion"}
        h._send_json(200, to_table(r.rt, items, str(rv), include, r.shown, meta=extra))
        return
    # Items are already serialized JSON objects in the store; splice them in without re-encoding twice.
    head = encode({"kind": r.rt.kind + "List", "apiVersion": r.rt.api_version_at(r.version or r.rt.version),
                   "metadata": meta})[:-1]
    json_of = h.ctx.store.json_of
    body = head + b',"items":[' + b",".join(json_of(r.shown(i)) for i in items) + b"]}"
    h._send(200, body)


def _sort_key(obj: dict[str, Any]) -> tuple[str, str]:
    m = obj.get("metadata") or {}
    return (m.get("namespace") or "", m.get("name") or "")
