"""Containers of this project's own image, run by the simulated kubelet as host processes.

The busybox rootfs (sim.runtime.rootfs) has no Python, and podman's containers here have no network
(`--network=none`), so `gpu-dra compute-domain-daemon` (the IMEX daemon pods' command) cannot run inside one: it
needs the interpreter, the project and its compiled dependencies (grpcio, pydantic-core), and it talks to the API
server and to its peers' IMEX daemons on their nodes' addresses. The closest faithful run is the pod's command as
a host process of the node, with what the pod would have:

- its env (the spec's, with downward-API values, and the `env` edits of its claims' CDI specs, read from the node's
  CDI dir by the ids the kubelet passes, as the runtime applies them);
- its file system as a directory, the container root, named to the process by GPU_DRA_CONTAINER_ROOT: its volume
  mounts and its CDI specs' `mounts` are links there at their container paths (the ServiceAccount token volume
  among them), and its /etc/hosts is its own file. A host process cannot get a private root without privileges,
  so the programs that run there (our daemon, the IMEX stand-ins) resolve their container paths under it;
- the node's network: the pod's IP is the node's address (the simulated cluster has no pod network; the node's
  loopback address is where its IMEX daemon listens, as a GB200 node's on its pod IP);
- `gpu-dra` is this checkout's CLI run by this interpreter (the image's entry point); other commands are looked
  up on the container root's /usr/bin and /bin (where CDI mounts put the driver's binaries), then the host's PATH.

The device nodes its CDI specs name are made (mknod, as root) under the container root's /dev with the spec's
numbers, so what reads the container's /dev (the IMEX stand-in) sees what a container would; the process itself
still opens the host's /dev. Logs are written in the CRI
format the kubelet's log files have. Stopping sends SIGTERM to the process group and SIGKILL after the grace
period.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from gpudra.timestamps import micro_rfc3339, rfc3339
from sim.runtime.podman import ContainerRequest, ContainerStatus, RuntimeError_, Seen

OWN_IMAGE = "ghcr.io/gpu-dra/gpu-dra"
ROOT_ENV = "GPU_DRA_CONTAINER_ROOT"
REPO = Path(__file__).resolve().parents[2]


def is_own_image(image: str) -> bool:
    name = image.split("@", 1)[0]
    repo = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
    return repo == OWN_IMAGE


def cdi_edits(cdi_dir: Path, device_ids: Sequence[str]
              ) -> tuple[dict[str, str], list[tuple[str, str]], list[Mapping[str, Any]]]:
    """The env, (host path, container path) mounts and device nodes the CDI specs in `cdi_dir` give these device
    ids (`vendor/class=name`), spec-level edits first; an id no spec defines is refused, as a runtime refuses it."""
    wanted = set(device_ids)
    env: dict[str, str] = {}
    mounts: list[tuple[str, str]] = []
    nodes: list[Mapping[str, Any]] = []
    found: set[str] = set()
    for path in sorted(cdi_dir.glob("*.json")):
        try:
            spec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        kind = str(spec.get("kind") or "")
        for device in spec.get("devices") or []:
            qualified = f"{kind}={device.get('name')}"
            if qualified not in wanted:
                continue
            found.add(qualified)
            for edits in (spec.get("containerEdits") or {}, device.get("containerEdits") or {}):
                for item in edits.get("env") or []:
                    key, _, value = str(item).partition("=")
                    env[key] = value
                mounts += [(str(m["hostPath"]), str(m["containerPath"])) for m in edits.get("mounts") or []]
                nodes += [n for n in edits.get("deviceNodes") or [] if isinstance(n, Mapping)]
    missing = sorted(wanted - found)
    if missing:
        raise RuntimeError_(f"unresolvable CDI devices {', '.join(missing)}")
    return env, mounts, nodes


def _device_node(root: Path, node: Mapping[str, Any]) -> None:
    """Create a CDI device node in the container root as a runtime creates it in the container: with the spec's
    type and numbers, else the host node's (which a runtime stats: a missing one fails the container)."""
    path = str(node.get("path") or "")
    kind, major, minor = str(node.get("type") or "c"), node.get("major"), node.get("minor")
    if major is None or minor is None:
        host = str(node.get("hostPath") or path)
        try:
            st = os.stat(host)
        except OSError:
            raise RuntimeError_(f'failed to stat CDI host device "{host}"') from None
        kind = "b" if stat.S_ISBLK(st.st_mode) else "c"
        major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or target.exists():
        target.unlink()
    mode = int(node.get("fileMode") or 0o666) & 0o7777
    try:
        os.mknod(target, mode | (stat.S_IFBLK if kind == "b" else stat.S_IFCHR), os.makedev(int(major), int(minor)))
    except PermissionError as exc:
        raise RuntimeError_(f"creating device node {path} in the container root {root}: {exc.strerror} (the host "
                            "process runtime makes a container's device nodes with mknod: run the cluster as root)"
                            ) from None


def _link(root: Path, host: str, container: str) -> None:
    target = root / container.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or target.is_file():
        target.unlink()
    target.symlink_to(host)


@dataclass
class _Process:
    request: ContainerRequest
    popen: subprocess.Popen[bytes]
    root: Path
    env: dict[str, str]
    started_at: str
    pumps: list[threading.Thread]
    finished_at: str = ""


class HostProcessRuntime:
    """Our image's containers on one node, as host processes under `state_dir`."""

    kind = "host"

    def __init__(self, state_dir: Path, cdi_dir: Path) -> None:
        self.state_dir = state_dir
        self.cdi_dir = cdi_dir
        self._procs: dict[str, _Process] = {}
        self._lock = threading.Lock()

    def _argv(self, root: Path, env: Mapping[str, str], command: Sequence[str]) -> list[str]:
        if not command:
            raise RuntimeError_("the image has no entrypoint: the container must give a command")
        if command[0] == "gpu-dra":
            return [sys.executable, "-m", "cli.main", *command[1:]]
        if "/" in command[0]:
            return list(command)
        for directory in env["PATH"].split(os.pathsep):
            candidate = Path(directory) / command[0]
            if os.access(candidate, os.X_OK):
                return [str(candidate), *command[1:]]
        raise RuntimeError_(f'exec: "{command[0]}": executable file not found in $PATH')

    def _environment(self, request: ContainerRequest, root: Path) -> dict[str, str]:
        cdi_env, mounts, nodes = cdi_edits(self.cdi_dir, request.cdi_devices)
        for host, container, _ in request.mounts:
            _link(root, host, container)
        for host, container in mounts:
            _link(root, host, container)
        for node in nodes:
            _device_node(root, node)
        hosts = root / "etc" / "hosts"
        if not hosts.exists():  # the kubelet-managed hosts file; the pod may edit its own copy
            hosts.write_text("# Kubernetes-managed hosts file (gpu-dra simulator).\n127.0.0.1\tlocalhost\n")
        path = os.pathsep.join([str(root / "usr" / "bin"), str(root / "bin"), os.environ.get("PATH", "/usr/bin:/bin")])
        return {**request.env, **cdi_env, ROOT_ENV: str(root), "PATH": path, "PYTHONPATH": str(REPO),
                "HOME": str(root)}

    def run(self, request: ContainerRequest) -> ContainerStatus:
        directory = self.state_dir / request.name
        root = directory / "root"
        try:
            (root / "etc").mkdir(parents=True, exist_ok=True)
            env = self._environment(request, root)
        except OSError as exc:
            raise RuntimeError_(f"setting up the container root {root}: {exc}") from None
        argv = self._argv(root, env, request.command)
        log_file = request.log_path or directory / "container.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        try:
            popen = subprocess.Popen(argv, env=env, cwd=str(REPO), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            raise RuntimeError_(f"starting {argv[0]}: {exc}") from None
        (directory / "pid").write_text(f"{popen.pid}\n")
        lock = threading.Lock()
        out = open(log_file, "a", encoding="utf-8")  # noqa: SIM115 - closed by the last pump
        pumps = [threading.Thread(target=self._pump, args=(stream, name, out, lock), daemon=True)
                 for stream, name in ((popen.stdout, "stdout"), (popen.stderr, "stderr"))]
        for t in pumps:
            t.start()
        threading.Thread(target=self._close_when_done, args=(pumps, out), daemon=True).start()
        started = rfc3339()
        with self._lock:
            self._procs[request.name] = _Process(request, popen, root, env, started, pumps)
        return ContainerStatus(request.name, True, None, started)

    @staticmethod
    def _pump(stream: IO[bytes] | None, name: str, out: IO[str], lock: threading.Lock) -> None:
        assert stream is not None
        for raw in iter(stream.readline, b""):
            text = raw.decode(errors="replace")
            full = text.endswith("\n")
            with lock:
                out.write(f"{micro_rfc3339()} {name} {'F' if full else 'P'} {text.rstrip(chr(10))}\n")
                out.flush()
        stream.close()

    @staticmethod
    def _close_when_done(pumps: list[threading.Thread], out: IO[str]) -> None:
        for t in pumps:
            t.join()
        out.close()

    def status(self, name: str) -> ContainerStatus:
        with self._lock:
            proc = self._procs.get(name)
        if proc is None:
            return ContainerStatus(name, False, 137, "", error=f"no such container {name}")
        code = proc.popen.poll()
        if code is None:
            return ContainerStatus(name, True, None, proc.started_at)
        if not proc.finished_at:
            proc.finished_at = rfc3339()
        # A process ended by a signal exits 128+N in a container's terms.
        return ContainerStatus(name, False, code if code >= 0 else 128 - code, proc.started_at, proc.finished_at)

    def remove(self, name: str, grace_seconds: int = 1) -> None:
        with self._lock:
            proc = self._procs.get(name)
        try:
            if proc is not None and proc.popen.poll() is None:
                os.killpg(proc.popen.pid, signal.SIGTERM)
                try:
                    proc.popen.wait(timeout=grace_seconds)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.popen.pid, signal.SIGKILL)
                    proc.popen.wait()
        except ProcessLookupError:
            pass
        with self._lock:
            self._procs.pop(name, None)

    def kill(self, name: str) -> None:
        """SIGKILL now: the grace period of a `remove` under way was shortened and is over."""
        with self._lock:
            proc = self._procs.get(name)
        if proc is not None and proc.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, signal.SIGKILL)

    def seen(self, name: str) -> Seen | None:
        return None  # no GPU probe: these containers are given no GPUs

    def _running(self, name: str) -> _Process | None:
        with self._lock:
            proc = self._procs.get(name)
        return proc if proc is not None and proc.popen.poll() is None else None

    def exec_argv(self, name: str, command: Sequence[str], *, tty: bool = False) -> list[str] | None:
        # A host process shares the node's terminal handling: with `tty` the streaming server's pty is the
        # command's own, so nothing is added for it.
        proc = self._running(name)
        if proc is None:
            return None
        argv = self._argv(proc.root, proc.env, command)
        return ["env", "-i", *(f"{k}={v}" for k, v in sorted(proc.env.items())), *argv]

    def attach_argv(self, name: str, *, stdin: bool) -> list[str] | None:
        return None  # started without a terminal or an open stdin: nothing to attach to, as for a podman one

    def tty_of(self, name: str) -> tuple[bool, bool]:
        return (False, False)

    def network_pid(self, name: str) -> int | None:
        proc = self._running(name)
        return proc.popen.pid if proc is not None else None  # the node's own network namespace

    def close(self) -> None:
        for name in list(self._procs):
            self.remove(name, grace_seconds=0)


def stop_leftovers(state_dir: Path) -> list[str]:
    """SIGKILL the process groups of containers a dead supervisor left under `state_dir` (a node's host runtime
    dir), recognised by their container root in their environment, so a reused pid is never taken for one."""
    stopped = []
    for pid_file in sorted(state_dir.glob("*/pid")):
        try:
            pid = int(pid_file.read_text().strip())
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except (OSError, ValueError):
            continue
        if f"{ROOT_ENV}={pid_file.parent / 'root'}".encode() not in environ.split(b"\0"):
            continue
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        stopped.append(f"host process {pid_file.parent.name} (pid {pid})")
    return stopped


class RoutingRuntime:
    """A node's runtime: our image's containers as host processes, every other one in `containers` (podman);
    `containers` None (`--runtime none`): only our image's containers run, every other pod is simulated."""

    def __init__(self, containers: Any | None, host: HostProcessRuntime) -> None:
        self.containers = containers
        self.host = host
        self.kind = containers.kind if containers is not None else "none"
        self._on_host: set[str] = set()

    @staticmethod
    def runs_on_host(image: str) -> bool:
        return is_own_image(image)

    def runs(self, images: Sequence[str]) -> bool:
        """Whether this runtime runs a pod whose containers have these images (the kubelet simulates the rest)."""
        return self.containers is not None or (bool(images) and all(map(is_own_image, images)))

    def _for(self, name: str) -> Any:
        return self.host if name in self._on_host or self.containers is None else self.containers

    def run(self, request: ContainerRequest) -> ContainerStatus:
        if self.runs_on_host(request.image):
            self._on_host.add(request.name)
            return self.host.run(request)
        if self.containers is None:
            raise RuntimeError_(f"no container runtime for image {request.image!r} (--runtime none)")
        return self.containers.run(request)

    def status(self, name: str) -> ContainerStatus:
        return self._for(name).status(name)

    def remove(self, name: str, grace_seconds: int = 1) -> None:
        self._for(name).remove(name, grace_seconds)
        self._on_host.discard(name)

    def kill(self, name: str) -> None:
        self._for(name).kill(name)

    def seen(self, name: str) -> Seen | None:
        return self._for(name).seen(name)

    def exec_argv(self, name: str, command: Sequence[str], *, tty: bool = False) -> list[str] | None:
        return self._for(name).exec_argv(name, command, tty=tty)

    def attach_argv(self, name: str, *, stdin: bool) -> list[str] | None:
        return self._for(name).attach_argv(name, stdin=stdin)

    def tty_of(self, name: str) -> tuple[bool, bool]:
        return self._for(name).tty_of(name)

    def network_pid(self, name: str) -> int | None:
        return self._for(name).network_pid(name)

    def close(self) -> None:
        self.host.close()
        if self.containers is not None:
            self.containers.close()

    def __getattr__(self, name: str) -> Any:
        containers = self.__dict__.get("containers")
        if containers is None:
            raise AttributeError(name)
        return getattr(containers, name)  # the rest of podman's runtime (logs, names, ...)
