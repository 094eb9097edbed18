"""Subresources with their own REST (pods/log, pods/exec|attach|portforward, namespaces/finalize's refusal of
anything but PUT, scale, pods/binding, pods/eviction) and the endpoints that answer
without storing: the access and subject reviews and TokenRequest (serviceaccounts/token)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from controlplane import eviction, execproxy, portforwardtunnel, reviews, scale
from controlplane.admission import noderestriction
from controlplane import status as st
from controlplane.authn import UserInfo
from controlplane.crds import serving as crd_serving
from controlplane.podlogserve import PodLogStream
from controlplane.routing import RequestHandler, Route


def serve(h: RequestHandler, method: str, r: Route, query: dict[str, str]) -> bool:
    """Answer a request for one of these subresources; False for any other (the object's own REST)."""
    assert r.name is not None  # an object's REST: the collection's is create and list
    store = h.ctx.store
    if r.subresource == "log":
        if method != "GET":
            raise st.method_not_allowed(f"{method} is not supported on pods/log; supported: GET")
        PodLogStream(h).serve(r, query)
        return True
    if r.subresource == "finalize" and method != "PUT":  # namespaces/finalize is an update only
        raise st.method_not_allowed("the server does not allow this method on the requested resource")
    if r.subresource in execproxy.SUBRESOURCES:  # controlplane.execproxy: relayed to the node's kubelet
        if method not in ("GET", "POST"):
            raise st.method_not_allowed(f"{method} is not supported on pods/{r.subresource}; supported: GET, POST")
        host, port, container = execproxy.target(store, r.rt, h.ctx.registry.by_kind("Node"), r.namespace,
                                                 r.name or "", query.get("container"), r.subresource)
        h.close_connection = True
        credential = h.ctx.security.authenticator.kubelet_client_token()
        if r.subresource == "portforward" and portforwardtunnel.is_websocket(h.headers):
            portforwardtunnel.serve(h.connection, h.headers, host, port, r.namespace, r.name or "", credential)
        else:
            execproxy.relay(h.connection, h.headers, host, port, r.subresource, r.namespace, r.name or "",
                            container, urlsplit(h.path).query, credential)
        return True
    if r.subresource == "scale" and r.rt.custom is not None:  # a CRD's scale subresource (its paths)
        h._send_json(200, crd_serving.serve_scale(store, r.rt, r.namespace, r.name or "", method, query,
                                                  h._body() if method != "GET" else None,
                                                  (h.headers.get("Content-Type") or "")))
        return True
    if r.subresource == "scale":  # controlplane.scale: Deployments, ReplicaSets, StatefulSets
        body = None if method == "GET" else h._body()
        h._send_json(200, scale.serve(store, r.rt, r.namespace, r.name or "", method, body,
                                      h.headers.get("Content-Type")))
        return True
    if r.subresource == "eviction":
        if method != "POST":
            raise st.method_not_allowed(f"{method} is not supported on pods/eviction; supported: POST")
        h._send_json(201, eviction.evict(store, h.ctx.registry, r.namespace, r.name or "", h._body()))
        return True
    if r.subresource == "binding":
        if method != "POST":
            raise st.method_not_allowed(f"{method} is not supported on pods/binding; supported: POST")
        h._send_json(201, store.bind(r.namespace, r.name, h._body()))
        return True
    return False


def review(h: RequestHandler, method: str, r: Route, user: UserInfo) -> None:
    """The endpoints that answer without storing: reviews and TokenRequest (POST only)."""
    if method != "POST" or (r.subresource == "token" and not r.name) or (r.rt.virtual and r.name):
        raise st.method_not_allowed(f"{method} is not supported on {r.rt.plural}"
                                    f"{'/' + r.subresource if r.subresource else ''}; supported: POST (create)")
    body = h._body()
    authorizer = h.ctx.security.authorizer
    if r.rt.kind == "SelfSubjectAccessReview":
        answer = reviews.self_subject_access_review(body, user, authorizer)
    elif r.rt.kind == "SubjectAccessReview":
        answer = reviews.subject_access_review(body, authorizer)
    elif r.rt.kind == "SelfSubjectRulesReview":
        answer = reviews.self_subject_rules_review(body, user, h.ctx.security.rbac)
    elif r.rt.kind == "SelfSubjectReview":
        answer = reviews.self_subject_review(user)
    else:
        store, reg = h.ctx.store, h.ctx.registry
        account = store.get(r.rt, r.namespace, r.name or "")

        def get(kind: str, ns: str, name: str) -> dict[str, Any] | None:
            rt = reg.by_kind(kind)
            try:
                return store.get(rt, ns, name) if rt is not None else None
            except st.StatusError:
                return None
        node = user.node_name
        if node is not None:  # NodeRestriction: kubelets mint only their pods' tokens
            noderestriction.check_token_request(node, r.rt, r.name or "", body,
                                                lambda pod: get("Pod", r.namespace, pod))
        answer = reviews.token_request(r.namespace, r.name or "", account, body,
                                       h.ctx.security.authenticator, get)
    h._send_json(201, answer)
