"""A container's environment as the kubelet builds it (downward API, resources, ConfigMaps, Secrets, envFrom), pod
IPs, and a pod whose ConfigMap is missing staying Pending in CreateContainerConfigError."""

from __future__ import annotations

import base64
import time
from typing import Any

import pytest

from sim.kubelet.envvars import EnvError, PodContext, container_env
from sim.kubelet.pods import NodeKubelet, PodIPs
from tests.conftest import RunningApiServer
from tests.plugin_helpers import DRIVER, NODE, short_tmp

POD: dict[str, Any] = {"metadata": {"name": "train-0-abcde", "namespace": "ml", "uid": "u-1",
                                    "labels": {"app": "train"},
                                    "annotations": {"batch.kubernetes.io/job-completion-index": "3"}},
                       "spec": {"nodeName": "a100-1"}}
OBJECTS: dict[tuple[str, str, str], dict[str, Any]] = {
    ("ConfigMap", "ml", "settings"): {"data": {"MODE": "fast", "bad key": "x"}},
    ("Secret", "ml", "token"): {"data": {"TOKEN": base64.b64encode(b"s3cret").decode()}},
}


def lookup(kind: str, ns: str, name: str) -> dict[str, Any] | None:
    return OBJECTS.get((kind, ns, name))


def test_value_from_every_source_and_env_from() -> None:
    ctx = PodContext(POD, "a100-1", "10.244.7.2", "127.0.0.1", {"cpu": "64", "memory": "512Gi"})
    container = {
        "name": "w", "resources": {"limits": {"cpu": "250m", "memory": "1Gi"}},
        "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}, {"secretRef": {"name": "token"}}],
        "env": [
            {"name": "INDEX", "valueFrom": {"fieldRef": {
                "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
            {"name": "REQ_CPU_M", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}},
            {"name": "MODE2", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "MODE"}}},
            {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "x", "optional": True}}},
            {"name": "WHERE", "value": "$(POD)@$(NODE)"},
        ]}
    env = container_env(container, ctx, lookup)
    assert env["INDEX"] == "3" and env["POD"] == "train-0-abcde" and env["NS"] == "ml" and env["APP"] == "train"
    assert env["NODE"] == "a100-1" and env["IP"] == "10.244.7.2"
    assert env["CPU"] == "1" and env["MEM_MI"] == "1024" and env["REQ_CPU_M"] == "250"
    assert env["CFG_MODE"] == "fast" and "CFG_bad key" not in env and env["TOKEN"] == "s3cret"
    assert env["MODE2"] == "fast" and "OPT" not in env and env["WHERE"] == "train-0-abcde@a100-1"
    # No limit: the node's allocatable.
    assert container_env({"env": [{"name": "C", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}]},
                         ctx, lookup)["C"] == "64"
    with pytest.raises(EnvError, match='configmap "missing" not found'):
        container_env({"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "missing", "key": "k"}}}]},
                      ctx, lookup)
    with pytest.raises(EnvError, match="couldn't find key NOPE in Secret ml/token"):
        container_env({"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "token", "key": "NOPE"}}}]},
                      ctx, lookup)


def test_pod_ips_come_from_the_nodes_subnet_and_are_reused() -> None:
    ips = PodIPs("a100-1")
    a, b = ips.get("a"), ips.get("b")
    assert a.startswith(ips.prefix) and a.endswith(".2") and b.endswith(".3") and ips.get("a") == a
    ips.release("a")
    assert ips.get("c") == a


def test_missing_config_map_keeps_the_pod_pending_then_it_runs_with_its_ip(apiserver: RunningApiServer) -> None:
    api = apiserver.api
    with short_tmp() as tmp:
        kubelet = NodeKubelet(api, NODE, tmp / "kubelet", DRIVER)
        kubelet.start()
        try:
            api.create("Pod", {"metadata": {"name": "p", "namespace": "default"}, "spec": {
                "nodeName": NODE, "containers": [{"name": "c", "image": "busybox", "env": [
                    {"name": "M", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "m"}}}]}]}},
                namespace="default")
            deadline = time.monotonic() + 30
            while True:
                status = api.get("Pod", "p", namespace="default").get("status") or {}
                if status.get("containerStatuses"):
                    break
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert status["phase"] == "Pending"
            assert status["containerStatuses"][0]["state"]["waiting"] == {
                "reason": "CreateContainerConfigError", "message": 'configmap "cfg" not found'}
            api.create("ConfigMap", {"metadata": {"name": "cfg"}, "data": {"m": "1"}}, namespace="default")
            while status.get("phase") != "Running":
                assert time.monotonic() < deadline
                time.sleep(0.1)
                status = api.get("Pod", "p", namespace="default").get("status") or {}
            assert status["podIP"].startswith("10.244.") and status["podIPs"] == [{"ip": status["podIP"]}]
            assert status["hostIP"] == "127.0.0.1"
        finally:
            kubelet.stop()
