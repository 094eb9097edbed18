"""`nvidia.com/gpu` served through DRA on real Kubernetes 1.37 (KEP-5004, the DRAExtendedResource gate, GA there):
the testbed deployed as manifests/testbed-extended-resource (our DeviceClass `gpu.nvidia.com` carries
`extendedResourceName: nvidia.com/gpu`, no device plugin shim), and a pod shaped as NVIDIA's
demo/specs/extended-resources/gpu-full.yaml, with no resourceClaims of its own: kube-scheduler makes its claim,
our driver prepares it for the real kubelet, and the container gets the device."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.upstream_helpers import UpstreamCluster, running, wait_for

pytestmark = [pytest.mark.upstream, pytest.mark.slow, pytest.mark.process]

ROOT = Path(__file__).resolve().parent.parent
NODE = "v100-1"

GPU_FULL = """
apiVersion: v1
kind: Namespace
metadata: {name: extended-resource-gpu-full}
---
apiVersion: v1
kind: Pod
metadata: {namespace: extended-resource-gpu-full, name: gpu-full-pod}
spec:
  restartPolicy: Never
  containers:
  - name: cuda-container
    image: nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0
    command: [bash, -c]
    args: ["ls /dev/nvidia*; nvidia-smi -L; trap 'exit 0' TERM; sleep 9999 & wait"]
    resources:
      limits: {nvidia.com/gpu: "COUNT"}
  tolerations:
  - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpstreamCluster]:
    with running(f"xr-{os.getpid()}", tmp_path_factory.mktemp("upstream-xr"), f"{NODE}=v100-4",
                 "--manifests", str(ROOT / "manifests" / "testbed-extended-resource")) as up:
        yield up


def _pod(cluster: UpstreamCluster) -> dict[str, Any]:
    return dict(cluster.get("-n", "extended-resource-gpu-full", "pod", "gpu-full-pod"))


def test_nvidia_com_gpu_limits_get_a_dra_claim_prepared_by_our_driver(cluster: UpstreamCluster) -> None:
    # No device plugin serves the name: the node does not advertise it, the DeviceClass does.
    node = cluster.get("node", NODE)
    assert "nvidia.com/gpu" not in node["status"]["allocatable"]
    assert cluster.get("deviceclass", "gpu.nvidia.com")["spec"]["extendedResourceName"] == "nvidia.com/gpu"

    cluster.kubectl("apply", "-f", "-", stdin=GPU_FULL.replace("COUNT", "2"))
    try:
        pod = wait_for("gpu-full-pod Running", lambda: (lambda p: p if p["status"].get("phase") == "Running"
                                                        else None)(_pod(cluster)), timeout=240)
        # kube-scheduler made the claim (KEP-5004's status field names it and maps the container's request).
        status = pod["status"]["extendedResourceClaimStatus"]
        (mapping,) = status["requestMappings"]
        assert (mapping["containerName"], mapping["resourceName"]) == ("cuda-container", "nvidia.com/gpu")
        claim = cluster.get("-n", "extended-resource-gpu-full", "resourceclaim", status["resourceClaimName"])
        results = claim["status"]["allocation"]["devices"]["results"]
        assert len(results) == 2 and {r["driver"] for r in results} == {"gpu.nvidia.com"}
        assert {r["request"] for r in results} == {mapping["requestName"]}
        # Our driver prepared it for the real kubelet: the container got those two GPUs' device nodes and driver.
        log = cluster.kubectl("-n", "extended-resource-gpu-full", "logs", "gpu-full-pod")
        devices = {line for line in log.split() if line[len("/dev/nvidia"):].isdigit() and line.startswith("/dev/nvidia")}
        assert len(devices) == 2, log
        assert len([line for line in log.splitlines() if line.startswith("GPU ")]) == 2, log
        prepared = cluster.node_dir(NODE) / "kubelet" / "plugins" / "gpu.nvidia.com"
        assert claim["metadata"]["uid"] in "".join(p.read_text(errors="replace") for p in prepared.glob("checkpoint*"))

        # Five of the node's four GPUs: kube-scheduler's FailedScheduling, and our controller's reason, said through
        # the claim kube-scheduler would make (it makes none for a pod that does not fit).
        too_many = GPU_FULL.replace("COUNT", "5").replace("name: gpu-full-pod", "name: too-many")
        cluster.kubectl("apply", "-f", "-", stdin=too_many)

        def reasons() -> dict[str, str] | None:
            events = cluster.get("-n", "extended-resource-gpu-full", "events",
                                 "--field-selector=involvedObject.name=too-many")["items"]
            found = {e["reason"]: e["message"] for e in events}
            return found if {"FailedScheduling", "GpuDraUnschedulable"} <= set(found) else None

        found = wait_for("both schedulers' reasons on the pod asking for 5", reasons, timeout=120)
        assert found["GpuDraUnschedulable"].startswith(
            "nvidia.com/gpu: 5 (container cuda-container) is served by DeviceClass gpu.nvidia.com"), found
        assert "needs 5 devices; the node has only 4 matching devices in all" in found["GpuDraUnschedulable"], found
        assert not any(c["metadata"]["name"].startswith("too-many") for c in
                       cluster.get("-n", "extended-resource-gpu-full", "resourceclaims")["items"])
    finally:
        cluster.kubectl("delete", "namespace", "extended-resource-gpu-full", "--wait=true", "--timeout=180s",
                        timeout=240)
