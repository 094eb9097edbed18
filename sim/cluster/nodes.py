"""Starting the pieces of a simulated cluster, shared by the demo (runs and exits) and `gpu-dra cluster` (stays up).

The control plane, the controller and one node agent per node are `gpu-dra` child processes; a node's kubelet
(and, for legacy pods, its device manager) is simulated in the calling process, over the agent's real sockets.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driver.discovery import discover
from driver.nvml import load_backend
from gpudra.kubeapi import KubeApi
from sim.cluster import identities
from sim.cluster.kubeconfig import admin_access
from sim.runtime import driverinstall
from sim.demo.cluster import NodeDirs, NodeSpec, node_object, register_node
from sim.demo.processes import Child, ChildFailed, ChildGroup, gpu_dra_command
from sim.kubelet.devicemanager import DeviceManagerSim
from sim.kubelet.pods import NodeKubelet


def token_key_path(kubeconfig: Path) -> Path:
    """Where the control plane's token signing key is kept: beside the admin kubeconfig it writes."""
    return kubeconfig.with_name(kubeconfig.name + ".token-key")


def apiserver_argv(kubeconfig: Path, *, state: Path | None = None, port: int = 0,
                   pod_logs_dir: Path | None = None, runtime_config: Sequence[str] = (),
                   features: Sequence[str] = (), tls_dir: Path | None = None) -> list[str]:
    """A request without credentials is never the admin: every component carries its own token. With `tls_dir`
    (the cluster a person points kubectl at) the server serves HTTPS on `port` with the CA kept in `tls_dir`, and
    the kubeconfig it writes is that URL, the CA and the admin's token, because kubectl sends a bearer token only
    over TLS; its plain HTTP port then takes a free port and is used by nobody. Without it (the demo, whose
    clients are the official Python client, which sends tokens over HTTP) the server is plain HTTP on `port`."""
    argv = ["apiserver", "--kubeconfig-out", str(kubeconfig), "--token-key", str(token_key_path(kubeconfig)),
            "--no-unauthenticated-as-admin"]
    if tls_dir is not None:
        argv += ["--tls", "--tls-dir", str(tls_dir), "--tls-port", str(port), "--port", "0"]
    else:
        argv += ["--no-tls", "--port", str(port)]
    for entry in runtime_config:
        argv += ["--runtime-config", entry]
    for gate in features:
        argv += ["--feature-gates", gate]
    if state is not None:
        argv += ["--state", str(state)]
    if pod_logs_dir is not None:
        argv += ["--pod-logs-dir", str(pod_logs_dir)]  # `kubectl logs` reads what the kubelets' runtime wrote
    return gpu_dra_command(*argv)


def start_apiserver(children: ChildGroup, kubeconfig: Path, *, timeout: float, state: Path | None = None,
                    port: int = 0, pod_logs_dir: Path | None = None, name: str = "apiserver",
                    runtime_config: Sequence[str] = (), features: Sequence[str] = (),
                    tls_dir: Path | None = None) -> tuple[Child, str]:
    """Start `gpu-dra apiserver` and return it with the URL its clients use: the one in the kubeconfig it wrote
    before printing its (plain) URL on its first stdout line, which is the HTTPS one with `tls_dir`."""
    argv = apiserver_argv(kubeconfig, state=state, port=port, pod_logs_dir=pod_logs_dir,
                          runtime_config=runtime_config, features=features, tls_dir=tls_dir)
    child = children.start(name, argv, stdout_pipe=True, tier=0)
    assert child.process.stdout is not None
    fd = child.process.stdout.fileno()
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 256) if ready else b""
        if not chunk:
            raise child.failure("did not print its URL")
        line += chunk
    if tls_dir is None:
        return child, line.decode().splitlines()[0].strip()
    return child, str(admin_access(kubeconfig)[0].get("server") or "")


def controller_argv(kubeconfig: Path, *, features: Sequence[str] = (), leader_elect: bool = True) -> list[str]:
    # The Lease in the controller's own namespace, where its manifest's Role allows it (as POD_NAMESPACE does).
    argv = ["controller", "--kubeconfig", str(kubeconfig), "--embedded", "--lease-namespace", identities.NAMESPACE]
    for gate in features:
        argv += ["--feature", gate]
    if not leader_elect:
        # A supervisor runs exactly one controller; a restarted one must not wait out its predecessor's Lease.
        argv.append("--no-leader-elect")
    return gpu_dra_command(*argv)


def plugin_argv(spec: NodeSpec, dirs: NodeDirs, kubeconfig: Path, driver_name: str, *, faults: Path | None = None,
                partitionable: bool = False, driver_root: Path | None = None) -> list[str]:
    nvml = f"sim:{spec.profile}" + ((("&" if "?" in spec.profile else "?") + f"faults={faults}") if faults is not None
                                     else "")
    argv = ["plugin", "--node", spec.name, "--nvml", nvml, "--kubeconfig", str(kubeconfig),
            "--kubelet-dir", str(dirs.kubelet), "--cdi-dir", str(dirs.cdi), "--driver-name", driver_name]
    if driver_root is not None:
        # The node's simulated driver install, visible at the same path to the agent and to containers.
        argv += ["--driver-root", str(driver_root), "--host-driver-root", str(driver_root)]
    if spec.device_plugin:
        argv.append("--device-plugin")
    if partitionable:
        argv.append("--partitionable")
    return gpu_dra_command(*argv)


@dataclass
class NodeSide:
    """What runs in-process for one node: its kubelet simulator and, with the device plugin, its device manager."""

    kubelet: NodeKubelet
    device_manager: DeviceManagerSim | None
    driver_root: Path | None = None  # the node's simulated driver install (sim.runtime.driverinstall)

    def stop(self) -> None:
        self.kubelet.stop()
        if self.device_manager is not None:
            self.device_manager.stop()


def start_node_side(api: KubeApi, spec: NodeSpec, dirs: NodeDirs, driver_name: str, *, runtime: Any = None,
                    pod_logs_dir: Path | None = None, admin_kubeconfig: Path | None = None,
                    faults: Path | None = None) -> NodeSide:
    """Write the node's simulated driver install, register the Node and serve the kubelet's sockets; the kubelet's
    pod threads start once the agent registered (`register_and_start`). `runtime` runs the pods' containers
    (sim.runtime; None: no containers); `faults` is the node's NVML faults file, which its IMEX stand-in reads."""
    dirs.kubelet.mkdir(parents=True, exist_ok=True)
    dirs.cdi.mkdir(parents=True, exist_ok=True)
    inventory = discover(load_backend(f"sim:{spec.profile}", node=spec.name), spec.name)
    driver_root = driverinstall.write(dirs.root / "driver", spec.name, inventory, faults)
    stream_client = None
    if admin_kubeconfig is not None:
        kubelet_config = identities.node_kubeconfig(token_key_path(admin_kubeconfig), admin_kubeconfig, spec.name,
                                                    dirs.root / "kubelet.kubeconfig")
        api = KubeApi.connect(kubeconfig=str(kubelet_config))
        stream_client = identities.kubelet_client_check(token_key_path(admin_kubeconfig))
    register_node(api, node_object(spec.name, gpu_allocatable=0 if spec.device_plugin else None, address=spec.address))
    dm: DeviceManagerSim | None = None
    if spec.device_plugin:
        # The kubelet's kubelet.sock must be served before a device plugin can register.
        dm = DeviceManagerSim(dirs.kubelet)
        dm.start()
    kubelet = NodeKubelet(api, spec.name, dirs.kubelet, driver_name, device_manager=dm, runtime=runtime,
                          node_address=spec.address, pod_logs_dir=pod_logs_dir, stream_client=stream_client)
    return NodeSide(kubelet, dm, driver_root)


def register_and_start(side: NodeSide, agent: Child, timeout: float) -> None:
    """Register the node agent's plugin with the kubelet simulator, then start the kubelet's pod threads."""
    from sim.kubelet.dra import KubeletError

    deadline = time.monotonic() + timeout
    while True:
        try:
            side.kubelet.register_plugin(timeout=min(1.0, max(0.1, deadline - time.monotonic())))
            break
        except KubeletError as exc:
            # Look again every second, and give up at once if the agent died (its log says why).
            if not agent.alive() or time.monotonic() >= deadline:
                raise ChildFailed(f"node {side.kubelet.node_name}: {exc}\n{agent.failure('did not register')}") from exc
    side.kubelet.start()


def reregister(side: NodeSide, driver_name: str, timeout: float) -> bool:
    """After the node agent restarted: register its new registration socket, as the kubelet's plugin watcher does
    when the socket is replaced. False if none appeared in time."""
    from sim.kubelet.dra import KubeletError

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if any(p.name == driver_name for p in side.kubelet.sim.sync()):
                return True
        except KubeletError:
            pass  # the socket is there but not served yet
        time.sleep(0.1)
    return False


def slice_device_counts(api: KubeApi) -> dict[str, int]:
    """Published devices per node."""
    slices, _ = api.list("ResourceSlice")
    counts: dict[str, int] = {}
    for sl in slices:
        spec = sl.get("spec") or {}
        node = str(spec.get("nodeName"))
        counts[node] = counts.get(node, 0) + len(spec.get("devices") or [])
    return counts
