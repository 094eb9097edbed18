"""`gpu-dra bench memory [--nodes N] [--pods P] [--seed S] [-o json]`: what the controller's informer caches and
the node agent's cluster-wide reads cost in memory at cluster scale (default 5,000 nodes, 50,000 pods), the
figures the manifests' memory limits are set from.

The cluster is generated with a fixed seed in the shapes the API server returns: Nodes with the status a kubelet
posts (conditions, addresses, nodeInfo, a list of cached images), one ResourceSlice per node with the devices a
dgx-h100 agent publishes, Pods with a claim each (the fields a Deployment's pods carry, status and
managedFields), and those ResourceClaims allocated and reserved. Each kind is written once as the JSON body of a
list response. Each side is then measured in a fresh process, from its RSS after imports:

- controller: the list bodies of Pod, ResourceClaim, ResourceSlice, DeviceClass and Node decoded and held in the
  informers' Stores (controller.informer), as `gpu-dra controller` (cluster mode) keeps them; `steadyMiB` is the
  RSS growth with every Store filled, `peakMiB` the high-water mark (a list body and its decoded objects at once);
- agent: the device plugin shim's claim relist (driver.allocatedclaims), the agent's one cluster-wide read: page
  bodies of LIST_PAGE_SIZE claims decoded and filtered to its own node's one after the other (`peakMiB`,
  `steadyMiB`), and for comparison the same claims as one unpaged list (`unpagedPeakMiB`: what the relist cost
  before it paged, and what the binder's initial list with --partitionable still costs).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.report import emit

DEFAULT_NODES = 5000
DEFAULT_PODS = 50000
DRIVER = "gpu.nvidia.com"
KINDS = ("Node", "ResourceSlice", "DeviceClass", "Pod", "ResourceClaim")


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    # Linux 4.0+: writing 5 to clear_refs resets VmHWM to the current RSS.
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _uid(rng: random.Random) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _managed(manager: str, op: str) -> list[dict[str, Any]]:
    return [{"manager": manager, "operation": op, "apiVersion": "v1", "time": "2026-12-01T10:00:00Z",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                                                   "f:spec": {"f:containers": {'k:{"name":"main"}': {".": {}}}}}}]


def nodes(count: int, rng: random.Random) -> Iterator[dict[str, Any]]:
    from sim.demo.cluster import node_object

    for i in range(count):
        node = node_object(f"gpu-node-{i:05d}")
        node["metadata"].update({"uid": _uid(rng), "resourceVersion": str(1000 + i),
                                 "creationTimestamp": "2026-11-01T00:00:00Z", "managedFields": _managed("kubelet", "Update")})
        node["metadata"]["labels"].update({"nvidia.com/gpu.present": "true", "node.kubernetes.io/instance-type": "p5.48xlarge",
                                           "topology.kubernetes.io/zone": f"zone-{i % 3}"})
        node["status"]["images"] = [{"names": [f"registry.example.com/team-{j}/image@sha256:{rng.getrandbits(256):064x}",
                                               f"registry.example.com/team-{j}/image:v{j}"], "sizeBytes": rng.randrange(10**8, 10**10)}
                                    for j in range(20)]
        yield node


def slices(count: int, rng: random.Random) -> Iterator[dict[str, Any]]:
    from driver.discovery import discover
    from driver.nvml import load_backend
    from driver.slices import SliceSettings, build_slices

    inventory = discover(load_backend("sim:dgx-h100", node="n"), "n")
    template = build_slices(inventory, SliceSettings(node_name="bench-template-node", driver_name=DRIVER))
    text = json.dumps(template)
    for i in range(count):
        for s in json.loads(text.replace("bench-template-node", f"gpu-node-{i:05d}")):
            s["metadata"].update({"uid": _uid(rng), "resourceVersion": str(20000 + i)})
            yield s


def device_classes() -> Iterator[dict[str, Any]]:
    for name, kind in (("gpu.nvidia.com", "gpu"), ("mig.nvidia.com", "mig")):
        yield {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name, "uid": name},
               "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}' && "
                                               f"device.attributes['{DRIVER}'].type == '{kind}'"}}]}}


def pods_and_claims(pods: int, node_count: int, rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    pod_list, claim_list = [], []
    for i in range(pods):
        ns, node = f"team-{i % 50}", f"gpu-node-{i % node_count:05d}"
        pod_name, pod_uid = f"train-{i:06d}-{rng.getrandbits(20):05x}", _uid(rng)
        claim_name = f"{pod_name}-gpu-{rng.getrandbits(20):05x}"
        pod_list.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": ns, "uid": pod_uid, "resourceVersion": str(10**6 + i),
                         "labels": {"app": f"train-{i % 500}", "pod-template-hash": f"{rng.getrandbits(32):08x}"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"train-{i % 500}",
                                              "uid": _uid(rng), "controller": True, "blockOwnerDeletion": True}],
                         "creationTimestamp": "2026-12-01T10:00:00Z", "managedFields": _managed("kube-controller-manager", "Update")},
            "spec": {"nodeName": node, "schedulerName": "default-scheduler", "restartPolicy": "Always",
                     "serviceAccountName": "default", "priority": 0, "enableServiceLinks": True,
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                                     {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                                      "tolerationSeconds": 300}],
                     "containers": [{"name": "main", "image": "registry.example.com/ml/train:v3",
                                     "command": ["python", "train.py"], "args": ["--epochs", "10"],
                                     "env": [{"name": f"VAR_{k}", "value": f"value-{k}"} for k in range(5)],
                                     "resources": {"claims": [{"name": "gpu"}], "requests": {"cpu": "4", "memory": "32Gi"}},
                                     "volumeMounts": [{"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                                                       "readOnly": True}],
                                     "terminationMessagePath": "/dev/termination-log", "imagePullPolicy": "IfNotPresent"}]},
            "status": {"phase": "Running", "podIP": f"10.{i % 250}.{i // 250 % 250}.{i % 200}", "hostIP": "10.0.0.1",
                       "qosClass": "Burstable", "startTime": "2026-12-01T10:00:05Z",
                       "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim_name}],
                       "conditions": [{"type": t, "status": "True", "lastTransitionTime": "2026-12-01T10:00:05Z"}
                                      for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")],
                       "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0, "started": True,
                                              "image": "registry.example.com/ml/train:v3",
                                              "imageID": f"registry.example.com/ml/train@sha256:{rng.getrandbits(256):064x}",
                                              "containerID": f"containerd://{rng.getrandbits(256):064x}",
                                              "state": {"running": {"startedAt": "2026-12-01T10:00:06Z"}}}]},
        })
        gpu = rng.randrange(8)
        claim_list.append({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": claim_name, "namespace": ns, "uid": _uid(rng), "resourceVersion": str(2 * 10**6 + i),
                         "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid,
                                              "controller": True, "blockOwnerDeletion": True}],
                         "finalizers": ["resource.kubernetes.io/delete-protection"],
                         "creationTimestamp": "2026-12-01T10:00:00Z", "managedFields": _managed("kube-scheduler", "Update")},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                         "allocationMode": "ExactCount", "count": 1}}]}},
            "status": {"allocation": {
                "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": node, "device": f"gpu-{gpu:012x}"}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                                         "values": [node]}]}]}},
                "reservedFor": [{"resource": "pods", "name": pod_name, "uid": pod_uid}]},
        })
    return pod_list, claim_list


def write_cluster(directory: Path, node_count: int, pod_count: int, seed: int) -> dict[str, int]:
    """One list-response body per kind (`<Kind>.json`); returns each body's size in bytes."""
    rng = random.Random(seed)
    pods, claims = pods_and_claims(pod_count, node_count, rng)
    lists = {"Node": list(nodes(node_count, rng)), "ResourceSlice": list(slices(node_count, rng)),
             "DeviceClass": list(device_classes()), "Pod": pods, "ResourceClaim": claims}
    sizes = {}
    for kind, items in lists.items():
        body = json.dumps({"apiVersion": "v1", "kind": f"{kind}List", "metadata": {"resourceVersion": "3000000"},
                           "items": items}, separators=(",", ":")).encode()
        (directory / f"{kind}.json").write_bytes(body)
        sizes[kind] = len(body)
    from driver.allocatedclaims import LIST_PAGE_SIZE

    for n, start in enumerate(range(0, len(claims), LIST_PAGE_SIZE)):
        page = {"apiVersion": "v1", "kind": "ResourceClaimList", "metadata": {"resourceVersion": "3000000",
                "continue": "more" if start + LIST_PAGE_SIZE < len(claims) else ""},
                "items": claims[start:start + LIST_PAGE_SIZE]}
        (directory / f"ResourceClaim-page-{n:05d}.json").write_bytes(json.dumps(page, separators=(",", ":")).encode())
    return sizes


def _controller(directory: str, out: Any) -> None:
    import controller.commands.controller  # noqa: F401 - what `gpu-dra controller` imports: its base RSS
    import controller.manager  # noqa: F401
    from controller.informer import Store

    base = _rss_kib("VmRSS")
    _reset_peak()
    stores = {}
    for kind in KINDS:
        body = Path(directory, f"{kind}.json").read_bytes()
        store = Store(kind)
        store.replace(json.loads(body)["items"], "3000000")
        stores[kind] = store
        del body
    out.send({"baseMiB": base / 1024, "steadyMiB": (_rss_kib("VmRSS") - base) / 1024,
              "peakMiB": (_rss_kib("VmHWM") - base) / 1024, "objects": {k: len(s) for k, s in stores.items()}})


def _agent(directory: str, node: str, paged: bool, out: Any) -> None:
    import driver.commands.plugin  # noqa: F401 - what `gpu-dra plugin` imports: its base RSS
    import driver.deviceplugin  # noqa: F401
    import driver.plugin.agent  # noqa: F401
    from driver.allocatedclaims import devices_by_claim

    base = _rss_kib("VmRSS")
    _reset_peak()
    mine: dict[Any, Any] = {}
    bodies = sorted(Path(directory).glob("ResourceClaim-page-*.json")) if paged else [Path(directory, "ResourceClaim.json")]
    for path in bodies:
        body = path.read_bytes()
        items = json.loads(body)["items"]
        del body
        mine.update(devices_by_claim(items, DRIVER, node))
        del items
    out.send({"baseMiB": base / 1024, "steadyMiB": max(_rss_kib("VmRSS") - base, 0) / 1024,
              "peakMiB": (_rss_kib("VmHWM") - base) / 1024, "ownClaims": len(mine), "pages": len(bodies)})


def _measure(target: Any, *args: Any) -> dict[str, Any]:
    # A fresh interpreter per side (spawn): neither inherits the other's or the generator's heap.
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=(*args, child))
    proc.start()
    result: dict[str, Any] = parent.recv()
    proc.join()
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in result.items()}


def measure(node_count: int, pod_count: int, seed: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gpu-dra-bench-memory-") as tmp:
        sizes = write_cluster(Path(tmp), node_count, pod_count, seed)
        controller = _measure(_controller, tmp)
        agent = _measure(_agent, tmp, "gpu-node-00000", True)
        agent["unpagedPeakMiB"] = _measure(_agent, tmp, "gpu-node-00000", False)["peakMiB"]
    return {"nodes": node_count, "pods": pod_count, "seed": seed,
            "listBodyMiB": {k: round(v / 2**20, 1) for k, v in sizes.items()},
            "controller": controller, "agent": agent,
            "peakRssMiB": round(max(controller["baseMiB"] + controller["peakMiB"], agent["baseMiB"] + agent["peakMiB"]), 1)}


def run(args: argparse.Namespace) -> int:
    nodes_arg = getattr(args, "nodes", None)
    node_count = nodes_arg[0] if nodes_arg else DEFAULT_NODES
    pod_count = getattr(args, "pods", None) or DEFAULT_PODS
    if node_count < 1 or pod_count < 0:
        import sys

        print("error: bench memory: --nodes must be at least 1 and --pods at least 0", file=sys.stderr)
        return 2
    emit("memory", measure(node_count, pod_count, getattr(args, "seed", 1)), getattr(args, "output", "table"))
    return 0


