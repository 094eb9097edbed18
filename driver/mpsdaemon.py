"""MPS control daemons as pods of their own, so that they outlive restarts of the node agent.

A daemon started inside the agent's container belongs to that container: the runtime kills it with the agent
on every restart or upgrade, and every MPS client of every claim on the node loses its server. NVIDIA's DRA
driver runs one daemon per claim in its own pod instead; so does this backend:

- the pod is created through the API with `spec.nodeName` set (no scheduler involved), `hostPID` (MPS
  identifies its clients by host PID), privileged (it opens every GPU it serves), the driver root mounted at
  `/driver-root`, and the claim's pipe, log and shm directories from the host. It runs
  `nvidia-cuda-mps-control -d` in a chroot of the driver root when that root has a shell (the host's `/` or a
  driver container's root: the daemon then uses the driver's own libc and libraries), otherwise directly with
  the driver's bin directories on PATH and its NVML preloaded (never its library directory on the loader's
  path: it may hold the host's libc), and then follows the control log;
- the agent waits until the daemon listens on `<pipe dir>/control` (the directory is a host path both see), then
  talks to it with `nvidia-cuda-mps-control` from the driver root (driver.gputools) to set the claim's limits;
- stop sends `quit`, deletes the pod and unmounts the shm;
- the per-claim shm is a tmpfs the agent mounts at `<claim dir>/shm` (the plugins dir is mounted with
  Bidirectional propagation, so the host and the daemon's and the clients' containers see the mount); clients
  get it as `/dev/shm` through their CDI spec (driver.sharing), the daemon through its pod.

After an agent restart nothing is restarted: the daemon still listens, so `mps_running` is true and prepare's
restore finds nothing to do. Should the pod be gone (deleted by hand, node rebooted), restore starts it again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from driver.gputools import CommandRunner, GpuToolError, MpsDirs, NvidiaTools, SubprocessRunner, control_socket_alive
from gpudra.kubeapi import AlreadyExists, ApiError, NotFound

log = logging.getLogger("gpu-dra.mpsdaemon")

COMPONENT = "mps-control-daemon"
PIPE_IN_POD = "/tmp/nvidia-mps"
LOG_IN_POD = "/var/log/nvidia-mps"
DRIVER_ROOT_IN_POD = "/driver-root"
SHM_OPTIONS = "rw,nosuid,nodev,noexec,relatime"
DEFAULT_SHM_SIZE = "8g"

# In a chroot of the driver root when it has a shell; otherwise straight from its directories. The daemon's
# directories are mounted inside the driver root so that both ways see them at the same absolute path.
_SCRIPT = f"""set -e
if [ -x {DRIVER_ROOT_IN_POD}/bin/sh ] || [ -x {DRIVER_ROOT_IN_POD}/usr/bin/sh ]; then
  RUN="chroot {DRIVER_ROOT_IN_POD} sh -c"
  LOGFILE={DRIVER_ROOT_IN_POD}{LOG_IN_POD}/control.log
else
  export PATH="{DRIVER_ROOT_IN_POD}/usr/bin:{DRIVER_ROOT_IN_POD}/bin:$PATH"
  # NVML preloaded, no driver library dir on the loader's path: it may hold the host's libc (driver.driverroot).
  # The versioned file itself: the .so.1 link's text is absolute, relative to the driver root, not to this pod.
  for f in {DRIVER_ROOT_IN_POD}/usr/lib64/libnvidia-ml.so.*.* {DRIVER_ROOT_IN_POD}/usr/lib/*-linux-gnu/libnvidia-ml.so.*.* \
           {DRIVER_ROOT_IN_POD}/lib64/libnvidia-ml.so.*.*; do
    if [ -f "$f" ] && [ ! -L "$f" ]; then export LD_PRELOAD="$f"; break; fi
  done
  export CUDA_MPS_PIPE_DIRECTORY={DRIVER_ROOT_IN_POD}{PIPE_IN_POD}
  export CUDA_MPS_LOG_DIRECTORY={DRIVER_ROOT_IN_POD}{LOG_IN_POD}
  RUN="sh -c"
  LOGFILE={DRIVER_ROOT_IN_POD}{LOG_IN_POD}/control.log
fi
$RUN "nvidia-cuda-mps-control -d"
trap '$RUN "echo quit | nvidia-cuda-mps-control" || true; exit 0' TERM INT
touch "$LOGFILE"
tail -n +1 -F "$LOGFILE" &
wait
"""


@dataclass(frozen=True)
class MpsPodSettings:
    namespace: str
    node_name: str
    image: str
    host_driver_root: str = "/"  # the driver root's path on the host (the pod mounts it from there)
    shm_size: str = DEFAULT_SHM_SIZE
    ready_timeout_s: float = 30.0


def pod_name(node_name: str, dirs: MpsDirs) -> str:
    """One pod per daemon, named from its pipe directory (which holds the claim UID): stable across restarts."""
    digest = hashlib.sha256(str(dirs.pipe).encode()).hexdigest()[:12]
    return f"gpu-dra-mps-{node_name[:40].rstrip('.-')}-{digest}".lower()


def pod_manifest(settings: MpsPodSettings, dirs: MpsDirs, device_uuids: Sequence[str]) -> dict[str, Any]:
    """The daemon's pod (pure)."""
    name = pod_name(settings.node_name, dirs)

    def host_dir(volume: str, path: str) -> dict[str, Any]:
        return {"name": volume, "hostPath": {"path": path, "type": "Directory"}}

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": {"app.kubernetes.io/name": "gpu-dra", "app.kubernetes.io/component": COMPONENT},
            "annotations": {"gpu.nvidia.com/mps-pipe-directory": str(dirs.pipe)},
        },
        "spec": {
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
                        # The daemon reaches the GPUs itself (privileged): no injection by the NVIDIA runtime.
                        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
                    ],
                    "securityContext": {"privileged": True},
                    "volumeMounts": [
                        {"name": "driver-root", "mountPath": DRIVER_ROOT_IN_POD, "mountPropagation": "HostToContainer"},
                        {"name": "mps-pipe", "mountPath": f"{DRIVER_ROOT_IN_POD}{PIPE_IN_POD}"},
                        {"name": "mps-log", "mountPath": f"{DRIVER_ROOT_IN_POD}{LOG_IN_POD}"},
                        {"name": "mps-shm", "mountPath": f"{DRIVER_ROOT_IN_POD}/dev/shm"},
                        {"name": "mps-shm", "mountPath": "/dev/shm"},
                    ],
                }
            ],
            "volumes": [
                host_dir("driver-root", settings.host_driver_root),
                host_dir("mps-pipe", str(dirs.pipe)),
                host_dir("mps-log", str(dirs.log)),
                host_dir("mps-shm", str(dirs.shm)),
            ],
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

    def start(self, dirs: MpsDirs, device_uuids: Sequence[str]) -> None:
        for d in (dirs.pipe, dirs.log):
            d.mkdir(parents=True, exist_ok=True)
        self._mount_shm(dirs)
        body = pod_manifest(self.settings, dirs, device_uuids)
        name = body["metadata"]["name"]
        try:
            self._api.create("Pod", body, namespace=self.settings.namespace)
            log.info("event=mps-pod-created pod=%s/%s pipe_dir=%s", self.settings.namespace, name, dirs.pipe)
        except AlreadyExists:
            pass  # a restart of this agent, or a retried prepare: the daemon's pod is already there
        except ApiError as exc:
            raise GpuToolError(f"creating the MPS control daemon pod {self.settings.namespace}/{name} failed: {exc}") from exc
        deadline = self._clock() + self.settings.ready_timeout_s
        while not control_socket_alive(dirs.pipe):
            if self._clock() >= deadline:
                raise GpuToolError(
                    f"the MPS control daemon pod {self.settings.namespace}/{name} did not listen on {dirs.pipe}/control "
                    f"within {self.settings.ready_timeout_s:g}s{self._pod_state(name)}"
                )
            time.sleep(self._poll_s)

    def _pod_state(self, name: str) -> str:
        try:
            pod = self._api.try_get("Pod", name, namespace=self.settings.namespace)
        except ApiError:
            return ""
        if pod is None:
            return " (the pod is gone)"
        status = pod.get("status") or {}
        waiting = [
            f"{s.get('name')}: {(s.get('state') or {}).get('waiting', {}).get('reason')}"
            for s in status.get("containerStatuses") or [] if (s.get("state") or {}).get("waiting")
        ]
        return f" (pod phase {status.get('phase', 'unknown')}{'; ' + ', '.join(waiting) if waiting else ''})"

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
            self._api.delete("Pod", name, namespace=self.settings.namespace)
        except NotFound:
            pass
        except ApiError as exc:
            raise GpuToolError(f"deleting the MPS control daemon pod {self.settings.namespace}/{name} failed: {exc}") from exc
        self._unmount_shm(dirs)

    def running(self, dirs: MpsDirs) -> bool:
        return control_socket_alive(dirs.pipe)
