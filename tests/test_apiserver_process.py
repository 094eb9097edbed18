"""The embedded control plane as a process and a tool target: persistence, discovery, kubectl, the CLI."""

from __future__ import annotations

import json
import sqlite3
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gpudra.features import Features
import yaml

from controlplane import EmbeddedApiServer
from gpudra.kubeapi import KubeApi

ROOT = Path(__file__).resolve().parent.parent


def _get(url: str) -> Any:
    with urllib.request.urlopen(url) as resp:
        body = resp.read()
        return json.loads(body) if resp.headers.get("Content-Type", "").startswith("application/json") else body


def test_state_persists_across_restart(tmp_path: Path) -> None:
    state = tmp_path / "state.db"
    first = EmbeddedApiServer(state_file=state)
    api = KubeApi.connect(url=first.start())
    created = api.create("ResourceClaim", {"metadata": {"name": "kept", "labels": {"a": "b"}}, "spec": {}})
    api.create("Namespace", {"metadata": {"name": "team"}})
    api.close()
    first.stop()
    assert [p.name for p in tmp_path.iterdir()] == ["state.db"]  # no WAL or temp files left behind

    second = EmbeddedApiServer(state_file=state)
    api = KubeApi.connect(url=second.start())
    try:
        kept = api.get("ResourceClaim", "kept", "default")
        assert kept == created
        assert api.get("Namespace", "team")["status"]["phase"] == "Active"
        later = api.create("ResourceClaim", {"metadata": {"name": "later"}, "spec": {}})
        assert int(later["metadata"]["resourceVersion"]) > int(kept["metadata"]["resourceVersion"])
        assert later["metadata"]["uid"] != kept["metadata"]["uid"]
    finally:
        api.close()
        second.stop()


def test_unreadable_state_file_is_reported(tmp_path: Path) -> None:
    state = tmp_path / "state.db"
    state.write_text("{not json")
    with pytest.raises(ValueError) as err:
        EmbeddedApiServer(state_file=state).start()
    assert str(state) in str(err.value) and "neither an SQLite database nor" in str(err.value)
    assert "move it away or pass another --state path" in str(err.value)


def test_non_loopback_addresses_are_refused() -> None:
    for address in ("0.0.0.0", "10.1.2.3", "example.com"):
        with pytest.raises(ValueError) as err:
            EmbeddedApiServer(host=address)
        assert "loopback" in str(err.value) and address in str(err.value)


def test_discovery_documents(apiserver: Any) -> None:
    url = apiserver.url
    assert _get(url + "/version")["gitVersion"] == "v1.37.0"
    assert _get(url + "/healthz") == b"ok" and _get(url + "/readyz") == b"ok"
    assert _get(url + "/api")["versions"] == ["v1"]
    groups = {g["name"]: g for g in _get(url + "/apis")["groups"]}
    assert groups["resource.k8s.io"]["preferredVersion"]["groupVersion"] == "resource.k8s.io/v1"
    assert {"coordination.k8s.io", "scheduling.k8s.io"} <= set(groups)
    assert _get(url + "/apis/resource.k8s.io")["versions"][0]["version"] == "v1"
    resources = {r["name"]: r for r in _get(url + "/apis/resource.k8s.io/v1")["resources"]}
    assert resources["resourceclaims"]["namespaced"] is True and resources["resourceclaims"]["kind"] == "ResourceClaim"
    assert resources["resourceslices"]["namespaced"] is False and "watch" in resources["resourceslices"]["verbs"]
    assert "resourceclaims/status" in resources
    core = {r["name"]: r for r in _get(url + "/api/v1")["resources"]}
    assert core["pods"]["shortNames"] == ["po"] and "pods/binding" in core and "pods/status" in core


def _kubectl(url: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None
    return subprocess.run([kubectl, "--server", url, *args], input=stdin, capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.mark.process
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH")
def test_kubectl_get_create_and_label(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    api.create("ResourceSlice", {"metadata": {"name": "node-1-gpu"}, "spec": {
        "driver": "gpu.nvidia.com", "nodeName": "node-1", "pool": {"name": "node-1", "generation": 1,
                                                                    "resourceSliceCount": 1},
        "devices": [{"name": "gpu-0"}]}})
    api.create("Pod", {"metadata": {"name": "worker", "namespace": "kube-system"}, "spec": {"containers": []}})
    slices = _kubectl(apiserver.url, "get", "resourceslices")
    assert slices.returncode == 0, slices.stderr
    header, row = slices.stdout.splitlines()[:2]
    assert header.split()[:4] == ["NAME", "NODE", "DRIVER", "POOL"]
    assert row.split()[:4] == ["node-1-gpu", "node-1", "gpu.nvidia.com", "node-1"]
    pods = _kubectl(apiserver.url, "get", "pods", "-A")
    assert pods.returncode == 0, pods.stderr
    assert pods.stdout.splitlines()[1].split()[:2] == ["kube-system", "worker"]
    node = yaml.safe_dump({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    created = _kubectl(apiserver.url, "create", "-f", "-", stdin=node)
    assert created.returncode == 0, created.stderr
    labelled = _kubectl(apiserver.url, "label", "node", "n1", "gpu=yes")
    assert labelled.returncode == 0, labelled.stderr
    assert api.get("Node", "n1")["metadata"]["labels"] == {"gpu": "yes"}
    missing = _kubectl(apiserver.url, "get", "resourceclaim", "nope")
    assert missing.returncode != 0 and 'resourceclaims.resource.k8s.io "nope" not found' in missing.stderr


@pytest.mark.process
def test_cli_serves_until_sigterm_and_persists(tmp_path: Path) -> None:
    state = tmp_path / "state.db"
    kubeconfig = tmp_path / "kubeconfig"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "apiserver", "--state", str(state),
                             "--kubeconfig-out", str(kubeconfig)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        api = KubeApi.connect(kubeconfig=str(kubeconfig))
        api.create("DeviceClass", {"metadata": {"name": "gpu.nvidia.com"}, "spec": {
            "selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}})
        api.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with sqlite3.connect(state) as db:
        kinds = db.execute("SELECT kind, name FROM objects").fetchall()
    assert ("DeviceClass", "gpu.nvidia.com") in kinds


@pytest.mark.process
def test_cli_refuses_non_loopback_address() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "cli.main", "apiserver", "--address", "0.0.0.0"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=60, check=False)
    assert done.returncode == 2
    assert "not a loopback address" in done.stderr and done.stdout == ""


@pytest.mark.parametrize(("version", "git_version", "workloads"), [
    ("1.37", "v1.37.0", True), ("1.36", "v1.36.2", False), ("1.34", "v1.34.3", False)])
def test_kubernetes_version_selects_version_and_served_apis(version: str, git_version: str, workloads: bool) -> None:
    # The Workload API (beta, off) served as the kind config enables it: its gate and its group version.
    features = Features.parse(["GenericWorkload"], version) if version == "1.37" else None
    server = EmbeddedApiServer(kubernetes_version=version, features=features,
                               runtime_config="scheduling.k8s.io/v1beta1=true")
    url = server.start()
    try:
        doc = _get(url + "/version")
        assert (doc["gitVersion"], doc["minor"]) == (git_version, version.split(".")[1])
        served = [g["groupVersion"] for g in _get(url + "/apis/scheduling.k8s.io")["versions"]]
        assert ("scheduling.k8s.io/v1beta1" in served) is workloads
    finally:
        server.stop()
