"""Applying a claim's sharing setting to its GPUs: compute mode, timeslice interval, MPS control daemons.

- TimeSlicing: the GPU's compute mode is set to DEFAULT (several processes share it by time slicing) and its
  timeslice interval to the config's level (Default 0, Short 1, Medium 2, Long 3) through the backend's
  `set_timeslice` (nvidia-smi compute-policy on a node, recorded state in the simulator). The interval is a
  setting of the full GPU: for MIG devices it is left alone and a note says so. When the last claim sharing a
  GPU is unprepared, the interval goes back to Default.
- MPS: the compute mode is set to EXCLUSIVE_PROCESS (the MPS server is the one process owning the GPU), then an
  MPS control daemon is started for the claim's devices with the claim's private pipe and log directories and
  CUDA_VISIBLE_DEVICES set to their UUIDs, and the config's limits are sent to it
  (`set_default_active_thread_percentage`, `set_default_device_pinned_mem_limit <uuid> <MiB>M`). With
  `multiUser` the daemon runs in multi-user mode (`-M`, Volta or newer): clients of every UID share one server;
  without it, the real daemon serves one UID at a time and queues clients of another until the first UID's
  clients are all gone (pods of one claim then need the same runAsUser). The
  directories are mounted into the claim's containers (CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY), and
  the limits are also given as client env vars. Clients also get the daemon's shm directory as /dev/shm. On a
  node the daemon runs as a pod of its own, so that it outlives agent restarts (driver.mpsdaemon). Unprepare
  sends `quit` and restores the DEFAULT compute mode.
- MIG devices: compute mode is a property of the parent GPU, so it is set there.

The backend (`SharingBackend`) is the same method set for real GPUs and the simulator; nothing here knows which.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpudra.deviceconfig import ConfigError, GpuConfig, SharingStrategy
from driver.gputools import GpuToolError, MpsDirs, make_mps_dirs
from driver.nvmlapi import NvmlBackend

COMPUTE_MODE_DEFAULT = 0
COMPUTE_MODE_EXCLUSIVE_PROCESS = 3

MPS_PIPE_IN_CONTAINER = "/tmp/nvidia-mps"


class SharingError(RuntimeError):
    pass


class SharingBackend(Protocol):
    def set_compute_mode(self, gpu_uuid: str, mode: int) -> None: ...

    def set_timeslice(self, gpu_uuid: str, level: int) -> None: ...

    def mps_start(
        self, dirs: MpsDirs, device_uuids: Sequence[str], commands: Sequence[str] = (), *, multi_user: bool = False,
    ) -> None:
        """Launch the daemon and give it `commands` (its limits), which it must keep across its own restarts; it
        may return before the daemon listens (`mps_wait`)."""
        ...

    def mps_wait(self, dirs: MpsDirs) -> None:
        """Until the launched daemon listens with its limits set; SharingError when it does not in time."""
        ...

    def mps_command(self, dirs: MpsDirs, command: str) -> str: ...

    def mps_stop(self, dirs: MpsDirs) -> None: ...

    def mps_running(self, dirs: MpsDirs) -> bool: ...


class MpsDaemons(Protocol):
    """Where MPS control daemons run when not in the agent's process (driver.mpsdaemon.MpsDaemonPods)."""

    def start(
        self, dirs: MpsDirs, device_uuids: Sequence[str], commands: Sequence[str] = (), *, multi_user: bool = False,
    ) -> None: ...

    def wait(self, dirs: MpsDirs) -> None: ...

    def command(self, dirs: MpsDirs, command: str) -> str: ...

    def stop(self, dirs: MpsDirs) -> None: ...

    def running(self, dirs: MpsDirs) -> bool: ...


class _BackendDaemons:
    """MPS control daemons in the agent's process, through the NVML backend (the driver's tools or the simulator)."""

    def __init__(self, nvml: NvmlBackend) -> None:
        self._nvml = nvml

    def start(
        self, dirs: MpsDirs, device_uuids: Sequence[str], commands: Sequence[str] = (), *, multi_user: bool = False,
    ) -> None:
        self._nvml.mps_start(dirs, device_uuids, commands, multi_user=multi_user)

    def wait(self, dirs: MpsDirs) -> None:
        self._nvml.mps_wait(dirs)

    def command(self, dirs: MpsDirs, command: str) -> str:
        return str(self._nvml.mps_command(dirs, command))

    def stop(self, dirs: MpsDirs) -> None:
        self._nvml.mps_stop(dirs)

    def running(self, dirs: MpsDirs) -> bool:
        return bool(self._nvml.mps_running(dirs))


class NvmlSharing:
    """Sharing through an NVML backend (driver.nvml.load_backend's object, real or simulated); MPS control
    daemons through `daemons` when given (in pods of their own), else through the backend."""

    def __init__(self, nvml: NvmlBackend, daemons: MpsDaemons | None = None) -> None:
        self._nvml = nvml
        self._daemons: MpsDaemons = daemons if daemons is not None else _BackendDaemons(nvml)

    def set_compute_mode(self, gpu_uuid: str, mode: int) -> None:
        try:
            handle = self._nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
            if self._nvml.nvmlDeviceGetComputeMode(handle) != mode:
                self._nvml.nvmlDeviceSetComputeMode(handle, mode)
        except Exception as exc:  # pynvml raises NVMLError subclasses; report them per claim
            raise SharingError(f"GPU {gpu_uuid}: setting the compute mode to {mode} failed: {exc}") from exc

    def set_timeslice(self, gpu_uuid: str, level: int) -> None:
        try:
            self._nvml.set_timeslice(gpu_uuid, level)
        except GpuToolError as exc:
            raise SharingError(f"GPU {gpu_uuid}: setting the timeslice interval to level {level} failed: {exc}") from exc

    def mps_start(
        self, dirs: MpsDirs, device_uuids: Sequence[str], commands: Sequence[str] = (), *, multi_user: bool = False,
    ) -> None:
        try:
            self._daemons.start(dirs, device_uuids, commands, multi_user=multi_user)
        except GpuToolError as exc:
            raise SharingError(
                f"GPU(s) {', '.join(device_uuids)}: starting the MPS control daemon (pipe directory {dirs.pipe}) failed: {exc}"
            ) from exc

    def mps_wait(self, dirs: MpsDirs) -> None:
        try:
            self._daemons.wait(dirs)
        except GpuToolError as exc:
            raise SharingError(f"MPS control daemon (pipe directory {dirs.pipe}): {exc}") from exc

    def mps_command(self, dirs: MpsDirs, command: str) -> str:
        try:
            return self._daemons.command(dirs, command)
        except GpuToolError as exc:
            raise SharingError(f"MPS control daemon (pipe directory {dirs.pipe}): {command!r} failed: {exc}") from exc

    def mps_stop(self, dirs: MpsDirs) -> None:
        try:
            self._daemons.stop(dirs)
        except GpuToolError as exc:
            raise SharingError(f"MPS control daemon (pipe directory {dirs.pipe}): stopping it failed: {exc}") from exc

    def mps_running(self, dirs: MpsDirs) -> bool:
        return self._daemons.running(dirs)


@dataclass(frozen=True)
class SharedDevice:
    uuid: str
    gpu_uuid: str
    gpu_index: int
    compute_capability: str = ""  # the parent GPU's CUDA compute capability ("8.0"); "" when unknown

    @property
    def is_full_gpu(self) -> bool:
        return self.uuid == self.gpu_uuid


@dataclass(frozen=True)
class ContainerSharing:
    """What the claim's containers get for its sharing setting."""

    env: Mapping[str, str] = field(default_factory=dict)
    mounts: Sequence[Mapping[str, Any]] = ()
    notes: tuple[str, ...] = ()


def mps_dirs(mps_root: Path, claim_uid: str, ordinal: int = 0) -> MpsDirs:
    """The directories of a claim's `ordinal`-th MPS daemon (a claim has one per distinct MPS config)."""
    base = mps_root / claim_uid if ordinal == 0 else mps_root / claim_uid / str(ordinal)
    return MpsDirs(pipe=base / "pipe", log=base / "log")


def is_mps(config: GpuConfig | None) -> bool:
    return config is not None and config.sharing is not None and config.sharing.strategy is SharingStrategy.MPS


def pinned_limits(config: GpuConfig, devices: Sequence[SharedDevice]) -> dict[str, int]:
    """The pinned device memory limit (MiB) of each device of one MPS daemon, by UUID (NVIDIA's semantics:
    index keys count the daemon's devices sorted by UUID); SharingError if a key names none of them."""
    mps = config.sharing.mps if config.sharing is not None else None
    if mps is None:
        return {}
    try:
        return mps.pinned_limits_mib([d.uuid for d in devices])
    except ConfigError as exc:
        raise SharingError("; ".join(exc.errors)) from exc


def mps_commands(config: GpuConfig, devices: Sequence[SharedDevice]) -> list[str]:
    """The control commands that put a config's limits on a freshly started daemon, in order."""
    mps = config.sharing.mps if config.sharing is not None else None
    if mps is None:
        return []
    out = []
    if mps.default_active_thread_percentage is not None:
        out.append(f"set_default_active_thread_percentage {mps.default_active_thread_percentage}")
    for uuid, mib in sorted(pinned_limits(config, devices).items()):
        out.append(f"set_default_device_pinned_mem_limit {uuid} {mib}M")
    return out


def _gpus(devices: Sequence[SharedDevice]) -> list[str]:
    return sorted({d.gpu_uuid for d in devices})


def shared_mps_dirs(mps_root: Path, gpu_uuid: str) -> MpsDirs:
    """The one MPS daemon of a GPU shared by capacity: every claim on that GPU is a client of it."""
    base = mps_root / "shared" / gpu_uuid
    return MpsDirs(pipe=base / "pipe", log=base / "log")


def capacity_parameters(consumed: Mapping[str, Any]) -> dict[str, Any]:
    """The MPS config that enforces a claim's part of a GPU shared by capacity: its `computeShare` as the active
    thread percentage and its `memory` as the pinned device memory limit (what the scheduler counted)."""
    from gpudra.deviceconfig import API_VERSION, KIND

    mps: dict[str, Any] = {"defaultActiveThreadPercentage": int(str(consumed.get("computeShare", "100")))}
    if consumed.get("memory") is not None:
        mps["defaultPinnedDeviceMemoryLimit"] = str(consumed["memory"])
    return {"apiVersion": API_VERSION, "kind": KIND, "sharing": {"strategy": "MPS", "mpsConfig": mps}}


def start_mps(
    backend: SharingBackend, config: GpuConfig, devices: Sequence[SharedDevice], dirs: MpsDirs, *, shared: bool = False
) -> bool:
    """Make sure the daemon runs with the config's limits; True if it had to be started.

    `shared`: the GPU's daemon for claims sharing it by capacity. It gets no default limits (they would apply to
    every claim's clients); each claim's limits reach its own clients through their environment."""
    multi_user = config.sharing is not None and config.sharing.mps is not None and config.sharing.mps.multi_user
    if multi_user:
        _require_volta(devices)
    for gpu in _gpus(devices):
        backend.set_compute_mode(gpu, COMPUTE_MODE_EXCLUSIVE_PROCESS)
    try:
        make_mps_dirs(dirs)
    except (GpuToolError, OSError) as exc:
        raise SharingError(f"MPS control daemon directories: {exc}") from exc
    if backend.mps_running(dirs):
        return False
    limits_commands = [] if shared else mps_commands(config, devices)  # a bad per-device key fails before anything starts
    # Defaults apply to MPS servers the daemon starts later, i.e. to the claim's first client onwards. The
    # backend gives them to the daemon where it survives restarts (a daemon pod replays them at each start).
    backend.mps_start(dirs, sorted(d.uuid for d in devices), limits_commands, multi_user=multi_user)
    return True


MULTI_USER_MIN_COMPUTE_CAPABILITY = (7, 0)  # Volta: NVIDIA's documented minimum for a multi-user MPS server


def _require_volta(devices: Sequence[SharedDevice]) -> None:
    for d in devices:
        try:
            cc = tuple(int(p) for p in d.compute_capability.split("."))
        except ValueError:
            cc = ()
        if not cc or cc < MULTI_USER_MIN_COMPUTE_CAPABILITY:
            have = f"CUDA compute capability {d.compute_capability}" if d.compute_capability else "an unknown compute capability"
            raise SharingError(
                f"sharing.mpsConfig.multiUser: GPU {d.gpu_uuid} has {have}; a multi-user MPS control daemon needs "
                "Volta (7.0) or newer"
            )


def apply(
    backend: SharingBackend, config: GpuConfig | None, devices: Sequence[SharedDevice], mps: MpsDirs | None,
    *, shared: bool = False,
) -> ContainerSharing:
    """Apply one config to the devices it covers (idempotent: re-applying after a reboot is safe).

    `mps` is the daemon's directories; required for an MPS config."""
    if config is None or config.sharing is None:
        return ContainerSharing()
    if config.sharing.strategy is SharingStrategy.TIME_SLICING:
        level = config.sharing.time_slicing.interval.level if config.sharing.time_slicing else 0
        notes = []
        for gpu in _gpus(devices):
            backend.set_compute_mode(gpu, COMPUTE_MODE_DEFAULT)
            if any(d.is_full_gpu for d in devices if d.gpu_uuid == gpu):
                backend.set_timeslice(gpu, level)
            elif level != 0:
                notes.append(
                    f"GPU {gpu}: the timeslice interval is a setting of the full GPU; not changed for its MIG device(s)"
                )
        return ContainerSharing(notes=tuple(notes))
    if mps is None:
        raise SharingError("an MPS config needs the MPS control daemon's directories")
    start_mps(backend, config, devices, mps, shared=shared)
    # The pipe directory only (as NVIDIA's driver gives clients): the daemon's log is none of the tenants' business.
    env = {"CUDA_MPS_PIPE_DIRECTORY": MPS_PIPE_IN_CONTAINER}
    settings = config.sharing.mps
    if settings is not None:
        if settings.default_active_thread_percentage is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(settings.default_active_thread_percentage)
        # Client limits are per CUDA device ordinal, the daemon's devices sorted by UUID (its CUDA_VISIBLE_DEVICES).
        limits = pinned_limits(config, devices)
        if limits:
            ordinals = sorted(d.uuid for d in devices)
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
                f"{i}={limits[u]}M" for i, u in enumerate(ordinals) if u in limits
            )
    mounts = [
        # Read-only: clients connect to the daemon's sockets there (a unix socket connects on a read-only mount)
        # but cannot create files or plant links that the agent or the daemon would later find.
        {"hostPath": str(mps.pipe), "containerPath": MPS_PIPE_IN_CONTAINER, "options": ["rbind", "ro", "nosuid", "nodev", "noexec"]},
        # MPS clients and their server share memory through /dev/shm: every client of the claim gets the
        # daemon's, not its own container's private one.
        {"hostPath": str(mps.shm), "containerPath": "/dev/shm", "options": ["rbind", "rw", "nosuid", "nodev"]},
    ]
    return ContainerSharing(env=env, mounts=mounts)


def undo(
    backend: SharingBackend, config: GpuConfig | None, gpus_still_shared: set[str], devices: Sequence[SharedDevice],
    mps: MpsDirs | None,
) -> list[str]:
    """Stop the config's MPS daemon, then return the GPUs to the default compute mode and timeslice unless
    another prepared claim still shares them. Safe to repeat (a rollback after a crash does).

    A failure to restore the timeslice is returned as a note, not raised: the interval only tunes scheduling,
    and an unprepare that can never finish would keep the claim's pods from terminating."""
    notes: list[str] = []
    if config is None or config.sharing is None:
        return notes
    if config.sharing.strategy is SharingStrategy.MPS and mps is not None:
        # Whether or not it listens: a daemon pod that never came up is deleted all the same.
        backend.mps_stop(mps)
        shutil.rmtree(mps.pipe, ignore_errors=True)
        shutil.rmtree(mps.log, ignore_errors=True)
        shutil.rmtree(mps.shm, ignore_errors=True)
    for gpu in sorted(set(_gpus(devices)) - gpus_still_shared):
        backend.set_compute_mode(gpu, COMPUTE_MODE_DEFAULT)
        if config.sharing.strategy is SharingStrategy.TIME_SLICING and any(
            d.is_full_gpu for d in devices if d.gpu_uuid == gpu
        ):
            try:
                backend.set_timeslice(gpu, 0)
            except SharingError as exc:
                notes.append(f"the timeslice interval stays as it was: {exc}")
    return notes
