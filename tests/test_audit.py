"""The audit log as kube-apiserver keeps it: the audit.k8s.io/v1 Policy (first matching rule, levels, omitStages,
clear errors naming the field), the events of a request through its stages with the authorization decision and
admission annotations, and the log backend's JSON lines."""

from __future__ import annotations

import argparse
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.apiserver import _auditor
from controller.cel.policyenv import PolicyEnvironment
from controlplane import EmbeddedApiServer
from controlplane.audit.backend import LogBackend
from controlplane.audit.event import Auditor, request_info
from controlplane.audit.policy import PolicyError, RequestAttributes, load_policy, parse_policy

CMS = "/api/v1/namespaces/default/configmaps"


def _policy(*rules: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": list(rules), **top}


class ListSink:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()

    def emit(self, event: dict[str, Any]) -> None:
        with self._cond:
            self.events.append(json.loads(json.dumps(event)))  # what the writer would encode, now
            self._cond.notify_all()

    def of(self, uri_part: str) -> list[dict[str, Any]]:
        """The events of requests whose URI has `uri_part`, once the last request's is complete (a response
        reaches the client just before its ResponseComplete event is recorded)."""
        def matching() -> list[dict[str, Any]]:
            return [e for e in self.events if uri_part in e["requestURI"]]
        with self._cond:
            # A request's first event is recorded before its response is sent: none means not audited.
            self._cond.wait_for(lambda: all(e["stage"] == "ResponseComplete" or e["user"] == {}
                                            for e in matching()[-1:]), timeout=10)
            return matching()


def _attrs(verb: str = "get", resource: str = "pods", sub: str = "", ns: str = "default", name: str = "p",
           group: str = "", user: str = "alice", groups: tuple[str, ...] = ("system:authenticated",),
           path: str = "") -> RequestAttributes:
    return RequestAttributes(user, groups, verb, not path, group, resource, sub, ns, name, path)


# ----- the policy ------------------------------------------------------------------------------------------


def test_first_matching_rule_gives_the_level() -> None:
    policy = parse_policy(_policy(
        {"level": "None", "users": ["system:kube-proxy"], "verbs": ["watch"]},
        {"level": "None", "nonResourceURLs": ["/healthz*", "/version"]},
        {"level": "RequestResponse", "resources": [{"group": "", "resources": ["pods/log", "*/status"]}]},
        {"level": "Request", "resources": [{"group": "", "resources": ["configmaps"], "resourceNames": ["cfg"]}]},
        {"level": "Metadata", "resources": [{"group": "apps", "resources": ["deployments/*"]}],
         "omitStages": ["ResponseStarted"]},
        {"level": "Request", "namespaces": [""], "userGroups": ["admins"]},
        {"level": "Metadata", "omitStages": ["ResponseComplete"]},
        omitStages=["RequestReceived"]))
    assert policy.evaluate(_attrs("watch", user="system:kube-proxy")).level == "None"
    assert policy.evaluate(_attrs("get", user="system:kube-proxy")).level == "Metadata"  # verbs narrow the rule
    assert policy.evaluate(_attrs(path="/healthz/ready")).level == "None"
    assert policy.evaluate(_attrs(path="/versions")).level == "Metadata"  # no prefix without the trailing *
    assert policy.evaluate(_attrs(sub="log")).level == "RequestResponse"
    assert policy.evaluate(_attrs(resource="nodes", sub="status")).level == "RequestResponse"
    assert policy.evaluate(_attrs()).level == "Metadata"  # "pods/log" does not name pods
    assert policy.evaluate(_attrs(resource="configmaps", name="cfg")).level == "Request"
    assert policy.evaluate(_attrs(resource="configmaps", name="other")).level == "Metadata"
    scaled = policy.evaluate(_attrs(group="apps", resource="deployments", sub="scale"))
    assert scaled.level == "Metadata" and scaled.omit_stages == {"RequestReceived", "ResponseStarted"}
    # "resource/*" also names the resource itself (upstream's checker compares the resource only).
    assert policy.evaluate(_attrs(group="apps", resource="deployments")).omit_stages == scaled.omit_stages
    assert policy.evaluate(_attrs(group="apps", resource="replicasets")).omit_stages == {"RequestReceived",
                                                                                          "ResponseComplete"}
    assert policy.evaluate(_attrs(resource="nodes", ns="", groups=("admins",))).level == "Request"
    assert policy.evaluate(_attrs(resource="pods", groups=("admins",))).level == "Metadata"  # namespaced
    # A resource rule never matches a non-resource request, nor a URL rule a resource one.
    assert parse_policy(_policy({"level": "Request", "namespaces": ["default"]})).evaluate(
        _attrs(path="/api")).level == "None"


@pytest.mark.parametrize(("doc", "message"), [
    (_policy({"level": "Everything"}), 'rules[0].level: Unsupported value: "Everything": supported values: "None", '
                                       '"Metadata", "Request", "RequestResponse"'),
    (_policy({"users": ["a"]}), "rules[0].level: Required value"),
    (_policy({"level": "None"}, {"level": "Metadata", "verb": ["get"]}), "rules[1].verb: unknown field"),
    (_policy({"level": "None", "omitStages": ["Done"]}), 'rules[0].omitStages[0]: Unsupported value: "Done"'),
    (_policy({"level": "None", "nonResourceURLs": ["healthz"]}), "rules[0].nonResourceURLs[0]: Invalid value: "
                                                                 '"healthz": non-resource URL rules must begin'),
    (_policy({"level": "None", "nonResourceURLs": ["/a*b"]}), "must be the final character"),
    (_policy({"level": "None", "nonResourceURLs": ["/a"], "namespaces": ["x"]}),
     "rules cannot apply to both regular resources and non-resource URLs"),
    (_policy({"level": "None", "resources": [{"group": "", "resources": ["*"], "resourceNames": ["x"]}]}),
     "rules[0].resources[0].resources[0]: Invalid value: \"*\": using resourceNames with wildcard"),
    (_policy({"level": "None", "users": "alice"}), "rules[0].users: Invalid value: \"alice\": must be a list"),
    (_policy(), "rules: Required value"),
    ({**_policy({"level": "None"}), "apiVersion": "audit.k8s.io/v1beta1"}, 'apiVersion: Unsupported value'),
    ({**_policy({"level": "None"}), "kind": "AuditPolicy"}, 'kind: Unsupported value: "AuditPolicy"'),
])
def test_bad_policies_name_the_field(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy(doc)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_policy_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="missing.yaml: No such file"):
        load_policy(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("rules: [")
    with pytest.raises(PolicyError, match="bad.yaml: not YAML or JSON"):
        load_policy(tmp_path / "bad.yaml")
    (tmp_path / "p.yaml").write_text("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n")
    assert load_policy(tmp_path / "p.yaml").rules[0].level == "Metadata"


def test_request_info_reads_the_path_as_kube_apiserver() -> None:
    assert request_info("GET", "/api/v1/namespaces/default/pods", {}) == (
        "list", {"resource": "pods", "namespace": "default", "apiVersion": "v1"})
    assert request_info("GET", "/api/v1/namespaces/default/pods", {"watch": "true"})[0] == "watch"
    assert request_info("PUT", "/apis/apps/v1/namespaces/ns/deployments/d/scale", {}) == (
        "update", {"resource": "deployments", "namespace": "ns", "name": "d", "apiGroup": "apps", "apiVersion": "v1",
                   "subresource": "scale"})
    assert request_info("GET", "/api/v1/namespaces/team", {}) == (
        "get", {"resource": "namespaces", "namespace": "team", "name": "team", "apiVersion": "v1"})
    assert request_info("DELETE", "/api/v1/nodes", {})[0] == "deletecollection"
    assert request_info("GET", "/apis/apps/v1", {}) == ("get", None)
    assert request_info("GET", "/healthz", {}) == ("get", None)


# ----- events of requests ------------------------------------------------------------------------------


@pytest.fixture
def sink() -> ListSink:
    return ListSink()


def _server(sink: ListSink, *rules: dict[str, Any], **kwargs: Any) -> EmbeddedApiServer:
    return EmbeddedApiServer(audit=Auditor(parse_policy(_policy(*rules)), sink), unauthenticated_as_admin=False,
                             **kwargs)


@pytest.fixture
def srv(sink: ListSink) -> Iterator[EmbeddedApiServer]:
    server = _server(sink, {"level": "None", "nonResourceURLs": ["/version"]},
                     {"level": "RequestResponse", "resources": [{"group": "", "resources": ["configmaps"]}]},
                     {"level": "Metadata"}, expressions=PolicyEnvironment())
    with server:
        yield server


def call(srv: EmbeddedApiServer, method: str, path: str, body: Any = None, token: str | None = "admin",
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    all_headers = {"Content-Type": "application/json", "User-Agent": "audit-test/1.0", **(headers or {})}
    if token:
        all_headers["Authorization"] = f"Bearer {srv.admin_token if token == 'admin' else token}"
    req = urllib.request.Request(srv.url + path, method=method, headers=all_headers,
                                 data=json.dumps(body).encode() if body is not None else None)
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def test_a_create_is_received_then_complete_with_its_objects(srv: EmbeddedApiServer, sink: ListSink) -> None:
    assert call(srv, "POST", CMS, {"metadata": {"name": "cm"}, "data": {"k": "v"}})[0] == 201
    received, complete = sink.of(CMS)
    assert [received["stage"], complete["stage"]] == ["RequestReceived", "ResponseComplete"]
    assert received["auditID"] == complete["auditID"]
    assert list(complete) == ["kind", "apiVersion", "level", "auditID", "stage", "requestURI", "verb", "user",
                              "sourceIPs", "userAgent", "objectRef", "responseStatus", "requestObject",
                              "responseObject", "requestReceivedTimestamp", "stageTimestamp", "annotations"]
    assert complete["kind"] == "Event" and complete["apiVersion"] == "audit.k8s.io/v1"
    assert complete["level"] == "RequestResponse" and complete["verb"] == "create" and complete["requestURI"] == CMS
    assert complete["user"] == {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]}
    assert complete["sourceIPs"] == ["127.0.0.1"] and complete["userAgent"] == "audit-test/1.0"
    assert complete["objectRef"] == {"resource": "configmaps", "namespace": "default", "apiVersion": "v1"}
    assert complete["responseStatus"] == {"metadata": {}, "code": 201}
    assert complete["requestObject"] == {"metadata": {"name": "cm"}, "data": {"k": "v"}}  # as the client sent it
    assert complete["responseObject"]["metadata"]["uid"]
    assert complete["annotations"] == {"authorization.k8s.io/decision": "allow", "authorization.k8s.io/reason": ""}
    assert "responseStatus" not in received and "annotations" not in received
    assert received["requestReceivedTimestamp"] == received["stageTimestamp"] == complete["requestReceivedTimestamp"]
    assert complete["stageTimestamp"] >= complete["requestReceivedTimestamp"]
    assert complete["stageTimestamp"].endswith("Z") and len(complete["stageTimestamp"]) == 27  # microseconds


def test_levels_none_and_metadata(srv: EmbeddedApiServer, sink: ListSink) -> None:
    assert call(srv, "GET", "/version")[0] == 200
    assert sink.of("/version") == []  # level None
    assert call(srv, "GET", "/api/v1/namespaces/default/pods?limit=5")[0] == 200
    event = sink.of("/pods")[-1]
    assert event["level"] == "Metadata" and event["verb"] == "list" and event["requestURI"].endswith("?limit=5")
    assert "requestObject" not in event and "responseObject" not in event


def test_refusals_forbidden_and_unauthenticated(srv: EmbeddedApiServer, sink: ListSink) -> None:
    code, _ = call(srv, "GET", "/api/v1/nodes", token=None)
    assert code == 403
    event = sink.of("/api/v1/nodes")[-1]
    assert event["user"] == {"username": "system:anonymous", "groups": ["system:unauthenticated"]}
    assert event["annotations"]["authorization.k8s.io/decision"] == "forbid"
    status = event["responseStatus"]
    assert status["code"] == 403 and status["reason"] == "Forbidden" and status["status"] == "Failure"
    assert 'User "system:anonymous" cannot list resource "nodes"' in status["message"]
    assert call(srv, "GET", "/api/v1/pods", token="bogus")[0] == 401
    events = sink.of("/api/v1/pods")
    assert [e["stage"] for e in events] == ["ResponseStarted"]  # refused credentials: one event, no user
    assert events[0]["user"] == {}
    assert events[0]["responseStatus"] == {"metadata": {}, "message": "Authentication failed, attempted: bearer",
                                           "code": 401}


def test_impersonation_records_both_users(srv: EmbeddedApiServer, sink: ListSink) -> None:
    assert call(srv, "GET", "/api/v1/namespaces/default/secrets", headers={"Impersonate-User": "jane"})[0] == 403
    event = sink.of("/secrets")[-1]
    assert event["user"]["username"] == "kubernetes-admin"
    assert event["impersonatedUser"] == {"username": "jane", "groups": ["system:authenticated"]}


def test_a_watch_has_a_response_started_stage(srv: EmbeddedApiServer, sink: ListSink) -> None:
    assert call(srv, "GET", "/api/v1/namespaces/default/pods?watch=true&timeoutSeconds=1")[0] == 200
    assert [e["stage"] for e in sink.of("watch=true")] == ["RequestReceived", "ResponseStarted", "ResponseComplete"]
    assert sink.of("watch=true")[1]["responseStatus"] == {"metadata": {}, "code": 200}


def test_omit_stages(sink: ListSink) -> None:
    with _server(sink, {"level": "Metadata", "omitStages": ["RequestReceived"]}) as srv:
        call(srv, "GET", "/api/v1/namespaces")
    assert [e["stage"] for e in sink.of("/api/v1/namespaces")] == ["ResponseComplete"]


def test_policy_audit_action_annotates_the_event(srv: EmbeddedApiServer, sink: ListSink) -> None:
    policy = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
              "metadata": {"name": "small"},
              "spec": {"failurePolicy": "Fail",
                       "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                               "operations": ["CREATE"],
                                                               "resources": ["configmaps"]}]},
                       "validations": [{"expression": "true"},
                                       {"expression": "size(object.data) < 2", "message": "too many keys"}],
                       "auditAnnotations": [{"key": "keys", "valueExpression": "string(size(object.data))"}]}}
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": "small-audit"},
               "spec": {"policyName": "small", "validationActions": ["Audit", "Warn"]}}
    assert call(srv, "POST", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies", policy)[0] == 201
    assert call(srv, "POST", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
                binding)[0] == 201
    assert call(srv, "POST", CMS, {"metadata": {"name": "big"}, "data": {"a": "1", "b": "2"}})[0] == 201
    annotations = sink.of(CMS)[-1]["annotations"]
    assert json.loads(annotations["validation.policy.admission.k8s.io/validation_failure"]) == [
        {"message": "too many keys", "policy": "small", "binding": "small-audit", "expressionIndex": 1,
         "validationActions": ["Audit", "Warn"]}]
    assert annotations["validation.policy.admission.k8s.io/validation_failure"].startswith('[{"message":')
    assert annotations["small/keys"] == "2"
    assert call(srv, "POST", CMS, {"metadata": {"name": "small"}, "data": {"a": "1"}})[0] == 201
    assert "validation.policy.admission.k8s.io/validation_failure" not in sink.of(CMS)[-1]["annotations"]


# ----- the log backend ---------------------------------------------------------------------------------


def test_log_backend_writes_json_lines(tmp_path: Path) -> None:
    log = tmp_path / "audit" / "audit.log"
    backend = LogBackend(log)
    auditor = Auditor(parse_policy(_policy({"level": "Metadata"})), backend)
    with EmbeddedApiServer(audit=auditor) as srv:
        for i in range(20):
            call(srv, "POST", CMS, {"metadata": {"name": f"c{i}"}}, token=None)
    lines = log.read_text().splitlines()  # stop() wrote every queued event
    events = [json.loads(line) for line in lines]
    assert len(events) == 40 and all(e["kind"] == "Event" for e in events)
    assert {e["stage"] for e in events} == {"RequestReceived", "ResponseComplete"}
    assert oct(log.stat().st_mode & 0o777) == "0o600"


def test_cli_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(json.dumps(_policy({"level": "Metadata"})))

    def args(**kw: Any) -> argparse.Namespace:
        return argparse.Namespace(**{"audit_policy_file": None, "audit_log_path": None, **kw})
    assert _auditor(args(audit_log_path=str(tmp_path / "a.log"))) is None
    assert "without --audit-policy-file: no audit events" in capsys.readouterr().err
    auditor = _auditor(args(audit_policy_file=str(policy), audit_log_path=str(tmp_path / "a.log")))
    assert auditor is not None
    auditor.stop()
    with pytest.raises(PolicyError, match="--audit-policy-file .*nope.yaml: No such file"):
        _auditor(args(audit_policy_file=str(tmp_path / "nope.yaml"), audit_log_path="-"))
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError, match="--audit-log-path .*file/a.log: "):
        _auditor(args(audit_policy_file=str(policy), audit_log_path=str(tmp_path / "file" / "a.log")))


def test_rbac_allow_reason_names_the_binding_role_and_subject() -> None:
    from controlplane.authn import UserInfo
    from controlplane.authz.attributes import Attributes
    from controlplane.authz.rbac import RbacIndex

    role = {"metadata": {"name": "reader", "namespace": "team"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}
    cluster_role = {"metadata": {"name": "node-reader"},
                    "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]}
    rb = {"metadata": {"name": "read", "namespace": "team"}, "roleRef": {"kind": "Role", "name": "reader"},
          "subjects": [{"kind": "User", "name": "bob"}, {"kind": "ServiceAccount", "name": "app"}]}
    crb = {"metadata": {"name": "nodes"}, "roleRef": {"kind": "ClusterRole", "name": "node-reader"},
           "subjects": [{"kind": "Group", "name": "ops"}]}
    index = RbacIndex([role], [cluster_role], [rb], [crb])
    app = UserInfo("system:serviceaccount:team:app", groups=("system:serviceaccounts",))
    pods = Attributes(app, "get", api_group="", resource="pods", namespace="team")
    assert index.allowed_by(app, "team", pods) == ('RBAC: allowed by RoleBinding "read/team" of Role "reader" to '
                                                   'ServiceAccount "app/team"')
    ops = UserInfo("carol", groups=("ops",))
    nodes = Attributes(ops, "list", api_group="", resource="nodes")
    assert index.allowed_by(ops, "", nodes) == ('RBAC: allowed by ClusterRoleBinding "nodes" of ClusterRole '
                                                '"node-reader" to Group "ops"')
    assert index.allowed_by(ops, "team", Attributes(ops, "get", resource="pods", namespace="team")) is None


def test_a_refused_certificate_is_audited_as_x509(sink: ListSink, tmp_path: Path) -> None:
    import ssl

    from controlplane.tls import issue_client_certificate, make_certificates

    cert, key = issue_client_certificate(make_certificates(), "mallory")
    (tmp_path / "c.crt").write_bytes(cert)
    (tmp_path / "c.key").write_bytes(key)
    with _server(sink, {"level": "Metadata"}, tls=True) as srv:
        assert srv.certificates is not None
        context = ssl.create_default_context(cadata=srv.certificates.ca_pem.decode())
        context.load_cert_chain(str(tmp_path / "c.crt"), str(tmp_path / "c.key"))
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(srv.tls_url + "/api/v1/namespaces", context=context)
        assert err.value.code == 401
    event = sink.of("/api/v1/namespaces")[-1]
    assert event["responseStatus"]["message"] == "Authentication failed, attempted: x509"
