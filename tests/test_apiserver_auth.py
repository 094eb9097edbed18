"""Authentication, authorization and admission of the embedded control plane, end to end over HTTP (and with
kubectl 1.37 for create token, auth whoami and auth can-i), against a server that refuses what
kube-apiserver refuses."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.cel.policyenv import PolicyEnvironment
from controlplane import EmbeddedApiServer

KUBECTL = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "kubectl"
MANIFESTS = Path(__file__).resolve().parents[1] / "manifests" / "base"


class Client:
    def __init__(self, url: str, token: str | None) -> None:
        self.url, self.token = url, token

    def call(self, method: str, path: str, body: Any = None, ctype: str = "application/json") -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        if body is not None:
            headers["Content-Type"] = ctype
        req = urllib.request.Request(self.url + path, method=method, headers=headers,
                                     data=json.dumps(body).encode() if body is not None else None)
        try:
            with urllib.request.urlopen(req) as resp:
                return resp.status, _decode(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, _decode(err.read())


def _decode(data: bytes) -> Any:
    try:
        return json.loads(data or b"null")
    except ValueError:
        return data.decode()


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[EmbeddedApiServer]:
    server = EmbeddedApiServer(unauthenticated_as_admin=False, expressions=PolicyEnvironment())
    server.start()
    try:
        yield server
    finally:
        server.stop()


def admin(srv: EmbeddedApiServer) -> Client:
    return Client(srv.url, srv.admin_token)


def _apply(c: Client, docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        rt = c.call("GET", "/apis" if "/" in doc["apiVersion"] else "/api")
        assert rt[0] == 200
        group_version = doc["apiVersion"]
        base = f"/apis/{group_version}" if "/" in group_version else f"/api/{group_version}"
        plural = {"ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings", "Role": "roles",
                  "RoleBinding": "rolebindings", "ServiceAccount": "serviceaccounts", "Namespace": "namespaces",
                  "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
                  "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
                  "ValidatingWebhookConfiguration": "validatingwebhookconfigurations", "Node": "nodes",
                  "ResourceSlice": "resourceslices"}[doc["kind"]]
        ns = doc["metadata"].get("namespace")
        path = f"{base}/namespaces/{ns}/{plural}" if ns else f"{base}/{plural}"
        code, body = c.call("POST", path, doc)
        assert code == 201, body


def _token(c: Client, namespace: str, name: str, spec: dict[str, Any] | None = None) -> str:
    code, body = c.call("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", {"spec": spec or {}})
    assert code == 201, body
    return str(body["status"]["token"])


def _account(c: Client, namespace: str, name: str) -> None:
    code, body = c.call("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": name}})
    assert code == 201, body


def test_anonymous_gets_public_info_only(srv: EmbeddedApiServer) -> None:
    anon = Client(srv.url, None)
    assert anon.call("GET", "/version")[0] == 200
    assert anon.call("GET", "/healthz")[0] == 200
    code, body = anon.call("GET", "/api/v1/nodes")
    assert code == 403
    assert body["message"] == ('nodes is forbidden: User "system:anonymous" cannot list resource "nodes" in API '
                               'group "" at the cluster scope')
    code, body = anon.call("GET", "/api")
    assert (code, body["message"]) == (403, 'forbidden: User "system:anonymous" cannot get path "/api"')
    code, body = anon.call("POST", "/api/v1/namespaces/default/pods", {"metadata": {"name": "x"}})
    assert code == 403 and 'cannot create resource "pods"' in body["message"] and 'namespace "default"' in body["message"]


def test_bogus_foreign_and_orphaned_tokens_are_401(srv: EmbeddedApiServer) -> None:
    assert Client(srv.url, "bogus").call("GET", "/version")[0] == 401
    with EmbeddedApiServer(unauthenticated_as_admin=False) as other:
        foreign = _token(admin(other), "default", "default")
    code, body = Client(srv.url, foreign).call("GET", "/version")
    assert (code, body["reason"]) == (401, "Unauthorized")
    c = admin(srv)
    _account(c, "default", "robot")
    token = _token(c, "default", "robot")
    assert Client(srv.url, token).call("GET", "/api")[0] == 200  # system:discovery for authenticated users
    assert c.call("DELETE", "/api/v1/namespaces/default/serviceaccounts/robot")[0] == 200
    assert Client(srv.url, token).call("GET", "/api")[0] == 401
    _account(c, "default", "robot")  # same name, new uid: the old token stays refused
    assert Client(srv.url, token).call("GET", "/api")[0] == 401


def test_namespaces_get_a_default_service_account(srv: EmbeddedApiServer) -> None:
    c = admin(srv)
    assert c.call("POST", "/api/v1/namespaces", {"metadata": {"name": "team-a"}})[0] == 201
    code, body = c.call("GET", "/api/v1/namespaces/team-a/serviceaccounts/default")
    assert code == 200, body


def _rbac(name: str, rules: list[dict[str, Any]], namespace: str = "default") -> list[dict[str, Any]]:
    return [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
             "rules": rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
             "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]}]


def _claim(c: Client, name: str, namespace: str = "default") -> dict[str, Any]:
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}
    code, body = c.call("POST", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims", claim)
    assert code == 201, body
    return body  # type: ignore[no-any-return]


def _allocation(node: str) -> dict[str, Any]:
    return {"devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": "gpu-0"}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}


def test_claim_status_needs_the_binding_and_driver_verbs(srv: EmbeddedApiServer) -> None:
    c = admin(srv)
    status_rule = {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims", "resourceclaims/status"],
                   "verbs": ["get", "update", "patch"]}
    _account(c, "default", "without")
    _account(c, "default", "with")
    _apply(c, _rbac("without", [status_rule]))
    _apply(c, _rbac("with", [status_rule,
                             {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/binding"],
                              "verbs": ["update", "patch"]},
                             {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
                              "resourceNames": ["gpu.nvidia.com"], "verbs": ["arbitrary-node:update"]}]))
    claim = _claim(c, "c1")
    path = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c1/status"
    body = {**claim, "status": {"allocation": _allocation("n1")}}
    code, answer = Client(srv.url, _token(c, "default", "without")).call("PUT", path, body)
    assert code == 422, answer
    assert "changing status.allocation or status.reservedFor requires extra permission" in answer["message"]
    allowed = Client(srv.url, _token(c, "default", "with"))
    code, answer = allowed.call("PUT", path, body)
    assert code == 200, answer
    devices = {**answer, "status": {**answer["status"], "devices": [
        {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"}]}}
    code, refused = Client(srv.url, _token(c, "default", "without")).call("PUT", path, devices)
    assert code == 422 and "changing status.devices requires extra permission" in refused["message"]
    code, answer = allowed.call("PUT", path, devices)
    assert code == 200, answer


def test_granular_status_authorization_follows_the_release(tmp_path: Path) -> None:
    with EmbeddedApiServer(unauthenticated_as_admin=False, kubernetes_version="1.35") as old:
        c = admin(old)
        _account(c, "default", "without")
        _apply(c, _rbac("without", [{"apiGroups": ["resource.k8s.io"],
                                     "resources": ["resourceclaims", "resourceclaims/status"],
                                     "verbs": ["get", "update"]}]))
        claim = _claim(c, "c1")
        code, answer = Client(old.url, _token(c, "default", "without")).call(
            "PUT", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c1/status",
            {**claim, "status": {"allocation": _allocation("n1")}})
        assert code == 200, answer


def _node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def _slice(node: str, name: str | None = None) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name or f"{node}-gpu"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                            "resourceSliceCount": 1}, "devices": []}}


def test_node_agent_policy_keeps_agents_to_their_node_slices(srv: EmbeddedApiServer) -> None:
    """manifests/base (renamed namespace, as kustomize would): the agent's own slices pass, another node's are
    refused by the ValidatingAdmissionPolicy whatever the namespace."""
    c = admin(srv)
    docs = []
    for path in ("namespace.yaml", "serviceaccounts.yaml", "rbac.yaml", "rbac-node-guard.yaml",
                 "node-slices-policy.yaml"):
        text = (MANIFESTS / path).read_text().replace("gpu-dra-system", "renamed-system")
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    _apply(c, docs)
    _apply(c, [_node("n1"), _node("n2")])
    agent = Client(srv.url, srv.service_account_token("renamed-system", "gpu-dra-node-agent", node="n1"))
    code, body = agent.call("POST", "/apis/resource.k8s.io/v1/resourceslices", _slice("n1"))
    assert code == 201, body
    code, body = agent.call("POST", "/apis/resource.k8s.io/v1/resourceslices", _slice("n2"))
    assert code == 422, body
    assert "ValidatingAdmissionPolicy 'gpu-dra-node-agent-own-slices'" in body["message"]
    assert "may only write ResourceSlices with spec.nodeName 'n1', not 'n2'" in body["message"]
    patch = {"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}}
    assert agent.call("PATCH", "/api/v1/nodes/n1", patch, "application/merge-patch+json")[0] == 200
    code, body = agent.call("PATCH", "/api/v1/nodes/n2", patch, "application/merge-patch+json")
    assert code == 422 and "may only change that Node, not 'n2'" in body["message"]
    condition = {"status": {"conditions": [{"type": "GpuDraDevicePluginConflict", "status": "False"}]}}
    assert agent.call("PATCH", "/api/v1/nodes/n1/status", condition, "application/merge-patch+json")[0] == 200
    assert agent.call("PATCH", "/api/v1/nodes/n2/status", condition, "application/merge-patch+json")[0] == 422
    unbound = Client(srv.url, srv.service_account_token("renamed-system", "gpu-dra-node-agent"))
    code, body = unbound.call("POST", "/apis/resource.k8s.io/v1/resourceslices", _slice("n1", "x"))
    assert code == 422 and "no node association found" in body["message"]


def test_kubelet_identity_is_scoped_to_its_node(srv: EmbeddedApiServer) -> None:
    c = admin(srv)
    _apply(c, [_node("n1"), _node("n2"), _slice("n2")])
    kubelet = Client(srv.url, srv.node_token("n1"))
    assert kubelet.call("GET", "/api/v1/nodes/n1")[0] == 200
    code, body = kubelet.call("GET", "/api/v1/nodes/n2")
    assert code == 403 and body["message"].endswith("node 'n1' cannot read 'n2', only its own Node object")
    assert kubelet.call("GET", "/apis/resource.k8s.io/v1/resourceslices/n2-gpu")[0] == 403
    assert kubelet.call("GET", "/api/v1/pods")[0] == 403
    assert kubelet.call("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1")[0] == 200
    code, body = kubelet.call("PATCH", "/api/v1/nodes/n2", {"metadata": {"labels": {"x": "y"}}},
                              "application/merge-patch+json")
    assert code == 403 and 'node "n1" is not allowed to modify node "n2"' in body["message"]
    assert kubelet.call("POST", "/apis/resource.k8s.io/v1/resourceslices", _slice("n2", "other"))[0] == 403


def test_node_restriction_keeps_labels_and_tokens_to_what_a_kubelet_sets(srv: EmbeddedApiServer) -> None:
    c = admin(srv)
    _apply(c, [_node("n1"), _node("n2")])
    kubelet = Client(srv.url, srv.node_token("n1"))
    merge = "application/merge-patch+json"
    for label in ("node-restriction.kubernetes.io/gpu-tenant", "team.node-restriction.kubernetes.io/x",
                  "node-role.kubernetes.io/control-plane", "k8s.io/other"):
        code, body = kubelet.call("PATCH", "/api/v1/nodes/n1", {"metadata": {"labels": {label: "y"}}}, merge)
        assert (code, body["message"]) == (403, f'nodes "n1" is forbidden: is not allowed to modify labels: {label}')
    for label in ("node.kubernetes.io/instance-type", "kubelet.kubernetes.io/x", "topology.kubernetes.io/zone",
                  "example.com/rack"):
        assert kubelet.call("PATCH", "/api/v1/nodes/n1", {"metadata": {"labels": {label: "y"}}}, merge)[0] == 200
    code, body = Client(srv.url, srv.node_token("n3")).call("POST", "/api/v1/nodes", {
        "metadata": {"name": "n3", "labels": {"node-restriction.kubernetes.io/a": "1", "kubernetes.io/os": "linux"}}})
    assert (code, body["message"]) == (403, 'nodes "n3" is forbidden: node "n3" is not allowed to set the following '
                                            "labels: node-restriction.kubernetes.io/a")
    # tokens: only bound to a pod (name and uid) that runs on the node
    _account(c, "default", "runner")
    pods = {}
    for name, node in (("here", "n1"), ("there", "n2")):
        code, pod = c.call("POST", "/api/v1/namespaces/default/pods", {"metadata": {"name": name}, "spec": {
            "nodeName": node, "serviceAccountName": "runner", "containers": [{"name": "c", "image": "busybox"}]}})
        assert code == 201, pod
        pods[name] = pod
    url = "/api/v1/namespaces/default/serviceaccounts/runner/token"

    def bound(pod: str, uid: str | None = None) -> dict[str, Any]:
        return {"spec": {"boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod,
                                            "uid": pods[pod]["metadata"]["uid"] if uid is None else uid}}}

    for body_, message in (({"spec": {}}, "node requested token not bound to a pod"),
                           ({"spec": {"boundObjectRef": {"apiVersion": "v1", "kind": "Node", "name": "n1"}}},
                            "node requested token not bound to a pod"),
                           (bound("here", ""), "node requested token with a pod binding without a uid"),
                           (bound("here", "0000"), "the UID in the bound object reference (0000) does not match the "
                                                   "UID in record. The object might have been deleted and then recreated"),
                           (bound("there"), "node requested token bound to a pod scheduled on a different node")):
        code, answer = kubelet.call("POST", url, body_)
        assert (code, answer["message"]) == (403, f'serviceaccounts "runner" is forbidden: {message}'), answer
    code, answer = kubelet.call("POST", url, bound("here"))
    assert code == 201 and answer["status"]["token"]


def _exec_accounts(c: Client, verbs: dict[str, list[str]]) -> dict[str, Client]:
    clients = {}
    for name, granted in verbs.items():
        _account(c, "default", name)
        _apply(c, _rbac(name, [{"apiGroups": [""], "resources": ["pods/exec", "pods/attach", "pods/portforward"],
                                "verbs": granted}]))
        clients[name] = Client(c.url, _token(c, "default", name))
    return clients


_UPGRADE = "/api/v1/namespaces/default/pods/absent/exec?command=true&stdout=true"


def _connect(c: Client, method: str, path: str = _UPGRADE) -> tuple[int, Any]:
    """A WebSocket upgrade (GET) or SPDY (POST) connect to a pod; the pod does not exist, so an authorized
    request ends in 404 and a refused one in 403."""
    headers = {"Authorization": f"Bearer {c.token}", "Connection": "Upgrade", "Upgrade": "websocket",
               "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
               "Sec-WebSocket-Protocol": "v5.channel.k8s.io"}
    req = urllib.request.Request(c.url + path, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, _decode(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, _decode(err.read())


def test_websocket_connect_to_a_pod_needs_create(srv: EmbeddedApiServer) -> None:
    """AuthorizePodWebsocketUpgradeCreatePermission (beta, on from 1.35): the GET of a WebSocket upgrade is
    authorized as `get`, and the pod registry also requires `create`, as for the SPDY POST."""
    accounts = _exec_accounts(admin(srv), {"getter": ["get"], "both": ["get", "create"], "creator": ["create"]})
    pod = srv.registry.by_kind("Pod")
    assert pod is not None
    served = {"exec", "attach", "portforward"} & set(pod.extra_subresources)
    assert "exec" in served
    for sub in sorted(served):
        path = _UPGRADE.replace("/exec", f"/{sub}")
        code, body = _connect(accounts["getter"], "GET", path)
        assert code == 403, (sub, body)
        assert body["message"] == (f'pods "absent" is forbidden: User "system:serviceaccount:default:getter" '
                                   f'cannot create resource "pods/{sub}" in API group "" in the namespace "default"')
        code, body = _connect(accounts["both"], "GET", path)
        assert code == 404 and body["reason"] == "NotFound", (sub, body)
    # `create` alone: the upgrade's GET is still authorized as `get` first; SPDY's POST is allowed.
    code, body = _connect(accounts["creator"], "GET")
    assert code == 403 and "cannot get resource \"pods/exec\"" in body["message"]
    assert _connect(accounts["creator"], "POST")[0] == 404
    assert _connect(accounts["getter"], "POST")[0] == 403


def test_websocket_connect_before_1_35_needs_get_only() -> None:
    with EmbeddedApiServer(unauthenticated_as_admin=False, kubernetes_version="1.34") as old:
        accounts = _exec_accounts(admin(old), {"getter": ["get"]})
        code, body = _connect(accounts["getter"], "GET")
        assert code == 404 and body["reason"] == "NotFound", body


def test_admin_access_needs_a_labelled_namespace(srv: EmbeddedApiServer) -> None:
    c = admin(srv)
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "admin"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": "gpu.nvidia.com", "adminAccess": True}}]}}}
    code, body = c.call("POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", claim)
    assert code == 422
    assert body["message"] == ('ResourceClaim.resource.k8s.io "admin" is invalid: spec.devices.requests[0].exactly.'
                               "adminAccess: Forbidden: admin access to devices requires the "
                               "`resource.kubernetes.io/admin-access: true` label on the containing namespace")
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "t"},
                "spec": {"spec": claim["spec"]}}
    code, body = c.call("POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates", template)
    assert code == 422 and "spec.spec.devices.requests[0].exactly.adminAccess: Forbidden" in body["message"]
    c.call("POST", "/api/v1/namespaces", {"metadata": {"name": "ops", "labels": {
        "resource.kubernetes.io/admin-access": "true"}}})
    assert c.call("POST", "/apis/resource.k8s.io/v1/namespaces/ops/resourceclaims", claim)[0] == 201


@pytest.mark.parametrize("patch, message", [
    ({"containers": [{"name": "../../../x", "image": "busybox"}]},
     'spec.containers[0].name: Invalid value: "../../../x": a lowercase RFC 1123 label must consist of lower case '
     "alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or "
     "'123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"),
    ({"containers": [{"name": "a", "image": "x"}], "initContainers": [{"name": "a", "image": "x"}]},
     'spec.containers[0].name: Duplicate value: "a"'),
    ({"containers": [{"name": "a", "image": "x", "ports": [{"containerPort": 70000}]}]},
     "spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive"),
    ({"containers": [{"name": "a", "image": "x", "env": [{"name": "A=B"}]}]},
     "spec.containers[0].env[0].name: Invalid value: \"A=B\": a valid environment variable name must consist only "
     "of printable ASCII characters other than '='"),
    ({"containers": [{"name": "a", "image": "x"}], "volumes": [{"name": "../v", "emptyDir": {}}]},
     'spec.volumes[0].name: Invalid value: "../v"'),
    ({"containers": [{"name": "a", "image": "x", "lifecycle": {"preStop": {}}}]},
     "spec.containers[0].lifecycle.preStop: Required value: must specify a handler type"),
    ({"containers": [{"name": "a", "image": "x", "lifecycle": {"postStart": {
        "exec": {"command": ["true"]}, "sleep": {"seconds": 1}}}}]},
     "spec.containers[0].lifecycle.postStart.sleep: Forbidden: may not specify more than 1 handler type"),
    ({"containers": [{"name": "a", "image": "x", "livenessProbe": {"exec": {"command": []}}}]},
     "spec.containers[0].livenessProbe.exec.command: Required value"),
    ({"containers": [{"name": "a", "image": "x"}], "initContainers": [
        {"name": "i", "image": "x", "lifecycle": {"preStop": {"exec": {"command": ["true"]}}}}]},
     "spec.initContainers[0].lifecycle: Forbidden: may not be set for init containers without restartPolicy=Always"),
])
def test_pod_validation(srv: EmbeddedApiServer, patch: dict[str, Any], message: str) -> None:
    code, body = admin(srv).call("POST", "/api/v1/namespaces/default/pods",
                                 {"metadata": {"name": "p"}, "spec": patch})
    assert code == 422, body
    assert message in body["message"]


def _policy(actions: list[str]) -> list[dict[str, Any]]:
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": "max-replicas"},
         "spec": {"paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
                  "matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                                                          "operations": ["CREATE", "UPDATE"],
                                                          "resources": ["deployments"]}]},
                  "matchConditions": [{"name": "not-exempt",
                                       "expression": "!has(object.metadata.labels) || "
                                                     "!('exempt' in object.metadata.labels)"}],
                  "validations": [{"expression": "object.spec.replicas <= int(params.data.max)",
                                   "messageExpression": "'replicas must be at most ' + params.data.max"}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": "max-replicas"},
         "spec": {"policyName": "max-replicas", "validationActions": actions,
                  "paramRef": {"name": "limits", "namespace": "default", "parameterNotFoundAction": "Deny"}}},
    ]


def _deployment(name: str, replicas: int, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}


def test_validating_admission_policy_with_params_conditions_and_actions(srv: EmbeddedApiServer) -> None:
    c = admin(srv)
    _apply(c, _policy(["Deny"]))
    deployments = "/apis/apps/v1/namespaces/default/deployments"
    code, body = c.call("POST", deployments, _deployment("d0", 1))
    assert code == 422 and "no params found" in body["message"]
    c.call("POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "limits"}, "data": {"max": "3"}})
    assert c.call("POST", deployments, _deployment("d1", 3))[0] == 201
    code, body = c.call("POST", deployments, _deployment("d2", 5))
    assert code == 422
    assert body["message"] == ('deployments.apps "d2" is forbidden: ValidatingAdmissionPolicy \'max-replicas\' with '
                               "binding 'max-replicas' denied request: replicas must be at most 3")
    assert c.call("POST", deployments, _deployment("d3", 5, {"exempt": "yes"}))[0] == 201
    assert c.call("DELETE", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/max-replicas")[0] == 200
    _apply(c, _policy(["Warn"])[1:])
    req = urllib.request.Request(srv.url + deployments, method="POST", data=json.dumps(_deployment("d4", 9)).encode(),
                                 headers={"Authorization": f"Bearer {srv.admin_token}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req) as resp:
        assert resp.status == 201
        warning = resp.headers.get("Warning")
    assert "Validation failed for ValidatingAdmissionPolicy 'max-replicas' with binding 'max-replicas': " \
           "replicas must be at most 3" in warning


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=hook",
                    "-addext", "subjectAltName=DNS:hook.webhooks.svc,IP:127.0.0.1",
                    "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")], check=True, capture_output=True)
    return d / "cert.pem", d / "key.pem"


class _Hook(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen.append((self.path, review))  # type: ignore[attr-defined]
        obj = review["request"]["object"] or {}
        allowed = "forbidden" not in ((obj.get("metadata") or {}).get("labels") or {})
        response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": allowed}
        if not allowed:
            response["status"] = {"code": 403, "reason": "Forbidden", "message": "label forbidden is not allowed"}
        data = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture
def webhook(tls_files: tuple[Path, Path]) -> Iterator[HTTPServer]:
    httpd = HTTPServer(("127.0.0.1", 0), _Hook)
    httpd.seen = []  # type: ignore[attr-defined]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(tls_files[0]), str(tls_files[1]))
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield httpd
    finally:
        httpd.shutdown()


def _webhook_config(name: str, client: dict[str, Any], failure: str = "Fail") -> dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [{"name": f"{name}.example.com", "clientConfig": client, "failurePolicy": failure,
                          "sideEffects": "None", "admissionReviewVersions": ["v1"], "timeoutSeconds": 2,
                          "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                     "resources": ["configmaps"]}]}]}


@pytest.mark.process  # kubectl or openssl
def test_validating_webhook_over_https(srv: EmbeddedApiServer, webhook: HTTPServer,
                                       tls_files: tuple[Path, Path]) -> None:
    c = admin(srv)
    ca = base64.b64encode(tls_files[0].read_bytes()).decode()
    port = webhook.server_address[1]
    _apply(c, [_webhook_config("by-url", {"url": f"https://127.0.0.1:{port}/validate", "caBundle": ca})])
    cms = "/api/v1/namespaces/default/configmaps"
    assert c.call("POST", cms, {"metadata": {"name": "ok"}})[0] == 201
    code, body = c.call("POST", cms, {"metadata": {"name": "bad", "labels": {"forbidden": "1"}}})
    assert (code, body["message"]) == (403, 'admission webhook "by-url.example.com" denied the request: label '
                                            "forbidden is not allowed")
    path, review = webhook.seen[0]  # type: ignore[attr-defined]
    assert path == "/validate?timeout=2s"
    assert review["request"]["operation"] == "CREATE" and review["request"]["userInfo"]["username"] == "kubernetes-admin"
    assert c.call("DELETE", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/by-url")[0] == 200
    srv.service_endpoints[("webhooks", "hook")] = ("127.0.0.1", port)
    _apply(c, [_webhook_config("by-service", {"service": {"namespace": "webhooks", "name": "hook", "port": 443,
                                                          "path": "/v"}, "caBundle": ca})])
    assert c.call("POST", cms, {"metadata": {"name": "bad2", "labels": {"forbidden": "1"}}})[0] == 403
    assert webhook.seen[-1][0] == "/v?timeout=2s"  # type: ignore[attr-defined]


@pytest.mark.process  # kubectl or openssl
def test_webhook_that_is_down_fails_or_is_ignored(srv: EmbeddedApiServer, tls_files: tuple[Path, Path]) -> None:
    c = admin(srv)
    ca = base64.b64encode(tls_files[0].read_bytes()).decode()
    _apply(c, [_webhook_config("down", {"url": "https://127.0.0.1:1/validate", "caBundle": ca})])
    code, body = c.call("POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "x"}})
    assert code == 500
    assert body["message"].startswith('Internal error occurred: failed calling webhook "down.example.com": failed to '
                                      'call webhook: Post "https://127.0.0.1:1/validate?timeout=2s"')
    c.call("DELETE", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/down")
    _apply(c, [_webhook_config("down", {"url": "https://127.0.0.1:1/validate", "caBundle": ca}, "Ignore")])
    assert c.call("POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "x"}})[0] == 201


def _kubectl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.process  # kubectl or openssl
def test_kubectl_create_token_whoami_and_can_i(tmp_path: Path) -> None:
    """kubectl sends credentials over TLS only; over this server's plain HTTP it sends none, which the server's
    insecure-port mode takes as the admin, and `--as` impersonates the account under test."""
    with EmbeddedApiServer(expressions=PolicyEnvironment()) as srv:
        kubeconfig = srv.write_kubeconfig(tmp_path / "admin")
        who = _kubectl(kubeconfig, "auth", "whoami", "-o", "json")
        assert who.returncode == 0, who.stderr
        assert json.loads(who.stdout)["status"]["userInfo"]["groups"] == ["system:masters", "system:authenticated"]
        assert _kubectl(kubeconfig, "create", "serviceaccount", "reader").returncode == 0
        made = _kubectl(kubeconfig, "create", "token", "reader", "--duration", "20m")
        assert made.returncode == 0, made.stderr
        code, answer = Client(srv.url, made.stdout.strip()).call(
            "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", {})
        assert answer["status"]["userInfo"]["username"] == "system:serviceaccount:default:reader"
        _apply(admin(srv), [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": "read-pods", "namespace": "default"},
             "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "read-pods", "namespace": "default"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-pods"},
             "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "default"}]}])
        sa = ["--as", "system:serviceaccount:default:reader"]
        assert _kubectl(kubeconfig, *sa, "auth", "can-i", "list", "pods").stdout.strip() == "yes"
        denied = _kubectl(kubeconfig, *sa, "auth", "can-i", "list", "nodes")
        assert denied.stdout.strip() == "no" and denied.returncode == 1
        assert _kubectl(kubeconfig, *sa, "auth", "can-i", "list", "pods", "-n", "kube-system").stdout.strip() == "no"
        assert "system:serviceaccount:default:reader" in _kubectl(kubeconfig, *sa, "auth", "whoami").stdout
        got = _kubectl(kubeconfig, *sa, "get", "nodes")
        assert got.returncode != 0
        assert ('User "system:serviceaccount:default:reader" cannot list resource "nodes" in API group "" at the '
                "cluster scope") in got.stderr
        short = _kubectl(kubeconfig, "create", "token", "reader", "--duration", "1m")
        assert short.returncode != 0 and "may not specify a duration less than 10 minutes" in short.stderr


def test_reviews_as_kubectl_sends_them_in_json(srv: EmbeddedApiServer) -> None:
    """The same endpoints kubectl auth can-i / whoami / create token call, with JSON bodies."""
    c = admin(srv)
    _account(c, "default", "reader")
    token = _token(c, "default", "reader", {"expirationSeconds": 1200})
    reader = Client(srv.url, token)
    code, answer = reader.call("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                               {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    assert code == 201 and answer["status"]["userInfo"]["username"] == "system:serviceaccount:default:reader"
    review = {"spec": {"resourceAttributes": {"verb": "list", "resource": "nodes"}}}
    code, answer = reader.call("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review)
    assert code == 201 and answer["status"]["allowed"] is False
    code, answer = c.call("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review)
    assert answer["status"]["allowed"] is True
    code, answer = c.call("POST", "/api/v1/namespaces/default/serviceaccounts/reader/token",
                          {"spec": {"expirationSeconds": 60}})
    assert code == 422 and "may not specify a duration less than 10 minutes" in answer["message"]
    # impersonation, as kubectl --as sends it
    req = urllib.request.Request(srv.url + "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", method="POST",
                                 data=json.dumps(review).encode(),
                                 headers={"Authorization": f"Bearer {srv.admin_token}", "Content-Type": "application/json",
                                          "Impersonate-User": "system:serviceaccount:default:reader"})
    with urllib.request.urlopen(req) as resp:
        assert json.loads(resp.read())["status"]["allowed"] is False
    req.headers["Authorization"] = f"Bearer {token}"
    req.add_header("Authorization", f"Bearer {token}")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req)
    assert err.value.code == 403


@pytest.mark.process  # kubectl or openssl
def test_kubectl_over_tls_authenticates_and_anonymous_is_anonymous(tmp_path: Path) -> None:
    """Over HTTPS kubectl sends its token: the admin's works, a bogus one is 401 (kubectl's "You must be logged in"),
    a ServiceAccount's is authorized by RBAC, and a request without credentials is system:anonymous."""
    with EmbeddedApiServer(tls=True, tls_dir=tmp_path / "pki") as srv:
        assert srv.tls_url.startswith("https://127.0.0.1:")
        kubeconfig = srv.write_kubeconfig(tmp_path / "admin")
        assert yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"] == srv.tls_url
        listed = _kubectl(kubeconfig, "get", "nodes")
        assert listed.returncode == 0, listed.stderr
        bogus = _kubectl(kubeconfig, "--token", "bogus", "get", "nodes")
        assert bogus.returncode == 1 and "You must be logged in to the server (Unauthorized)" in bogus.stderr
        c = admin(srv)
        _account(c, "default", "reader")
        token = _token(c, "default", "reader")
        denied = _kubectl(kubeconfig, "--token", token, "get", "nodes")
        assert ('User "system:serviceaccount:default:reader" cannot list resource "nodes" in API group "" at the '
                "cluster scope") in denied.stderr
        who = _kubectl(kubeconfig, "--token", token, "auth", "whoami")
        assert who.returncode == 0 and "system:serviceaccount:default:reader" in who.stdout, who.stderr
        can = _kubectl(kubeconfig, "--token", token, "auth", "can-i", "list", "nodes")
        assert (can.returncode, can.stdout.strip()) == (1, "no")
        listed_rules = _kubectl(kubeconfig, "--token", token, "auth", "can-i", "--list")
        assert listed_rules.returncode == 0, listed_rules.stderr
        assert "selfsubjectaccessreviews.authorization.k8s.io" in listed_rules.stdout  # system:basic-user
        assert "nodes" not in listed_rules.stdout
        made = _kubectl(kubeconfig, "create", "token", "reader")
        assert made.returncode == 0, made.stderr
        assert _kubectl(kubeconfig, "--token", made.stdout.strip(), "auth", "whoami").returncode == 0
        ca = ssl.create_default_context(cafile=None, cadata=(tmp_path / "pki" / "ca.crt").read_text())
        for path, code in (("/version", 200), ("/api/v1/nodes", 403), ("/api", 403)):
            req = urllib.request.Request(srv.tls_url + path)
            try:
                with urllib.request.urlopen(req, context=ca) as resp:
                    got = resp.status
            except urllib.error.HTTPError as err:
                got = err.code
                if code == 403:
                    assert "system:anonymous" in json.loads(err.read())["message"]
            assert got == code, path


def test_manifest_rbac_carries_the_dra_status_verbs(srv: EmbeddedApiServer) -> None:
    """manifests/base as shipped: the controller may allocate and deallocate (clearing status.devices), the agent
    may report status.devices only for claims on its own node."""
    c = admin(srv)
    docs = []
    for path in ("namespace.yaml", "serviceaccounts.yaml", "rbac.yaml"):
        docs.extend(d for d in yaml.safe_load_all((MANIFESTS / path).read_text()) if d)
    _apply(c, docs + [_node("n1"), _node("n2")])
    controller = Client(srv.url, srv.service_account_token("gpu-dra-system", "gpu-dra-controller"))
    agent = Client(srv.url, srv.service_account_token("gpu-dra-system", "gpu-dra-node-agent", node="n1"))
    for name, node in (("on-n1", "n1"), ("on-n2", "n2")):
        claim = _claim(c, name)
        path = f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{name}/status"
        code, claim = controller.call("PUT", path, {**claim, "status": {"allocation": _allocation(node)}})
        assert code == 200, claim
        devices = {**claim, "status": {**claim["status"], "devices": [
            {"driver": "gpu.nvidia.com", "pool": node, "device": "gpu-0", "conditions": []}]}}
        code, answer = agent.call("PUT", path, devices)
        if node == "n1":
            assert code == 200, answer
            code, answer = controller.call("PUT", path, {**answer, "status": {}})
            assert code == 200, answer  # deallocated, devices cleared
        else:
            assert code == 422 and "changing status.devices requires extra permission" in answer["message"]
