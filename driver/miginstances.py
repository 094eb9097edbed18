"""Creating and destroying MIG instances through an NVML backend, for partitionable (on-demand) MIG devices.

A MIG device is a GPU instance (GI) at a fixed memory-slice placement plus a compute instance (CI) inside it;
we always create the one full-size CI, so that a GI is one usable MIG device. Destroying goes CI first, then GI,
as the driver refuses to destroy a GI that still has compute instances.

Everything raises `MigError` with a message that names the GPU and what was asked; callers turn it into a
per-claim error. Destroying something that is already gone is not an error (rollback must be repeatable).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from driver.nvmlapi import NvmlBackend
import pynvml

# GI slice count -> the compute-instance profile that spans the whole GI.
_FULL_CI_PROFILE: dict[int, int] = {
    1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    6: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
    7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    8: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
}


class MigError(Exception):
    pass


@dataclass(frozen=True)
class CreatedMig:
    gpu_instance_id: int
    compute_instance_id: int
    uuid: str  # "MIG-..."


def _handle(nvml: NvmlBackend, gpu_uuid: str) -> Any:
    try:
        return nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
    except pynvml.NVMLError as exc:
        raise MigError(f"GPU {gpu_uuid}: cannot get its NVML handle: {exc}") from exc


def mig_mode(nvml: NvmlBackend, gpu_uuid: str) -> tuple[bool, bool]:
    """(current, pending) MIG mode of a GPU."""
    try:
        current, pending = nvml.nvmlDeviceGetMigMode(_handle(nvml, gpu_uuid))
    except pynvml.NVMLError as exc:
        raise MigError(f"GPU {gpu_uuid}: reading its MIG mode failed: {exc}") from exc
    return bool(current), bool(pending)


def set_mig_mode(nvml: NvmlBackend, gpu_uuid: str, enabled: bool) -> None:
    """Switch MIG mode; raises when the change only becomes pending (the GPU needs a reset first)."""
    want = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
    what = "enabling" if enabled else "disabling"
    try:
        nvml.nvmlDeviceSetMigMode(_handle(nvml, gpu_uuid), want)
    except pynvml.NVMLError as exc:
        raise MigError(f"GPU {gpu_uuid}: {what} MIG mode failed: {exc}") from exc
    current, _ = mig_mode(nvml, gpu_uuid)
    if current != enabled:
        raise MigError(
            f"GPU {gpu_uuid}: {what} MIG mode is pending until the GPU is reset (processes still use it, or the "
            "platform needs a reboot); not preparing on it until the mode is active"
        )


def _profile_info(nvml: NvmlBackend, handle: Any, profile_id: int) -> Any:
    """The GI profile info whose NVML profile id is `profile_id` (what discovery records as MigProfile.profile_id);
    NVML is asked by NVML_GPU_INSTANCE_PROFILE_* value, so the values are scanned."""
    for enum_value in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum_value)
        except pynvml.NVMLError:
            continue
        if int(info.id) == profile_id:
            return info
    raise MigError(f"GPU instance profile id {profile_id} is not supported by this GPU")


def _find_gpu_instance(nvml: NvmlBackend, handle: Any, profile_id: int, start: int) -> Any | None:
    """The GI of `profile_id` (NVML's profile id, not the enum) placed at `start`, or None."""
    count = ctypes.c_uint(0)
    try:
        nvml.nvmlDeviceGetGpuInstances(handle, profile_id, None, ctypes.byref(count))
        if count.value == 0:
            return None
        array = (pynvml.c_nvmlGpuInstance_t * count.value)()
        nvml.nvmlDeviceGetGpuInstances(handle, profile_id, array, ctypes.byref(count))
    except pynvml.NVMLError_NotFound:
        return None
    for gi in array[: count.value]:
        if int(nvml.nvmlGpuInstanceGetInfo(gi).placement.start) == start:
            return gi
    return None


def _mig_uuid(nvml: NvmlBackend, handle: Any, gpu_instance_id: int) -> str:
    for index in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
        except pynvml.NVMLError_NotFound:
            continue
        if int(nvml.nvmlDeviceGetGpuInstanceId(mig)) == gpu_instance_id:
            uuid = nvml.nvmlDeviceGetUUID(mig)
            return uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    raise MigError(f"GPU instance {gpu_instance_id} has a compute instance but no MIG device handle")


def create(nvml: NvmlBackend, gpu_uuid: str, profile: int, start: int, size: int) -> CreatedMig:
    """Create the GI of GPU-instance profile id `profile` (NVML's id, MigProfile.profile_id) at exactly
    placement (start, size), with its full compute instance. A GI left without a CI is destroyed again."""
    handle = _handle(nvml, gpu_uuid)
    where = f"GPU {gpu_uuid}: MIG profile {profile} at placement start={start} size={size}"
    try:
        info = _profile_info(nvml, handle, profile)
        placement = pynvml.c_nvmlGpuInstancePlacement_t(start, size)
        gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, int(info.id), ctypes.byref(placement))
    except pynvml.NVMLError_InsufficientResources as exc:
        raise MigError(f"{where}: the placement is taken or overlaps an existing MIG instance ({exc})") from exc
    except pynvml.NVMLError as exc:
        raise MigError(f"{where}: creating the GPU instance failed: {exc}") from exc
    except MigError as exc:
        raise MigError(f"GPU {gpu_uuid}: {exc}") from exc
    try:
        ci_profile = _FULL_CI_PROFILE.get(int(info.sliceCount))
        if ci_profile is None:
            raise MigError(f"{where}: no compute-instance profile spans {int(info.sliceCount)} slices")
        ci_info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, ci_profile, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        )
        ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, int(ci_info.id))
        gi_id = int(nvml.nvmlGpuInstanceGetInfo(gi).id)
        ci_id = int(nvml.nvmlComputeInstanceGetInfo(ci).id)
        return CreatedMig(gi_id, ci_id, _mig_uuid(nvml, handle, gi_id))
    except (pynvml.NVMLError, MigError) as exc:
        _destroy_gi(nvml, gi)
        if isinstance(exc, MigError):
            raise
        raise MigError(f"{where}: creating its compute instance failed: {exc}") from exc


def _destroy_gi(nvml: NvmlBackend, gi: Any) -> None:
    for ci_id in range(8):  # a GI holds at most 8 compute instances
        try:
            nvml.nvmlComputeInstanceDestroy(nvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id))
        except (pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument):
            continue
    nvml.nvmlGpuInstanceDestroy(gi)


def destroy(nvml: NvmlBackend, gpu_uuid: str, profile: int, start: int) -> bool:
    """Destroy the MIG instance (CIs, then the GI) of `profile` at `start`; False when there is none."""
    handle = _handle(nvml, gpu_uuid)
    try:
        gi = _find_gpu_instance(nvml, handle, profile, start)
        if gi is None:
            return False
        _destroy_gi(nvml, gi)
    except pynvml.NVMLError as exc:
        raise MigError(f"GPU {gpu_uuid}: destroying the MIG instance of profile {profile} at start {start} failed: {exc}") from exc
    return True


def destroy_by_id(nvml: NvmlBackend, gpu_uuid: str, gpu_instance_id: int) -> bool:
    """Destroy the MIG instance (CIs, then the GI) whose GPU-instance id is `gpu_instance_id`; False when none is."""
    handle = _handle(nvml, gpu_uuid)
    try:
        try:
            gi = nvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id)
        except pynvml.NVMLError_NotFound:
            return False
        _destroy_gi(nvml, gi)
    except pynvml.NVMLError as exc:
        raise MigError(f"GPU {gpu_uuid}: destroying MIG GPU instance {gpu_instance_id} failed: {exc}") from exc
    return True
