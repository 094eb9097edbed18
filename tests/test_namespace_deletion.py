"""Namespace deletion through Terminating: `kubectl delete -f` of a file holding a namespace and objects in it
deletes them all with no NotFound errors, the namespace shows Terminating with the namespace controller's
conditions, its content goes, then the namespace (finalizers and conditions: tests/test_namespace_finalization.py)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from gpudra.kubeapi import ApiError, NotFound
from tests.conftest import RunningApiServer

KUBECTL = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "kubectl")
MANIFEST = """
apiVersion: v1
kind: Namespace
metadata: {name: team}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: team}
data: {mode: fast}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: team}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: web, image: busybox}]}
---
apiVersion: v1
kind: Pod
metadata: {name: solo, namespace: team}
spec: {containers: [{name: c, image: busybox}]}
"""


@pytest.mark.process
def test_kubectl_delete_f_of_a_namespace_and_its_content(apiserver: RunningApiServer, tmp_path: Path) -> None:
    if not Path(KUBECTL).exists():
        pytest.skip("kubectl is installed by `make install-test`")
    manifest = tmp_path / "team.yaml"
    manifest.write_text(MANIFEST)
    base = [KUBECTL, "--kubeconfig", str(apiserver.kubeconfig)]
    created = subprocess.run([*base, "apply", "-f", str(manifest)], capture_output=True, text=True, timeout=60)
    assert created.returncode == 0, created.stderr
    deleted = subprocess.run([*base, "delete", "-f", str(manifest), "--wait=false"], capture_output=True, text=True,
                             timeout=60)
    assert deleted.returncode == 0 and deleted.stderr == "", deleted.stderr
    assert deleted.stdout.splitlines() == ['namespace "team" deleted', 'configmap "settings" deleted from team namespace',
                                           'deployment.apps "web" deleted from team namespace',
                                           'pod "solo" deleted from team namespace']
    _wait_gone(apiserver)
    # The namespace alone: Terminating while the namespace controller gets to its content, which then goes.
    assert subprocess.run([*base, "apply", "-f", str(manifest)], capture_output=True, timeout=60).returncode == 0
    alone = subprocess.run([*base, "delete", "namespace", "team", "--wait=false"], capture_output=True, text=True,
                           timeout=60)
    assert alone.returncode == 0, alone.stderr
    ns = apiserver.api.get("Namespace", "team")
    assert ns["status"]["phase"] == "Terminating" and ns["metadata"]["deletionTimestamp"]
    # kube-apiserver sets the phase; the conditions are the namespace controller's, written after its first pass.
    assert "conditions" not in ns["status"] and ns["spec"]["finalizers"] == ["kubernetes"]
    listed = subprocess.run([*base, "get", "ns", "team", "--no-headers"], capture_output=True, text=True, timeout=60)
    assert listed.stdout.split()[:2] == ["team", "Terminating"]
    assert apiserver.api.get("ConfigMap", "settings", namespace="team")  # not yet
    with pytest.raises(ApiError, match="because it is being terminated"):
        apiserver.api.create("ConfigMap", {"metadata": {"name": "late"}}, namespace="team")
    _wait_gone(apiserver)
    assert apiserver.api.list("ConfigMap", namespace="team")[0] == []


def _wait_gone(apiserver: RunningApiServer) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            apiserver.api.get("Namespace", "team")
        except NotFound:
            return
        assert time.monotonic() < deadline, "the namespace to go"
        time.sleep(0.2)
