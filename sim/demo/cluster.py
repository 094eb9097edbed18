"""The demo cluster: its nodes, their directories and Node objects, and applying manifests to the API server.

Pure builders (node layout, Node objects and their Leases, the order objects are applied in) plus small API
helpers.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from gpudra.kubeapi import AlreadyExists, KubeApi
from gpudra.manifests import load_objects
from gpudra.timestamps import rfc3339
from sim.demo.processes import PROJECT_ROOT
from sim.events import EventRecorder
from sim.kubelet.heartbeat import renew_node_lease

# The checkout's manifests; an installed copy (e.g. the container image) is pointed at its own with --manifests.
DEFAULT_MANIFESTS = PROJECT_ROOT / "manifests"


@dataclass(frozen=True)
class Manifests:
    """Where the demo reads its DeviceClasses and example workloads from."""

    root: Path

    @property
    def device_classes(self) -> Path:
        return self.root / "base" / "deviceclasses.yaml"

    @property
    def examples(self) -> Path:
        return self.root / "examples"

    def missing(self) -> list[Path]:
        """The files the demo needs that are not there."""
        return [p for p in (self.device_classes, self.examples / "00-namespace.yaml") if not p.is_file()]


HOSTNAME_LABEL = "kubernetes.io/hostname"
EXTENDED_GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class NodeSpec:
    name: str
    profile: str  # a shipped NVML simulator profile, optionally with simulator options (`gb200-nvl?clique=2`)
    device_plugin: bool = False  # also serve the legacy nvidia.com/gpu device plugin
    # The node's InternalIP: loopback; nodes whose services talk to each other (IMEX daemons on GB200 trays)
    # get loopback addresses of their own.
    address: str = "127.0.0.1"


# Two DGX A100 (8 NVLink-connected GPUs each), a V100 quad that also serves legacy pods, an H100 node with MIG.
NODES: tuple[NodeSpec, ...] = (
    NodeSpec("a100-1", "dgx-a100"),
    NodeSpec("a100-2", "dgx-a100"),
    NodeSpec("v100-1", "v100-4", device_plugin=True),
    NodeSpec("h100-1", "h100-mig"),
)


@dataclass(frozen=True)
class NodeDirs:
    """Where one node's kubelet state lives under the work dir."""

    root: Path

    @property
    def kubelet(self) -> Path:
        return self.root / "kubelet"

    @property
    def cdi(self) -> Path:
        return self.root / "cdi"

    def plugin_dir(self, driver_name: str) -> Path:
        return self.kubelet / "plugins" / driver_name


def node_dirs(workdir: Path, node: str) -> NodeDirs:
    return NodeDirs(workdir / "nodes" / node)


KUBELET_VERSION = "v1.37.0"




def node_conditions(now: datetime | None = None) -> list[dict[str, Any]]:
    """The conditions a healthy kubelet posts, in its order: three pressures False, then Ready True."""
    stamp = rfc3339(now)
    conditions = [{"type": ctype, "status": "False", "lastHeartbeatTime": stamp, "lastTransitionTime": stamp,
                   "reason": reason, "message": message}
                  for ctype, reason, message in (
                      ("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                      ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                      ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"))]
    conditions.append({"type": "Ready", "status": "True", "lastHeartbeatTime": stamp, "lastTransitionTime": stamp,
                       "reason": "KubeletReady", "message": "kubelet is posting ready status"})
    return conditions


def node_object(name: str, *, gpu_allocatable: int | None = None, address: str = "127.0.0.1") -> dict[str, Any]:
    """The Node a kubelet registers: hostname label, capacity, the conditions, addresses and system info that
    `kubectl describe node` shows. GPUs through DRA are not node resources; `nvidia.com/gpu` appears only on
    nodes whose device plugin reported devices. Every simulated node runs on this machine: its address is
    loopback."""
    # A DGX-class machine as its kubelet reports it: allocatable is capacity less the default hard eviction
    # thresholds (memory.available 100Mi, nodefs.available 10%).
    capacity: dict[str, str] = {"cpu": "64", "memory": "512Gi", "ephemeral-storage": "1Ti", "hugepages-1Gi": "0",
                                "hugepages-2Mi": "0", "pods": "110"}
    allocatable = {**capacity, "memory": "524188Mi", "ephemeral-storage": "966367641600"}
    if gpu_allocatable is not None:
        capacity[EXTENDED_GPU_RESOURCE] = allocatable[EXTENDED_GPU_RESOURCE] = str(gpu_allocatable)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {HOSTNAME_LABEL: name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"},
        },
        "spec": {},
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": node_conditions(),
            "addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": "", "operatingSystem": "linux",
                         "architecture": "amd64", "osImage": f"gpu-dra simulated node ({platform.system()})",
                         "kernelVersion": platform.release(), "containerRuntimeVersion": "gpu-dra-sim://1",
                         "machineID": "", "systemUUID": "", "bootID": ""},
        },
    }


# Objects other objects depend on go first, then pods (as `kubectl apply -f dir/` sorts by kind).
_KIND_ORDER = ("Namespace", "PriorityClass", "DeviceClass", "ResourceClaimTemplate", "ResourceClaim", "Pod")


def apply_order(objects: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    def rank(obj: Mapping[str, Any]) -> int:
        kind = str(obj.get("kind"))
        return _KIND_ORDER.index(kind) if kind in _KIND_ORDER else len(_KIND_ORDER)

    return sorted((dict(o) for o in objects), key=rank)


def example_objects(files: Sequence[Path]) -> list[dict[str, Any]]:
    return load_objects(sorted(str(f) for f in files))


def create_all(api: KubeApi, objects: Iterable[Mapping[str, Any]]) -> list[str]:
    """Create each object (in apply order); an object that already exists is left as it is."""
    created = []
    for obj in apply_order(objects):
        kind = str(obj["kind"])
        body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
        try:
            api.create(kind, body)
        except AlreadyExists:
            continue
        meta = obj.get("metadata") or {}
        created.append(f"{kind}/{meta.get('namespace') + '/' if meta.get('namespace') else ''}{meta.get('name')}")
    return created


def _registration_events(api: KubeApi, node: Mapping[str, Any]) -> None:
    """What `kubectl describe node` lists after a kubelet registered: the kubelet's start and condition Events
    (about the node by name, as the kubelet refers to it) and the node controller's RegisteredNode."""
    name = str(node["metadata"]["name"])
    kubelet = EventRecorder(api, "kubelet", host=name)
    by_name = {"apiVersion": "v1", "kind": "Node", "namespace": "", "name": name, "uid": name}
    kubelet.record(by_name, "Starting", "Starting kubelet.")
    for condition in ("NodeHasSufficientMemory", "NodeHasNoDiskPressure", "NodeHasSufficientPID"):
        kubelet.record(by_name, condition, f"Node {name} status is now: {condition}")
    kubelet.record(by_name, "NodeAllocatableEnforced", "Updated Node Allocatable limit across pods")
    kubelet.record(by_name, "NodeReady", f"Node {name} status is now: NodeReady")
    EventRecorder(api, "node-controller").record({**by_name, "uid": str(node["metadata"].get("uid") or "")},
                                                 "RegisteredNode", f"Node {name} event: Registered Node {name} in Controller")


def register_node(api: KubeApi, node: Mapping[str, Any]) -> dict[str, Any]:
    """Create the Node and write its status (a kubelet registers, then posts status)."""
    body = {k: v for k, v in node.items() if k not in ("apiVersion", "kind")}
    try:
        stored = api.create("Node", body)
    except AlreadyExists:
        stored = api.get("Node", str(node["metadata"]["name"]))
    else:
        _registration_events(api, stored)
    if (stored.get("status") or {}).get("allocatable") != node["status"]["allocatable"] \
            or not (stored.get("status") or {}).get("addresses"):
        stored = api.patch("Node", str(node["metadata"]["name"]), {"status": node["status"]}, subresource="status")
    renew_node_lease(api, str(node["metadata"]["name"]), stored["metadata"].get("uid"))
    return stored
