"""`gpu-dra cluster up|down|status --kubernetes upstream`: the same commands on real Kubernetes.

`up` builds (or finds in the cache) the upstream binaries and the images, starts the supervisor detached, waits
until every node is Ready, then does what a user does on a new cluster: merges the kubeconfig context and applies
the manifests with `kubectl apply -k`, and waits until the agents have published their ResourceSlices.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sim.upstream import images, netns, pki
from sim.upstream.layout import ClusterLayout, netns_name, plan_nodes
from sim.upstream.node import remove_cgroups
from sim.upstream.supervisor import UpstreamSpec

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = Path(__file__).with_name("build.sh")
# The overlay a testbed cluster deploys: the base manifests, the testbed image (NVML simulator inside) and the
# simulator profile taken from each node's label.
TESTBED_OVERLAY = ROOT / "manifests" / "testbed"


class UpstreamError(RuntimeError):
    pass


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def build_binaries() -> Path:
    """The bin directory of the cached build (sim/upstream/build.sh prints it on its last line)."""
    if shutil.which("go") is None:
        raise UpstreamError("the upstream backend builds Kubernetes from its Go modules and needs Go (1.26+) on PATH; "
                            "without Go use the embedded backend (the default)")
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise UpstreamError(f"building the upstream binaries failed (exit {result.returncode}); see the lines above")
    return Path(result.stdout.strip().splitlines()[-1])


def read_spec(state: Path) -> UpstreamSpec | None:
    try:
        data = json.loads((state / "spec.json").read_text())
    except (OSError, ValueError):
        return None
    return UpstreamSpec.from_json(data) if isinstance(data, dict) and data.get("backend") == "upstream" else None


def read_status(state: Path) -> dict[str, Any]:
    try:
        data = json.loads((state / "status.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def supervisor_alive(state: Path) -> bool:
    pid = read_status(state).get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return str(state).encode() in cmdline


def up(name: str, state: Path, nodes: list[tuple[str, str]], wait: float) -> tuple[str, Path]:
    """Start the cluster; return (server URL on loopback, the admin kubeconfig)."""
    if os.geteuid() != 0:
        raise UpstreamError("the upstream backend runs real kubelets and containerd, which need root")
    for tool in ("unshare", "ip", "runc", "nft"):
        if shutil.which(tool) is None:
            raise UpstreamError(f"{tool} is not installed (Debian: util-linux, iproute2, runc, nftables)")
    bin_dir = build_binaries()
    image_paths: tuple[str, ...] = ()
    if nodes:  # a control plane only runs no containers: no images to build
        _progress("images: building (or reusing) the product, testbed, pause and stand-in images")
        try:
            image_paths = tuple(str(p) for p in images.build_all().all())
        except images.ImageBuildError as exc:
            raise UpstreamError(str(exc)) from None
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    spec = UpstreamSpec(name, tuple(nodes), str(bin_dir), image_paths)
    (state / "spec.json").write_text(json.dumps(spec.to_json(), indent=2))
    (state / "logs").mkdir(exist_ok=True, mode=0o700)
    with open(state / "logs" / "supervisor.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "sim.upstream.supervisor", str(state)], cwd=str(ROOT),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    shown = 0
    deadline = time.monotonic() + wait
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = read_status(state)
        steps = status.get("steps") or []
        for line in steps[shown:]:
            _progress(f"  {line}")
        shown = len(steps)
        if status.get("phase") in ("ready", "failed", "stopped") or proc.poll() is not None:
            break
        time.sleep(0.5)
    if status.get("phase") != "ready":
        why = status.get("error") or (f"not ready after {wait:.0f} s" if proc.poll() is None
                                      else f"supervisor exited with {proc.returncode}")
        tail = (state / "logs" / "supervisor.log").read_text(errors="replace").strip().splitlines()[-6:]
        raise UpstreamError(f"cluster {name} did not come up: {why}; logs in {state / 'logs'}"
                            + ("\n  " + "\n  ".join(tail) if tail else ""))
    layout = ClusterLayout(name, state, plan_nodes(nodes))
    user_config = state / "kubeconfig.yaml"
    pki.Pki(layout.pki).kubeconfig(pki.ADMIN, status["server"], user_config, context=f"gpu-dra-{name}")
    return str(status["server"]), user_config


def deploy(bin_dir: Path, kubeconfig: Path, overlay: Path, wait: float) -> None:
    """`kubectl apply -k OVERLAY`, then wait for the agents' rollout and their slices."""
    kubectl = [str(bin_dir / "kubectl"), f"--kubeconfig={kubeconfig}"]

    def run(*argv: str) -> str:
        result = subprocess.run([*kubectl, *argv], capture_output=True, text=True, timeout=wait + 30)
        if result.returncode != 0:
            raise UpstreamError(f"kubectl {' '.join(argv)}: {result.stderr.strip()}")
        return result.stdout

    shown = overlay.relative_to(ROOT) if overlay.is_relative_to(ROOT) else overlay
    _progress(f"deploying: kubectl apply -k {shown}")
    run("apply", "-k", str(overlay))
    for what in ("daemonset/gpu-dra-node-agent", "deployment/gpu-dra-controller"):
        run("-n", "gpu-dra-system", "rollout", "status", what, f"--timeout={int(wait)}s")
        _progress(f"  {what} rolled out")


def faults_file(state: Path, node: str) -> Path:
    """The node's simulated-faults file, as its agent pod sees it at /var/lib/kubelet/plugins/ (manifests/testbed)."""
    return state / "nodes" / node / "kubelet" / "plugins" / "gpu-dra-sim-faults.json"


def plugin_dir(state: Path, node: str) -> Path:
    """The agent's plugin directory (its checkpoint) on the node, as the host sees it."""
    from gpudra import DEFAULT_DRIVER_NAME

    return state / "nodes" / node / "kubelet" / "plugins" / DEFAULT_DRIVER_NAME


def restart_agent(state: Path, node: str) -> None:
    spec = read_spec(state)
    if spec is None:
        raise UpstreamError(f"{state}: not an upstream cluster")
    result = subprocess.run([f"{spec.bin_dir}/kubectl", f"--kubeconfig={state / 'kubeconfig.yaml'}", "-n",
                             "gpu-dra-system", "delete", "pod", "-l", "app.kubernetes.io/component=node-agent",
                             f"--field-selector=spec.nodeName={node}", "--wait=false"],
                            capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise UpstreamError(result.stderr.strip())


def import_stand_ins(state: Path, references: list[str]) -> list[str]:
    """Import the busybox stand-in under each image reference into every node's containerd (what `cluster up`
    does for the images the quickstart and examples name), so that a spec naming other public images runs here;
    returns the references, normalised as the kubelet asks containerd for them. The images the cluster runs as
    they are (ours, pause) and references pinned by digest (no stand-in has that digest) are refused."""
    spec = read_spec(state)
    if spec is None:
        raise UpstreamError(f"{state}: not an upstream cluster")
    if not supervisor_alive(state):
        raise UpstreamError(f"cluster {spec.name} is not running; gpu-dra cluster up --kubernetes upstream "
                            f"--name {spec.name} first")
    real = {images.product_reference(), images.product_reference(testbed=True), images.PAUSE_REFERENCE}
    wanted: list[str] = []
    for given in references:
        try:
            reference = images.check_reference(given)
        except images.SpecImagesError as exc:
            raise UpstreamError(str(exc)) from None
        if reference in real:
            raise UpstreamError(f"{given}: the cluster runs this image as built, not a stand-in")
        if "@" in reference:
            raise UpstreamError(f"{given}: pinned by digest, which no stand-in has (name it by tag)")
        if reference not in wanted:
            wanted.append(reference)
    layout = ClusterLayout(spec.name, state, plan_nodes(list(spec.nodes)))
    archives = []
    for reference in wanted:
        try:
            archives.append(images.workload_image(reference))
        except images.ImageBuildError as exc:
            raise UpstreamError(str(exc)) from None
    # The node's /run is a directory of the state on the host, and ctr streams each archive to containerd over its
    # socket; a link under /tmp keeps that path within a unix socket's 108 bytes wherever the state lives.
    with tempfile.TemporaryDirectory(prefix="gd-") as links:
        for node in layout.nodes:
            socket = Path(links) / node.name
            socket.symlink_to(layout.node_dir(node) / "run" / "containerd" / "containerd.sock")
            for reference, archive in zip(wanted, archives, strict=True):
                result = subprocess.run([f"{spec.bin_dir}/ctr", "--address", str(socket), "--namespace", "k8s.io",
                                         "images", "import", "--all-platforms", str(archive)],
                                        capture_output=True, text=True, timeout=300)
                if result.returncode != 0:
                    raise UpstreamError(f"importing {reference} into {node.name}'s containerd: "
                                        f"{result.stderr.strip()}")
            _progress(f"  {node.name}: {len(wanted)} stand-in image(s) imported")
    return wanted


def stop(state: Path, grace: float = 120.0) -> list[str]:
    """Stop the supervisor (it stops the nodes, then the control plane), then remove whatever a crash may have
    left: processes in the namespace or the nodes' cgroups, the namespace, the cgroups, the state."""
    stopped: list[str] = []
    spec = read_spec(state)
    status = read_status(state)
    pid = status.get("pid")
    if isinstance(pid, int) and supervisor_alive(state):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and supervisor_alive(state):
            time.sleep(0.2)
        if supervisor_alive(state):
            os.kill(pid, signal.SIGKILL)
        stopped.append(f"supervisor (pid {pid})")
    if spec is not None:
        ns = netns_name(spec.name)
        layout = ClusterLayout(spec.name, state, plan_nodes(list(spec.nodes)))
        from sim.upstream import config

        left = set(netns.pids(ns)) if netns.exists(ns) else set()
        for node in layout.nodes:
            left |= _cgroup_pids(config.cgroup_root(layout, node))
        for leftover in sorted(left):
            try:
                os.kill(leftover, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if left:
            stopped.append(f"{len(left)} leftover processes")
            time.sleep(0.5)
        for node in layout.nodes:
            remove_cgroups(config.cgroup_root(layout, node))
        if netns.exists(ns):
            netns.delete(ns)
            stopped.append(f"network namespace {ns}")
    shutil.rmtree(state, ignore_errors=True)
    return stopped


def _cgroup_pids(root: str) -> set[int]:
    top = Path("/sys/fs/cgroup/pids") / root.lstrip("/")
    found: set[int] = set()
    if top.exists():
        for procs in top.rglob("cgroup.procs"):
            try:
                found |= {int(p) for p in procs.read_text().split()}
            except OSError:
                continue
    return found
