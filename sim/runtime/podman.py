"""A container runtime for one simulated node: podman with runc, CDI devices, a busybox rootfs.

What the kubelet asks of containerd after NodePrepareResources, done with podman (facts in
shared/reference/cdi-runtime.md): each container is started from the busybox rootfs (sim.runtime.rootfs) with
the CDI device ids of its claims and of the device plugin, the pod's env and command, inside the node's private
mount namespace (sim.runtime.namespace), where /var/run/cdi is the node's CDI dir. podman keeps its storage
under the node's state dir and its run and tmp dirs in the namespace's private /run.

The runtime is as strict as containerd's CDI handling: a device node a spec names by path only (no type and
major) must exist on the node, or the container fails to create ("failed to stat CDI host device"). The node's
own device nodes are the `host_devices` it is made with (what a driver on that host would have created); nothing
a spec names is ever created for it. Typed nodes are created in the container by the runtime, as on a node.

Before the container's command, a probe script records what the container itself sees (its `nvidia-smi -L`,
`NVIDIA_VISIBLE_DEVICES` and NVIDIA device nodes) into a per-container directory; `seen()` reads it.
Logs are podman's k8s-file log (one line per write: time, stream, P/F, text); `logs()` turns it into text.
Exits are noticed without spawning podman: once the container's process is gone (its --pidfile), podman is
asked for the exit code; its conmon monitor (--conmon-pidfile) lingers a second or two for podman's clean-up.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.podlogs import parse_cri_log
from sim.demo.processes import pid_alive
from sim.runtime.namespace import PRIVATE_RUN, NamespaceError, PrivateMountNamespace, leftover_holder, same_mount_namespace
from sim.runtime.rootfs import PROBE_DIR, SEEN_DIR
from gpudra.timestamps import rfc3339

log = logging.getLogger("sim.runtime")

RUNC_CANDIDATES: tuple[str, ...] = ("/usr/sbin/runc", "/usr/bin/runc", "/usr/local/sbin/runc", "/usr/local/bin/runc")
# Debian's podman/runc on cgroup v1 without CAP_SYS_RESOURCE: podman's default rlimits cannot be set.
RUN_FLAGS: tuple[str, ...] = ("--network=none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
                              "--read-only", "--stop-timeout", "1")
PODMAN_TIMEOUT_SECONDS = 120.0
# The exit code the kubelet reports for a container whose state the runtime lost (ContainerStatusUnknown).
UNKNOWN_EXIT_CODE = 137
# What a container runs when the pod gives neither command nor args (a server image's entrypoint).
DEFAULT_COMMAND: tuple[str, ...] = ("sleep", "2147483647")

PROBE_SCRIPT = r"""#!/bin/sh
# Written by the gpu-dra kubelet simulator: records what this container sees, then runs its command.
out=SEEN
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi -L > "$out/nvidia-smi" 2>&1; echo $? > "$out/nvidia-smi.rc"
else
  echo "nvidia-smi: not found" > "$out/nvidia-smi"; echo 127 > "$out/nvidia-smi.rc"
fi
if [ "${NVIDIA_VISIBLE_DEVICES+set}" = set ]; then printf '%s\n' "$NVIDIA_VISIBLE_DEVICES" > "$out/visible"; fi
for f in /dev/nvidia* /dev/nvidia-caps/*; do [ -c "$f" ] && echo "$f"; done > "$out/devices"
: > "$out/done"
# runc resolves the command before the container starts: one that cannot run is a start error (exit 128).
case "$1" in
  */*) if [ ! -e "$1" ]; then why="no such file or directory"; elif [ -d "$1" ] || [ ! -x "$1" ]; then why="permission denied"; fi ;;
  *) command -v "$1" >/dev/null 2>&1 || why='executable file not found in $PATH' ;;
esac
if [ -n "$why" ]; then printf 'exec: "%s": %s' "$1" "$why" > "$out/start-error"; exit 128; fi
exec "$@"
""".replace("SEEN", SEEN_DIR)


class RuntimeError_(RuntimeError):
    """A container could not be started, inspected or removed; the message says which and why."""


def find_runc() -> str | None:
    return next((c for c in RUNC_CANDIDATES if os.access(c, os.X_OK)), None)


@dataclass(frozen=True)
class ContainerRequest:
    name: str  # unique on the node
    command: tuple[str, ...]  # argv; empty: DEFAULT_COMMAND
    env: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()
    log_path: Path | None = None  # where podman writes its k8s-file log (default: the node's logs/<name>.log)
    mounts: tuple[tuple[str, str, bool], ...] = ()  # (host path, container path, read-only): the pod's volumes
    user: str = ""  # UID[:GID] the command runs as (the pod's securityContext.runAsUser); empty: the image's (root)
    image: str = ""  # the pod's image name (every name runs the busybox rootfs; sim.runtime.hostprocess routes ours)
    stdin: bool = False  # the container's stdin is kept open for `kubectl attach -i` (spec stdin)
    tty: bool = False  # the container gets a terminal (spec tty)
    hostname: str = ""  # the pod's hostname (sim.kubelet.etchosts); empty: the runtime's own


@dataclass(frozen=True)
class ContainerStatus:
    name: str
    running: bool
    exit_code: int | None  # when not running
    started_at: str
    finished_at: str = ""
    error: str = ""  # why it could not be inspected


@dataclass(frozen=True)
class Seen:
    """What a container saw of its GPUs, from inside."""

    nvidia_smi: tuple[str, ...]  # `nvidia-smi -L` output lines
    nvidia_smi_rc: int | None
    visible_devices: str | None  # NVIDIA_VISIBLE_DEVICES, None when unset
    device_nodes: tuple[str, ...]
    start_error: str | None = None  # why its command could not be started (exec: "x": ...), if it could not




@dataclass
class _Container:
    request: ContainerRequest
    conmon_pid: int | None
    pid: int | None  # the container's init process, on the host
    started_at: str
    finished: ContainerStatus | None = None


class PodmanRuntime:
    """Containers of one simulated node. `start()` before use, `close()` removes every container it started."""

    kind = "podman"

    def __init__(
        self, state_dir: Path, cdi_dir: Path, rootfs: Path, *, runc: str, podman: str = "podman",
        host_devices: Sequence[tuple[str, int, int]] = (),
    ) -> None:
        self.state_dir = state_dir
        self.cdi_dir = cdi_dir
        self.rootfs = rootfs
        self.host_devices = tuple(host_devices)
        self.ns = PrivateMountNamespace(state_dir / "ns", cdi_dir)
        self._global = podman_flags(state_dir, runc, podman)
        self._containers: dict[str, _Container] = {}
        self._lock = threading.Lock()

    # ---- lifecycle --------------------------------------------------------------------------------------

    def start(self) -> None:
        for d in ("logs", "seen", "conmon", "probe"):
            (self.state_dir / d).mkdir(parents=True, exist_ok=True)
        probe = self.state_dir / "probe" / "probe"
        probe.write_text(PROBE_SCRIPT)
        probe.chmod(0o755)
        self.ns.start()
        try:
            self.ns.ensure_char_devices(self.host_devices)
        except NamespaceError as exc:
            self.ns.close()
            raise RuntimeError_(f"creating the node's device nodes failed: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            names = list(self._containers)
        for name in names:
            try:
                self.remove(name, grace_seconds=0)
            except RuntimeError_ as exc:
                log.warning("event=container-remove-failed container=%s error=%r", name, str(exc))
        self.ns.close()

    def _podman(self, *args: str, timeout: float = PODMAN_TIMEOUT_SECONDS, check: bool = True) -> subprocess.CompletedProcess[str]:
        try:
            return self.ns.run([*self._global, *args], timeout=timeout, check=check)
        except NamespaceError as exc:
            raise RuntimeError_(str(exc)) from exc
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError_(f"podman {' '.join(args[:2])} did not finish within {timeout:.0f} s") from exc

    # ---- containers ---------------------------------------------------------------------------------------

    def run(self, request: ContainerRequest) -> ContainerStatus:
        """Start a container (detached); raises RuntimeError_ when podman refuses it."""
        name = request.name
        seen = self.state_dir / "seen" / name
        shutil.rmtree(seen, ignore_errors=True)
        seen.mkdir(parents=True)
        conmon_pidfile = self.state_dir / "conmon" / f"{name}.pid"
        conmon_pidfile.unlink(missing_ok=True)
        pidfile = self.state_dir / "conmon" / f"{name}.ctr.pid"
        pidfile.unlink(missing_ok=True)
        log_file = request.log_path or self.state_dir / "logs" / f"{name}.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        args = ["run", "-d", "--name", name, *RUN_FLAGS,
                "--log-driver", "k8s-file", "--log-opt", f"path={log_file}",
                "--conmon-pidfile", str(conmon_pidfile), "--pidfile", str(pidfile),
                "-v", f"{self.state_dir / 'probe'}:{PROBE_DIR}:ro", "-v", f"{seen}:{SEEN_DIR}"]
        for key, value in request.env.items():
            args += ["-e", f"{key}={value}"]
        for host, path, read_only in request.mounts:
            args += ["-v", f"{host}:{path}:{'ro' if read_only else 'rw'}"]
        for cid in request.cdi_devices:
            args += ["--device", cid]
        if request.user:
            args += ["--user", request.user]
            seen.chmod(0o777)  # the probe records what the container sees as that user
        args += ["-i"] if request.stdin else []
        args += ["-t"] if request.tty else []
        args += ["--hostname", request.hostname] if request.hostname else []
        # The kubelet's hosts file, not podman's (which names the container by its ID).
        args += ["--no-hosts"] if any(path == "/etc/hosts" for _, path, _ in request.mounts) else []
        args += ["--rootfs", str(self.rootfs), f"{PROBE_DIR}/probe", *(request.command or DEFAULT_COMMAND)]
        self._podman("rm", "-f", *_exactly(name), check=False)  # a leftover of the same name (a restart)
        done = self._podman(*args, check=False)
        if done.returncode != 0:
            raise RuntimeError_(f"container {name}: podman run exited with status {done.returncode}: "
                                f"{done.stderr.strip() or done.stdout.strip()}")
        conmon, pid = _read_pid(conmon_pidfile), _read_pid(pidfile)
        started = rfc3339()
        with self._lock:
            self._containers[name] = _Container(request, conmon, pid, started)
        log.info("event=container-started container=%s devices=%s", name, ",".join(request.cdi_devices) or "-")
        return ContainerStatus(name, True, None, started)

    def status(self, name: str) -> ContainerStatus:
        """Running or exited (with its exit code). Spawns podman only once the container's conmon is gone."""
        with self._lock:
            c = self._containers.get(name)
        if c is None:
            return ContainerStatus(name, False, None, "", error=f"no container {name} on this node")
        if c.finished is not None:
            return c.finished
        watched = c.pid if c.pid is not None else c.conmon_pid
        # conmon outlives the container while it drains the container's output into the log: until it is gone
        # too, the logs may still be short of the last lines, so the container is not reported finished yet.
        if any(p is not None and pid_alive(p) for p in (c.pid, c.conmon_pid)):
            return ContainerStatus(name, True, None, c.started_at)
        done = self._podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name, check=False)
        words = done.stdout.split()
        if done.returncode != 0 or len(words) != 2:
            error = done.stderr.strip() or "podman inspect gave no state"
            if watched is None:
                return ContainerStatus(name, True, None, c.started_at, error=error)
            # Its monitor is gone and podman does not know it: the kubelet's ContainerStatusUnknown (exit 137).
            finished = ContainerStatus(name, False, UNKNOWN_EXIT_CODE, c.started_at, rfc3339(), error=error)
            with self._lock:
                c.finished = finished
            return finished
        if words[0] in ("running", "created", "configured", "paused", "stopping"):
            return ContainerStatus(name, True, None, c.started_at)
        finished = ContainerStatus(name, False, int(words[1]), c.started_at, rfc3339())
        with self._lock:
            c.finished = finished
        return finished

    def remove(self, name: str, grace_seconds: int = 1) -> None:
        """Stop (SIGTERM, SIGKILL after the grace period) and remove the container."""
        with self._lock:
            known = self._containers.get(name)  # kept while it stops, for `kill`
        done = self._podman("rm", "-f", "--time", str(grace_seconds), *_exactly(name), check=False)
        with self._lock:
            self._containers.pop(name, None)
        if done.returncode != 0:
            raise RuntimeError_(f"container {name}: podman rm exited with status {done.returncode}: {done.stderr.strip()}")
        if known is not None:
            log.info("event=container-removed container=%s", name)

    def kill(self, name: str) -> None:
        """SIGKILL now: the grace period of a `remove` under way was shortened and is over. The container's init
        process is signalled directly; the `remove` then sees it exit."""
        with self._lock:
            c = self._containers.get(name)
        if c is not None and c.pid is not None and pid_alive(c.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(c.pid, signal.SIGKILL)

    def exec_argv(self, name: str, command: Sequence[str], *, tty: bool = False) -> list[str] | None:
        """argv that runs `command` in the running container `name` (stdin kept open; with `tty` in a terminal of
        the container's, sized from the terminal the argv itself runs on), or None if it is not running."""
        if not self.status(name).running:
            return None
        return self.ns.command([*self._global, "exec", "-i", *(["-t"] if tty else []), name, *command])

    def attach_argv(self, name: str, *, stdin: bool) -> list[str] | None:
        """argv that attaches to the running container `name`'s main process (its output from now on and, with
        `stdin`, its input); ending it detaches and leaves the container running. None if it is not running."""
        if not self.status(name).running:
            return None
        return self.ns.command([*self._global, "attach", "--sig-proxy=false", *([] if stdin else ["--no-stdin"]),
                                name])

    def tty_of(self, name: str) -> tuple[bool, bool]:
        """(stdin, tty) the container `name` was started with."""
        with self._lock:
            c = self._containers.get(name)
        return (c.request.stdin, c.request.tty) if c is not None else (False, False)

    def network_pid(self, name: str) -> int | None:
        """A host pid inside the running container `name`'s network namespace, or None if it is not running."""
        with self._lock:
            c = self._containers.get(name)
        if c is None or c.pid is None or not self.status(name).running or not pid_alive(c.pid):
            return None
        return c.pid

    def names(self) -> list[str]:
        with self._lock:
            return list(self._containers)

    # ---- what a container printed and saw -----------------------------------------------------------------

    def log_path(self, name: str) -> Path | None:
        with self._lock:
            c = self._containers.get(name)
        if c is None:
            return None
        return c.request.log_path or self.state_dir / "logs" / f"{name}.log"

    def logs(self, name: str) -> str:
        """The container's output as text (stdout and stderr interleaved, as `kubectl logs` prints them)."""
        path = self.log_path(name)
        try:
            raw = path.read_text(errors="replace") if path is not None else ""
        except FileNotFoundError:
            return ""
        return "".join(line.text for line in parse_cri_log(raw))

    def seen(self, name: str) -> Seen | None:
        """What the probe recorded. The directory is the container's to write (bind-mounted at SEEN_DIR), so its
        entries are read as untrusted: only regular files, never through a symlink, never blocking, bounded."""
        d = self.state_dir / "seen" / name
        if read_untrusted(d / "done") is None:
            return None

        def read(f: str) -> str | None:
            return read_untrusted(d / f)

        rc = (read("nvidia-smi.rc") or "").strip()
        visible = read("visible")
        return Seen(
            nvidia_smi=tuple((read("nvidia-smi") or "").splitlines()),
            nvidia_smi_rc=int(rc) if rc.lstrip("-").isdigit() else None,
            visible_devices=visible.rstrip("\n") if visible is not None else None,
            device_nodes=tuple((read("devices") or "").split()),
            start_error=read("start-error"),
        )


# The probe's files are a few lines; more than this is not what the probe wrote.
MAX_SEEN_FILE_BYTES = 64 * 1024


def read_untrusted(path: Path, limit: int = MAX_SEEN_FILE_BYTES) -> str | None:
    """A file a container could have written, or None when it is missing, not a regular file (a FIFO, device or
    directory), a symlink (O_NOFOLLOW), or unreadable; at most `limit` bytes of it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks: list[bytes] = []
        left = limit
        while left > 0:
            chunk = os.read(fd, min(left, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _exactly(name: str) -> list[str]:
    """The container named `name`, and no other: podman takes a name no container has for an ID prefix, so
    `rm b` removed whichever container's ID began with b."""
    return ["--filter", f"name=^{re.escape(name)}$"]


def podman_flags(state_dir: Path, runc: str, podman: str = "podman") -> list[str]:
    return [podman, "--root", str(state_dir / "storage"), "--runroot", f"{PRIVATE_RUN}/podman",
            "--tmpdir", f"{PRIVATE_RUN}/libpod", "--storage-driver", "vfs", "--events-backend", "file",
            "--runtime", runc, "--cgroup-manager", "cgroupfs"]


def stop_leftovers(state_dir: Path) -> list[str]:
    """What a node runtime (state dir `state_dir`) left running when its process was killed: every container
    (podman rm inside its namespace), their conmon monitors, then the namespace holder. Returns what was stopped."""
    holder = leftover_holder(state_dir / "ns")
    if holder is None:
        return []
    stopped = []
    runc = find_runc()
    if runc is not None:
        argv = ["nsenter", "--target", str(holder), "--mount", "--", *podman_flags(state_dir, runc),
                "rm", "--all", "--force", "--time", "0"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=PODMAN_TIMEOUT_SECONDS,
                                  stdin=subprocess.DEVNULL)
            removed = [line for line in done.stdout.split() if line]
            if removed:
                stopped.append(f"{len(removed)} containers")
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("event=leftover-containers-not-removed state_dir=%s error=%r", state_dir, str(exc))
    monitors = same_mount_namespace(holder)
    for pid in [*monitors, holder]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    stopped.append(f"namespace holder (pid {holder})" + (f" and {len(monitors)} monitors" if monitors else ""))
    return stopped


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


