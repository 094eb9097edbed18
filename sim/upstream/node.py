"""One upstream node: containerd and a real kubelet in a mount namespace of their own.

Its mounts are copies of the machine's, made private (nothing mounted here propagates back), then shared within
the node, as a systemd host's are: the agent's HostToContainer and Bidirectional volumes (/dev, the driver root,
the kubelet's plugins directory) need a shared or slave mount.

Run by the cluster supervisor as `unshare --mount --propagation private -- python -m sim.upstream.node FILE`
inside the cluster's network namespace. It mounts the node's directories over the standard paths (layout.py),
starts containerd, imports the images, starts the kubelet, restarts either when it exits (with a back-off, as
systemd would), and on SIGTERM stops the kubelet, every container and containerd, then kills whatever is left
below it (it is the children's subreaper, so the shims stay its descendants) and removes the node's cgroups.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from sim.upstream import config
from sim.upstream.layout import NODE_MOUNTS, ClusterLayout, NodePlan
from sim.upstream.process import Component

_PR_SET_CHILD_SUBREAPER = 36
_CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class NodeJob:
    """What the supervisor hands a node process (as JSON)."""
    cluster: str
    state: str
    node: str
    profile: str
    index: int
    bin_dir: str
    cni_dir: str
    images: tuple[str, ...]
    labels: dict[str, str]

    @property
    def layout(self) -> ClusterLayout:
        return ClusterLayout(self.cluster, Path(self.state), (self.plan,))

    @property
    def plan(self) -> NodePlan:
        return NodePlan(self.node, self.profile, self.index)


def log(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} node: {text}", flush=True)


def _mount(*argv: str) -> None:
    subprocess.run(["mount", *argv], check=True)


def mount_node_dirs(node_dir: Path) -> None:
    _mount("--make-rshared", "/")
    for rel, target in NODE_MOUNTS:
        source = node_dir / rel
        source.mkdir(parents=True, exist_ok=True)
        Path(target).mkdir(parents=True, exist_ok=True)
        _mount("--bind", str(source), target)
    for sub in ("containerd", "cdi"):
        Path("/run", sub).mkdir(parents=True, exist_ok=True)


def write_driver_install(node: NodePlan) -> None:
    """The node's simulated driver install where the GPU Operator's driver container puts the real one
    (/run/nvidia/driver, node-private here): the agent finds it under its driver root and puts its files
    (`nvidia-smi`, which lists what the container was given) into every claim's CDI spec, as on a GPU node, and
    runs its `nvidia-cuda-mps-control` in MPS daemon pods."""
    from driver.discovery import discover
    from driver.nvml import load_backend
    from sim.runtime import driverinstall
    from sim.upstream import drivertools
    from sim.upstream.images import IMAGE_PYTHON

    inventory = discover(load_backend(f"sim:{node.profile}", node=node.name), node.name)
    root = driverinstall.write(Path("/run/nvidia/driver"), node.name, inventory, container_python=IMAGE_PYTHON)
    # The agent then runs each MPS claim's control daemon in a pod of our image, as on a GPU node (driver.mpsdaemon).
    drivertools.install(root)


def cgroup_dirs(root: str) -> list[Path]:
    """The node's cgroup root in every mounted hierarchy (v1 controllers and the unified one)."""
    return [d / root.lstrip("/") for d in sorted(_CGROUP_ROOT.iterdir()) if d.is_dir()]


def make_cgroups(root: str) -> None:
    for d in cgroup_dirs(root):
        d.mkdir(parents=True, exist_ok=True)


def remove_cgroups(root: str) -> None:
    for top in cgroup_dirs(root):
        if not top.exists():
            continue
        for here, dirs, _files in os.walk(top, topdown=False):
            for name in dirs:
                _rmdir(Path(here) / name)
        _rmdir(top)


def _rmdir(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass


def _ctr(job: NodeJob, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(job.bin_dir) / "ctr"), "--address", "/run/containerd/containerd.sock",
                           "--namespace", "k8s.io", *argv], capture_output=True, text=True, timeout=600)


def wait_for_socket(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout:.0f} s")
        time.sleep(0.1)


def import_images(job: NodeJob) -> None:
    for archive in job.images:
        result = _ctr(job, "images", "import", "--all-platforms", archive)
        if result.returncode != 0:
            raise RuntimeError(f"ctr images import {archive}: {result.stderr.strip()}")
        log(f"imported {Path(archive).name}")


def stop_containers(job: NodeJob) -> None:
    """Every task killed and deleted, so that the shims exit before containerd does."""
    tasks = _ctr(job, "tasks", "ls", "-q")
    for task in tasks.stdout.split():
        _ctr(job, "tasks", "kill", "--signal", "SIGKILL", task)
    deadline = time.monotonic() + 10
    for task in tasks.stdout.split():
        while _ctr(job, "tasks", "delete", task).returncode != 0 and time.monotonic() < deadline:
            time.sleep(0.2)


def kill_descendants() -> None:
    """SIGKILL every process below this one (orphaned shims and containers included: we are their subreaper)."""
    me = os.getpid()
    for _ in range(20):
        children = [int(p) for p in _children(me)]
        if not children:
            return
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        time.sleep(0.1)


def _children(pid: int) -> list[str]:
    out: list[str] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += (task / "children").read_text().split()
        except OSError:
            continue
    return out


def run(job: NodeJob) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    layout, node = job.layout, job.plan
    node_dir = layout.node_dir(node)
    logs = layout.logs
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    mount_node_dirs(node_dir)
    write_driver_install(node)
    root = config.cgroup_root(layout, node)
    make_cgroups(root)
    etc = node_dir / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "containerd.toml").write_text(config.containerd_config(Path(job.cni_dir), "/usr/sbin/runc"))
    Path("/etc/cni/net.d/10-gpu-dra.conflist").write_text(config.cni_config(node))
    (etc / "resolv.conf").write_text("options ndots:1\n")
    pki = layout.pki
    kubelet_cfg = config.kubelet_config(layout, node, pki / f"kubelet-serving-{node.name}.crt",
                                        pki / f"kubelet-serving-{node.name}.key")
    kubelet_cfg["resolvConf"] = str(etc / "resolv.conf")
    (etc / "kubelet.yaml").write_text(yaml.safe_dump(kubelet_cfg))
    containerd = Component("containerd", [str(Path(job.bin_dir) / "containerd"), "--config", str(etc / "containerd.toml")],
                       logs / f"containerd-{node.name}.log")
    kubelet = Component("kubelet", config.kubelet_argv(Path(job.bin_dir), layout, node, etc / "kubelet.yaml", job.labels),
                    logs / f"kubelet-{node.name}.log")
    env_path = f"{job.bin_dir}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
    os.environ["PATH"] = env_path  # containerd finds its shim, the kubelet finds nothing else it needs
    try:
        containerd.start()
        wait_for_socket(Path("/run/containerd/containerd.sock"), 60)
        import_images(job)
        kubelet.start()
        log("ready")
        while not stop.wait(1.0):
            containerd.check()
            kubelet.check()
    finally:
        log("stopping")
        kubelet.stop(grace=20)
        stop_containers(job)
        containerd.stop(grace=20)
        kill_descendants()
        remove_cgroups(root)
        log("stopped")
    return 0


def main(argv: list[str]) -> int:
    data = json.loads(Path(argv[0]).read_text())
    data["images"] = tuple(data["images"])
    return run(NodeJob(**data))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
