"""Where an upstream cluster's parts live and which addresses they use: pure data, no I/O.

The whole cluster runs in one network namespace of its own (`gpu-dra-NAME`): the API server and every node have
an address on one link there, pods get addresses from a per-node bridge, and kube-proxy's nftables rules
live there too, so nothing touches the machine's own network. A person's kubectl reaches the API server through a
forwarder on 127.0.0.1 in the machine's namespace.

Each node runs in a mount namespace of its own in which the node's directories are mounted over the standard paths
(/var/lib/kubelet, /var/lib/containerd, /run, /etc/cni/net.d, /var/log/pods): its kubelet, containerd and the
agent's hostPath volumes see a node of their own, so the manifests' paths work unchanged, as on kind's nodes.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

NETWORK = ipaddress.ip_network("10.231.0.0/24")
API_ADDRESS = "10.231.0.1"
API_PORT = 6443
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
POD_CIDR = "10.244.0.0/16"
CLUSTER_DOMAIN = "cluster.local"
ADDRESS_LINK = "gdnet0"
# Paths mounted over in a node's mount namespace, relative to the node's directory: (node dir, mount point).
NODE_MOUNTS = (
    ("run", "/run"),
    ("kubelet", "/var/lib/kubelet"),
    ("containerd", "/var/lib/containerd"),
    ("cni-conf", "/etc/cni/net.d"),
    ("pod-logs", "/var/log/pods"),
    ("container-logs", "/var/log/containers"),
)


def netns_name(cluster: str) -> str:
    return f"gpu-dra-{cluster}"


@dataclass(frozen=True)
class NodePlan:
    name: str
    profile: str
    index: int

    @property
    def address(self) -> str:
        return str(NETWORK.network_address + 10 + self.index)

    @property
    def pod_subnet(self) -> str:
        return f"10.244.{self.index}.0/24"

    @property
    def pod_gateway(self) -> str:
        return f"10.244.{self.index}.1"

    @property
    def bridge(self) -> str:
        return f"gdcni{self.index}"


@dataclass(frozen=True)
class ClusterLayout:
    name: str
    state: Path
    nodes: tuple[NodePlan, ...]

    @property
    def netns(self) -> str:
        return netns_name(self.name)

    @property
    def pki(self) -> Path:
        return self.state / "pki"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def etcd_data(self) -> Path:
        return self.state / "etcd"

    def node_dir(self, node: NodePlan) -> Path:
        return self.state / "nodes" / node.name

    def kubeconfig(self, who: str) -> Path:
        return self.state / "kubeconfigs" / f"{who}.yaml"


def plan_nodes(nodes: list[tuple[str, str]]) -> tuple[NodePlan, ...]:
    return tuple(NodePlan(name, profile, i + 1) for i, (name, profile) in enumerate(nodes))
