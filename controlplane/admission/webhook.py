"""Validating admission webhooks (ValidatingWebhookConfiguration), called as kube-apiserver calls them:
AdmissionReview v1 POSTed over HTTPS (the caBundle, or the system roots without one, verifying the URL's host
or `<service>.<namespace>.svc`), `?timeout=<n>s` on the URL, timeoutSeconds (default 10), failurePolicy
(default Fail), rules, namespaceSelector, objectSelector and matchConditions. Webhooks of one write are called
one after another (kube-apiserver calls them in parallel; the answers are the same)."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from controlplane import status as st
from controlplane.admission.matching import NamespaceLookup, request_view, rules_match, selectors_match
from controlplane.admission.policy import Expressions, PolicyVersion
from controlplane.admission.request import AdmissionRequest

# () -> (key, ValidatingWebhookConfigurations)
WebhookSource = Callable[[], "tuple[Any, list[dict[str, Any]]]"]
# (namespace, name, port) -> (host, port) to connect to for a service reference; TLS still verifies the
# service's DNS name, as kube-apiserver's service resolver does.
ServiceResolver = Callable[[str, str, int], "tuple[str, int]"]


class WebhookCallError(Exception):
    pass


def default_service_resolver(namespace: str, name: str, port: int) -> tuple[str, int]:
    return f"{name}.{namespace}.svc", port


def _target(client: dict[str, Any], resolve: ServiceResolver) -> tuple[str, int, str, str, str]:
    """(connect host, port, TLS server name, request path, URL as kube-apiserver names it)."""
    if client.get("url"):
        u = urlsplit(client["url"])
        if u.scheme != "https" or not u.hostname:
            raise WebhookCallError(f"invalid URL {client['url']!r}: webhooks are called over https only")
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        return u.hostname, u.port or 443, u.hostname, path, client["url"]
    svc = client.get("service") or {}
    namespace, name, port = svc.get("namespace", ""), svc.get("name", ""), int(svc.get("port") or 443)
    host, real_port = resolve(namespace, name, port)
    path = svc.get("path") or "/"
    return host, real_port, f"{name}.{namespace}.svc", path, f"https://{name}.{namespace}.svc:{port}{path}"


def call_webhook(client: dict[str, Any], review: dict[str, Any], timeout_s: int,
                 resolve: ServiceResolver) -> dict[str, Any]:
    host, port, server_name, path, shown = _target(client, resolve)
    ca = client.get("caBundle")
    try:
        context = ssl.create_default_context(cadata=base64.b64decode(ca).decode() if ca else None)
    except (ValueError, ssl.SSLError) as exc:
        raise WebhookCallError(f"invalid caBundle: {exc}") from None
    path = path + ("&" if "?" in path else "?") + f"timeout={timeout_s}s"
    shown = shown + ("&" if "?" in shown else "?") + f"timeout={timeout_s}s"
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        # TLS verifies the name the webhook is known by (the URL's host or the service's DNS name), whatever
        # address the connection goes to.
        conn.sock = context.wrap_socket(socket.create_connection((host, port), timeout=timeout_s),
                                        server_hostname=server_name)
        conn.request("POST", path, body=json.dumps(review).encode(),
                     headers={"Content-Type": "application/json", "Accept": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
    except TimeoutError:
        raise WebhookCallError(f'failed to call webhook: Post "{shown}": context deadline exceeded') from None
    except (OSError, http.client.HTTPException) as exc:
        raise WebhookCallError(f'failed to call webhook: Post "{shown}": {exc}') from None
    finally:
        conn.close()
    if resp.status != 200:
        raise WebhookCallError(f"received invalid webhook response: HTTP {resp.status}")
    try:
        answer = json.loads(data)
        response = answer["response"]
    except (ValueError, KeyError, TypeError):
        raise WebhookCallError("received invalid webhook response: not an AdmissionReview with a response") from None
    if not isinstance(response, dict) or response.get("uid") != review["request"]["uid"]:
        raise WebhookCallError("received invalid webhook response: expected response.uid "
                               f"{review['request']['uid']!r}")
    return response


class WebhookPlugin:
    def __init__(self, version: PolicyVersion, load: WebhookSource, namespace: NamespaceLookup,
                 expressions: Expressions | None, resolve: ServiceResolver = default_service_resolver) -> None:
        self._version = version
        self._load = load
        self._namespace = namespace
        self._cel = expressions
        self.resolve = resolve
        self._key: Any = object()
        self._hooks: list[dict[str, Any]] = []

    def _webhooks(self) -> list[dict[str, Any]]:
        key = self._version()
        if key != self._key:
            _, configs = self._load()
            self._hooks = [w for c in configs for w in c.get("webhooks") or () if isinstance(w, dict)]
            self._key = key
        return self._hooks

    def admit(self, req: AdmissionRequest, obj: dict[str, Any] | None, old: dict[str, Any] | None,
              warnings: list[str]) -> None:
        hooks = self._webhooks()
        if not hooks or (req.rt.group == "admissionregistration.k8s.io"):
            return  # webhooks never intercept admissionregistration objects, so a broken one can be removed
        for hook in hooks:
            if not rules_match(hook.get("rules"), req):
                continue
            if not selectors_match(hook.get("namespaceSelector"), hook.get("objectSelector"), req, obj, old,
                                   self._namespace):
                continue
            if not self._conditions(hook, req, obj, old):
                continue
            self._call(hook, req, obj, old, warnings)

    def _conditions(self, hook: dict[str, Any], req: AdmissionRequest, obj: dict[str, Any] | None,
                    old: dict[str, Any] | None) -> bool:
        conditions = hook.get("matchConditions") or ()
        if not conditions or self._cel is None:
            return True
        activation = {"object": obj, "oldObject": old, "request": request_view(req), "params": None,
                      "namespaceObject": None, "variables": {}}
        for cond in conditions:
            try:
                if self._cel.compile(cond.get("expression", "")).evaluate(activation) is not True:
                    return False
            except ValueError:
                return (hook.get("failurePolicy") or "Fail") == "Fail"
        return True

    def _call(self, hook: dict[str, Any], req: AdmissionRequest, obj: dict[str, Any] | None,
              old: dict[str, Any] | None, warnings: list[str]) -> None:
        name = hook.get("name", "")
        request = {**request_view(req), "uid": str(uuid.uuid4()), "object": obj, "oldObject": old,
                   "options": None}
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
        timeout = int(hook.get("timeoutSeconds") or 10)
        try:
            response = call_webhook(hook.get("clientConfig") or {}, review, timeout, self.resolve)
        except WebhookCallError as exc:
            if (hook.get("failurePolicy") or "Fail") == "Fail":
                raise st.StatusError(500, "InternalError", f'Internal error occurred: failed calling webhook '
                                                           f'"{name}": {exc}') from None
            return
        warnings.extend(str(w) for w in response.get("warnings") or ())
        if response.get("allowed") is True:
            return
        raw = response.get("status")
        status: dict[str, Any] = raw if isinstance(raw, dict) else {}
        denied = f'admission webhook "{name}" denied the request'
        message = (f"{denied}: {status['message']}" if status.get("message")
                   else f"{denied}: {status['reason']}" if status.get("reason") else f"{denied} without explanation")
        given = status.get("code")
        code = given if isinstance(given, int) and given >= 400 else 400
        raise st.StatusError(code, str(status.get("reason") or ""), message, status.get("details"))
