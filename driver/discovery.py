"""GPU discovery over any NVML backend (real pynvml or the simulator) into the typed Inventory.

Discovery only calls pynvml's functions on the object it is given, so it cannot tell the
backends apart. A GPU whose required queries fail is reported in `Inventory.skipped`;
optional facts (NUMA node, NVLink, fabric, PCIe root) degrade to None when unsupported.
"""

from __future__ import annotations

import ctypes
import hashlib
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pynvml

from driver.inventory import Gpu, Health, Inventory, MigDevice, MigPlacement, MigProfile, NvLink
from driver.nvmlapi import NvmlBackend

_MIB = 1024 * 1024

ARCHITECTURES: dict[int, str] = {
    pynvml.NVML_DEVICE_ARCH_KEPLER: "Kepler",
    pynvml.NVML_DEVICE_ARCH_MAXWELL: "Maxwell",
    pynvml.NVML_DEVICE_ARCH_PASCAL: "Pascal",
    pynvml.NVML_DEVICE_ARCH_VOLTA: "Volta",
    pynvml.NVML_DEVICE_ARCH_TURING: "Turing",
    pynvml.NVML_DEVICE_ARCH_AMPERE: "Ampere",
    pynvml.NVML_DEVICE_ARCH_ADA: "Ada Lovelace",
    pynvml.NVML_DEVICE_ARCH_HOPPER: "Hopper",
    pynvml.NVML_DEVICE_ARCH_BLACKWELL: "Blackwell",
    getattr(pynvml, "NVML_DEVICE_ARCH_RUBIN", 13): "Rubin",
}


def _brand_names() -> dict[int, str]:
    names: dict[int, str] = {}
    # Sorted so that of two aliases for one value (VGAMING, CLOUD_GAMING) the same one always wins.
    for attr in sorted(dir(pynvml)):
        if attr.startswith("NVML_BRAND_") and attr != "NVML_BRAND_COUNT":
            value = getattr(pynvml, attr)
            names.setdefault(value, "".join(p.capitalize() for p in attr[len("NVML_BRAND_"):].split("_")))
    return names


BRANDS = _brand_names()
# Failures that mean "this optional fact is not available here", not "this GPU is broken".
_DEGRADE = (
    pynvml.NVMLError_NotSupported,
    pynvml.NVMLError_FunctionNotFound,
    pynvml.NVMLError_NotFound,
    pynvml.NVMLError_InvalidArgument,
    pynvml.NVMLError_NoPermission,
    pynvml.NVMLError_Unknown,
)

PcieRootLookup = Callable[[str], "str | None"]


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def normalize_bus_id(bus_id: str | bytes) -> str:
    """'00000000:1B:00.0' -> '0000:1b:00.0' (lowercase hex, 4-digit domain as sysfs names it)."""
    text = _text(bus_id).strip().lower()
    domain, bus, rest = text.split(":")
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{rest}"


def cuda_version_text(version: int) -> str:
    """13000 -> '13.0', 12040 -> '12.4' (NVML's CUDA_DRIVER_VERSION encoding)."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def nvlink_domain_id(member_uuids: list[str]) -> str:
    """A stable id for an NVLink domain, derived from its members' sorted UUIDs."""
    digest = hashlib.sha256("\n".join(sorted(member_uuids)).encode()).hexdigest()
    return f"nvlink-{digest[:16]}"


@dataclass
class _LinkFacts:
    gpu_links: set[str]  # bus ids of peer GPUs reached directly
    switch_links: int
    fabric: tuple[str, int] | None


def discover(nvml: NvmlBackend, node_name: str, *, pcie_root_of: PcieRootLookup | None = None) -> Inventory:
    """Discover the node's GPUs. `pcie_root_of(bus_id)` defaults to the backend's `pcie_root`."""
    lookup: PcieRootLookup = pcie_root_of or nvml.pcie_root
    driver_version = _text(nvml.nvmlSystemGetDriverVersion())
    try:
        cuda = nvml.nvmlSystemGetCudaDriverVersion_v2()
    except (pynvml.NVMLError_FunctionNotFound, AttributeError):
        cuda = nvml.nvmlSystemGetCudaDriverVersion()
    count = nvml.nvmlDeviceGetCount()
    gpus: list[Gpu] = []
    links: dict[str, _LinkFacts] = {}
    skipped: list[tuple[str, str]] = []
    for index in range(count):
        ident = f"index {index}"
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            ident = _text(nvml.nvmlDeviceGetUUID(handle))
            gpu, facts, mig_skips = _discover_gpu(nvml, handle, index, ident, lookup)
        except pynvml.NVMLError as exc:
            skipped.append((ident, f"NVML query failed: {exc}"))
            continue
        gpus.append(gpu)
        links[gpu.uuid] = facts
        skipped.extend(mig_skips)
    gpus = _assign_nvlink_domains(gpus, links)
    return Inventory(
        node=node_name,
        driver_version=driver_version,
        cuda_driver_version=cuda_version_text(int(cuda)),
        gpus=tuple(gpus),
        skipped=tuple(skipped),
    )


# nvmlDeviceGetAddressingMode values, named as go-nvlib's GetAddressingModeAsString (NVIDIA's driver publishes these).
ADDRESSING_MODES: dict[int, str] = {
    pynvml.NVML_DEVICE_ADDRESSING_MODE_NONE: "None",
    pynvml.NVML_DEVICE_ADDRESSING_MODE_HMM: "HMM",
    pynvml.NVML_DEVICE_ADDRESSING_MODE_ATS: "ATS",
}


def _not_supported(*_args: Any) -> Any:
    """Stands in for an NVML entry point the backend lacks (an older pynvml or driver)."""
    raise pynvml.NVMLError_FunctionNotFound(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


def _optional(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except _DEGRADE:
        return None


def _discover_gpu(
    nvml: NvmlBackend, handle: Any, index: int, uuid: str, pcie_root_of: PcieRootLookup
) -> tuple[Gpu, _LinkFacts, list[tuple[str, str]]]:
    name = _text(nvml.nvmlDeviceGetName(handle))
    brand = BRANDS.get(int(nvml.nvmlDeviceGetBrand(handle)), "Unknown")
    arch_value = _optional(nvml.nvmlDeviceGetArchitecture, handle)
    architecture = ARCHITECTURES.get(int(arch_value), "Unknown") if arch_value is not None else "Unknown"
    major, minor_cc = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    memory = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
    pci = nvml.nvmlDeviceGetPciInfo(handle)
    bus_id = normalize_bus_id(pci.busId or pci.busIdLegacy)
    minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
    numa = _optional(nvml.nvmlDeviceGetNumaNodeId, handle)
    numa_node = int(numa) if numa is not None and int(numa) >= 0 else None
    try:
        pcie_root = pcie_root_of(bus_id)
    except OSError:
        pcie_root = None

    mig_mode = _optional(nvml.nvmlDeviceGetMigMode, handle)
    mig_capable = mig_mode is not None
    mig_enabled = bool(mig_mode and int(mig_mode[0]) == pynvml.NVML_DEVICE_MIG_ENABLE)
    profiles = _mig_profiles(nvml, handle) if mig_capable else ()
    mig_devices, mig_skips = _mig_devices(nvml, handle, uuid, profiles) if mig_enabled else ((), [])

    nvlinks = _nvlinks(nvml, handle)
    fabric = _fabric(nvml, handle)
    mode = _optional(getattr(nvml, "nvmlDeviceGetAddressingMode", _not_supported), handle)
    facts = _LinkFacts(
        gpu_links={nl.remote_pci_bus_id for nl in nvlinks if nl.active and nl.remote_pci_bus_id and not nl.remote_is_switch},
        switch_links=sum(1 for nl in nvlinks if nl.active and nl.remote_is_switch),
        fabric=fabric,
    )
    gpu = Gpu(
        uuid=uuid,
        index=index,
        minor=minor,
        product_name=name,
        brand=brand,
        architecture=architecture,
        cuda_compute_capability=f"{major}.{minor_cc}",
        memory_bytes=memory,
        pci_bus_id=bus_id,
        pcie_root=pcie_root,
        numa_node=numa_node,
        mig_capable=mig_capable,
        mig_enabled=mig_enabled,
        mig_profiles=profiles,
        mig_devices=mig_devices,
        nvlinks=tuple(nvlinks),
        fabric_cluster_uuid=fabric[0] if fabric else None,
        fabric_clique_id=fabric[1] if fabric else None,
        memory_slices=max((p.start + p.size for prof in profiles for p in prof.placements), default=0),
        compute_slices=max((prof.compute_slices for prof in profiles), default=0),
        health=Health(),
        addressing_mode=ADDRESSING_MODES.get(int(mode)) if mode is not None else None,
    )
    return gpu, facts, mig_skips


def _profile_info(nvml: NvmlBackend, handle: Any, profile: int) -> Any:
    try:
        return nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile)
    except pynvml.NVMLError_FunctionNotFound:
        return nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile, 1)


def _profile_name(info: Any) -> str:
    raw = _text(getattr(info, "name", b"") or b"").strip()
    if raw.startswith("MIG "):
        raw = raw[len("MIG "):]
    if raw:
        return raw
    # v1 structs carry no name: rebuild nvidia-smi's "<slices>g.<GB>gb" from the facts.
    return f"{info.sliceCount}g.{round(info.memorySizeMB / 1024)}gb"


def _placements(nvml: NvmlBackend, handle: Any, profile_id: int) -> tuple[MigPlacement, ...]:
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.byref(count))
    if count.value == 0:
        return ()
    array = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array, ctypes.byref(count))
    return tuple(MigPlacement(int(array[i].start), int(array[i].size)) for i in range(count.value))


def _mig_profiles(nvml: NvmlBackend, handle: Any) -> tuple[MigProfile, ...]:
    out: list[MigProfile] = []
    for profile in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        info = _optional(_profile_info, nvml, handle, profile)
        if info is None or info.instanceCount == 0:
            continue
        placements = _optional(_placements, nvml, handle, int(info.id)) or ()
        out.append(
            MigProfile(
                name=_profile_name(info),
                profile_id=int(info.id),
                count=int(info.instanceCount),
                memory_bytes=int(info.memorySizeMB) * _MIB,
                multiprocessors=int(info.multiprocessorCount),
                copy_engines=int(info.copyEngineCount),
                decoders=int(info.decoderCount),
                encoders=int(info.encoderCount),
                jpeg_engines=int(info.jpegCount),
                ofa_engines=int(info.ofaCount),
                placements=placements,
                memory_slices=max((p.size for p in placements), default=0),
                compute_slices=int(info.sliceCount),
            )
        )
    # nvidia-smi's order: by compute slices, then memory, then profile id.
    out.sort(key=lambda p: (p.compute_slices, p.memory_bytes, p.profile_id))
    return tuple(out)


def _mig_devices(
    nvml: NvmlBackend, handle: Any, gpu_uuid: str, profiles: tuple[MigProfile, ...]
) -> tuple[tuple[MigDevice, ...], list[tuple[str, str]]]:
    by_id = {p.profile_id: p for p in profiles}
    devices: list[MigDevice] = []
    skipped: list[tuple[str, str]] = []
    max_count = _optional(nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
    for i in range(int(max_count)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except pynvml.NVMLError_NotFound:
            continue
        except pynvml.NVMLError as exc:
            skipped.append((f"{gpu_uuid} MIG index {i}", f"NVML query failed: {exc}"))
            continue
        ident = f"{gpu_uuid} MIG index {i}"
        try:
            ident = _text(nvml.nvmlDeviceGetUUID(mig))
            gi_id = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
            ci_id = int(nvml.nvmlDeviceGetComputeInstanceId(mig))
            memory = int(nvml.nvmlDeviceGetMemoryInfo(mig).total)
            gi_info = nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id))
        except pynvml.NVMLError as exc:
            skipped.append((ident, f"NVML query failed: {exc}"))
            continue
        profile = by_id.get(int(gi_info.profileId))
        if profile is None:
            skipped.append((ident, f"GPU instance {gi_id} has profile id {gi_info.profileId}, which the GPU does not list"))
            continue
        devices.append(
            MigDevice(
                uuid=ident,
                profile=profile.name,
                placement=MigPlacement(int(gi_info.placement.start), int(gi_info.placement.size)),
                memory_bytes=memory,
                multiprocessors=profile.multiprocessors,
                copy_engines=profile.copy_engines,
                decoders=profile.decoders,
                encoders=profile.encoders,
                jpeg_engines=profile.jpeg_engines,
                ofa_engines=profile.ofa_engines,
                gpu_instance_id=gi_id,
                compute_instance_id=ci_id,
            )
        )
    devices.sort(key=lambda d: (d.placement.start, d.gpu_instance_id))
    return tuple(devices), skipped


def _nvlinks(nvml: NvmlBackend, handle: Any) -> list[NvLink]:
    links: list[NvLink] = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except _DEGRADE:
            # NOT_SUPPORTED on link 0: no NVLink; INVALID_ARGUMENT: past the GPU's last link.
            break
        active = int(state) == pynvml.NVML_FEATURE_ENABLED
        remote: str | None = None
        is_switch = False
        if active:
            pci = _optional(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            remote = normalize_bus_id(pci.busId or pci.busIdLegacy) if pci is not None else None
            kind = _optional(nvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
            is_switch = kind is not None and int(kind) == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
        links.append(NvLink(link=link, active=active, remote_pci_bus_id=None if is_switch else remote, remote_is_switch=is_switch))
    return links


def _fabric(nvml: NvmlBackend, handle: Any) -> tuple[str, int] | None:
    """(clusterUuid, cliqueId) when the GPU is registered in an NVLink fabric (GB200 NVL-style)."""
    info: Any = pynvml.c_nvmlGpuFabricInfoV_t()
    try:
        nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
    except (pynvml.NVMLError_FunctionNotFound, AttributeError):
        info = pynvml.c_nvmlGpuFabricInfo_t()
        if _optional(nvml.nvmlDeviceGetGpuFabricInfo, handle, ctypes.byref(info)) is None:
            return None
    except _DEGRADE:
        return None
    if int(info.state) != pynvml.NVML_GPU_FABRIC_STATE_COMPLETED or int(info.status) != pynvml.NVML_SUCCESS:
        return None
    raw = bytes(info.clusterUuid)
    if not any(raw):
        return None
    return str(uuidlib.UUID(bytes=raw)), int(info.cliqueId)


def _assign_nvlink_domains(gpus: list[Gpu], links: dict[str, _LinkFacts]) -> list[Gpu]:
    """Union GPUs reachable over NVLink (directly or through the node's NVSwitches) into domains."""
    parent = {g.uuid: g.uuid for g in gpus}

    def find(u: str) -> str:
        while parent[u] != u:
            parent[u] = parent[parent[u]]
            u = parent[u]
        return u

    def union(a: str, b: str) -> None:
        parent[find(a)] = find(b)

    by_bus = {g.pci_bus_id: g.uuid for g in gpus}
    switched = [g.uuid for g in gpus if links[g.uuid].switch_links]
    for other in switched[1:]:
        union(switched[0], other)
    for g in gpus:
        for bus in links[g.uuid].gpu_links:
            if bus in by_bus:
                union(g.uuid, by_bus[bus])
    members: dict[str, list[str]] = {}
    for g in gpus:
        members.setdefault(find(g.uuid), []).append(g.uuid)
    out: list[Gpu] = []
    for g in gpus:
        facts = links[g.uuid]
        group = members[find(g.uuid)]
        if facts.fabric is not None:
            domain: str | None = f"{facts.fabric[0]}.{facts.fabric[1]}"
        elif len(group) > 1 or facts.switch_links:
            domain = nvlink_domain_id(group)
        else:
            domain = None
        out.append(replace(g, nvlink_domain=domain))
    return out
