"""MPS control daemons in Deployments of their own: what a node needs, and a daemon that outlives the agent.

A stand-in for the Deployment controller and the kubelet watches the embedded API server for the daemon's
Deployment and, like the real pod's script, listens on `<pipe dir>/control` (a host path both the agent and the
pod see), records the limits the Deployment gives the daemon and marks it started in its state dir; it stops
listening when the Deployment is deleted.
"""

from __future__ import annotations

import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driver import sharing
from driver.gputools import CommandResult, GpuToolError, MpsDirs, NvidiaTools, make_mps_dirs
from driver.mpsdaemon import (
    COMMANDS_ENV, DAEMON_ARGS_ENV, STARTED_MARK, MpsDaemonPods, MpsPodSettings, deployment_manifest, pod_name,
    ready_timeout, state_dir,
)
from gpudra.deviceconfig import parse
from tests.plugin_helpers import short_tmp

NODE = "gpu-node-1"
SETTINGS = MpsPodSettings(namespace="gpu-dra-system", node_name=NODE, image="gpu-dra:dev",
                          host_driver_root="/run/nvidia/driver", ready_timeout_s=30)


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.stdin: list[str] = []

    def run(self, argv, *, env=None, stdin=None) -> CommandResult:  # noqa: ANN001 - CommandRunner protocol
        self.calls.append(list(argv))
        self.stdin.append(stdin or "")
        return CommandResult(0, "", "")


class _Kubelet:
    """Runs the MPS Deployments it sees: a listener on the pod's pipe hostPath, closed when it is deleted."""

    def __init__(self, api: Any) -> None:
        self._api = api
        self._stop = threading.Event()
        self.listeners: dict[str, socket.socket] = {}
        self.started: list[str] = []
        self.commands: dict[str, list[str]] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for event, deployment in self._api.watch("Deployment", namespace=SETTINGS.namespace, stop=self._stop):
            name = deployment["metadata"]["name"]
            pod = deployment["spec"]["template"]["spec"]
            if event == "ADDED" and name not in self.listeners:
                volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
                env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.bind(f"{volumes['mps-pipe']}/control")
                s.listen(4)
                self.commands[name] = [c for c in env[COMMANDS_ENV].split("\n") if c]
                Path(volumes["mps-state"], STARTED_MARK).write_text("")
                self.listeners[name] = s
                self.started.append(name)
            elif event == "DELETED" and name in self.listeners:
                s = self.listeners.pop(name)
                path = s.getsockname()
                s.close()
                Path(path).unlink(missing_ok=True)

    def close(self) -> None:
        self._stop.set()
        for s in self.listeners.values():
            s.close()


@pytest.fixture
def api(apiserver: Any) -> Any:
    apiserver.api.create("Namespace", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SETTINGS.namespace}})
    return apiserver.api


@pytest.fixture
def tmp() -> Iterator[Path]:
    with short_tmp() as path:
        yield path


def test_daemon_deployment_is_what_a_gpu_node_needs(tmp: Path) -> None:
    dirs = sharing.mps_dirs(tmp / "mps", "uid-1")
    settings = MpsPodSettings(namespace="gpu-dra-system", node_name=NODE, image="registry.example/gpu-dra:1",
                              host_driver_root="/run/nvidia/driver", image_pull_secrets=("regcred",))
    deployment = deployment_manifest(settings, dirs, ["GPU-a", "MIG-b"], ["set_default_active_thread_percentage 50"])
    # Owned by a controller object: recreated when its pod is deleted, evicted (not refused) by kubectl drain.
    assert deployment["kind"] == "Deployment" and deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # never two daemons on one pipe dir
    template = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    spec = template["spec"]
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["nodeName"] == NODE and spec["hostPID"] is True and spec["restartPolicy"] == "Always"
    (container,) = spec["containers"]
    assert container["securityContext"]["privileged"] is True
    # Root whatever the image's user: the daemon starts each client UID's MPS server as that UID.
    assert container["securityContext"]["runAsUser"] == 0 and container["securityContext"]["runAsNonRoot"] is False
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-a,MIG-b" and env["NVIDIA_VISIBLE_DEVICES"] == "void"
    # The limits are the pod's own: its script gives them to the daemon at every start.
    assert env[COMMANDS_ENV] == "set_default_active_thread_percentage 50"
    assert env[DAEMON_ARGS_ENV] == "" and f"-d ${DAEMON_ARGS_ENV}" in container["command"][2]
    multi = deployment_manifest(settings, dirs, ["GPU-a"], multi_user=True)["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e["value"] for e in multi["env"]}[DAEMON_ARGS_ENV] == "-M"
    assert COMMANDS_ENV in container["command"][2] and "nvidia-cuda-mps-control" in container["command"][2]
    assert "LD_LIBRARY_PATH" not in container["command"][2]
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    assert volumes == {"driver-root": "/run/nvidia/driver", "mps-pipe": str(dirs.pipe), "mps-log": str(dirs.log),
                       "mps-shm": str(dirs.shm), "mps-state": str(state_dir(dirs))}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts["/driver-root"] == "driver-root" and mounts["/dev/shm"] == "mps-shm"
    assert container["startupProbe"]["exec"]["command"][-1].endswith(f"/{STARTED_MARK}")
    assert deployment["metadata"]["name"] == pod_name(NODE, dirs) and len(deployment["metadata"]["name"]) <= 63


def test_daemon_outlives_the_agent_and_is_stopped_with_its_claim(api: Any, tmp: Path) -> None:
    kubelet = _Kubelet(api)
    try:
        dirs = sharing.mps_dirs(tmp / "mps", "uid-1")
        config = parse({"apiVersion": "gpu.nvidia.com/v1alpha1", "kind": "GpuConfig",
                        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}})
        devices = [sharing.SharedDevice(uuid="GPU-a", gpu_uuid="GPU-a", gpu_index=0)]

        def agent(runner: _Recorder) -> Any:
            """One incarnation of the agent's backend: real pods, recorded tool and mount commands."""
            pods = MpsDaemonPods(api, SETTINGS, NvidiaTools(runner), runner=runner, poll_s=0.05,
                                 is_mount=lambda p: any(c[:2] == ["mount", "-t"] and c[-1] == p for c in runner.calls))

            class Backend:
                set_compute_mode = staticmethod(lambda uuid, mode: None)
                set_timeslice = staticmethod(lambda uuid, level: None)
                mps_start = staticmethod(pods.start)
                mps_wait = staticmethod(pods.wait)
                mps_command = staticmethod(pods.command)
                mps_stop = staticmethod(pods.stop)
                mps_running = staticmethod(pods.running)

            return Backend()

        first = _Recorder()
        assert sharing.start_mps(agent(first), config, devices, dirs) is True
        agent(first).mps_wait(dirs)
        assert kubelet.started == [pod_name(NODE, dirs)]
        assert ["mount", "-t", "tmpfs", "-o", "rw,nosuid,nodev,noexec,relatime,mode=1777,size=8g", "shm", str(dirs.shm)] in first.calls
        # Clients and the servers of any UID reach the pipe dir; only root writes there.
        assert {d.name: stat.S_IMODE(d.stat().st_mode) for d in (dirs.pipe, dirs.log, dirs.shm)} == {
            "pipe": 0o755, "log": 0o755, "shm": 0o1777}
        # The limits went into the daemon's Deployment (its pod replays them at each daemon start), not over the pipe.
        assert kubelet.commands[pod_name(NODE, dirs)] == ["set_default_active_thread_percentage 50"]
        assert "set_default_active_thread_percentage 50\n" not in first.stdin
        edits = sharing.apply(agent(first), config, devices, dirs)
        assert {"hostPath": str(dirs.shm), "containerPath": "/dev/shm", "options": ["rbind", "rw", "nosuid", "nodev"]} in edits.mounts

        # The agent restarts (a new backend, nothing in memory): the daemon's pod still runs, nothing is started.
        second = _Recorder()
        assert sharing.start_mps(agent(second), config, devices, dirs) is False
        assert kubelet.started == [pod_name(NODE, dirs)]
        assert api.get("Deployment", pod_name(NODE, dirs), SETTINGS.namespace)["spec"]["template"]["spec"]["hostPID"] is True

        # Unprepare: quit through the control pipe, the pod deleted, the shm unmounted.
        sharing.undo(agent(second), config, set(), devices, dirs)
        assert "quit\n" in second.stdin
        assert api.try_get("Deployment", pod_name(NODE, dirs), SETTINGS.namespace) is None
    finally:
        kubelet.close()


def test_a_daemon_pod_that_never_listens_names_the_pod(api: Any, tmp: Path) -> None:
    settings = MpsPodSettings(namespace="gpu-dra-system", node_name=NODE, image="gpu-dra:dev", ready_timeout_s=0.3)
    pods = MpsDaemonPods(api, settings, NvidiaTools(_Recorder()), runner=_Recorder(), poll_s=0.05,
                         is_mount=lambda p: True)
    dirs = MpsDirs(tmp / "p", tmp / "l")
    with pytest.raises(GpuToolError, match=f"Deployment gpu-dra-system/{pod_name(NODE, dirs)} did not start a daemon "
                                           ".*control.* \\(it has no pod yet\\); the kubelet retries"):
        pods.start(dirs, ["GPU-a"])
        pods.wait(dirs)
    # The claim's rollback stops it all the same: the Deployment of a daemon that never listened is deleted too.
    assert api.try_get("Deployment", pod_name(NODE, dirs), settings.namespace) is not None

    class Backend:
        set_compute_mode = staticmethod(lambda uuid, mode: None)
        set_timeslice = staticmethod(lambda uuid, level: None)
        mps_stop = staticmethod(pods.stop)
        mps_running = staticmethod(pods.running)

    config = parse({"apiVersion": "gpu.nvidia.com/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "MPS"}})
    sharing.undo(Backend(), config, set(), [sharing.SharedDevice(uuid="GPU-a", gpu_uuid="GPU-a", gpu_index=0)], dirs)
    assert api.try_get("Deployment", pod_name(NODE, dirs), settings.namespace) is None


def test_links_planted_in_the_daemon_dirs_are_never_followed(tmp: Path) -> None:
    from driver.gputools import control_socket_alive

    real = tmp / "elsewhere"
    real.mkdir()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(real / "control"))
    listener.listen(1)
    try:
        assert control_socket_alive(real)
        pipe = tmp / "pipe"
        pipe.mkdir()
        (pipe / "control").symlink_to(real / "control")  # a socket elsewhere, reached through a link
        assert not control_socket_alive(pipe)
        linked_dir = tmp / "linked-pipe"
        linked_dir.symlink_to(real)
        assert not control_socket_alive(linked_dir)
        dirs = MpsDirs(linked_dir, tmp / "log")
        pods = MpsDaemonPods(None, SETTINGS, NvidiaTools(_Recorder()), runner=_Recorder(), is_mount=lambda p: True)
        with pytest.raises(GpuToolError, match="found a symbolic link"):
            make_mps_dirs(dirs)
        (tmp / "claim").mkdir()
        (tmp / "claim" / "daemon").symlink_to(real)  # the daemon's private state dir, planted
        with pytest.raises(GpuToolError, match="found a symbolic link"):
            pods.start(MpsDirs(tmp / "claim" / "pipe", tmp / "claim" / "log"), ["GPU-a"])
    finally:
        listener.close()


def test_a_retry_after_a_timeout_reuses_the_daemons_deployment(api: Any, tmp: Path) -> None:
    settings = MpsPodSettings(namespace="gpu-dra-system", node_name=NODE, image="gpu-dra:dev", ready_timeout_s=0.2)
    pods = MpsDaemonPods(api, settings, NvidiaTools(_Recorder()), runner=_Recorder(), poll_s=0.05,
                         is_mount=lambda p: True)
    dirs = sharing.mps_dirs(tmp / "mps", "uid-1")
    make_mps_dirs(dirs)
    pods.start(dirs, ["GPU-a"])
    with pytest.raises(GpuToolError, match="within 0.2s"):
        pods.wait(dirs)
    first = api.get("Deployment", pod_name(NODE, dirs), settings.namespace)["metadata"]["uid"]
    # The slow pod comes up meanwhile and marks itself started; the retry's start finds its Deployment and leaves
    # the mark alone (a new Deployment would start a new pod, which a busy node again fails to start in time).
    Path(state_dir(dirs), STARTED_MARK).write_text("")
    pods.start(dirs, ["GPU-a"])
    assert api.get("Deployment", pod_name(NODE, dirs), settings.namespace)["metadata"]["uid"] == first
    assert Path(state_dir(dirs), STARTED_MARK).exists()


def test_the_daemon_gets_30s_by_default_and_the_flag_is_checked() -> None:
    from driver.commands import plugin
    import argparse

    assert MpsPodSettings(namespace="n", node_name=NODE, image="i").ready_timeout_s == 30
    parser = argparse.ArgumentParser()
    plugin.register(parser)
    assert parser.parse_args(["--node", "n", "--nvml", "real", "--mps-ready-timeout", "12.5"]).mps_ready_timeout == 12.5
    for bad in ("0", "45", "soon"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--node", "n", "--nvml", "real", "--mps-ready-timeout", bad])
    with pytest.raises(ValueError, match="'45': expected seconds, more than 0 and at most 40"):
        ready_timeout("45")


class _Daemons:
    """Records what NvmlSharing asks of the daemons' home."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def start(self, dirs: MpsDirs, device_uuids: Any, commands: Any = (), *, multi_user: bool = False) -> None:
        self.calls.append(("start", str(dirs.pipe), *device_uuids, *commands))

    def wait(self, dirs: MpsDirs) -> None:
        self.calls.append(("wait", str(dirs.pipe)))

    def command(self, dirs: MpsDirs, command: str) -> str:
        self.calls.append(("command", command))
        return "50.0\n"

    def stop(self, dirs: MpsDirs) -> None:
        self.calls.append(("stop", str(dirs.pipe)))

    def running(self, dirs: MpsDirs) -> bool:
        return True


def test_sharing_sends_every_mps_step_to_the_daemons_home_and_none_to_nvml(tmp_path: Path) -> None:
    """With daemons in pods, the backend (real NVML or the simulator, whose own daemons live in its process) is
    never asked to start, talk to or stop one."""
    from driver.nvml import load_backend

    nvml = load_backend("sim:t4-1", node="n")
    daemons = _Daemons()
    backend = sharing.NvmlSharing(nvml, daemons)
    dirs = sharing.mps_dirs(tmp_path / "mps", "uid-1")
    backend.mps_start(dirs, ["GPU-1"], ["set_default_active_thread_percentage 50"])
    backend.mps_wait(dirs)
    assert backend.mps_command(dirs, "get_default_active_thread_percentage") == "50.0\n"
    assert backend.mps_running(dirs)
    backend.mps_stop(dirs)
    assert daemons.calls == [("start", str(dirs.pipe), "GPU-1", "set_default_active_thread_percentage 50"),
                             ("wait", str(dirs.pipe)), ("command", "get_default_active_thread_percentage"),
                             ("stop", str(dirs.pipe))]
    assert nvml.mps_daemon(dirs) is None  # the simulator started none
