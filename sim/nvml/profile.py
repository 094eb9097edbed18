"""Simulator profiles: YAML descriptions of a node's GPUs, validated by pydantic.

A profile names the node's driver, a few GPU *models* (product facts: memory, compute
capability, MIG profile table) and the GPUs themselves (bus id, NUMA node, PCIe root,
NVLink wiring, MIG state). docs/simulator.md documents the format for users who write
profiles for their own hardware.
"""

from __future__ import annotations

import uuid as uuidlib
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

import pynvml
import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from driver.nvmlapi import BackendConfigError

PROFILE_PACKAGE = "sim.nvml.profiles"


class ProfileError(BackendConfigError):
    """A simulator profile that cannot be loaded: the message names the file and the field path."""


class _Model(BaseModel):
    # Unknown keys are errors: a misspelt field must not be silently ignored.
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


def _enum_names(prefix: str) -> list[str]:
    return sorted(name[len(prefix):] for name in dir(pynvml) if name.startswith(prefix) and name != prefix + "COUNT")


def _nvml_enum(prefix: str, what: str) -> AfterValidator:
    """A field check that the value names one of pynvml's `<prefix>*` constants."""

    def check(value: str) -> str:
        allowed = _enum_names(prefix)
        if value not in allowed:
            raise ValueError(f"unknown {what} {value!r}; accepted: {', '.join(allowed)}")
        return value

    return AfterValidator(check)


def nvml_constant(prefix: str, suffix: str) -> int:
    """The value of pynvml's `<prefix><suffix>` constant (e.g. NVML_BRAND_ + NVIDIA)."""
    return int(getattr(pynvml, prefix + suffix))


class MigProfileSpec(_Model):
    """One GPU-instance profile as `nvidia-smi mig -lgip` / -lgipp report it."""

    profile: Annotated[str, _nvml_enum("NVML_GPU_INSTANCE_PROFILE_", "GPU instance profile")] = Field(
        description="NVML_GPU_INSTANCE_PROFILE_<profile>, e.g. 1_SLICE, 1_SLICE_REV1"
    )
    id: int = Field(ge=0, description="the profile id nvidia-smi shows (19 for 1g.10gb)")
    name: str = Field(pattern=r"^\d+g\.\d+gb(\+me|\+gfx|-me)?$")
    slices: int = Field(ge=1, le=8, description="compute slices (the 'Ng' part)")
    instance_count: int = Field(alias="instanceCount", ge=1)
    memory_mib: int = Field(alias="memoryMiB", ge=1)
    multiprocessors: int = Field(ge=1)
    copy_engines: int = Field(alias="copyEngines", ge=0)
    decoders: int = Field(ge=0)
    encoders: int = Field(ge=0)
    jpeg_engines: int = Field(alias="jpegEngines", ge=0)
    ofa_engines: int = Field(alias="ofaEngines", ge=0)
    p2p: bool = False
    placement_starts: tuple[int, ...] = Field(alias="placementStarts", min_length=1)
    placement_size: int = Field(alias="placementSize", ge=1, le=8)

    @property
    def enum_value(self) -> int:
        return nvml_constant("NVML_GPU_INSTANCE_PROFILE_", self.profile)


class GpuModelSpec(_Model):
    """Facts of one GPU product, shared by all GPUs of that model in the profile."""

    product_name: str = Field(alias="productName", min_length=1)
    brand: Annotated[str, _nvml_enum("NVML_BRAND_", "brand")] = "NVIDIA"
    architecture: Annotated[str, _nvml_enum("NVML_DEVICE_ARCH_", "architecture")]
    cuda_compute_capability: str = Field(alias="cudaComputeCapability", pattern=r"^\d+\.\d+$")
    memory_mib: int = Field(alias="memoryMiB", ge=1)
    pci_device_id: int = Field(alias="pciDeviceId", ge=0)
    pci_subsystem_id: int = Field(default=0, alias="pciSubSystemId", ge=0)
    nvlink_count: int = Field(default=0, alias="nvlinkCount", ge=0, le=pynvml.NVML_NVLINK_MAX_LINKS)
    mig_profiles: tuple[MigProfileSpec, ...] = Field(default=(), alias="migProfiles")
    fabric_capable: bool = Field(default=False, alias="fabricCapable")
    # nvmlDeviceGetAddressingMode: HMM or ATS on coherent-memory platforms (Grace), None there when inactive;
    # unset where the platform does not support it (NVML answers NOT_SUPPORTED).
    addressing_mode: Literal["None", "HMM", "ATS"] | None = Field(default=None, alias="addressingMode")

    @model_validator(mode="after")
    def _unique_profiles(self) -> GpuModelSpec:
        seen: set[str] = set()
        for p in self.mig_profiles:
            if p.profile in seen:
                raise ValueError(f"migProfiles: profile {p.profile} listed twice")
            seen.add(p.profile)
        return self

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    @property
    def memory_slices(self) -> int:
        return max((max(p.placement_starts) + p.placement_size for p in self.mig_profiles), default=0)


class NvLinkSpec(_Model):
    """One NVLink of a GPU: to a peer GPU (by index in `gpus`) or to an NVSwitch (by PCI bus id)."""

    peer: int | None = Field(default=None, ge=0)
    switch: str | None = None
    active: bool = True

    @model_validator(mode="after")
    def _one_end(self) -> NvLinkSpec:
        if self.active and (self.peer is None) == (self.switch is None):
            raise ValueError("an active link names exactly one of peer (GPU index) or switch (PCI bus id)")
        return self


class MigDeviceSpec(_Model):
    """An existing MIG device: a GPU instance of `profile` at placement `start`, with its full compute instance."""

    profile: str
    start: int = Field(ge=0)
    uuid: str | None = Field(default=None, pattern=r"^MIG-[0-9a-f-]+$")


class GpuSpec(_Model):
    model: str
    uuid: str = Field(pattern=r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
    pci_bus_id: str = Field(alias="pciBusId", pattern=r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
    pcie_root: str | None = Field(default=None, alias="pcieRoot", pattern=r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
    numa_node: int | None = Field(default=None, alias="numaNode", ge=0)
    minor: int | None = Field(default=None, ge=0)
    mig_enabled: bool = Field(default=False, alias="migEnabled")
    mig_devices: tuple[MigDeviceSpec, ...] = Field(default=(), alias="migDevices")
    nvlinks: tuple[NvLinkSpec, ...] | None = None


class NvSwitchSpec(_Model):
    """NVSwitch wiring: every GPU's links go round-robin to these switches (DGX/HGX baseboards)."""

    pci_bus_ids: tuple[str, ...] = Field(alias="pciBusIds", min_length=1)


class FabricSpec(_Model):
    """NVLink fabric membership (GB200 NVL-style): all GPUs of the node are in this clique."""

    cluster_uuid: str = Field(alias="clusterUuid", pattern=r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
    clique_id: int = Field(alias="cliqueId", ge=0)


class Profile(_Model):
    name: str
    description: str = ""
    driver_version: str = Field(alias="driverVersion", pattern=r"^\d+\.\d+(\.\d+)?$")
    cuda_driver_version: int = Field(alias="cudaDriverVersion", ge=1000, description="e.g. 13000 for CUDA 13.0")
    models: dict[str, GpuModelSpec]
    gpus: tuple[GpuSpec, ...] = Field(min_length=0)
    nvswitch: NvSwitchSpec | None = None
    fabric: FabricSpec | None = None
    kind: Literal["gpu-dra/nvml-profile"] = "gpu-dra/nvml-profile"

    @model_validator(mode="after")
    def _consistent(self) -> Profile:
        uuids: set[str] = set()
        buses: set[str] = set()
        for i, gpu in enumerate(self.gpus):
            where = f"gpus.{i}"
            if gpu.model not in self.models:
                raise ValueError(f"{where}.model: unknown model {gpu.model!r}; defined: {', '.join(sorted(self.models))}")
            if gpu.uuid in uuids:
                raise ValueError(f"{where}.uuid: {gpu.uuid} is used twice")
            uuids.add(gpu.uuid)
            if gpu.pci_bus_id in buses:
                raise ValueError(f"{where}.pciBusId: {gpu.pci_bus_id} is used twice")
            buses.add(gpu.pci_bus_id)
            model = self.models[gpu.model]
            if (gpu.mig_enabled or gpu.mig_devices) and not model.mig_capable:
                raise ValueError(f"{where}.migEnabled: model {gpu.model!r} has no migProfiles, so it is not MIG capable")
            if gpu.mig_devices and not gpu.mig_enabled:
                raise ValueError(f"{where}.migDevices: MIG devices need migEnabled: true")
            _check_mig_layout(where, model, gpu.mig_devices)
            if gpu.nvlinks is not None:
                if len(gpu.nvlinks) > model.nvlink_count:
                    raise ValueError(
                        f"{where}.nvlinks: {len(gpu.nvlinks)} links listed but model {gpu.model!r} has nvlinkCount {model.nvlink_count}"
                    )
                for j, link in enumerate(gpu.nvlinks):
                    if link.peer is not None and (link.peer >= len(self.gpus) or link.peer == i):
                        raise ValueError(f"{where}.nvlinks.{j}.peer: {link.peer} is not another GPU's index (0..{len(self.gpus) - 1})")
        return self


def _check_mig_layout(where: str, model: GpuModelSpec, devices: tuple[MigDeviceSpec, ...]) -> None:
    """Reject MIG layouts the hardware would refuse: unknown profile, bad start, overlap, too many."""
    by_name = {p.name: p for p in model.mig_profiles}
    used: set[int] = set()
    counts: dict[str, int] = {}
    compute = 0
    for j, dev in enumerate(devices):
        p = by_name.get(dev.profile)
        if p is None:
            raise ValueError(f"{where}.migDevices.{j}.profile: unknown profile {dev.profile!r}; accepted: {', '.join(by_name)}")
        if dev.start not in p.placement_starts:
            raise ValueError(
                f"{where}.migDevices.{j}.start: {dev.start} is not a placement of {p.name}; accepted: {list(p.placement_starts)}"
            )
        slots = set(range(dev.start, dev.start + p.placement_size))
        if slots & used:
            raise ValueError(f"{where}.migDevices.{j}: {p.name} at {dev.start} overlaps another MIG device")
        used |= slots
        counts[p.name] = counts.get(p.name, 0) + 1
        if counts[p.name] > p.instance_count:
            raise ValueError(f"{where}.migDevices.{j}: more than {p.instance_count} instances of {p.name}")
        compute += p.slices
    max_compute = max((p.slices for p in model.mig_profiles), default=0)
    if compute > max_compute:
        raise ValueError(f"{where}.migDevices: {compute} compute slices used, the GPU has {max_compute}")


# Namespace of the per-node UUIDs (a fixed uuid5 of the project's name, so derived UUIDs never change).
NODE_UUID_NAMESPACE = uuidlib.uuid5(uuidlib.NAMESPACE_DNS, "gpu-dra.sim.node-identity")


def node_uuid(node: str, profile_uuid: str) -> str:
    """The UUID a GPU or MIG device of `profile_uuid` has on `node`: same prefix (GPU-/MIG-), uuid5 body.

    Real GPUs never share UUIDs, so two simulated nodes running one profile must not either; deriving them
    from the node name keeps them stable across restarts of the same node (stable device names)."""
    prefix, _, _ = profile_uuid.partition("-")
    return f"{prefix}-{uuidlib.uuid5(NODE_UUID_NAMESPACE, f'{node}/{profile_uuid}')}"


def profile_for_node(profile: Profile, node: str) -> Profile:
    """`profile` as node `node` reports it: every GPU and explicit MIG UUID derived from (node, profile UUID).

    PCI ids, topology and the fabric cluster UUID and clique id stay as written: they are either per-machine
    facts that repeat across identical machines or, for the fabric, shared by all nodes of one NVLink fabric."""
    if not node:
        raise ValueError("profile_for_node: node name is empty; accepted: the node's name")
    gpus = tuple(
        gpu.model_copy(update={
            "uuid": node_uuid(node, gpu.uuid),
            "mig_devices": tuple(
                dev.model_copy(update={"uuid": node_uuid(node, dev.uuid)}) if dev.uuid else dev for dev in gpu.mig_devices
            ),
        })
        for gpu in profile.gpus
    )
    return profile.model_copy(update={"gpus": gpus})


def shipped_profiles() -> list[str]:
    """Names of the profiles that ship with gpu-dra (sim:NAME)."""
    root = resources.files(PROFILE_PACKAGE)
    return sorted(p.name[: -len(".yaml")] for p in root.iterdir() if p.name.endswith(".yaml"))


def _format_error(source: str, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        path = ".".join(str(part) for part in e["loc"]) or "(top level)"
        lines.append(f"{source}: {path}: {e['msg']}")
    return "\n".join(lines)


def parse_profile(text: str, source: str) -> Profile:
    """Parse profile YAML; errors name `source` and the field path."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ProfileError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: (top level): expected a mapping with name, driverVersion, models and gpus")
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(_format_error(source, exc)) from exc


def load_profile(name_or_path: str) -> Profile:
    """Load a shipped profile by name (`dgx-h100`) or a profile file by path."""
    if "/" in name_or_path or name_or_path.endswith((".yaml", ".yml")):
        path = Path(name_or_path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ProfileError(f"{path}: cannot read profile: {exc.strerror or exc}") from exc
        return parse_profile(text, str(path))
    names = shipped_profiles()
    if name_or_path not in names:
        raise ProfileError(
            f"sim:{name_or_path}: unknown simulator profile; shipped: {', '.join(names)} (or give a path: sim:/path/profile.yaml)"
        )
    resource = resources.files(PROFILE_PACKAGE).joinpath(f"{name_or_path}.yaml")
    return parse_profile(resource.read_text(encoding="utf-8"), f"profiles/{name_or_path}.yaml")
