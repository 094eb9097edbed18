"""MutatingWebhookConfiguration called as kube-apiserver calls it: before validation (validating webhooks see
the patched object), in the order of configuration names, JSONPatch responses applied and the result defaulted
again, one reinvocation for `IfNeeded`, failurePolicy, sideEffects on a dry run, and the audit annotations."""

from __future__ import annotations

import base64
import json
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from controlplane import EmbeddedApiServer
from controlplane.admission.matching import rules_match
from controlplane.admission.request import AdmissionRequest
from controlplane.authn import ADMIN
from controlplane.tls import make_certificates

CMS = "/api/v1/namespaces/default/configmaps"
HOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def _patch_response(patch: list[dict[str, Any]]) -> dict[str, Any]:
    return {"allowed": True, "patchType": "JSONPatch", "patch": base64.b64encode(json.dumps(patch).encode()).decode()}


def _label(key: str, obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Add label `key` unless it is there (a webhook that is idempotent, as IfNeeded webhooks must be)."""
    labels = (obj.get("metadata") or {}).get("labels")
    if labels is None:
        return [{"op": "add", "path": "/metadata/labels", "value": {key: "yes"}}]
    return [] if key in labels else [{"op": "add", "path": f"/metadata/labels/{key}", "value": "yes"}]


class _Hook(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        path = self.path.split("?")[0]
        self.server.seen.append((path, review))  # type: ignore[attr-defined]
        obj = review["request"]["object"] or {}
        response: dict[str, Any]
        if path.startswith("/label/"):
            response = _patch_response(_label(path.rsplit("/", 1)[1], obj))
        elif path == "/drop-restart-policy":
            response = _patch_response([{"op": "remove", "path": "/spec/restartPolicy"}])
        elif path == "/require-label":  # a validating webhook: refuses objects without the label "a"
            allowed = "a" in ((obj.get("metadata") or {}).get("labels") or {})
            response = {"allowed": allowed, "status": {"code": 403, "message": "label a is missing"}}
        elif path == "/bad-patch-type":
            response = {**_patch_response([]), "patchType": "MergePatch"}
        elif path == "/deny":
            response = {"allowed": False, "status": {"code": 403, "message": "no deletes today"}}
        else:
            response = {"allowed": True, "auditAnnotations": {"seen": "yes"}}
        response["uid"] = review["request"]["uid"]
        data = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                           "response": response}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture(scope="module")
def hook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ThreadingHTTPServer, str]]:
    certs = make_certificates()
    d = tmp_path_factory.mktemp("hook")
    (d / "tls.crt").write_bytes(certs.cert_pem)
    (d / "tls.key").write_bytes(certs.key_pem)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    httpd.seen = []  # type: ignore[attr-defined]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(d / "tls.crt"), str(d / "tls.key"))
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield httpd, base64.b64encode(certs.ca_pem).decode()
    finally:
        httpd.shutdown()


@pytest.fixture
def srv(hook: tuple[ThreadingHTTPServer, str]) -> Iterator[EmbeddedApiServer]:
    hook[0].seen.clear()  # type: ignore[attr-defined]
    with EmbeddedApiServer() as server:
        yield server


def call(srv: EmbeddedApiServer, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    req = urllib.request.Request(srv.url + path, method=method, data=json.dumps(body).encode() if body else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _config(hook: tuple[ThreadingHTTPServer, str], name: str, *paths: str, kind: str = "Mutating",
            resources: str = "configmaps", operations: tuple[str, ...] = ("CREATE", "UPDATE"),
            **extra: Any) -> dict[str, Any]:
    port = hook[0].server_address[1]
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": f"{kind}WebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [{"name": f"{name}-{i}.example.com", "sideEffects": "None", "admissionReviewVersions": ["v1"],
                          "clientConfig": {"url": f"https://127.0.0.1:{port}{p}", "caBundle": hook[1]},
                          "timeoutSeconds": 5, "rules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                          "operations": list(operations),
                                                          "resources": [resources]}], **extra}
                         for i, p in enumerate(paths)]}


def _create(srv: EmbeddedApiServer, *configs: dict[str, Any]) -> None:
    for c in configs:
        plural = "mutating" if c["kind"].startswith("Mutating") else "validating"
        code, body = call(srv, "POST", f"/apis/admissionregistration.k8s.io/v1/{plural}webhookconfigurations", c)
        assert code == 201, body


def _paths(hook: tuple[ThreadingHTTPServer, str]) -> list[str]:
    return [p for p, _ in hook[0].seen]  # type: ignore[attr-defined]


def test_mutating_webhook_configurations_are_served(srv: EmbeddedApiServer, hook: Any) -> None:
    _create(srv, _config(hook, "m", "/allow"))
    code, listed = call(srv, "GET", HOOKS)
    assert code == 200 and [i["metadata"]["name"] for i in listed["items"]] == ["m"]
    code, resources = call(srv, "GET", "/apis/admissionregistration.k8s.io/v1")
    assert "mutatingwebhookconfigurations" in [r["name"] for r in resources["resources"]]


def test_patches_apply_in_configuration_order_before_validation(srv: EmbeddedApiServer, hook: Any) -> None:
    # Named so that the list order differs from the name order: "a-..." is called before "b-...".
    _create(srv, _config(hook, "b-second", "/label/b"), _config(hook, "a-first", "/label/a"),
            _config(hook, "v", "/require-label", kind="Validating"))
    code, obj = call(srv, "POST", CMS, {"metadata": {"name": "x"}, "data": {"k": "v"}})
    assert code == 201, obj["message"]
    assert obj["metadata"]["labels"] == {"a": "yes", "b": "yes"}
    assert _paths(hook) == ["/label/a", "/label/b", "/require-label"]
    validated = hook[0].seen[-1][1]["request"]["object"]
    assert validated["metadata"]["labels"] == {"a": "yes", "b": "yes"}  # the validating webhook saw the patch
    code, stored = call(srv, "GET", f"{CMS}/x")
    assert stored["metadata"]["labels"] == {"a": "yes", "b": "yes"} and stored["data"] == {"k": "v"}


def test_if_needed_webhooks_are_reinvoked_once_after_a_later_change(srv: EmbeddedApiServer, hook: Any) -> None:
    _create(srv, _config(hook, "a", "/label/a", reinvocationPolicy="IfNeeded"),
            _config(hook, "b", "/label/b", reinvocationPolicy="IfNeeded"), _config(hook, "c", "/allow"))
    assert call(srv, "POST", CMS, {"metadata": {"name": "x", "labels": {"a": "yes"}}})[0] == 201
    # a changed nothing, b did: a (IfNeeded, called before the change) runs again; b (the change's author) and
    # c (Never) do not.
    assert _paths(hook) == ["/label/a", "/label/b", "/allow", "/label/a"]
    hook[0].seen.clear()
    assert call(srv, "POST", CMS, {"metadata": {"name": "y", "labels": {"a": "yes", "b": "yes"}}})[0] == 201
    assert _paths(hook) == ["/label/a", "/label/b", "/allow"]  # nothing changed: no reinvocation


def test_patched_object_is_defaulted_again(srv: EmbeddedApiServer, hook: Any) -> None:
    _create(srv, _config(hook, "m", "/drop-restart-policy", resources="pods"))
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox"}],
                                               "restartPolicy": "Never"}}
    code, obj = call(srv, "POST", "/api/v1/namespaces/default/pods", pod)
    assert code == 201, obj["message"]
    assert obj["spec"]["restartPolicy"] == "Always"


def test_failure_policy_dry_run_and_bad_responses(srv: EmbeddedApiServer, hook: Any) -> None:
    down = _config(hook, "down", "/allow")
    down["webhooks"][0]["clientConfig"]["url"] = "https://127.0.0.1:1/m"
    _create(srv, down)
    code, body = call(srv, "POST", CMS, {"metadata": {"name": "x"}})
    assert code == 500 and body["message"].startswith(
        'Internal error occurred: failed calling webhook "down-0.example.com": failed to call webhook: Post '
        '"https://127.0.0.1:1/m?timeout=5s"')
    assert call(srv, "DELETE", f"{HOOKS}/down")[0] == 200
    down["webhooks"][0]["failurePolicy"] = "Ignore"
    _create(srv, down)
    assert call(srv, "POST", CMS, {"metadata": {"name": "x"}})[0] == 201
    _create(srv, _config(hook, "bad", "/bad-patch-type"))
    code, body = call(srv, "POST", CMS, {"metadata": {"name": "y"}})
    assert code == 500 and "webhook returned invalid response.patchType of 'MergePatch'" in body["message"]
    assert call(srv, "DELETE", f"{HOOKS}/bad")[0] == 200
    _create(srv, _config(hook, "effects", "/allow", sideEffects="Some"))
    code, body = call(srv, "POST", CMS + "?dryRun=All", {"metadata": {"name": "z"}})
    assert (code, body["message"]) == (400, 'admission webhook "effects-0.example.com" does not support dry run')
    assert call(srv, "POST", CMS, {"metadata": {"name": "z"}})[0] == 201


def test_a_delete_can_be_refused(srv: EmbeddedApiServer, hook: Any) -> None:
    assert call(srv, "POST", CMS, {"metadata": {"name": "x"}})[0] == 201
    _create(srv, _config(hook, "nodelete", "/deny", operations=("DELETE",)))
    code, body = call(srv, "DELETE", f"{CMS}/x")
    assert (code, body["message"]) == (403, 'admission webhook "nodelete-0.example.com" denied the request: no '
                                            "deletes today")
    assert hook[0].seen[-1][1]["request"]["operation"] == "DELETE"


def test_match_policy_exact_names_the_request_version() -> None:
    from controlplane.resources import registry_for
    reg = registry_for("1.37", None, None)
    rt = reg.by_kind("ResourceClaim")
    assert rt is not None
    rules = [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1beta2"], "operations": ["CREATE"],
              "resources": ["resourceclaims"]}]

    def req(version: str) -> AdmissionRequest:
        return AdmissionRequest(ADMIN, "CREATE", rt, "default", "c", "", "create", False, None,  # type: ignore[arg-type]
                                version)
    served_beta = "v1beta2" in rt.versions
    assert rules_match(rules, req("v1")) is served_beta  # Equivalent: any version the resource is served in
    assert rules_match(rules, req("v1"), "Exact") is False
    assert rules_match(rules, req("v1beta2"), "Exact") is True


class _Sink:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def emit(self, event: dict[str, Any]) -> None:
        self.events.append(event)


def test_audit_annotations_of_webhooks(hook: Any) -> None:
    from controlplane.audit.event import Auditor
    from controlplane.audit.policy import parse_policy

    sink = _Sink()
    policy = parse_policy({"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [
        {"level": "Request", "resources": [{"group": "", "resources": ["configmaps"]}]}]})
    with EmbeddedApiServer(audit=Auditor(policy, sink)) as srv:
        _create(srv, _config(hook, "a", "/label/a", reinvocationPolicy="IfNeeded"), _config(hook, "b", "/label/b"),
                _config(hook, "v", "/allow", kind="Validating"))
        assert call(srv, "POST", CMS, {"metadata": {"name": "x", "labels": {"a": "yes"}}})[0] == 201
    complete = [e for e in sink.events if e["stage"] == "ResponseComplete" and e["verb"] == "create"
                and e["objectRef"]["resource"] == "configmaps"][-1]
    annotations = complete["annotations"]
    assert json.loads(annotations["mutation.webhook.admission.k8s.io/round_0_index_0"]) == {
        "configuration": "a", "webhook": "a-0.example.com", "mutated": False}
    assert json.loads(annotations["mutation.webhook.admission.k8s.io/round_0_index_1"]) == {
        "configuration": "b", "webhook": "b-0.example.com", "mutated": True}
    assert json.loads(annotations["mutation.webhook.admission.k8s.io/round_1_index_0"])["mutated"] is False
    assert json.loads(annotations["patch.webhook.admission.k8s.io/round_0_index_1"]) == {
        "configuration": "b", "webhook": "b-0.example.com",
        "patch": [{"op": "add", "path": "/metadata/labels/b", "value": "yes"}], "patchType": "JSONPatch"}
    assert annotations["v-0.example.com/seen"] == "yes"  # a webhook's auditAnnotations, under its name
    assert annotations["authorization.k8s.io/decision"] == "allow"


def test_a_validating_webhook_may_not_patch_and_failing_open_is_annotated(hook: Any) -> None:
    from controlplane.audit.event import Auditor
    from controlplane.audit.policy import parse_policy

    sink = _Sink()
    policy = parse_policy({"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [{"level": "Metadata"}]})
    with EmbeddedApiServer(audit=Auditor(policy, sink)) as srv:
        _create(srv, _config(hook, "patching", "/label/a", kind="Validating"))
        code, body = call(srv, "POST", CMS, {"metadata": {"name": "x"}})
        assert code == 500 and "validating webhooks may not return patches" in body["message"]
        assert call(srv, "DELETE", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/patching")[0] == 200
        down = _config(hook, "down", "/allow", failurePolicy="Ignore")
        down["webhooks"][0]["clientConfig"]["url"] = "https://127.0.0.1:1/m"
        _create(srv, down)
        assert call(srv, "POST", CMS, {"metadata": {"name": "y"}})[0] == 201
    complete = [e for e in sink.events if e["stage"] == "ResponseComplete" and e["verb"] == "create"
                and e["objectRef"]["resource"] == "configmaps"][-1]
    assert complete["annotations"]["failed-open.mutation.webhook.admission.k8s.io/round_0_index_0"] == "true"
    assert "mutation.webhook.admission.k8s.io/round_0_index_0" not in complete["annotations"]


def test_a_status_write_keeps_only_the_status_a_webhook_patched(srv: EmbeddedApiServer, hook: Any) -> None:
    pods = "/api/v1/namespaces/default/pods"
    code, pod = call(srv, "POST", pods, {"metadata": {"name": "p"},
                                        "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    assert code == 201, pod
    _create(srv, _config(hook, "m", "/label/x", resources="pods/status", operations=("UPDATE",)))
    pod["status"] = {"phase": "Running"}
    code, updated = call(srv, "PUT", f"{pods}/p/status", pod)
    assert code == 200, updated
    assert updated["status"]["phase"] == "Running"
    assert "labels" not in updated["metadata"]  # the webhook's label, patched into a status write, is dropped
    assert _paths(hook) == ["/label/x"]
