"""Admission webhooks (Validating- and MutatingWebhookConfiguration), called as kube-apiserver calls them:
AdmissionReview v1 POSTed over HTTPS (the caBundle, or the system roots without one, verifying the URL's host
or `<service>.<namespace>.svc`), `?timeout=<n>s` on the URL, timeoutSeconds (default 10), failurePolicy
(default Fail), rules with matchPolicy, namespaceSelector, objectSelector, matchConditions, sideEffects on a
dry run, and each response's warnings and auditAnnotations; in the order of the configurations' names, then
of their webhooks.

Mutating webhooks run before the object is validated and may answer a JSONPatch (RFC 6902), applied to the
object the next webhook sees; one with `reinvocationPolicy: IfNeeded` is called once more when a webhook after
it changed the object. Validating webhooks of one write are called one after another (kube-apiserver calls them
in parallel; the answers are the same)."""

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
from controlplane.objects import replace_content
from controlplane.patch import PatchError, json_patch
from controlplane.admission.matching import NamespaceLookup, request_view, rules_match, selectors_match
from controlplane.admission.policy import Expressions, PolicyVersion
from controlplane.admission.request import AdmissionRequest

# () -> (key, the webhook configurations of one kind)
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


class _Webhooks:
    """The webhooks of one kind of configuration, as (configuration name, webhook) in calling order, loaded
    again when a configuration changes, and what calling one of them takes."""

    kinds = None  # a webhook may match any kind

    def __init__(self, version: PolicyVersion, load: WebhookSource, namespace: NamespaceLookup,
                 expressions: Expressions | None, resolve: ServiceResolver = default_service_resolver) -> None:
        self._version = version
        self._load = load
        self._namespace = namespace
        self._cel = expressions
        self.resolve = resolve
        self._key: Any = object()
        self._hooks: list[tuple[str, dict[str, Any]]] = []

    def _webhooks(self) -> list[tuple[str, dict[str, Any]]]:
        key = self._version()
        if key != self._key:
            _, configs = self._load()
            ordered = sorted(configs, key=lambda c: str((c.get("metadata") or {}).get("name") or ""))
            self._hooks = [(str(c["metadata"].get("name") or ""), w) for c in ordered
                           for w in c.get("webhooks") or () if isinstance(w, dict)]
            self._key = key
        return self._hooks

    def configured(self) -> bool:
        return bool(self._webhooks())

    def _matching(self, req: AdmissionRequest, obj: dict[str, Any] | None,
                  old: dict[str, Any] | None) -> list[tuple[int, str, dict[str, Any]]]:
        """(index among all webhooks, configuration, webhook) of those that apply to the request."""
        hooks = self._webhooks()
        if not hooks or req.rt.group == "admissionregistration.k8s.io":
            return []  # webhooks never intercept admissionregistration objects, so a broken one can be removed
        return [(i, config, hook) for i, (config, hook) in enumerate(hooks)
                if rules_match(hook.get("rules"), req, hook.get("matchPolicy") or "Equivalent")
                and selectors_match(hook.get("namespaceSelector"), hook.get("objectSelector"), req, obj, old,
                                    self._namespace)
                and self._conditions(hook, req, obj, old)]

    def _conditions(self, hook: dict[str, Any], req: AdmissionRequest, obj: dict[str, Any] | None,
                    old: dict[str, Any] | None) -> bool:
        conditions = hook.get("matchConditions") or ()
        if not conditions or self._cel is None:
            return True
        activation = {"object": obj, "oldObject": old, "request": request_view(req), "params": None,
                      "namespaceObject": None, "variables": {}}
        errors: list[str] = []
        for cond in conditions:
            try:
                value = self._cel.compile(cond.get("expression", "")).evaluate(activation)
            except ValueError as exc:
                errors.append(f"{cond.get('name', '')}: {exc}")
                continue
            if not isinstance(value, bool):
                errors.append(f"{cond.get('name', '')}: must evaluate to bool")
            elif not value:
                return False  # a false condition skips the webhook whatever the others' errors
        if not errors:
            return True
        # As kube-apiserver: the webhook is not called; Fail rejects the request, Ignore skips the webhook.
        if (hook.get("failurePolicy") or "Fail") == "Fail":
            raise st.StatusError(500, "InternalError", f'Internal error occurred: failed calling webhook '
                                                       f'"{hook.get("name", "")}": failed evaluating match '
                                                       f'conditions: {"; ".join(errors)}')
        return False

    def _call(self, hook: dict[str, Any], req: AdmissionRequest, obj: dict[str, Any] | None,
              old: dict[str, Any] | None, warnings: list[str], failed_open: str,
              mutating: bool = False) -> dict[str, Any] | None:
        """The webhook's allowing response (its patch decoded, for a mutating one); None when the call failed
        and failurePolicy is Ignore (the audit annotation `failed_open` says so). A refusal raises the
        webhook's status, a failed call under failurePolicy Fail a 500."""
        name = hook.get("name", "")
        if req.dry_run and hook.get("sideEffects") not in ("None", "NoneOnDryRun"):
            raise st.bad_request(f'admission webhook "{name}" does not support dry run')
        request = {**request_view(req), "uid": str(uuid.uuid4()), "object": obj, "oldObject": old,
                   "options": None}
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
        timeout = int(hook.get("timeoutSeconds") or 10)
        try:
            response = call_webhook(hook.get("clientConfig") or {}, review, timeout, self.resolve)
            patch = _patch_of(response, mutating)
        except WebhookCallError as exc:
            if (hook.get("failurePolicy") or "Fail") == "Fail":
                raise st.StatusError(500, "InternalError", f'Internal error occurred: failed calling webhook '
                                                           f'"{name}": {exc}') from None
            req.annotate(failed_open, "true")
            return None
        warnings.extend(str(w) for w in response.get("warnings") or ())
        for key, value in (response.get("auditAnnotations") or {}).items():
            req.annotate(f"{name}/{key}", str(value))
        if response.get("allowed") is not True:
            raise _refusal(name, response)
        response["patch"] = patch
        return response


def _patch_of(response: dict[str, Any], mutating: bool) -> list[Any] | None:
    """The response's JSON patch, decoded; a malformed one, or one from a validating webhook, is an invalid
    response (failurePolicy applies)."""
    raw = response.get("patch")
    if not raw:
        return None
    if not mutating:
        raise WebhookCallError("received invalid webhook response: validating webhooks may not return patches")
    if response.get("patchType") is None:
        raise WebhookCallError("received invalid webhook response: webhook returned response.patch but not "
                               "response.patchType")
    if response.get("patchType") != "JSONPatch":
        raise WebhookCallError(f"received invalid webhook response: webhook returned invalid response.patchType "
                               f"of {response.get('patchType')!r}")
    try:
        patch = json.loads(base64.b64decode(raw, validate=True))
    except (ValueError, TypeError):
        raise WebhookCallError("received invalid webhook response: response.patch is not base64-encoded "
                               "JSON") from None
    if not isinstance(patch, list):
        raise WebhookCallError("received invalid webhook response: response.patch is not a JSON patch array")
    return patch


def _refusal(name: str, response: dict[str, Any]) -> st.StatusError:
    raw = response.get("status")
    status: dict[str, Any] = raw if isinstance(raw, dict) else {}
    denied = f'admission webhook "{name}" denied the request'
    message = (f"{denied}: {status['message']}" if status.get("message")
               else f"{denied}: {status['reason']}" if status.get("reason") else f"{denied} without explanation")
    given = status.get("code")
    code = given if isinstance(given, int) and given >= 400 else 400
    return st.StatusError(code, str(status.get("reason") or ""), message, status.get("details"))


class WebhookPlugin(_Webhooks):
    """ValidatingAdmissionWebhook: every matching webhook must allow the write."""

    def admit(self, req: AdmissionRequest, obj: dict[str, Any] | None, old: dict[str, Any] | None,
              warnings: list[str]) -> None:
        for index, _, hook in self._matching(req, obj, old):
            self._call(hook, req, obj, old, warnings,
                       f"failed-open.validating.webhook.admission.k8s.io/round_0_index_{index}")


class MutatingWebhookPlugin(_Webhooks):
    """MutatingAdmissionWebhook, with its one reinvocation round."""

    def mutate(self, req: AdmissionRequest, obj: dict[str, Any] | None, old: dict[str, Any] | None,
               warnings: list[str]) -> bool:
        """Call the matching webhooks on `obj`, replacing its content by each patch's result; True when the
        object changed. A DELETE's webhooks may refuse it but have nothing to patch."""
        hooks = self._matching(req, obj, old)
        changed = False
        invoked: set[int] = set()  # IfNeeded webhooks called since the object last changed
        reinvoke: set[int] = set()
        for index, config, hook in hooks:
            if self._invoke(0, index, config, hook, req, obj, old, warnings):
                changed = True
                reinvoke |= invoked
                invoked = set()
            if hook.get("reinvocationPolicy") == "IfNeeded":
                invoked.add(index)
        for index, config, hook in hooks:
            if index in reinvoke:
                changed = self._invoke(1, index, config, hook, req, obj, old, warnings) or changed
        return changed

    def _invoke(self, round_: int, index: int, config: str, hook: dict[str, Any], req: AdmissionRequest,
                obj: dict[str, Any] | None, old: dict[str, Any] | None, warnings: list[str]) -> bool:
        """Call one webhook and apply its patch; True when the object changed."""
        key = f"round_{round_}_index_{index}"
        name = hook.get("name", "")
        response = self._call(hook, req, obj, old, warnings, f"failed-open.mutation.webhook.admission.k8s.io/{key}",
                              mutating=True)
        if response is None:
            return False
        mutated = False
        patch = response["patch"]
        if patch is not None and obj is not None:
            try:
                patched = json_patch(obj, patch)
            except PatchError as exc:
                raise st.StatusError(500, "InternalError", f"Internal error occurred: {exc}") from None
            if not isinstance(patched, dict):
                raise st.StatusError(500, "InternalError", f'Internal error occurred: the patch of webhook "{name}" '
                                                           "replaced the object by a non-object")
            mutated = patched != obj
            if mutated:
                replace_content(obj, patched)
            req.annotate(f"patch.webhook.admission.k8s.io/{key}", json.dumps(
                {"configuration": config, "webhook": name, "patch": patch, "patchType": "JSONPatch"},
                separators=(",", ":")), "Request")
        req.annotate(f"mutation.webhook.admission.k8s.io/{key}", json.dumps(
            {"configuration": config, "webhook": name, "mutated": mutated}, separators=(",", ":")))
        return mutated
