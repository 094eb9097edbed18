"""MPS control daemons in pods of their own, each owned by a Deployment, so that they outlive the node agent.

A daemon started inside the agent's container belongs to that container: the runtime kills it with the agent
on every restart or upgrade, and every MPS client of every claim on the node loses its server. NVIDIA's DRA
driver runs one daemon per claim in a Deployment of its own; so does this backend:

- one Deployment per daemon (replicas 1, named from the pipe directory, stable across agent restarts): its pod
  is recreated when deleted or evicted, and `kubectl drain` evicts it like any managed pod instead of refusing
  on a bare pod. The pod template has `nodeName` (no scheduler involved, as NVIDIA's), `hostPID` (MPS identifies
  its clients by host PID), privileged (it opens every GPU it serves), the driver root at `/driver-root`, the
  claim's pipe, log, shm and private state directories from the host, and the agent's image pull secrets;
- the daemon runs as root (`runAsUser: 0` whatever the image's user): it starts each client UID's MPS server as
  that UID, which only root can; with `multiUser` it is started with `-M` (one root server for every UID);
- the pod's script starts `nvidia-cuda-mps-control -d` in a chroot of the driver root when that root has a
  shell (the host's `/` or a driver container's root: the daemon then uses the driver's own libc and
  libraries), otherwise directly with the driver's bin directories on PATH and its NVML preloaded (never its
  library directory on the loader's path: it may hold the host's libc); then it gives the daemon the claim's
  limits itself (`GPU_DRA_MPS_COMMANDS`, one command a line), so a restarted daemon has them again without the
  agent, and only then marks itself started in its state directory, which no tenant container mounts;
- `start` only creates the Deployment (or reuses the one a timed-out attempt left, see below); `wait` then polls
  for that mark and the listening control socket for at most `ready_timeout_s` (30 s by default, of the 45 s the
  kubelet gives a whole NodePrepareResources call: an image pull and a pod start on a busy node take that long;
  `--mps-ready-timeout`), without the node's lock (driver.prepare), and fails the claim with the pod's state;
- a claim whose daemon did not come up in time keeps its Deployment (driver.prepare): the kubelet's retry finds
  it and waits for the same pod again, instead of deleting it and starting a new one that can never win the race;
- stop sends `quit`, deletes the Deployment (its pod goes with it) and unmounts the shm;
- the per-claim shm is a tmpfs the agent mounts at `<claim dir>/shm` (the plugins dir is mounted with
  Bidirectional propagation, so the host and the daemon's and the clients' containers see the mount); clients
  get it as `/dev/shm` and the pipe directory read-only through their CDI spec (driver.sharing).

After an agent restart nothing is restarted: the daemon still listens, so `mps_running` is true and prepare's
restore finds nothing to do. Should the Deployment be gone (deleted by hand), restore creates it again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driver.gputools import (
    CommandRunner, GpuToolError, MpsDirs, NvidiaTools, SubprocessRunner, control_socket_alive, make_mps_dir, mps_daemon_argv,
)
from gpudra.kubeapi import AlreadyExists, ApiError, NotFound

log = logging.getLogger("gpu-dra.mpsdaemon")

COMPONENT = "mps-control-daemon"
PIPE_IN_POD = "/tmp/nvidia-mps"
LOG_IN_POD = "/var/log/nvidia-mps"
DRIVER_ROOT_IN_POD = "/driver-root"
SHM_OPTIONS = "rw,nosuid,nodev,noexec,relatime,mode=1777"  # as /dev/shm: servers and clients of every UID
DEFAULT_SHM_SIZE = "8g"

STATE_IN_POD = "/var/run/gpu-dra-mps"  # the daemon's private state dir (its startup mark), outside the driver root
STARTED_MARK = "started"
COMMANDS_ENV = "GPU_DRA_MPS_COMMANDS"
DAEMON_ARGS_ENV = "GPU_DRA_MPS_DAEMON_ARGS"  # "-M" for a multi-user daemon

# In a chroot of the driver root when it has a shell; otherwise straight from its directories. The daemon's
# directories are mounted inside the driver root so that both ways see them at the same absolute path.
_SCRIPT = f"""set -e
rm -f {STATE_IN_POD}/{STARTED_MARK}
if [ -x {DRIVER_ROOT_IN_POD}/bin/sh ] || [ -x {DRIVER_ROOT_IN_POD}/usr/bin/sh ]; then
  RUN="chroot {DRIVER_ROOT_IN_POD} sh -c"
  LOGFILE={DRIVER_ROOT_IN_POD}{LOG_IN_POD}/control.log
else
  export PATH="{DRIVER_ROOT_IN_POD}/usr/bin:{DRIVER_ROOT_IN_POD}/bin:$PATH"
  # NVML preloaded, no driver library dir on the loader's path: it may hold the host's libc (driver.driverroot).
  # The versioned file itself: the .so.1 link's text is absolute, relative to the driver root, not to this pod.
  for f in {DRIVER_ROOT_IN_POD}/usr/lib64/libnvidia-ml.so.*.* {DRIVER_ROOT_IN_POD}/usr/lib/*-linux-gnu/libnvidia-ml.so.*.* \\
           {DRIVER_ROOT_IN_POD}/lib64/libnvidia-ml.so.*.*; do
    if [ -f "$f" ] && [ ! -L "$f" ]; then export LD_PRELOAD="$f"; break; fi
  done
  export CUDA_MPS_PIPE_DIRECTORY={DRIVER_ROOT_IN_POD}{PIPE_IN_POD}
  export CUDA_MPS_LOG_DIRECTORY={DRIVER_ROOT_IN_POD}{LOG_IN_POD}
  RUN="sh -c"
  LOGFILE={DRIVER_ROOT_IN_POD}{LOG_IN_POD}/control.log
fi
$RUN "nvidia-cuda-mps-control -d ${DAEMON_ARGS_ENV}"
trap '$RUN "echo quit | nvidia-cuda-mps-control" || true; exit 0' TERM INT
# The claim's limits, given by the daemon's own pod at every start: they survive daemon restarts.
printf '%s\\n' "${COMMANDS_ENV}" | while read -r command; do
  if [ -n "$command" ]; then $RUN "echo $command | nvidia-cuda-mps-control"; fi
done
: > {STATE_IN_POD}/{STARTED_MARK}
touch "$LOGFILE"
tail -n +1 -F "$LOGFILE" &
wait
"""


# What a daemon pod gets from its Deployment's creation to a listening daemon: 30 s of the kubelet's 45 s
# NodePrepareResources timeout (the rest is the claim's other steps); at most READY_TIMEOUT_MAX_S.
DEFAULT_READY_TIMEOUT_S = 30.0
READY_TIMEOUT_MAX_S = 40.0


def ready_timeout(value: str) -> float:
    """`--mps-ready-timeout`: seconds, more than 0 and at most READY_TIMEOUT_MAX_S."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds <= READY_TIMEOUT_MAX_S:
        raise ValueError(
            f"{value!r}: expected seconds, more than 0 and at most {READY_TIMEOUT_MAX_S:g} (the kubelet gives a whole "
            "NodePrepareResources call 45 s, and the claim's other steps need the rest)")
    return seconds


@dataclass(frozen=True)
class MpsPodSettings:
    namespace: str
    node_name: str
    image: str
    host_driver_root: str = "/"  # the driver root's path on the host (the pod mounts it from there)
    shm_size: str = DEFAULT_SHM_SIZE
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    image_pull_secrets: tuple[str, ...] = ()  # the agent's own (its pod's imagePullSecrets): same image


def state_dir(dirs: MpsDirs) -> Path:
    """The daemon's private state dir on the host, beside (not inside) the directories tenants get."""
    return dirs.pipe.parent / "daemon"


def pod_name(node_name: str, dirs: MpsDirs) -> str:
    """One Deployment per daemon, named from its pipe directory (which holds the claim UID): stable across
    restarts."""
    digest = hashlib.sha256(str(dirs.pipe).encode()).hexdigest()[:12]
    return f"gpu-dra-mps-{node_name[:40].rstrip('.-')}-{digest}".lower()


def deployment_manifest(
    settings: MpsPodSettings, dirs: MpsDirs, device_uuids: Sequence[str], commands: Sequence[str] = (),
    *, multi_user: bool = False,
) -> dict[str, Any]:
    """The daemon's Deployment (pure)."""
    name = pod_name(settings.node_name, dirs)
    labels = {"app.kubernetes.io/name": "gpu-dra", "app.kubernetes.io/component": COMPONENT,
              "gpu-dra.mps-daemon": name}

    def host_dir(volume: str, path: str | Path) -> dict[str, Any]:
        return {"name": volume, "hostPath": {"path": str(path), "type": "Directory"}}

    pod_spec: dict[str, Any] = {
        "nodeName": settings.node_name,
        "hostPID": True,
        "restartPolicy": "Always",
        "priorityClassName": "system-node-critical",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        # Bound to its node by nodeName; it must stay however the node is tainted (NoExecute included).
        "tolerations": [{"operator": "Exists"}],
        "containers": [
            {
                "name": "mps-control-daemon",
                "image": settings.image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", _SCRIPT],
                "env": [
                    {"name": "CUDA_VISIBLE_DEVICES", "value": ",".join(device_uuids)},
                    {"name": "CUDA_MPS_PIPE_DIRECTORY", "value": PIPE_IN_POD},
                    {"name": "CUDA_MPS_LOG_DIRECTORY", "value": LOG_IN_POD},
                    {"name": COMMANDS_ENV, "value": "\n".join(commands)},
                    {"name": DAEMON_ARGS_ENV, "value": " ".join(mps_daemon_argv(multi_user)[2:])},
                    # The daemon reaches the GPUs itself (privileged): no injection by the NVIDIA runtime.
                    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
                ],
                # Root whatever the image says: the daemon starts each client UID's server as that UID.
                "securityContext": {"privileged": True, "runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False},
                "startupProbe": {"exec": {"command": ["cat", f"{STATE_IN_POD}/{STARTED_MARK}"]},
                                 "periodSeconds": 1, "failureThreshold": 60},
                "volumeMounts": [
                    {"name": "driver-root", "mountPath": DRIVER_ROOT_IN_POD, "mountPropagation": "HostToContainer"},
                    {"name": "mps-pipe", "mountPath": f"{DRIVER_ROOT_IN_POD}{PIPE_IN_POD}"},
                    {"name": "mps-log", "mountPath": f"{DRIVER_ROOT_IN_POD}{LOG_IN_POD}"},
                    {"name": "mps-shm", "mountPath": f"{DRIVER_ROOT_IN_POD}/dev/shm"},
                    {"name": "mps-shm", "mountPath": "/dev/shm"},
                    {"name": "mps-state", "mountPath": STATE_IN_POD},
                ],
            }
        ],
        "volumes": [
            host_dir("driver-root", settings.host_driver_root),
            host_dir("mps-pipe", dirs.pipe),
            host_dir("mps-log", dirs.log),
            host_dir("mps-shm", dirs.shm),
            host_dir("mps-state", state_dir(dirs)),
        ],
    }
    if settings.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in settings.image_pull_secrets]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": labels,
            "annotations": {"gpu.nvidia.com/mps-pipe-directory": str(dirs.pipe)},
        },
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"gpu-dra.mps-daemon": name}},
            # One daemon per pipe directory: the old pod must be gone before a new one starts.
            "strategy": {"type": "Recreate"},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


class MpsDaemonPods:
    """The MPS part of the real NVML backend when daemons run as pods (see the module docstring)."""

    def __init__(
        self,
        api: Any,
        settings: MpsPodSettings,
        tools: NvidiaTools,
        *,
        runner: CommandRunner | None = None,
        poll_s: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
        is_mount: Callable[[str], bool] = os.path.ismount,
    ) -> None:
        self._api = api
        self.settings = settings
        self._tools = tools
        self._runner = runner or SubprocessRunner()
        self._poll_s = poll_s
        self._clock = clock
        self._is_mount = is_mount

    def _mount_shm(self, dirs: MpsDirs) -> None:
        dirs.shm.mkdir(parents=True, exist_ok=True)
        if self._is_mount(str(dirs.shm)):
            return
        options = f"{SHM_OPTIONS},size={self.settings.shm_size}"
        result = self._runner.run(["mount", "-t", "tmpfs", "-o", options, "shm", str(dirs.shm)])
        if result.returncode != 0:
            raise GpuToolError(f"mounting the MPS shm tmpfs at {dirs.shm} failed: {result.stderr.strip() or result.stdout.strip()}")

    def _unmount_shm(self, dirs: MpsDirs) -> None:
        if not self._is_mount(str(dirs.shm)):
            return
        result = self._runner.run(["umount", str(dirs.shm)])
        if result.returncode != 0:
            log.warning("event=mps-shm-umount-failed dir=%s error=%r", dirs.shm, result.stderr.strip())

    def start(
        self, dirs: MpsDirs, device_uuids: Sequence[str], commands: Sequence[str] = (), *, multi_user: bool = False,
    ) -> None:
        """Create the daemon's Deployment (its directories exist: driver.sharing.start_mps); returns at once.

        A Deployment already there (an earlier attempt that timed out, a restart of this agent) is reused as it is:
        its pod may be about to mark itself started, so the mark is left alone."""
        make_mps_dir(state_dir(dirs))
        self._mount_shm(dirs)
        body = deployment_manifest(self.settings, dirs, device_uuids, commands, multi_user=multi_user)
        name = body["metadata"]["name"]
        try:
            existing = self._api.try_get("Deployment", name, namespace=self.settings.namespace)
        except ApiError as exc:
            raise GpuToolError(f"reading the MPS control daemon Deployment {self.settings.namespace}/{name} failed: {exc}") from exc
        if existing is not None:
            log.info("event=mps-daemon-reused deployment=%s/%s pipe_dir=%s", self.settings.namespace, name, dirs.pipe)
            return
        # A mark left by an earlier daemon of these directories must not pass for this one's.
        (state_dir(dirs) / STARTED_MARK).unlink(missing_ok=True)
        try:
            self._api.create("Deployment", body, namespace=self.settings.namespace)
            log.info("event=mps-daemon-created deployment=%s/%s pipe_dir=%s", self.settings.namespace, name, dirs.pipe)
        except AlreadyExists:
            pass  # a restart of this agent, or a retried prepare: the daemon's Deployment is already there
        except ApiError as exc:
            raise GpuToolError(f"creating the MPS control daemon Deployment {self.settings.namespace}/{name} failed: {exc}") from exc

    def wait(self, dirs: MpsDirs) -> None:
        """Until the daemon listens with its limits set, for at most `ready_timeout_s`; GpuToolError with the pod's
        state otherwise."""
        name = pod_name(self.settings.node_name, dirs)
        deadline = self._clock() + self.settings.ready_timeout_s
        while not self.running(dirs):
            if self._clock() >= deadline:
                raise GpuToolError(
                    f"the MPS control daemon Deployment {self.settings.namespace}/{name} did not start a daemon "
                    f"listening on {dirs.pipe}/control with its limits set within {self.settings.ready_timeout_s:g}s"
                    f"{self._pod_state(name)}; the kubelet retries the claim"
                )
            time.sleep(self._poll_s)

    def _pod_state(self, name: str) -> str:
        try:
            pods, _ = self._api.list("Pod", namespace=self.settings.namespace, label_selector=f"gpu-dra.mps-daemon={name}")
        except ApiError:
            return ""
        if not pods:
            return " (it has no pod yet)"
        status = pods[0].get("status") or {}
        waiting = [
            f"{s.get('name')}: {(s.get('state') or {}).get('waiting', {}).get('reason')}"
            for s in status.get("containerStatuses") or [] if (s.get("state") or {}).get("waiting")
        ]
        return f" (pod {pods[0]['metadata']['name']} phase {status.get('phase', 'unknown')}{'; ' + ', '.join(waiting) if waiting else ''})"

    def command(self, dirs: MpsDirs, command: str) -> str:
        return self._tools.mps_command(dirs, command)

    def stop(self, dirs: MpsDirs) -> None:
        if control_socket_alive(dirs.pipe):
            try:
                self._tools.mps_stop(dirs)
            except GpuToolError as exc:  # deleting the pod stops it anyway (its TERM trap sends quit)
                log.warning("event=mps-quit-failed pipe_dir=%s error=%r", dirs.pipe, str(exc))
        name = pod_name(self.settings.node_name, dirs)
        try:
            self._api.delete("Deployment", name, namespace=self.settings.namespace)
        except NotFound:
            pass
        except ApiError as exc:
            raise GpuToolError(f"deleting the MPS control daemon Deployment {self.settings.namespace}/{name} failed: {exc}") from exc
        self._unmount_shm(dirs)

    def running(self, dirs: MpsDirs) -> bool:
        """The daemon listens and its pod has given it the claim's limits."""
        mark = state_dir(dirs) / STARTED_MARK
        try:
            started = stat.S_ISREG(os.lstat(mark).st_mode)
        except OSError:
            started = False
        return started and control_socket_alive(dirs.pipe)

