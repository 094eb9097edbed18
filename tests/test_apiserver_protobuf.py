"""`application/vnd.kubernetes.protobuf` bodies, as kubectl 1.37 sends them (create namespace/deployment/secret,
priorityclass) and asks for them (protobuf first, JSON as fallback)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from controlplane import protobuf
from controlplane import k8sapi
from tests.test_kubectl import KUBECTL, kubectl


def test_the_descriptor_set_is_current() -> None:
    pytest.importorskip("grpc_tools")
    assert k8sapi.DESCRIPTORS.read_bytes() == k8sapi.compile_descriptors(), \
        "controlplane/k8sproto/descriptors.binpb is stale: run python -m controlplane.k8sapi"


def test_round_trips_keep_every_field_and_their_types() -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "d", "namespace": "default", "labels": {"app": "d"},
                               "creationTimestamp": "2026-01-02T03:04:05Z", "generation": 2},
                  "spec": {"replicas": 0, "strategy": {"type": "RollingUpdate",
                                                       "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 1}},
                           "selector": {"matchLabels": {"app": "d"}},
                           "template": {"metadata": {"labels": {"app": "d"}}, "spec": {
                               "automountServiceAccountToken": False, "securityContext": {},
                               "containers": [{"name": "a", "image": "x:1", "command": ["sh"],
                                               "resources": {"requests": {"cpu": "100m"}, "claims": [{"name": "g"}]},
                                               "ports": [{"containerPort": 80, "protocol": "TCP"}],
                                               "readinessProbe": {"httpGet": {"port": 8080}, "periodSeconds": 5},
                                               "env": [{"name": "E", "valueFrom": {"configMapKeyRef": {
                                                   "name": "cm", "key": "k"}}}]}],
                               "volumes": [{"name": "v", "configMap": {"name": "cm"}}]}}}}
    assert protobuf.decode(protobuf.encode(deployment)) == deployment
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "type": "Opaque",
              "data": {"token": "aGVsbG8="}, "stringData": {"x": "y"}}
    assert protobuf.decode(protobuf.encode(secret)) == secret
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
             "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu", "count": 2}}],
                                  "config": [{"opaque": {"driver": "gpu.nvidia.com",
                                                         "parameters": {"kind": "GpuConfig", "x": [1, 2]}}}]}}}
    assert protobuf.decode(protobuf.encode(claim)) == claim


def test_bad_bodies_are_refused_with_the_reason() -> None:
    with pytest.raises(protobuf.ProtobufError, match="magic"):
        protobuf.decode(b"{}")
    with pytest.raises(protobuf.ProtobufError, match="no protobuf message type for Widget"):
        type_meta = b"\n\x0eexample.com/v1\x12\x06Widget"
        protobuf.decode(protobuf.MAGIC + b"\n" + bytes([len(type_meta)]) + type_meta)


def _post(url: str, body: bytes, accept: str) -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": protobuf.MEDIA_TYPE, "Accept": accept})
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read()


def test_the_server_answers_in_the_format_asked_for(apiserver: Any) -> None:
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}}
    code, ctype, body = _post(apiserver.url + "/api/v1/namespaces", protobuf.encode(ns),
                              f"{protobuf.MEDIA_TYPE},application/json")
    assert (code, ctype) == (201, protobuf.MEDIA_TYPE)
    created = protobuf.decode(body)
    assert created["metadata"]["name"] == "team" and created["status"] == {"phase": "Active"}
    code, ctype, body = _post(apiserver.url + "/api/v1/namespaces", protobuf.encode({**ns, "metadata": {"name": "b"}}),
                              "application/json")
    assert (code, ctype) == (201, "application/json") and json.loads(body)["metadata"]["name"] == "b"
    code, _, body = _post(apiserver.url + "/api/v1/namespaces", b"k8s\x00\xff\xff", "application/json")
    assert code == 400 and "cannot be decoded" in json.loads(body)["message"]


@pytest.mark.process
@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
def test_kubectl_create_namespace_deployment_and_priorityclass(apiserver: Any, tmp_path: Path) -> None:
    kubectl(apiserver, "create", "namespace", "newcomer")
    kubectl(apiserver, "create", "deployment", "web", "--image=busybox:1.36", "--replicas=2", "--port=8080",
            "-n", "newcomer")
    kubectl(apiserver, "create", "priorityclass", "high", "--value=1000", "--description=batch")
    ns = json.loads(kubectl(apiserver, "get", "namespace", "newcomer", "-o", "json").stdout)
    assert ns["status"]["phase"] == "Active" and "generateName" not in ns["metadata"]
    deploy = json.loads(kubectl(apiserver, "get", "deployment", "web", "-n", "newcomer", "-o", "json").stdout)
    assert deploy["spec"]["replicas"] == 2
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "busybox:1.36" and container["ports"] == [{"containerPort": 8080, "protocol": "TCP"}]
    assert "creationTimestamp" not in deploy["spec"]["template"]["metadata"]
    pc = json.loads(kubectl(apiserver, "get", "priorityclass", "high", "-o", "json").stdout)
    assert (pc["value"], pc["description"]) == (1000, "batch")
    out = kubectl(apiserver, "create", "namespace", "newcomer", check=False)
    assert out.returncode == 1 and 'namespaces "newcomer" already exists' in out.stderr
