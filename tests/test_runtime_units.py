"""Pure parts of the container runtime and the pod side of the kubelet simulator, and pods/log on the embedded
API server (from a log directory, no containers needed)."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from driver.commands.plugin import DEFAULT_CDI_DIR, DEFAULT_KUBELET_DIR, node_dirs, simulated_state_dir
from driver.discovery import discover
from driver.nvml import load_backend
from controlplane.podlogs import PodLogsDir, parse_cri_log
from sim.kubelet.dra import ClaimInfo, PreparedDevice
from sim.kubelet.pods import (
    ContainerRun, LegacyGrant, NodeKubelet, PreparedClaim, container_cdi_devices, container_command, container_env,
    expand, pod_phase, will_restart,
)
from sim.runtime import Runtimes, choose, driverinstall
from sim.runtime.hostprocess import OWN_IMAGE
from sim.runtime.podman import ContainerRequest, RuntimeError_
from tests.conftest import RunningApiServer


def _claim(name: str, devices: list[tuple[str, str]]) -> PreparedClaim:
    return PreparedClaim(ClaimInfo("ns", f"uid-{name}", name),
                         tuple(PreparedDevice((req,), "node", dev, (f"k/c={name}-{dev}",), None) for req, dev in devices))


def test_container_cdi_devices_follow_claim_references_and_requests() -> None:
    claims = [_claim("c1", [("a", "gpu-0"), ("b/small", "mig-1")]), _claim("c2", [("x", "gpu-2")])]
    claim_map = {"first": "c1", "second": "c2"}
    legacy = [LegacyGrant("main", ("GPU-9",), {"NVIDIA_VISIBLE_DEVICES": "GPU-9"}, ("k/gpu=GPU-9",))]
    whole = {"name": "main", "resources": {"claims": [{"name": "first"}, {"name": "second"}]}}
    assert container_cdi_devices(whole, claim_map, claims, legacy) == (
        "k/c=c1-gpu-0", "k/c=c1-mig-1", "k/c=c2-gpu-2", "k/gpu=GPU-9")
    # A container naming one request gets that request's devices (a subrequest result belongs to its request).
    only_b = {"name": "side", "resources": {"claims": [{"name": "first", "request": "b"}]}}
    assert container_cdi_devices(only_b, claim_map, claims, legacy) == ("k/c=c1-mig-1",)
    assert container_cdi_devices({"name": "none"}, claim_map, claims, legacy) == ()


def test_env_and_command_expansion_like_kubernetes() -> None:
    legacy = [LegacyGrant("main", ("GPU-9",), {"NVIDIA_VISIBLE_DEVICES": "GPU-9"}, ())]
    container = {"name": "main", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "$(A)-$(NVIDIA_VISIBLE_DEVICES)"},
                                          {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                 "command": ["echo", "$(B)"], "args": ["$$(A)", "$(UNKNOWN)"]}
    env = container_env(container, legacy)
    assert env == {"NVIDIA_VISIBLE_DEVICES": "GPU-9", "A": "1", "B": "1-GPU-9"}
    assert container_command(container, env) == ("echo", "1-GPU-9", "$(A)", "$(UNKNOWN)")
    assert expand("$$$(A)", {"A": "x"}) == "$x"


def _run(exit_code: int | None, restarts: int = 0) -> ContainerRun:
    return ContainerRun("c", "rt", restarts, (), "t0", exit_code is None, exit_code)


def test_pod_phase_follows_containers_and_restart_policy() -> None:
    assert pod_phase("Never", [_run(None)]) is None
    assert pod_phase("Never", [_run(0), _run(0)]) == "Succeeded"
    assert pod_phase("Never", [_run(0), _run(2)]) == "Failed"
    assert pod_phase("OnFailure", [_run(0)]) == "Succeeded"
    assert pod_phase("OnFailure", [_run(1)]) is None and will_restart("OnFailure", _run(1))
    assert pod_phase("Always", [_run(0)]) is None and will_restart("Always", _run(0))
    assert not will_restart("Always", _run(None))


@pytest.mark.process
def test_runtime_choice() -> None:
    assert choose("none").kind == "none"
    with pytest.raises(ValueError, match="expected one of auto, podman, none"):
        choose("docker")
    auto = choose("auto")
    assert auto.kind in ("podman", "none") and auto.reason
    if auto.kind == "none":
        assert "install: apt-get install -y podman runc busybox-static" in auto.reason
        with pytest.raises(ValueError, match="podman cannot run here"):
            choose("podman")


@pytest.mark.process
def test_simulated_nvidia_smi_lists_only_devices_present(tmp_path: Path) -> None:
    inventory = discover(load_backend("sim:h100-mig", node="n"), "n")
    script = driverinstall.script("n", inventory)
    for gpu in inventory.gpus:
        assert f"{gpu.minor}|{gpu.uuid}|{gpu.product_name}|" in script
    root = driverinstall.write(tmp_path / "driver", "n", inventory)
    smi = root / "usr/bin/nvidia-smi"
    assert smi.stat().st_mode & 0o111
    sh = shutil.which("sh")
    assert sh is not None
    # This machine has no NVIDIA device nodes: nothing to list, as the real tool says.
    done = subprocess.run([sh, str(smi), "-L"], capture_output=True, text=True, env={"NVIDIA_VISIBLE_DEVICES": "all"})
    assert (done.returncode, done.stdout) == (6, "No devices were found\n")
    bad = subprocess.run([sh, str(smi), "-q"], capture_output=True, text=True)
    assert bad.returncode == 2 and "only -L" in bad.stderr


def test_simulated_agent_never_uses_the_hosts_dirs() -> None:
    args = argparse.Namespace(nvml="sim:dgx-a100", node="n1", kubelet_dir=None, cdi_dir=None)
    kubelet, cdi_dir, notice = node_dirs(args)
    state = simulated_state_dir("n1")
    assert (kubelet, cdi_dir) == (state / "kubelet", state / "cdi")
    assert str(state) in notice and DEFAULT_KUBELET_DIR in notice and "never the host's" in notice
    given = argparse.Namespace(nvml="sim:dgx-a100", node="n1", kubelet_dir="/x/k", cdi_dir=None)
    assert node_dirs(given)[:2] == (Path("/x/k"), state / "cdi")
    real = argparse.Namespace(nvml="real", node="n1", kubelet_dir=None, cdi_dir=None)
    assert node_dirs(real) == (Path(DEFAULT_KUBELET_DIR), Path(DEFAULT_CDI_DIR), "")


# ---- pods/log ------------------------------------------------------------------------------------------------

CRI = ("2026-01-01T00:00:00.000000001Z stdout F line one\n"
       "2026-01-01T00:00:00.000000002Z stderr P part\n"
       "2026-01-01T00:00:00.000000003Z stderr F ial\n"
       "2026-01-01T00:00:00.000000004Z stdout F last\n")


def test_cri_log_and_log_dir_layout(tmp_path: Path) -> None:
    assert "".join(line.text for line in parse_cri_log(CRI)) == "line one\npartial\nlast\n"
    d = tmp_path / "ns_pod_uid1" / "main"
    d.mkdir(parents=True)
    for n in (0, 1, 10):
        (d / f"{n}.log").write_text("")
    source = PodLogsDir(tmp_path)
    assert source.log_file("ns", "pod", "uid1", "main", False) == d / "10.log"
    assert source.log_file("ns", "pod", "uid1", "main", True) == d / "1.log"
    assert source.log_file("ns", "pod", "uid2", "main", False) is None


def _pod(apiserver: RunningApiServer, name: str, containers: list[str], phase: str = "Succeeded") -> dict[str, object]:
    pod = apiserver.api.create("Pod", {"metadata": {"name": name, "namespace": "default"}, "spec": {
        "nodeName": "n1", "containers": [{"name": c, "image": "busybox"} for c in containers]}}, namespace="default")
    pod["status"] = {"phase": phase}
    return apiserver.api.replace_status("Pod", pod)


@pytest.mark.process
def test_kubectl_logs_from_a_registered_log_source(apiserver: RunningApiServer, tmp_path: Path) -> None:
    def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["kubectl", "--kubeconfig", str(apiserver.kubeconfig), "-n", "default", *args],
                              capture_output=True, text=True, timeout=60)

    one = _pod(apiserver, "one", ["main"])
    two = _pod(apiserver, "two", ["a", "b"])
    no_source = kubectl("logs", "one")
    assert no_source.returncode != 0 and "no container log source" in no_source.stderr
    apiserver.server.pod_logs = PodLogsDir(tmp_path)
    waiting = kubectl("logs", "one")
    assert waiting.returncode != 0 and 'container "main" in pod "one" is waiting to start: ContainerCreating' in \
        waiting.stderr
    # The reason the container's status gives, as the kubelet answers it.
    apiserver.api.patch("Pod", "one", {"status": {"containerStatuses": [{
        "name": "main", "ready": False, "restartCount": 0, "image": "i", "imageID": "",
        "state": {"waiting": {"reason": "CreateContainerConfigError", "message": 'configmap "nope" not found'}}}]}},
        namespace="default", subresource="status")
    waiting = kubectl("logs", "one")
    assert 'container "main" in pod "one" is waiting to start: CreateContainerConfigError' in waiting.stderr, waiting
    for pod, container in ((one, "main"), (two, "b")):
        meta = pod["metadata"]
        d = tmp_path / f"default_{meta['name']}_{meta['uid']}" / container  # type: ignore[index]
        d.mkdir(parents=True)
        (d / "0.log").write_text(CRI)
    assert kubectl("logs", "one").stdout == "line one\npartial\nlast\n"
    assert kubectl("logs", "one", "--tail", "1").stdout == "last\n"
    assert kubectl("logs", "one", "--timestamps").stdout.splitlines()[0] == "2026-01-01T00:00:00.000000001Z line one"
    # A terminated pod's followed log ends after its last line.
    assert kubectl("logs", "-f", "one").stdout == "line one\npartial\nlast\n"
    assert kubectl("logs", "two", "-c", "b").stdout == "line one\npartial\nlast\n"
    bad = kubectl("logs", "two", "-c", "c")
    assert bad.returncode != 0 and "container c is not valid for pod two" in bad.stderr
    resources = json.loads(kubectl("get", "--raw", "/api/v1").stdout)["resources"]
    assert {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]} in resources


@pytest.mark.process
def test_without_podman_auto_falls_back_and_podman_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os
    import sys

    monkeypatch.setenv("PATH", str(tmp_path))  # no podman, runc, unshare... on this PATH
    auto = choose("auto")
    assert auto.kind == "none" and "podman is not installed" in auto.reason and "pods are marked Running" in auto.reason
    with pytest.raises(ValueError, match="podman is not installed"):
        choose("podman")
    repo = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-m", "cli.main", "demo", "--runtime", "podman"], cwd=repo, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PATH": str(tmp_path)})
    assert done.returncode == 2 and "gpu-dra demo: --runtime podman: podman cannot run here" in done.stderr


@pytest.mark.process
def test_simulated_plugin_process_uses_its_private_state_dir(apiserver: RunningApiServer) -> None:
    import os
    import sys
    import time

    from tests.plugin_helpers import short_tmp, stop_process

    repo = Path(__file__).resolve().parent.parent
    host_kubelet_existed = Path(DEFAULT_KUBELET_DIR).exists()
    with short_tmp() as tmp:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "plugin", "--node", "simnode", "--nvml", "sim:v100-4",
             "--kubeconfig", str(apiserver.kubeconfig)],
            cwd=repo, env={**os.environ, "TMPDIR": str(tmp)}, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        try:
            state = tmp / f"gpu-dra-sim-{os.getuid()}" / "simnode"
            registry = state / "kubelet" / "plugins_registry"
            deadline = time.monotonic() + 60
            while not (registry.is_dir() and any(registry.glob("*.sock"))):
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline, "the agent did not create its registration socket"
                time.sleep(0.1)
        finally:
            stop_process(proc)
        assert proc.stderr is not None
        err = proc.stderr.read()
        proc.stderr.close()
        assert f"using the private state dir {state}" in err and "never the host's /var/lib/kubelet" in err
    assert Path(DEFAULT_KUBELET_DIR).exists() == host_kubelet_existed


def test_what_a_container_wrote_is_read_without_following_or_blocking(tmp_path: Path) -> None:
    import os

    from sim.runtime.podman import MAX_SEEN_FILE_BYTES, read_untrusted

    (tmp_path / "plain").write_text("GPU 0\n")
    assert read_untrusted(tmp_path / "plain") == "GPU 0\n"
    secret = tmp_path / "host-secret"
    secret.write_text("root only")
    (tmp_path / "link").symlink_to(secret)
    assert read_untrusted(tmp_path / "link") is None  # a symlink to a host path is not followed
    os.mkfifo(tmp_path / "fifo")
    assert read_untrusted(tmp_path / "fifo") is None  # a FIFO neither blocks nor is read
    assert read_untrusted(tmp_path) is None and read_untrusted(tmp_path / "missing") is None
    (tmp_path / "big").write_bytes(b"x" * (MAX_SEEN_FILE_BYTES * 4))
    assert len(read_untrusted(tmp_path / "big") or "") == MAX_SEEN_FILE_BYTES


@pytest.mark.process  # starts `true` as a host process
def test_runtime_none_runs_only_our_image_and_the_kubelet_simulates_the_rest(tmp_path: Path) -> None:
    """`--runtime none`: the node's runtime runs pods whose containers (init ones too) are all of our image;
    the kubelet gets no runtime for any other pod, and a foreign image is refused, never started."""
    runtime = Runtimes(tmp_path / "runtime", "none").for_node("n1", tmp_path / "cdi")
    assert runtime.kind == "none"
    kubelet = NodeKubelet.__new__(NodeKubelet)  # only _runtime_for is exercised: no API server, no threads
    kubelet.runtime = runtime

    def pod(*images: str, init: str = "") -> dict[str, object]:
        return {"spec": {"containers": [{"name": f"c{i}", "image": im} for i, im in enumerate(images)],
                         "initContainers": [{"name": "i", "image": init}] if init else []}}

    ours = f"{OWN_IMAGE}:v1"
    assert kubelet._runtime_for(pod(ours)) is runtime
    assert kubelet._runtime_for(pod(ours, "busybox")) is None
    assert kubelet._runtime_for(pod(ours, init="busybox")) is None
    assert kubelet._runtime_for(pod("busybox")) is None
    with pytest.raises(RuntimeError_, match="no container runtime for image 'busybox'"):
        runtime.run(ContainerRequest("x", ("true",), image="busybox"))
    done = runtime.run(ContainerRequest("ours", ("true",), image=ours))
    assert done.running or done.exit_code == 0
    runtime.remove("ours")
    runtime.close()
