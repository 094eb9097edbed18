"""The upstream cluster's supervisor: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy
and one node process (containerd + kubelet, node.py) per node, all real, in the cluster's network namespace.

    python -m sim.upstream.supervisor STATE_DIR     (started detached by `gpu-dra cluster up --kubernetes upstream`)

It writes status.json in STATE_DIR (phase starting|ready|failed|stopped, the server URL on the machine's loopback,
every process), restarts a component that exits (with a back-off), and on SIGTERM stops the nodes (each removes its
containers, mounts and cgroups), then the control plane, then deletes the namespace.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from driver.commands.plugin import CLIQUE_LABEL, PROFILE_LABEL
from gpudra.atomicfile import atomic_write
from sim.upstream import config, netns, pki
from sim.upstream.process import Component
from sim.upstream.layout import (
    API_ADDRESS,
    API_PORT,
    CLUSTER_DOMAIN,
    KUBERNETES_SERVICE_IP,
    ClusterLayout,
    NodePlan,
    netns_name,
    plan_nodes,
)



@dataclass(frozen=True)
class UpstreamSpec:
    """What `cluster up --kubernetes upstream` asked for (spec.json in the state dir)."""
    name: str
    nodes: tuple[tuple[str, str], ...]
    bin_dir: str
    images: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"backend": "upstream", **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UpstreamSpec:
        return cls(data["name"], tuple((n, p) for n, p in data["nodes"]), data["bin_dir"], tuple(data["images"]))


@dataclass
class Status:
    phase: str = "starting"
    server: str = ""
    error: str = ""
    steps: list[str] = field(default_factory=list)
    processes: list[dict[str, Any]] = field(default_factory=list)
    pid: int = 0


def node_labels(node: NodePlan) -> dict[str, str]:
    """What a GPU node carries where the agent's node affinity looks (the GPU Operator's label) and which profile
    its simulator plays (the kind overlay's `--nvml sim:node-label`)."""
    profile, _, options = node.profile.partition("?")
    labels = {"nvidia.com/gpu.present": "true", PROFILE_LABEL: profile}
    if options.startswith("clique="):
        labels[CLIQUE_LABEL] = options.removeprefix("clique=")
    return labels


class Supervisor:
    def __init__(self, state: Path) -> None:
        self.state = state
        self.spec = UpstreamSpec.from_json(json.loads((state / "spec.json").read_text()))
        self.layout = ClusterLayout(self.spec.name, state, plan_nodes(list(self.spec.nodes)))
        self.bin = Path(self.spec.bin_dir)
        self.status = Status(pid=os.getpid())
        self.components: list[Component] = []
        self.stopping = threading.Event()

    # -- status ---------------------------------------------------------------------------------------------------

    def publish(self) -> None:
        self.status.processes = [c.info() for c in self.components]
        atomic_write(self.state / "status.json", json.dumps(asdict(self.status), indent=2).encode(), mode=0o600,
                     durable=False)

    def step(self, text: str) -> None:
        self.status.steps.append(text)
        self.publish()

    # -- set-up ---------------------------------------------------------------------------------------------------

    def make_pki(self) -> pki.Pki:
        keys = pki.Pki(self.layout.pki)
        keys.serving("apiserver", "kube-apiserver",
                     ["kubernetes", "kubernetes.default", "kubernetes.default.svc",
                      f"kubernetes.default.svc.{CLUSTER_DOMAIN}", "localhost"],
                     ["127.0.0.1", API_ADDRESS, KUBERNETES_SERVICE_IP])
        keys.service_account_keys()
        keys.client(pki.APISERVER_KUBELET_CLIENT)
        server = f"https://{API_ADDRESS}:{API_PORT}"
        for who in (pki.ADMIN, pki.SCHEDULER, pki.CONTROLLER_MANAGER, pki.KUBE_PROXY):
            keys.kubeconfig(who, server, self.layout.kubeconfig(who.file))
        for node in self.layout.nodes:
            keys.serving(f"kubelet-serving-{node.name}", f"system:node:{node.name}", [node.name], [node.address])
            keys.kubeconfig(pki.node_identity(node.name), server, self.layout.kubeconfig(f"kubelet-{node.name}"))
        return keys

    def add(self, role: str, argv: list[str], node: str | None = None) -> Component:
        component = Component(role, argv, self.layout.logs / f"{role}{'-' + node if node else ''}.log", node)
        component.start()
        self.components.append(component)
        self.publish()
        return component

    def wait_healthy(self, what: str, url: str, timeout: float, context: ssl.SSLContext | None = None) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.stopping.is_set():
                raise RuntimeError("stopped while starting")
            try:
                with urllib.request.urlopen(url, timeout=5, context=context) as response:
                    if response.status == 200:
                        return
            except Exception as exc:  # noqa: BLE001 - not up yet: any connection or HTTP error
                last = str(exc)
            for c in self.components:
                if c.proc is not None and c.proc.poll() is not None:
                    raise RuntimeError(f"{c.role} exited with {c.proc.returncode} while starting; see {c.log_file}")
            time.sleep(0.5)
        raise RuntimeError(f"{what} not healthy after {timeout:.0f} s ({url}: {last})")

    def admin_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.layout.pki / "ca.crt"))
        context.load_cert_chain(str(self.layout.pki / "admin.crt"), str(self.layout.pki / "admin.key"))
        return context

    def kubectl(self, *argv: str, stdin: str | None = None) -> str:
        result = subprocess.run([str(self.bin / "kubectl"), f"--kubeconfig={self.layout.kubeconfig('admin')}", *argv],
                                input=stdin, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(argv)}: {result.stderr.strip()}")
        return result.stdout

    def start_control_plane(self) -> None:
        (self.layout.state / "audit-policy.yaml").write_text(yaml.safe_dump(config.AUDIT_POLICY))
        self.add("etcd", config.etcd_argv(self.bin, self.layout))
        self.wait_healthy("etcd", "http://127.0.0.1:2381/health", 60)
        self.step("etcd is healthy")
        self.add("kube-apiserver", config.apiserver_argv(self.bin, self.layout))
        self.wait_healthy("kube-apiserver", f"https://{API_ADDRESS}:{API_PORT}/readyz", 180, self.admin_context())
        self.step("kube-apiserver is ready")
        # The API server's client to the kubelets (logs, exec, port-forward), as kubeadm binds it.
        self.kubectl("create", "clusterrolebinding", "kube-apiserver-kubelet-client",
                     "--clusterrole=system:kubelet-api-admin", f"--user={pki.APISERVER_KUBELET_CLIENT.common_name}")
        self.add("kube-controller-manager", config.controller_manager_argv(self.bin, self.layout))
        self.add("kube-scheduler", config.scheduler_argv(self.bin, self.layout))
        if not self.layout.nodes:
            self.step("kube-controller-manager and kube-scheduler started (no nodes: a control plane only)")
            return
        # One kube-proxy serves the whole namespace every node shares.
        proxy_config = self.layout.state / "kube-proxy.yaml"
        proxy_config.write_text(yaml.safe_dump(config.kube_proxy_config(self.layout, self.layout.nodes[0])))
        self.add("kube-proxy", config.kube_proxy_argv(self.bin, proxy_config))
        self.step("kube-controller-manager, kube-scheduler and kube-proxy started")

    def start_nodes(self) -> None:
        cni = self.bin.parent / "cni"
        for node in self.layout.nodes:
            job = {"cluster": self.layout.name, "state": str(self.state), "node": node.name, "profile": node.profile,
                   "index": node.index, "bin_dir": str(self.bin), "cni_dir": str(cni),
                   "images": list(self.spec.images), "labels": node_labels(node)}
            job_file = self.layout.node_dir(node) / "job.json"
            job_file.parent.mkdir(parents=True, exist_ok=True)
            job_file.write_text(json.dumps(job))
            self.add("node", ["unshare", "--mount", "--propagation", "private", "--",
                              sys.executable, "-m", "sim.upstream.node", str(job_file)], node=node.name)
        self.step(f"{len(self.layout.nodes)} nodes started (containerd + kubelet each)")

    def wait_nodes_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        want = {n.name for n in self.layout.nodes}
        while time.monotonic() < deadline and not self.stopping.is_set():
            try:
                nodes = json.loads(self.kubectl("get", "nodes", "-o", "json"))["items"]
            except RuntimeError:
                nodes = []
            ready = {n["metadata"]["name"] for n in nodes
                     if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))}
            if want <= ready:
                self.step(f"nodes Ready: {', '.join(sorted(ready))}")
                return
            for c in self.components:
                c.check()
            time.sleep(1.0)
        raise RuntimeError(f"nodes not Ready after {timeout:.0f} s; see {self.layout.logs}/kubelet-*.log")

    # -- run and stop ---------------------------------------------------------------------------------------------

    def run(self, listener: Any) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        signal.signal(signal.SIGINT, lambda *_: self.stopping.set())
        self.layout.logs.mkdir(parents=True, exist_ok=True, mode=0o700)
        forwarder = netns.Forwarder(listener, (API_ADDRESS, API_PORT))
        try:
            self.make_pki()
            self.step("certificates ready")
            self.start_control_plane()
            forwarder.start()
            self.status.server = f"https://127.0.0.1:{forwarder.port}"
            self.start_nodes()
            self.wait_nodes_ready(300)
            self.status.phase = "ready"
            self.publish()
            while not self.stopping.wait(1.0):
                for c in self.components:
                    c.check()
                self.publish()
        except Exception as exc:  # noqa: BLE001 - reported in status.json, then everything is stopped
            self.status.phase, self.status.error = "failed", str(exc)
            self.publish()
        finally:
            self.shutdown()
            forwarder.stop()
        return 0 if self.status.phase != "failed" else 1

    def shutdown(self) -> None:
        for c in [c for c in self.components if c.role == "node"]:
            c.stop(grace=90)
        for c in reversed([c for c in self.components if c.role != "node"]):
            c.stop(grace=15)
        if self.status.phase != "failed":
            self.status.phase = "stopped"
        self.publish()


def main(argv: list[str]) -> int:
    state = Path(argv[0])
    spec = UpstreamSpec.from_json(json.loads((state / "spec.json").read_text()))
    nodes = plan_nodes(list(spec.nodes))
    # The loopback listener first, in the machine's namespace; everything after runs in the cluster's.
    listener = netns.host_listener()
    ns = netns_name(spec.name)
    netns.create(ns, nodes)
    try:
        netns.enter(ns)
        return Supervisor(state).run(listener)
    finally:
        netns.delete(ns)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
