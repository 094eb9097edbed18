"""NVIDIA's command-line tools for the GPU settings NVML does not expose: timeslice interval and MPS.

- `nvidia-smi compute-policy -i <GPU uuid> --set-timeslice <level>` sets a GPU's time-slice interval
  (levels: 0 default, 1 short, 2 medium, 3 long; the same numbers NVIDIA's DRA driver uses).
- `nvidia-cuda-mps-control -d` starts an MPS control daemon (`-d -M`: in multi-user mode, one root server for
  the clients of every UID); its pipe and log directories come from CUDA_MPS_PIPE_DIRECTORY /
  CUDA_MPS_LOG_DIRECTORY and the GPUs it serves from CUDA_VISIBLE_DEVICES.
  Commands (`set_default_active_thread_percentage 50`, `set_default_device_pinned_mem_limit <uuid> 4096M`,
  `quit`) are written to `nvidia-cuda-mps-control`'s stdin with the same pipe directory, which connects to
  the daemon through `<pipe dir>/control`.

`NvidiaTools` runs them through a `CommandRunner` (the subprocess one on a node, a recording one in tests);
failures raise `GpuToolError` with the command and its stderr. Given a driver root (driver.driverroot), the
tools are run by their path under it with the driver's `libnvidia-ml.so.1` preloaded (`LD_PRELOAD` only: the
driver's library directory may hold the host's libc, see driver.driverroot); without one, from PATH.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from driver.cdi import parse_proc_devices
from driver.driverroot import DriverRoot, DriverRootError

NVIDIA_SMI = "nvidia-smi"
MPS_CONTROL = "nvidia-cuda-mps-control"
MPS_CONTROL_SOCKET = "control"
MPS_MULTI_USER_FLAG = "-M"
TIMESLICE_LEVELS = (0, 1, 2, 3)
COMMAND_TIMEOUT_S = 30.0


class GpuToolError(RuntimeError):
    """A tool was missing, failed or timed out; the message names the command and carries its stderr."""


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


class CommandRunner(Protocol):
    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, stdin: str | None = None) -> CommandResult:
        """Run argv (argv[0] looked up on PATH) with extra env vars on top of this process's environment.

        Raises GpuToolError when the program is missing or does not finish in time."""
        ...


class SubprocessRunner:
    def __init__(self, timeout_s: float = COMMAND_TIMEOUT_S) -> None:
        self._timeout_s = timeout_s

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, stdin: str | None = None) -> CommandResult:
        full_env = {**os.environ, **(env or {})}
        program = shutil.which(argv[0], path=full_env.get("PATH"))
        if program is None:
            raise GpuToolError(f"{argv[0]} was not found on PATH ({full_env.get('PATH', '')}); it comes with the NVIDIA driver")
        # Output goes to files, not pipes: `nvidia-cuda-mps-control -d` leaves a daemon behind that may keep
        # inherited descriptors open, and waiting for EOF on a pipe would then hang until the timeout.
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                done = subprocess.run(
                    [program, *argv[1:]], input=(stdin or "").encode(), stdout=out, stderr=err, env=full_env,
                    timeout=self._timeout_s, check=False,
                )
            except subprocess.TimeoutExpired as exc:
                raise GpuToolError(f"{' '.join(argv)} did not finish within {self._timeout_s:g}s") from exc
            except OSError as exc:
                raise GpuToolError(f"{' '.join(argv)} could not be run: {exc}") from exc
            out.seek(0)
            err.seek(0)
            return CommandResult(done.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"))


@dataclass(frozen=True)
class MpsDirs:
    """One MPS control daemon's directories on the host (its identity: one daemon per pipe directory)."""

    pipe: Path
    log: Path

    @property
    def shm(self) -> Path:
        """The daemon's and its clients' shared /dev/shm (a tmpfs when daemons run as pods), beside the pipe dir."""
        return self.pipe.parent / "shm"

    def env(self) -> dict[str, str]:
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe), "CUDA_MPS_LOG_DIRECTORY": str(self.log)}


def mps_daemon_argv(multi_user: bool) -> list[str]:
    return [MPS_CONTROL, "-d", *([MPS_MULTI_USER_FLAG] if multi_user else [])]


def make_mps_dir(path: Path, mode: int = 0o755) -> None:
    """mkdir -p one of a daemon's directories, refusing a symbolic link or another file in its place (nothing the
    agent creates or reads there follows one); root-owned, `mode` exactly whatever this process's umask."""
    path.mkdir(parents=True, exist_ok=True)
    if os.path.islink(path) or not path.is_dir():
        raise GpuToolError(f"{path}: expected a directory of the agent's, found a symbolic link or another file")
    if os.geteuid() == 0:
        os.chown(path, 0, 0)
    os.chmod(path, mode)


def make_mps_dirs(dirs: MpsDirs) -> None:
    """A daemon's pipe, log and shm directories, as clients of any UID need them:

    - pipe and log 0755: every client reaches the control socket (connecting needs search permission on the
      directory, not write), and so does the server the daemon starts for a non-root client, which runs as that
      client's UID; nobody but root writes there (the clients' mount is read-only too);
    - shm 1777 (sticky, as /dev/shm): the servers and clients of each UID create their segments there, and none
      removes another's."""
    make_mps_dir(dirs.pipe)
    make_mps_dir(dirs.log)
    make_mps_dir(dirs.shm, 0o1777)


def control_socket_alive(pipe_dir: Path) -> bool:
    """Whether an MPS control daemon listens on `<pipe_dir>/control` (a stale socket file refuses connections)."""
    path = pipe_dir / MPS_CONTROL_SOCKET
    try:
        # lstat: a link planted in the pipe dir is never followed, only the daemon's own socket counts.
        if os.path.islink(pipe_dir) or not stat.S_ISSOCK(os.lstat(path).st_mode):
            return False
    except OSError:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2.0)
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def _describe(argv: Sequence[str], result: CommandResult) -> str:
    detail = result.stderr.strip() or result.stdout.strip() or "no output"
    return f"`{' '.join(argv)}` exited with status {result.returncode}: {detail}"


class NvidiaTools:
    """Timeslice and MPS control through NVIDIA's tools, as the real NVML backend offers them."""

    def __init__(self, runner: CommandRunner | None = None, driver_root: DriverRoot | None = None) -> None:
        self._runner = runner or SubprocessRunner()
        self._root = driver_root

    def command(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
        """argv and extra env as they are run: the tool by its path under the driver root, the driver's
        NVML preloaded. Raises GpuToolError naming the paths searched when the tool is not there."""
        extra = dict(env or {})
        if self._root is None:
            return list(argv), extra
        try:
            program = self._root.find_binary(argv[0])
        except DriverRootError as exc:
            raise GpuToolError(str(exc)) from exc
        # The preload goes on top of whatever LD_PRELOAD this process has, as NVIDIA's plugin does.
        base = {k: v for k, v in os.environ.items() if k == "LD_PRELOAD"}
        return [str(program), *argv[1:]], {**extra, **self._root.tool_env({**base, **extra})}

    def _run(self, argv: Sequence[str], env: Mapping[str, str] | None = None, stdin: str | None = None) -> str:
        argv, env = self.command(argv, env)
        result = self._runner.run(argv, env=env, stdin=stdin)
        if result.returncode != 0:
            raise GpuToolError(_describe(argv, result))
        return result.stdout

    def set_timeslice(self, gpu_uuid: str, level: int) -> None:
        if level not in TIMESLICE_LEVELS:
            raise GpuToolError(f"GPU {gpu_uuid}: timeslice level {level} is not one of {TIMESLICE_LEVELS}")
        self._run([NVIDIA_SMI, "compute-policy", "-i", gpu_uuid, "--set-timeslice", str(level)])

    def mps_start(
        self, dirs: MpsDirs, device_uuids: Sequence[str], commands: Sequence[str] = (), *, multi_user: bool = False,
    ) -> None:
        """A daemon in this process's container (no daemon pods): started, then given its limits."""
        self._run(mps_daemon_argv(multi_user), env={**dirs.env(), "CUDA_VISIBLE_DEVICES": ",".join(device_uuids)})
        for command in commands:
            self.mps_command(dirs, command)

    def mps_wait(self, dirs: MpsDirs) -> None:
        """`nvidia-cuda-mps-control -d` returns once its daemon listens, and mps_start gave it its limits."""
        if not control_socket_alive(dirs.pipe):
            raise GpuToolError(f"no MPS control daemon listens on {dirs.pipe / MPS_CONTROL_SOCKET}")

    def mps_command(self, dirs: MpsDirs, command: str) -> str:
        return self._run([MPS_CONTROL], env=dirs.env(), stdin=command + "\n")

    def mps_stop(self, dirs: MpsDirs) -> None:
        if control_socket_alive(dirs.pipe):  # nothing to stop otherwise
            self._run([MPS_CONTROL], env=dirs.env(), stdin="quit\n")

    def mps_running(self, dirs: MpsDirs) -> bool:
        return control_socket_alive(dirs.pipe)


NVIDIA_MODPROBE = "nvidia-modprobe"
UVM_MISSING = "CUDA will lack /dev/nvidia-uvm"
UVM_HOST_HINT = "load it on the host (`nvidia-modprobe -u -c=0`, or `modprobe nvidia-uvm` and create the nodes)"


def uvm_missing(proc_root: Path) -> str | None:
    """None when nvidia-uvm is loaded (its major is in /proc/devices), else what is wrong."""
    try:
        majors = parse_proc_devices((proc_root / "devices").read_text())
    except OSError as exc:
        return f"cannot read {proc_root / 'devices'}: {exc.strerror or exc}"
    return None if "nvidia-uvm" in majors else "the nvidia-uvm module is not loaded (no nvidia-uvm in /proc/devices)"


def ensure_uvm_loaded(driver_root: DriverRoot, proc_root: Path, runner: CommandRunner | None = None) -> str | None:
    """Load nvidia-uvm (CUDA's unified memory module) when it is not loaded, the way NVIDIA's tools do it from a
    container: the driver root's `nvidia-modprobe -u -c=0` run chrooted into the driver root (`chroot ROOT
    nvidia-modprobe`), so that it finds that root's own `modprobe`, kernel modules and libc, none of which the
    agent's image has. Returns None when the module is loaded (before or now), else the reason, starting with
    "CUDA will lack /dev/nvidia-uvm: " (for the log, the Node condition and Event); claim specs then leave
    /dev/nvidia-uvm* out (driver.cdi) until it is loaded."""
    missing = uvm_missing(proc_root)
    if missing is None:
        return None
    if missing.startswith("cannot read"):
        return f"{UVM_MISSING}: {missing}"
    try:
        program = driver_root.find_binary(NVIDIA_MODPROBE)
    except DriverRootError:
        return (f"{UVM_MISSING}: {missing} and the driver root {driver_root.path} has no {NVIDIA_MODPROBE} to load it "
                f"with; {UVM_HOST_HINT}")
    argv = ["chroot", str(driver_root.path), "/" + str(program.relative_to(driver_root.path)), "-u", "-c=0"]
    try:
        result = (runner or SubprocessRunner()).run(argv)
    except GpuToolError as exc:
        return f"{UVM_MISSING}: {missing}; `{' '.join(argv)}` could not run: {exc}; {UVM_HOST_HINT}"
    if result.returncode != 0:
        return f"{UVM_MISSING}: {missing}; {_describe(argv, result)}; {UVM_HOST_HINT}"
    after = uvm_missing(proc_root)
    if after is not None:
        return f"{UVM_MISSING}: `{' '.join(argv)}` exited 0 but {after}; {UVM_HOST_HINT}"
    return None
