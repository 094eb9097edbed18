"""The config the C NVML mock (sim/nodebox/c/nvml.c) answers from, written from a simulator profile.

The simulator is walked through its own NVML calls (the same names and structs pynvml gives), so the mock
reports what `--nvml sim:PROFILE` reports for the same node: GPUs, MIG profiles and placements, existing MIG
devices, NVLinks and fabric. MIG devices that do not exist yet get the UUID and GPU instance id the simulator
would give them, one line per placement. One tab-separated record per line; a GPU's or profile's name is last.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import pynvml

from sim.nvml import load_simulator
from sim.nvml.simulator import gpu_instance_id, mig_uuid

CONFIG_NAME = "nodebox-nvml.conf"


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(fn: Any, *args: Any, default: Any = None) -> Any:
    try:
        return fn(*args)
    except pynvml.NVMLError:
        return default


def _bus_id(pci: Any) -> str:
    domain, bus, rest = _text(pci.busId).split(":")
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{rest.lower()}"


def config_text(profile: str, node: str) -> str:
    """The mock's config for `profile` (a shipped name or a YAML path) on node `node` (pure but for reading it)."""
    nvml = load_simulator(f"sim:{profile}", node=node)
    lines = [f"driver\t{_text(nvml.nvmlSystemGetDriverVersion())}", f"cuda\t{nvml.nvmlSystemGetCudaDriverVersion_v2()}"]
    for index in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(h))
        pci = nvml.nvmlDeviceGetPciInfo(h)
        cc = nvml.nvmlDeviceGetCudaComputeCapability(h)
        mig = _optional(nvml.nvmlDeviceGetMigMode, h)
        numa = _optional(nvml.nvmlDeviceGetNumaNodeId, h, default=-1)
        addressing = _optional(nvml.nvmlDeviceGetAddressingMode, h, default=-1)
        max_mig = _optional(nvml.nvmlDeviceGetMaxMigDeviceCount, h, default=0)
        fields = [
            "gpu", index, nvml.nvmlDeviceGetMinorNumber(h), uuid, _bus_id(pci), nvml.nvmlDeviceGetBrand(h),
            nvml.nvmlDeviceGetArchitecture(h), cc[0], cc[1], int(nvml.nvmlDeviceGetMemoryInfo(h).total),
            f"{int(pci.pciDeviceId):x}", f"{int(pci.pciSubSystemId):x}", numa, addressing,
            int(mig is not None), int(bool(mig and mig[0])), max_mig, _text(nvml.nvmlDeviceGetName(h)),
        ]
        lines.append("\t".join(str(f) for f in fields))
        if mig is not None:
            lines += _mig_lines(nvml, h, index, uuid)
        lines += _link_lines(nvml, h, index)
        fabric = pynvml.c_nvmlGpuFabricInfoV_t()
        if _optional(nvml.nvmlDeviceGetGpuFabricInfoV, h, ctypes.byref(fabric)) is not None \
                and int(fabric.state) == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED:
            lines.append(f"fabric\t{index}\t{bytes(fabric.clusterUuid).hex()}\t{int(fabric.cliqueId)}")
    return "\n".join(lines) + "\n"


def _mig_lines(nvml: Any, h: Any, index: int, gpu_uuid: str) -> list[str]:
    lines: list[str] = []
    for enum_value in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        info = _optional(nvml.nvmlDeviceGetGpuInstanceProfileInfo, h, enum_value)
        if info is None:
            continue
        name = _text(info.name).removeprefix("MIG ")
        lines.append("\t".join(str(f) for f in (
            "profile", index, enum_value, info.id, info.sliceCount, info.instanceCount, info.multiprocessorCount,
            info.copyEngineCount, info.decoderCount, info.encoderCount, info.jpegCount, info.ofaCount,
            info.memorySizeMB, name,
        )))
        count = ctypes.c_uint(0)
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, None, ctypes.byref(count))
        array = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, array, ctypes.byref(count))
        for p in array[: count.value]:
            start, size = int(p.start), int(p.size)
            lines.append(f"placement\t{index}\t{info.id}\t{start}\t{size}\t{gpu_instance_id(start, size)}\t"
                         f"{mig_uuid(gpu_uuid, name, start)}")
    for i in range(int(_optional(nvml.nvmlDeviceGetMaxMigDeviceCount, h, default=0))):
        m = _optional(nvml.nvmlDeviceGetMigDeviceHandleByIndex, h, i)
        if m is None:
            continue
        gi = nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(h, nvml.nvmlDeviceGetGpuInstanceId(m)))
        lines.append(f"instance\t{index}\t{gi.profileId}\t{gi.placement.start}\t{_text(nvml.nvmlDeviceGetUUID(m))}")
    return lines


def _link_lines(nvml: Any, h: Any, index: int) -> list[str]:
    lines: list[str] = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        state = _optional(nvml.nvmlDeviceGetNvLinkState, h, link)
        if state is None:
            break
        active = int(state) == pynvml.NVML_FEATURE_ENABLED
        remote, is_switch = "-", 0
        if active:
            kind = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, link)
            is_switch = int(int(kind) == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)
            pci = _optional(nvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            remote = _bus_id(pci) if pci is not None else "-"
        lines.append(f"link\t{index}\t{int(active)}\t{is_switch}\t{remote}")
    return lines


def write(directory: Path, profile: str, node: str) -> Path:
    """Write the config beside the mock library in `directory`; returns its path."""
    path = directory / CONFIG_NAME
    path.write_text(config_text(profile, node))
    return path
