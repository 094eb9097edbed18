"""End to end on real Kubernetes 1.37 (the upstream backend): kube-apiserver, kube-scheduler,
kube-controller-manager, kube-proxy, kubelets and containerd built from their Go modules; our image; the manifests
applied with `kubectl apply -k`. The only simulated part is the GPUs (the NVML simulator in the agent's pod).

Every workload's container reports what it got (its /dev/nvidia* nodes) in its log, and the claims are allocated
by the real kube-scheduler, prepared by our agent for the real kubelet, which hands the CDI ids to containerd.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from driver.checkpoint import Checkpoint
from sim.upstream.images import product_reference
from tests import test_nvidia_quickstart as quickstart
from tests.upstream_helpers import UpstreamCluster, running, wait_for

pytestmark = [pytest.mark.upstream, pytest.mark.slow, pytest.mark.process]

NODES = "a100-1=dgx-a100,h100-1=h100-mig"
NODE_NAMES = ("a100-1", "h100-1")
REPORT = ("ls /dev/nvidia*; nvidia-smi -L; echo NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES; "
          "trap 'exit 0' TERM; sleep 9999 & wait")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpstreamCluster]:
    with running(f"e2e-{os.getpid()}", tmp_path_factory.mktemp("upstream"), NODES) as up:
        yield up


def _with_report(spec: str, report: str = REPORT) -> str:
    """A spec's pods with a command that reports their devices (NVIDIA's specs run `nvidia-smi -L` the same way)."""
    docs = [d for d in yaml.safe_load_all(spec) if d]
    for doc in docs:
        pod = doc["spec"]["template"]["spec"] if doc["kind"] == "Deployment" else doc["spec"] if doc["kind"] == "Pod" \
            else None
        for container in (pod or {}).get("containers", []):
            container["command"], container["args"] = ["bash", "-c"], [report]
    return yaml.safe_dump_all(docs)


def _running(cluster: UpstreamCluster, namespace: str, count: int) -> list[dict[str, Any]]:
    def check() -> list[dict[str, Any]] | None:
        pods = cluster.get("-n", namespace, "pods")["items"]
        ok = [p for p in pods if p["status"].get("phase") == "Running"
              and all(c.get("ready") for c in p["status"].get("containerStatuses", []))]
        return ok if len(ok) == count else None

    return list(wait_for(f"{count} pods Running in {namespace}", check, timeout=240))


def _devices_seen(cluster: UpstreamCluster, namespace: str, pod: str, container: str | None = None) -> set[str]:
    argv = ["-n", namespace, "logs", pod] + (["-c", container] if container else [])
    return {line.strip() for line in cluster.kubectl(*argv).splitlines()
            if line.startswith("/dev/nvidia") and line.strip()[len("/dev/nvidia"):].isdigit()}


def _gpus_listed(cluster: UpstreamCluster, namespace: str, pod: str) -> list[str]:
    """The `nvidia-smi -L` lines a container printed (the driver install's nvidia-smi, mounted by the CDI spec)."""
    return [line for line in cluster.kubectl("-n", namespace, "logs", pod).splitlines() if line.startswith("GPU ")]


def _allocated(cluster: UpstreamCluster, namespace: str) -> dict[str, list[str]]:
    claims = cluster.get("-n", namespace, "resourceclaims")["items"]
    return {c["metadata"]["name"]: [r["device"] for r in c["status"]["allocation"]["devices"]["results"]]
            for c in claims if c.get("status", {}).get("allocation")}


def _plugin_dir(cluster: UpstreamCluster, node: str) -> Path:
    return cluster.node_dir(node) / "kubelet" / "plugins" / "gpu.nvidia.com"


def _checkpoint_text(cluster: UpstreamCluster) -> str:
    """The agents' checkpoint files on every node (snapshot and journal), as text."""
    return "\n".join(p.read_text(errors="replace") for node in NODE_NAMES
                     for p in sorted(_plugin_dir(cluster, node).glob("checkpoint*")) if p.is_file())


def _apply(cluster: UpstreamCluster, spec: str) -> None:
    cluster.kubectl("apply", "-f", "-", stdin=spec)


def _delete_namespace(cluster: UpstreamCluster, namespace: str) -> None:
    cluster.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=180s", timeout=240)


def test_the_cluster_is_real_kubernetes(cluster: UpstreamCluster) -> None:
    version = json.loads(cluster.kubectl("version", "-o", "json"))
    assert version["serverVersion"]["gitVersion"] == "v1.37.2"
    nodes = cluster.get("nodes")["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == list(NODE_NAMES)
    for node in nodes:
        info = node["status"]["nodeInfo"]
        assert info["kubeletVersion"] == "v1.37.2"
        assert info["containerRuntimeVersion"].startswith("containerd://2.")


def test_agents_run_our_image_and_publish_slices(cluster: UpstreamCluster) -> None:
    pods = cluster.get("-n", "gpu-dra-system", "pods", "-l", "app.kubernetes.io/component=node-agent")["items"]
    assert sorted(p["spec"]["nodeName"] for p in pods) == list(NODE_NAMES)
    for pod in pods:
        assert pod["spec"]["containers"][0]["image"] == product_reference(testbed=True)
        assert pod["status"]["phase"] == "Running"
    slices = cluster.get("resourceslices")["items"]
    devices = {}
    for s in slices:
        devices.setdefault(s["spec"]["nodeName"], []).extend(d["name"] for d in s["spec"]["devices"])
    assert len([d for d in devices["a100-1"] if "-mig-" not in d]) == 8
    assert any("-mig-" in d for d in devices["h100-1"])


def test_exclusive_gpus_per_pod(cluster: UpstreamCluster) -> None:
    _apply(cluster, _with_report(quickstart.GPU_TEST1))
    try:
        pods = _running(cluster, "gpu-test1", 2)
        seen = [_devices_seen(cluster, "gpu-test1", p["metadata"]["name"]) for p in pods]
        assert all(len(s) == 1 for s in seen), seen
        assert seen[0] != seen[1], "two claims were given the same GPU"
        # The driver's files reach the container through the claim's CDI spec: its nvidia-smi lists its one GPU.
        listed = [_gpus_listed(cluster, "gpu-test1", p["metadata"]["name"]) for p in pods]
        assert [len(lines) for lines in listed] == [1, 1] and listed[0] != listed[1], listed
        allocated = _allocated(cluster, "gpu-test1")
        assert len(allocated) == 2 and len({d for ds in allocated.values() for d in ds}) == 2
    finally:
        _delete_namespace(cluster, "gpu-test1")


def test_one_claim_shared_by_two_pods(cluster: UpstreamCluster) -> None:
    _apply(cluster, _with_report(quickstart.GPU_TEST3))
    try:
        pods = _running(cluster, "gpu-test3", 2)
        seen = [_devices_seen(cluster, "gpu-test3", p["metadata"]["name"]) for p in pods]
        assert len(seen[0]) == 1 and seen[0] == seen[1]
        claim = cluster.get("-n", "gpu-test3", "resourceclaim", "single-gpu")
        assert len(claim["status"]["reservedFor"]) == 2
    finally:
        _delete_namespace(cluster, "gpu-test3")


def test_time_slicing_config_reaches_the_gpu(cluster: UpstreamCluster) -> None:
    _apply(cluster, _with_report(quickstart.GPU_TEST6))
    try:
        pods = _running(cluster, "gpu-test6", 4)
        assert all(len(_devices_seen(cluster, "gpu-test6", p["metadata"]["name"])) == 1 for p in pods)
        # The applied setting is in the node's checkpoint, by claim (the simulator keeps the interval itself).
        state = _checkpoint_text(cluster)
        for claim in cluster.get("-n", "gpu-test6", "resourceclaims")["items"]:
            assert claim["metadata"]["uid"] in state
        assert '"TimeSlicing"' in state and '"Long"' in state, state[-2000:]
    finally:
        _delete_namespace(cluster, "gpu-test6")


# Each MPS client container asks its claim's daemon, through the pipe directory its CDI spec mounts, for the
# limit the claim's config set (nvidia-cuda-mps-control comes from the driver install, also by the spec).
MPS_REPORT = ("echo CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY; ls /dev/nvidia*; "
              "echo THREADS=$(echo get_default_active_thread_percentage | nvidia-cuda-mps-control); "
              "trap 'exit 0' TERM; sleep 9999 & wait")
MPS_DAEMONS = "app.kubernetes.io/component=mps-control-daemon"


def test_mps_daemon_pod_serves_the_claims_containers(cluster: UpstreamCluster) -> None:
    """NVIDIA's MPS quickstart: the agent runs the claim's MPS control daemon as a pod of our image (a Deployment
    on the claim's node, the driver install's nvidia-cuda-mps-control), given the claim's limits by its pod, and
    both containers of the workload reach it."""
    _apply(cluster, _with_report(quickstart.GPU_TEST_MPS, MPS_REPORT))
    try:
        (pod,) = _running(cluster, "gpu-test-mps", 1)
        (daemon,) = cluster.get("-n", "gpu-dra-system", "pods", "-l", MPS_DAEMONS)["items"]
        assert daemon["spec"]["nodeName"] == pod["spec"]["nodeName"] and daemon["status"]["phase"] == "Running"
        assert daemon["spec"]["containers"][0]["image"] == product_reference(testbed=True)
        seen = []
        for container in ("mps-ctr0", "mps-ctr1"):
            log = cluster.kubectl("-n", "gpu-test-mps", "logs", "test-pod", "-c", container)
            assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in log and re.search(r"^THREADS=50(\.0)?$", log, re.M), log
            seen.append(_devices_seen(cluster, "gpu-test-mps", "test-pod", container))
        assert len(seen[0]) == 1 and seen[0] == seen[1], seen
    finally:
        _delete_namespace(cluster, "gpu-test-mps")
    # Unprepared with its claim: the daemon's Deployment (and its pod) go.
    wait_for("the MPS daemon's Deployment deleted", lambda: not cluster.get(
        "-n", "gpu-dra-system", "deployments", "-l", MPS_DAEMONS)["items"], timeout=120)


MIG_CLAIM = """
apiVersion: v1
kind: Namespace
metadata: {name: mig-test}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {namespace: mig-test, name: mig-1g}
spec:
  spec:
    devices:
      requests:
      - name: mig
        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel: {expression: "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}
---
apiVersion: v1
kind: Pod
metadata: {namespace: mig-test, name: mig-pod}
spec:
  containers:
  - name: ctr
    image: ubuntu:22.04
    resources: {claims: [{name: mig}]}
  resourceClaims:
  - {name: mig, resourceClaimTemplateName: mig-1g}
"""


def test_a_mig_slice(cluster: UpstreamCluster) -> None:
    _apply(cluster, _with_report(MIG_CLAIM))
    try:
        (pod,) = _running(cluster, "mig-test", 1)
        assert pod["spec"]["nodeName"] == "h100-1"
        out = cluster.kubectl("-n", "mig-test", "logs", "mig-pod")
        assert "/dev/nvidia-caps" in out or any(line.startswith("/dev/nvidia") for line in out.splitlines()), out
        (devices,) = _allocated(cluster, "mig-test").values()
        assert "-mig-1g-10gb-" in devices[0]
    finally:
        _delete_namespace(cluster, "mig-test")


NVLINK_CLAIM = """
apiVersion: v1
kind: Namespace
metadata: {name: nvlink-test}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {namespace: nvlink-test, name: four-nvlink}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        exactly: {deviceClassName: gpu.nvidia.com, count: 4}
      constraints:
      - matchAttribute: gpu.nvidia.com/nvlinkDomain
---
apiVersion: v1
kind: Pod
metadata: {namespace: nvlink-test, name: trainer}
spec:
  containers:
  - name: ctr
    image: ubuntu:22.04
    resources: {claims: [{name: gpus}]}
  resourceClaims:
  - {name: gpus, resourceClaimTemplateName: four-nvlink}
"""


def test_four_nvlink_gpus_with_match_attribute(cluster: UpstreamCluster) -> None:
    _apply(cluster, _with_report(NVLINK_CLAIM))
    try:
        (pod,) = _running(cluster, "nvlink-test", 1)
        assert len(_devices_seen(cluster, "nvlink-test", "trainer")) == 4
        (devices,) = _allocated(cluster, "nvlink-test").values()
        slices = cluster.get("resourceslices", f"--field-selector=spec.nodeName={pod['spec']['nodeName']}")["items"]
        domains = {d["name"]: d["attributes"].get("nvlinkDomain", {}).get("string")
                   for s in slices for d in s["spec"]["devices"]}
        assert len(devices) == 4 and len({domains[d] for d in devices}) == 1 and domains[devices[0]]
    finally:
        _delete_namespace(cluster, "nvlink-test")


LEGACY_POD = """
apiVersion: v1
kind: Namespace
metadata: {name: legacy-test}
---
apiVersion: v1
kind: Pod
metadata: {namespace: legacy-test, name: legacy}
spec:
  nodeSelector: {kubernetes.io/hostname: a100-1}
  containers:
  - name: cuda
    image: nvcr.io/nvidia/cuda:12.8.0-base-ubuntu24.04
    resources: {limits: {nvidia.com/gpu: 1}}
"""


def test_a_legacy_nvidia_com_gpu_pod_through_the_shim(cluster: UpstreamCluster) -> None:
    _apply(cluster, _with_report(LEGACY_POD))
    try:
        _running(cluster, "legacy-test", 1)
        (device,) = _devices_seen(cluster, "legacy-test", "legacy")
        # The GPU the device plugin handed out is not offered to DRA claims: its slice entry carries the shim's
        # NoSchedule taint (with its MIG devices), and no other GPU's does.
        def shim_tainted() -> list[str]:
            slices = cluster.get("resourceslices", "--field-selector=spec.nodeName=a100-1")["items"]
            return [d["name"] for s in slices for d in s["spec"]["devices"]
                    if d["attributes"]["type"]["string"] == "gpu"
                    and any(t["key"] == "gpu.nvidia.com/device-plugin" and t["effect"] == "NoSchedule"
                            for t in d.get("taints", []))]
        assert len(wait_for("the legacy pod's GPU tainted in a100-1's slice", shim_tainted, timeout=60)) == 1
        # The kubelet counts every healthy GPU into allocatable, the legacy pod's included, on its next node status
        # update; GPUs the NVLink test's claims held (Unhealthy to it until unprepared) come back with that delay.
        wait_for("a100-1 to advertise all 8 GPUs, none held by a DRA claim",
                 lambda: cluster.get("node", "a100-1")["status"]["allocatable"].get("nvidia.com/gpu") == "8",
                 timeout=60)
        assert device.startswith("/dev/nvidia")
    finally:
        _delete_namespace(cluster, "legacy-test")


def _gang(size: int, count: int) -> str:
    """A gang of `size` pods, each with its own claim of `count` NVLink-connected GPUs, the pods gated until the
    controller has allocated the whole gang (the gate kube-scheduler waits for; docs/controller.md)."""
    docs: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gang-test"}}]
    for i in range(size):
        docs.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                     "metadata": {"namespace": "gang-test", "name": f"worker-{i}-gpus",
                                  "labels": {"gpu.nvidia.com/gang": "train", "gpu.nvidia.com/gang-size": str(size)}},
                     "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                         "deviceClassName": "gpu.nvidia.com", "count": count}}],
                         "constraints": [{"matchAttribute": "gpu.nvidia.com/nvlinkDomain"}]}}})
        docs.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "gang-test", "name": f"worker-{i}"},
                     "spec": {"schedulingGates": [{"name": "gpu.nvidia.com/gang"}],
                              "containers": [{"name": "ctr", "image": "ubuntu:22.04",
                                              "resources": {"claims": [{"name": "gpus"}]}}],
                              "resourceClaims": [{"name": "gpus", "resourceClaimName": f"worker-{i}-gpus"}]}})
    return yaml.safe_dump_all(docs)


def test_a_gang_is_allocated_all_or_nothing_beside_kube_scheduler(cluster: UpstreamCluster) -> None:
    # 2 x 8 GPUs in one NVLink domain each: only a100-1 has 8, so the gang cannot fit, and neither claim may hold
    # GPUs (kube-scheduler alone would allocate the first and leave it waiting for the second).
    _apply(cluster, _with_report(_gang(2, 8)))
    try:
        def explained() -> bool:
            claims = cluster.get("-n", "gang-test", "resourceclaims")["items"]
            return len(claims) == 2 and any("gpu.nvidia.com/explanation" in c["metadata"].get("annotations", {})
                                            for c in claims)

        wait_for("the controller's explanation on the gang", explained, timeout=120)
        assert _allocated(cluster, "gang-test") == {}
        assert all(p["spec"].get("schedulingGates") for p in cluster.get("-n", "gang-test", "pods")["items"])
    finally:
        _delete_namespace(cluster, "gang-test")
    # 2 x 4 GPUs fits (on one node, one domain): both allocated by the controller, then placed by kube-scheduler.
    _apply(cluster, _with_report(_gang(2, 4)))
    try:
        pods = _running(cluster, "gang-test", 2)
        allocated = _allocated(cluster, "gang-test")
        assert len(allocated) == 2 and len({d for ds in allocated.values() for d in ds}) == 8
        assert all(len(_devices_seen(cluster, "gang-test", p["metadata"]["name"])) == 4 for p in pods)
    finally:
        _delete_namespace(cluster, "gang-test")


def test_a_gpu_fault_taints_the_device(cluster: UpstreamCluster) -> None:
    cluster.gpu_dra("cluster", "fault", "a100-1", "--name", cluster.name, "--gpu", "0", "--xid", "79")

    def tainted() -> list[str]:
        slices = cluster.get("resourceslices", "--field-selector=spec.nodeName=a100-1")["items"]
        return [d["name"] for s in slices for d in s["spec"]["devices"] if d.get("taints")]

    names = wait_for("a taint on the faulted GPU", tainted, timeout=90)
    assert len(names) == 1, names
    cluster.gpu_dra("cluster", "fault", "a100-1", "--name", cluster.name, "--clear")
    wait_for("the taint cleared after the GPU reset", lambda: not tainted(), timeout=180)


def test_agent_restart_and_rolling_update_keep_prepared_claims(cluster: UpstreamCluster) -> None:
    _apply(cluster, _with_report(quickstart.GPU_TEST1))
    try:
        _running(cluster, "gpu-test1", 2)
        before = _allocated(cluster, "gpu-test1")
        cluster.kubectl("-n", "gpu-dra-system", "delete", "pod", "-l", "app.kubernetes.io/component=node-agent")
        cluster.kubectl("-n", "gpu-dra-system", "rollout", "status", "ds/gpu-dra-node-agent", "--timeout=240s",
                        timeout=300)
        cluster.kubectl("-n", "gpu-dra-system", "rollout", "restart", "ds/gpu-dra-node-agent")
        cluster.kubectl("-n", "gpu-dra-system", "rollout", "status", "ds/gpu-dra-node-agent", "--timeout=300s",
                        timeout=360)
        assert _allocated(cluster, "gpu-test1") == before
        assert len(_running(cluster, "gpu-test1", 2)) == 2
        state = _checkpoint_text(cluster)
        assert all(c["metadata"]["uid"] in state for c in cluster.get("-n", "gpu-test1", "resourceclaims")["items"])
    finally:
        _delete_namespace(cluster, "gpu-test1")


OWN_IMAGES = """
apiVersion: v1
kind: Namespace
metadata: {name: own-images}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {namespace: own-images, name: one-gpu}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: gpu.nvidia.com}
---
apiVersion: v1
kind: Pod
metadata: {namespace: own-images, name: trainer}
spec:
  initContainers:
  - name: fetch
    image: python:3.12-slim
    command: [sh, -c, "true"]
  containers:
  - name: train
    image: registry.example.com/team/trainer:v3
    command: [bash, -c]
    args: ["ls /dev/nvidia*; trap 'exit 0' TERM; sleep 9999 & wait"]
    resources: {claims: [{name: gpu}]}
  resourceClaims:
  - {name: gpu, resourceClaimTemplateName: one-gpu}
"""


def test_images_a_spec_names_run_once_given_stand_ins(cluster: UpstreamCluster, tmp_path: Path) -> None:
    spec = tmp_path / "own-images.yaml"
    spec.write_text(OWN_IMAGES)
    _apply(cluster, OWN_IMAGES)
    try:
        # No registry is reachable and no stand-in has these names yet: the real kubelet's pull error.
        def pull_failed() -> str | None:
            pod = cluster.get("-n", "own-images", "pod", "trainer")
            waiting = [s.get("state", {}).get("waiting", {}) for s in pod["status"].get("initContainerStatuses", [])]
            return next((w["reason"] for w in waiting if w.get("reason") in ("ErrImagePull", "ImagePullBackOff")),
                        None)
        wait_for("the init container's image pull to fail", pull_failed, timeout=120)
        events = cluster.get("-n", "own-images", "events", "--field-selector=involvedObject.name=trainer")["items"]
        assert any("python:3.12-slim" in e.get("message", "") for e in events
                   if e.get("reason") == "Failed"), [e.get("message") for e in events]

        imported = cluster.gpu_dra("cluster", "stand-in", "--name", cluster.name, "-f", str(spec)).stdout.split()
        assert imported == ["docker.io/library/python:3.12-slim", "registry.example.com/team/trainer:v3"]
        _running(cluster, "own-images", 1)
        assert len(_devices_seen(cluster, "own-images", "trainer")) == 1
        # Our own image stays the one built from this tree; a digest-pinned reference has no stand-in.
        refused = cluster.gpu_dra("cluster", "stand-in", "--name", cluster.name, product_reference(), check=False)
        assert refused.returncode == 1 and "runs this image as built" in refused.stderr
        pinned = cluster.gpu_dra("cluster", "stand-in", "--name", cluster.name, "ubuntu@sha256:" + "0" * 64,
                                 check=False)
        assert pinned.returncode == 1 and "pinned by digest" in pinned.stderr
    finally:
        _delete_namespace(cluster, "own-images")


def test_uninstall_leaves_no_spec_checkpoint_entry_or_slice(cluster: UpstreamCluster) -> None:
    # Runs last in this module: it removes the driver.
    _apply(cluster, _with_report(quickstart.GPU_TEST1))
    pods = _running(cluster, "gpu-test1", 2)
    uids = [c["metadata"]["uid"] for c in cluster.get("-n", "gpu-test1", "resourceclaims")["items"]]
    assert len(pods) == 2 and all(uid in _checkpoint_text(cluster) for uid in uids)
    _delete_namespace(cluster, "gpu-test1")
    cluster.kubectl("delete", "-k", str(Path(__file__).resolve().parent.parent / "manifests" / "testbed"),
                    "--wait=true", "--timeout=180s", timeout=240)
    wait_for("no ResourceSlices", lambda: not cluster.get("resourceslices")["items"], timeout=120)
    for name in NODE_NAMES:
        cdi = cluster.node_dir(name) / "run" / "cdi"
        assert not (list(cdi.iterdir()) if cdi.exists() else []), list(cdi.iterdir())
        checkpoint, _ = Checkpoint.open(_plugin_dir(cluster, name))
        assert [uid for uid in uids if checkpoint.claim(uid) is not None] == []
