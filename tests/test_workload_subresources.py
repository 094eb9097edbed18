"""kubectl 1.37 against the embedded control plane: `kubectl scale` through the scale subresource of Deployments,
ReplicaSets and StatefulSets, and kube-apiserver's printer columns for the workload kinds."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RunningApiServer

KUBECTL = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "kubectl")
TEMPLATE = {"metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}, {"name": "side", "image": "busybox"}]}}


def kubectl(s: RunningApiServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KUBECTL, "--kubeconfig", str(s.kubeconfig), "-n", "default", *args],
                          capture_output=True, text=True, timeout=60)


def _workloads(s: RunningApiServer) -> None:
    spec: dict[str, Any] = {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "template": TEMPLATE}
    s.api.create("Deployment", {"metadata": {"name": "web"}, "spec": spec}, namespace="default")
    s.api.create("ReplicaSet", {"metadata": {"name": "web-rs"}, "spec": spec}, namespace="default")
    s.api.create("StatefulSet", {"metadata": {"name": "db"}, "spec": {**spec, "serviceName": "db"}}, namespace="default")


@pytest.fixture
def kubectl_ok() -> None:
    if not Path(KUBECTL).exists():
        pytest.skip("kubectl is installed by `make install-test`")


@pytest.mark.process
def test_kubectl_scale_uses_the_scale_subresource(apiserver: RunningApiServer, kubectl_ok: None) -> None:
    _workloads(apiserver)
    for kind, name in (("Deployment", "web"), ("ReplicaSet", "web-rs"), ("StatefulSet", "db")):
        done = kubectl(apiserver, "scale", kind.lower(), name, "--replicas=5")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"{kind.lower()}.apps/{name} scaled"
        assert apiserver.api.get(kind, name, namespace="default")["spec"]["replicas"] == 5
    scale = json.loads(kubectl(apiserver, "get", "--raw",
                               "/apis/apps/v1/namespaces/default/deployments/web/scale").stdout)
    assert scale["kind"] == "Scale" and scale["apiVersion"] == "autoscaling/v1"
    assert scale["spec"] == {"replicas": 5} and scale["status"]["selector"] == "app=web"
    # --current-replicas is a precondition kubectl checks against the Scale.
    wrong = kubectl(apiserver, "scale", "deployment", "web", "--current-replicas=3", "--replicas=1")
    assert wrong.returncode != 0 and "Expected replicas to be 3, was 5" in wrong.stderr
    negative = kubectl(apiserver, "scale", "deployment", "web", "--replicas=-1")
    assert negative.returncode != 0
    missing = kubectl(apiserver, "scale", "deployment", "nope", "--replicas=1")
    assert missing.returncode != 0 and 'deployments.apps "nope" not found' in missing.stderr


@pytest.mark.process
def test_printer_columns_of_the_workload_kinds(apiserver: RunningApiServer, kubectl_ok: None) -> None:
    _workloads(apiserver)
    apiserver.api.patch("Deployment", "web", {"status": {"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2,
                                                          "availableReplicas": 1}}, namespace="default",
                        subresource="status")
    apiserver.api.create("Job", {"metadata": {"name": "train"}, "spec": {"completions": 3, "template": {
        "spec": {"restartPolicy": "Never", "containers": [{"name": "w", "image": "busybox"}]}}}}, namespace="default")
    apiserver.api.patch("Job", "train", {"status": {"succeeded": 1, "startTime": "2026-01-01T00:00:00Z"}},
                        namespace="default", subresource="status")
    deploy = kubectl(apiserver, "get", "deploy", "-o", "wide").stdout.splitlines()
    assert deploy[0].split() == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE", "CONTAINERS", "IMAGES", "SELECTOR"]
    row = deploy[1].split()
    assert row[:4] == ["web", "1/2", "2", "1"] and row[5:] == ["web,side", "nginx:1.27,busybox", "app=web"]
    rs = kubectl(apiserver, "get", "rs").stdout.splitlines()
    assert rs[0].split() == ["NAME", "DESIRED", "CURRENT", "READY", "AGE"] and rs[1].split()[:4] == ["web-rs", "2", "0", "0"]
    sts = kubectl(apiserver, "get", "sts").stdout.splitlines()
    assert sts[0].split() == ["NAME", "READY", "AGE"] and sts[1].split()[:2] == ["db", "0/2"]
    job = kubectl(apiserver, "get", "job").stdout.splitlines()
    assert job[0].split() == ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"]
    assert job[1].split()[:3] == ["train", "Running", "1/3"]
