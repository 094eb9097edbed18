"""Applying a claim's sharing setting to its GPUs: compute modes through NVML, MPS directories and client env.

- TimeSlicing: the GPU's compute mode is set to DEFAULT (several processes share it by time slicing). The
  interval is NVIDIA's compute-policy timeslice (Default 0, Short 1, Medium 2, Long 3), which NVML does not
  expose; on the real backend it is set with `nvidia-smi compute-policy --set-timeslice`, on the simulator it is
  only recorded (the simulator has no timeslice setting) and reported as such in the result.
- MPS: the compute mode is set to EXCLUSIVE_PROCESS (one MPS server owns the GPU); the claim gets private pipe
  and log directories, mounted into its containers with CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY, and
  the MPS client limits CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT. Starting the MPS
  control daemon for the claim is not done by this process (see the report in docs).
- MIG devices: compute mode is a property of the parent GPU, so it is set there.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from driver.config import GpuConfig, SharingStrategy

COMPUTE_MODE_DEFAULT = 0
COMPUTE_MODE_EXCLUSIVE_PROCESS = 3

MPS_PIPE_IN_CONTAINER = "/tmp/nvidia-mps"
MPS_LOG_IN_CONTAINER = "/tmp/nvidia-mps-log"


class SharingError(RuntimeError):
    pass


class SharingBackend(Protocol):
    def set_compute_mode(self, gpu_uuid: str, mode: int) -> None: ...

    def set_timeslice(self, gpu_uuid: str, level: int) -> bool:
        """Returns False when the backend cannot set the interval (recorded only)."""
        ...


class NvmlSharing:
    """Sharing through an NVML backend (driver.nvml.load_backend's object)."""

    def __init__(self, nvml: Any, *, real: bool) -> None:
        self._nvml = nvml
        self._real = real

    def set_compute_mode(self, gpu_uuid: str, mode: int) -> None:
        try:
            handle = self._nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
            if self._nvml.nvmlDeviceGetComputeMode(handle) != mode:
                self._nvml.nvmlDeviceSetComputeMode(handle, mode)
        except Exception as exc:  # pynvml raises NVMLError subclasses; report them per claim
            raise SharingError(f"GPU {gpu_uuid}: setting the compute mode to {mode} failed: {exc}") from exc

    def set_timeslice(self, gpu_uuid: str, level: int) -> bool:
        if not self._real:
            return False
        smi = shutil.which("nvidia-smi")
        if smi is None:
            raise SharingError(f"GPU {gpu_uuid}: nvidia-smi is needed to set the timeslice interval and was not found")
        done = subprocess.run(
            [smi, "compute-policy", "-i", gpu_uuid, f"--set-timeslice={level}"], capture_output=True, text=True, timeout=30
        )
        if done.returncode != 0:
            raise SharingError(f"GPU {gpu_uuid}: nvidia-smi compute-policy --set-timeslice={level} failed: {done.stderr.strip()}")
        return True


@dataclass(frozen=True)
class SharedDevice:
    uuid: str
    gpu_uuid: str
    gpu_index: int


@dataclass(frozen=True)
class ContainerSharing:
    """What the claim's containers get for its sharing setting."""

    env: Mapping[str, str] = field(default_factory=dict)
    mounts: Sequence[Mapping[str, Any]] = ()
    notes: tuple[str, ...] = ()


def mps_dirs(mps_root: Path, claim_uid: str) -> tuple[Path, Path]:
    base = mps_root / claim_uid
    return base / "pipe", base / "log"


def apply(
    backend: SharingBackend, config: GpuConfig | None, devices: Sequence[SharedDevice], claim_uid: str, mps_root: Path
) -> ContainerSharing:
    """Apply one config to the devices it covers (idempotent: re-applying after a reboot is safe)."""
    if config is None or config.sharing is None:
        return ContainerSharing()
    gpus = sorted({d.gpu_uuid for d in devices})
    if config.sharing.strategy is SharingStrategy.TIME_SLICING:
        level = config.sharing.time_slicing.interval.level if config.sharing.time_slicing else 0
        notes = []
        for gpu in gpus:
            backend.set_compute_mode(gpu, COMPUTE_MODE_DEFAULT)
            if not backend.set_timeslice(gpu, level):
                notes.append(f"GPU {gpu}: timeslice level {level} recorded; this NVML backend cannot set it")
        return ContainerSharing(notes=tuple(notes))
    for gpu in gpus:
        backend.set_compute_mode(gpu, COMPUTE_MODE_EXCLUSIVE_PROCESS)
    pipe, log = mps_dirs(mps_root, claim_uid)
    pipe.mkdir(parents=True, exist_ok=True)
    log.mkdir(parents=True, exist_ok=True)
    env = {"CUDA_MPS_PIPE_DIRECTORY": MPS_PIPE_IN_CONTAINER, "CUDA_MPS_LOG_DIRECTORY": MPS_LOG_IN_CONTAINER}
    mps = config.sharing.mps
    if mps is not None:
        if mps.default_active_thread_percentage is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(mps.default_active_thread_percentage)
        # Client limits are per CUDA device ordinal as the container sees them (claim order).
        limits = []
        for ordinal, d in enumerate(devices):
            limit = mps.pinned_limit_bytes(d.uuid, d.gpu_index)
            if limit is not None:
                limits.append(f"{ordinal}={max(1, limit // (1024 * 1024))}M")
        if limits:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(limits)
    mounts = [
        {"hostPath": str(pipe), "containerPath": MPS_PIPE_IN_CONTAINER, "options": ["rbind", "rw"]},
        {"hostPath": str(log), "containerPath": MPS_LOG_IN_CONTAINER, "options": ["rbind", "rw"]},
    ]
    return ContainerSharing(env=env, mounts=mounts)


def undo(
    backend: SharingBackend, config: GpuConfig | None, gpus_still_shared: set[str], devices: Sequence[SharedDevice],
    claim_uid: str, mps_root: Path,
) -> None:
    """Return the GPUs to the default compute mode unless another prepared claim still shares them."""
    if config is None or config.sharing is None:
        return
    for gpu in sorted({d.gpu_uuid for d in devices} - gpus_still_shared):
        backend.set_compute_mode(gpu, COMPUTE_MODE_DEFAULT)
    if config.sharing.strategy is SharingStrategy.MPS:
        shutil.rmtree(mps_root / claim_uid, ignore_errors=True)
