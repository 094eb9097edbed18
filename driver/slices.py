"""Inventory -> ResourceSlices: the pure function behind everything a node publishes.

Device names are derived from hardware identity (GPU UUIDs and MIG placements), never from NVML
enumeration order, so that a reboot that renumbers GPUs does not rename devices that claims were
allocated against. `gpu_device_name` and `mig_device_name` are the only place names come from.

Naming (all DNS labels, <= 63 characters):
- full GPU: ``gpu-<h>`` where ``<h>`` is the first 12 hex digits of sha256(lowercased GPU UUID).
  A hash rather than the UUID's own digits, because simulated and some virtualised GPUs carry UUIDs
  that differ only in their last digits.
- MIG device or MIG placement: ``gpu-<h>-mig-<profile>-<start>``, profile lowercased with every run
  of other characters turned into ``-`` (``1g.10gb+me`` -> ``1g-10gb-me``), ``<start>`` the placement's
  first memory slice. An existing MIG device and the placement it occupies share one name, so a
  pool keeps its names when MIG devices are recreated (they get new UUIDs) or when switching between
  static and partitionable publication.

Health is published as device taints (`DRADeviceTaints` is alpha in 1.35: the API server stores the
field in v1 whatever the gate; schedulers without the gate ignore it, so it is advisory there).
A MIG device (and the placement it occupies) is tainted from its parent GPU's health combined with its
own (`MigDevice.health`: Xids charged to its GPU instance), so a parent fault taints every MIG device on
that GPU and a MIG device's own Xid taints only that device.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from driver.inventory import APPLICATION_XIDS, Gpu, Health, Inventory, MigDevice, MigPlacement, MigProfile
from gpudra import DEFAULT_DRIVER_NAME
from gpudra.bindingconditions import mig_conditions

STANDARD_DOMAIN = "resource.kubernetes.io"

# Kubernetes' ResourceSlice limits (resource.k8s.io/v1, 1.35).
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS = 64
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_COUNTERS_PER_SET = 32
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_TAINTS_PER_DEVICE = 16
MAX_SLICE_NAME = 253
MAX_DNS_LABEL = 63
MAX_STRING_ATTRIBUTE = 64

# APPLICATION_XIDS (driver.inventory): Xids NVIDIA treats as application errors, not GPU faults; the GPU stays
# schedulable, so their taint carries effect None (informational).

# MIG engine counts: (capacity name, counter name, MigProfile/MigDevice attribute).
_ENGINE_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("multiprocessors", "multiprocessors", "multiprocessors"),
    ("copyEngines", "copy-engines", "copy_engines"),
    ("decoders", "decoders", "decoders"),
    ("encoders", "encoders", "encoders"),
    ("jpegEngines", "jpeg-engines", "jpeg_engines"),
    ("ofaEngines", "ofa-engines", "ofa_engines"),
)


class SliceBuildError(ValueError):
    """The inventory cannot be published as asked (e.g. two devices would share a name)."""


@dataclass(frozen=True)
class SliceSettings:
    node_name: str
    driver_name: str = DEFAULT_DRIVER_NAME
    generation: int = 0
    # DRAPartitionableDevices: publish MIG-capable GPUs as counter sets plus every MIG placement.
    partitionable: bool = False
    # Static split: GPUs the legacy device plugin owns are not published at all.
    reserved_uuids: frozenset[str] = frozenset()
    # Device name -> additional taints (dicts with key, value, effect), e.g. from the node ledger.
    extra_taints: Mapping[str, Sequence[Mapping[str, str]]] = field(default_factory=dict)
    # When set, every slice is owned by the Node so that deleting the Node garbage-collects them.
    node_uid: str | None = None
    # DRAConsumableCapacity: full GPUs are shared by capacity (allowMultipleAllocations; `memory` and
    # `computeShare` consumed per claim, enforced at prepare through MPS client limits).
    shared_capacity: bool = False
    # KEP-5007: MIG placements carry binding conditions, so the scheduler binds a pod only once the node agent has
    # created the MIG instance (gpudra.bindingconditions). Needs DRADeviceBindingConditions (on from 1.36).
    binding_conditions: bool = False

    def __post_init__(self) -> None:
        if not _is_dns_subdomain(self.node_name, MAX_SLICE_NAME):
            raise ValueError(
                f"SliceSettings.node_name {self.node_name!r}: a node name must be a DNS subdomain "
                "(lowercase letters, digits, '-' and '.', at most 253 characters)"
            )
        if not _is_dns_subdomain(self.driver_name, MAX_DNS_LABEL):
            raise ValueError(
                f"SliceSettings.driver_name {self.driver_name!r}: a driver name must be a DNS subdomain "
                "of at most 63 characters, e.g. gpu.nvidia.com"
            )
        if self.generation < 0:
            raise ValueError(f"SliceSettings.generation {self.generation}: must be >= 0")
        if self.shared_capacity and self.partitionable:
            raise ValueError("SliceSettings: shared capacity and partitionable devices exclude each other (a full GPU "
                             "shared by capacity cannot also be split into MIG placements)")


_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _is_dns_subdomain(text: str, max_len: int) -> bool:
    return 0 < len(text) <= max_len and all(
        len(label) <= MAX_DNS_LABEL and _DNS_LABEL_RE.match(label) for label in text.split(".")
    )


# --- names ---------------------------------------------------------------------------------


def _uuid_hash(uuid: str) -> str:
    return hashlib.sha256(uuid.strip().lower().encode()).hexdigest()[:12]


def _dns_label_part(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def gpu_device_name(gpu: Gpu) -> str:
    """The device name of a full GPU: ``gpu-<12 hex of sha256(uuid)>``."""
    return f"gpu-{_uuid_hash(gpu.uuid)}"


def mig_device_name(gpu: Gpu, mig: MigDevice | MigProfile, placement: MigPlacement | None = None) -> str:
    """The device name of a MIG device, or of a MIG placement (`mig` a profile, `placement` given)."""
    if isinstance(mig, MigDevice):
        profile, where = mig.profile, mig.placement
    else:
        if placement is None:
            raise TypeError(f"mig_device_name: profile {mig.name!r} needs a placement")
        profile, where = mig.name, placement
    prefix = f"{gpu_device_name(gpu)}-mig-"
    suffix = f"-{where.start}"
    part = _dns_label_part(profile) or "profile"
    room = MAX_DNS_LABEL - len(prefix) - len(suffix)
    if len(part) > room:
        # Keep names unique and within a DNS label even for unexpectedly long profile names.
        digest = hashlib.sha256(profile.encode()).hexdigest()[:8]
        part = part[: max(room - 9, 1)].rstrip("-") + "-" + digest
    return prefix + part + suffix


def counter_set_name(gpu: Gpu) -> str:
    return f"{gpu_device_name(gpu)}-counters"


def slice_name(node_name: str, driver_name: str, index: int) -> str:
    """Deterministic slice names (`<node>-<driver>-<i>`) so that reconciliation is by name."""
    suffix = f"-{index}"
    base = f"{node_name}-{driver_name}"
    if len(base) + len(suffix) > MAX_SLICE_NAME:
        digest = hashlib.sha256(base.encode()).hexdigest()[:10]
        keep = MAX_SLICE_NAME - len(suffix) - len(digest) - 1
        base = base[:keep].rstrip(".-") + "-" + digest
    return base + suffix


# --- value formatting ----------------------------------------------------------------------


def binary_quantity(n: int) -> str:
    """Kubernetes' canonical BinarySI form of an integer (81920 MiB -> "80Gi", 1536 -> "1536")."""
    if n == 0:
        return "0"
    value, exp = n, 0
    while exp < 6 and value % 1024 == 0:
        value //= 1024
        exp += 1
    return f"{value}{('', 'Ki', 'Mi', 'Gi', 'Ti', 'Pi', 'Ei')[exp]}"


def semver_of(text: str) -> str | None:
    """Normalise a dotted numeric version to strict semver ("580.95.05" -> "580.95.5", "9.0" -> "9.0.0").

    None when the text is not 1-3 dot-separated numbers: such a version is left out rather than
    published as something a semver() comparison would misorder.
    """
    parts = text.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    nums = [int(p) for p in parts] + [0] * (3 - len(parts))
    return ".".join(str(n) for n in nums)


def _string(v: str) -> dict[str, Any]:
    return {"string": v[:MAX_STRING_ATTRIBUTE]}


# --- health --------------------------------------------------------------------------------


def health_taints(health: Health, driver_name: str) -> list[dict[str, str]]:
    """Taints for an unhealthy device; an empty list for a healthy one (recovery removes them).

    `health` is a full GPU's own, or for a MIG device its parent's combined with its own
    (`mig_health`), so a parent fault taints every MIG device while a MIG device's own Xid taints only it.
    """
    taints: list[dict[str, str]] = []
    if health.lost:
        taints.append({"key": f"{driver_name}/gpu-lost", "effect": "NoSchedule"})
    if health.xids:
        # One Xid taint: the most recent fault if there is one, else the most recent application error.
        faults = [x for x in health.xids if x not in APPLICATION_XIDS]
        xid = faults[-1] if faults else health.xids[-1]
        taints.append(
            {"key": f"{driver_name}/xid", "value": str(xid), "effect": "NoSchedule" if faults else "None"}
        )
    if health.unmonitored:
        # Informational: the GPU works, but its faults would not be seen (a toleration is not needed).
        taints.append({"key": f"{driver_name}/unmonitored", "effect": "None"})
    return taints


def mig_health(gpu: Gpu, mig: MigDevice | None) -> Health:
    """The health a MIG device (or a MIG placement, `mig` the device living there or None) is published with."""
    return gpu.health if mig is None else gpu.health.combined(mig.health)


def _taints_for(name: str, base: Sequence[Mapping[str, str]], settings: SliceSettings) -> list[dict[str, str]]:
    out = [dict(t) for t in base]
    seen = {(t["key"], t.get("effect", "")) for t in out}
    for extra in settings.extra_taints.get(name, ()):
        ident = (extra["key"], extra.get("effect", ""))
        if ident not in seen:
            seen.add(ident)
            out.append(dict(extra))
    return out[:MAX_TAINTS_PER_DEVICE]


# --- devices -------------------------------------------------------------------------------


def _common_attributes(gpu: Gpu, inv: Inventory, first: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Attributes every device of `gpu` carries, after the device-specific `first` ones (type, uuid, ...)."""
    attrs: dict[str, dict[str, Any]] = {
        **first,
        "productName": _string(gpu.product_name),
        "brand": _string(gpu.brand),
        "architecture": _string(gpu.architecture),
    }
    for name, raw in (
        ("cudaComputeCapability", gpu.cuda_compute_capability),
        ("driverVersion", inv.driver_version),
        ("cudaDriverVersion", inv.cuda_driver_version),
    ):
        version = semver_of(raw)
        if version is not None:
            attrs[name] = {"version": version}
    if gpu.nvlink_domain:
        attrs["nvlinkDomain"] = _string(gpu.nvlink_domain)
    if gpu.numa_node is not None and gpu.numa_node >= 0:
        attrs["numaNode"] = {"int": gpu.numa_node}
        # The standard name (Kubernetes 1.37) that CPU, memory and NIC drivers publish too, so `matchAttribute:
        # resource.kubernetes.io/numaNode` aligns devices across drivers; ours stays for existing selectors.
        attrs[f"{STANDARD_DOMAIN}/numaNode"] = {"int": gpu.numa_node}
    if gpu.fabric_cluster_uuid:
        attrs["fabricClusterUUID"] = _string(gpu.fabric_cluster_uuid)
    if gpu.fabric_clique_id is not None:
        attrs["fabricCliqueID"] = {"int": gpu.fabric_clique_id}
    if gpu.pcie_root:
        attrs[f"{STANDARD_DOMAIN}/pcieRoot"] = _string(gpu.pcie_root)
    # A MIG device carries its GPU's bus id and addressing mode too, as NVIDIA's driver publishes them.
    attrs[f"{STANDARD_DOMAIN}/pciBusID"] = _string(gpu.pci_bus_id)
    if gpu.addressing_mode:
        attrs["addressingMode"] = _string(gpu.addressing_mode)
    return attrs


def _gpu_device(gpu: Gpu, inv: Inventory, settings: SliceSettings) -> dict[str, Any]:
    name = gpu_device_name(gpu)
    attrs = _common_attributes(gpu, inv, {"type": _string("gpu"), "uuid": _string(gpu.uuid)})
    attrs["migCapable"] = {"bool": gpu.mig_capable}
    attrs["migEnabled"] = {"bool": gpu.mig_enabled}
    device: dict[str, Any] = {
        "name": name,
        "attributes": attrs,
        "capacity": {"memory": {"value": binary_quantity(gpu.memory_bytes)}},
    }
    if settings.shared_capacity and not settings.partitionable:
        device.update(shared_capacity(gpu))
    taints = _taints_for(name, health_taints(gpu.health, settings.driver_name), settings)
    if taints:
        device["taints"] = taints
    return device


# The compute share of a GPU shared by capacity, in percent: what MPS's active thread percentage limits.
COMPUTE_SHARE = "computeShare"


def shared_capacity(gpu: Gpu) -> dict[str, Any]:
    """A full GPU that several claims share by capacity: each takes `memory` (whole GiB, the whole GPU when it
    asks for none) and `computeShare` (1..100 percent, all of it when it asks for none)."""
    memory = binary_quantity(gpu.memory_bytes)
    return {
        "allowMultipleAllocations": True,
        "capacity": {
            "memory": {"value": memory, "requestPolicy": {"default": memory, "validRange": {"min": "1Gi", "step": "1Gi"}}},
            COMPUTE_SHARE: {"value": "100", "requestPolicy": {"default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}}},
        },
    }


def _mig_attributes(gpu: Gpu, inv: Inventory, profile: str, uuid: str | None) -> dict[str, dict[str, Any]]:
    first = {"type": _string("mig"), **({"uuid": _string(uuid)} if uuid else {})}
    return _common_attributes(gpu, inv, {**first, "parentUUID": _string(gpu.uuid), "profile": _string(profile)})


def _mig_capacity(source: MigDevice | MigProfile) -> dict[str, dict[str, str]]:
    cap = {"memory": {"value": binary_quantity(source.memory_bytes)}}
    for cap_name, _, attr in _ENGINE_FIELDS:
        cap[cap_name] = {"value": str(getattr(source, attr))}
    return cap


def _with_memory_slices(device: dict[str, Any], placement: MigPlacement) -> dict[str, Any]:
    """NVIDIA's `memorySlice<i>` capacities (1 per memory slice the placement covers), all of them or, where they
    would take the device past Kubernetes' 32 attributes and capacities, none (the placement's start is also in
    the device name, and with --partitionable the memory-slice counters say the same)."""
    slices = {f"memorySlice{i}": {"value": "1"} for i in range(placement.start, placement.start + placement.size)}
    if len(device["attributes"]) + len(device["capacity"]) + len(slices) <= MAX_ATTRIBUTES_AND_CAPACITIES:
        device["capacity"].update(slices)
    return device


def _mig_device(gpu: Gpu, mig: MigDevice, inv: Inventory, settings: SliceSettings) -> dict[str, Any]:
    name = mig_device_name(gpu, mig)
    attrs = _mig_attributes(gpu, inv, mig.profile, mig.uuid)
    device: dict[str, Any] = _with_memory_slices(
        {"name": name, "attributes": attrs, "capacity": _mig_capacity(mig)}, mig.placement)
    taints = _taints_for(name, health_taints(mig_health(gpu, mig), settings.driver_name), settings)
    if taints:
        device["taints"] = taints
    return device


# --- partitionable (KEP 4815) --------------------------------------------------------------


def _placements(gpu: Gpu) -> list[tuple[MigProfile, MigPlacement]]:
    pairs = [(p, pl) for p in gpu.mig_profiles for pl in p.placements]
    # Larger partitions first, then by profile and position: a stable, readable order.
    return sorted(pairs, key=lambda pp: (-pp[1].size, pp[0].name, pp[1].start))


def _memory_slice_count(gpu: Gpu) -> int:
    ends = [pl.start + pl.size for p in gpu.mig_profiles for pl in p.placements]
    return max([gpu.memory_slices, *ends])


def _profile_counters(profile: MigProfile) -> dict[str, int]:
    counters = {"memory": profile.memory_bytes, "compute-slices": profile.compute_slices}
    for _, counter, attr in _ENGINE_FIELDS:
        counters[counter] = getattr(profile, attr)
    return counters


def _max_concurrent(compute_total: int, pairs: Sequence[tuple[MigProfile, MigPlacement]]) -> dict[str, int]:
    """Per aggregate counter, the largest sum over any set of MIG instances that can coexist.

    Coexisting = disjoint memory slices, compute slices within the GPU's total and each profile
    at most `count` times. Totals at least this large never reject a layout the hardware accepts;
    the memory-slice counters are what rule out overlapping placements. An exhaustive search over
    non-overlapping placements: a few thousand sets for a GPU with 8 memory slices.
    """
    names = list(_profile_counters(pairs[0][0])) if pairs else []
    order = sorted(pairs, key=lambda pp: pp[1].start)
    masks = [((1 << pl.size) - 1) << pl.start for _, pl in order]
    vectors = [tuple(_profile_counters(p).values()) for p, _ in order]
    profile_ids = {name: i for i, name in enumerate(dict.fromkeys(p.name for p, _ in order))}
    which = [profile_ids[p.name] for p, _ in order]
    limits = [1] * len(profile_ids)
    for p, _ in order:
        limits[profile_ids[p.name]] = max(p.count, 1)
    compute = [p.compute_slices for p, _ in order]
    best = [0] * len(names)
    counts = [0] * len(profile_ids)

    def walk(i: int, used: int, compute_used: int, sums: tuple[int, ...]) -> None:
        for k, v in enumerate(sums):
            if v > best[k]:
                best[k] = v
        for j in range(i, len(order)):
            if masks[j] & used or counts[which[j]] >= limits[which[j]]:
                continue
            if compute_total and compute_used + compute[j] > compute_total:
                continue
            counts[which[j]] += 1
            walk(j + 1, used | masks[j], compute_used + compute[j], tuple(a + b for a, b in zip(sums, vectors[j])))
            counts[which[j]] -= 1

    walk(0, 0, 0, (0,) * len(names))
    return dict(zip(names, best))


# (compute slices, placements) -> _max_concurrent result; one per build_slices call, since the
# GPUs of a node usually share one shape and the search is the costly step.
_ShapeCache = dict[tuple[int, tuple[tuple[MigProfile, MigPlacement], ...]], dict[str, int]]


def _gpu_counter_totals(gpu: Gpu, cache: _ShapeCache) -> dict[str, int]:
    shape = (gpu.compute_slices, tuple(_placements(gpu)))
    if shape not in cache:
        cache[shape] = _max_concurrent(*shape)
    totals = dict(cache[shape])
    totals["memory"] = max(totals.get("memory", 0), gpu.memory_bytes)
    if gpu.compute_slices:
        totals["compute-slices"] = gpu.compute_slices
    for i in range(_memory_slice_count(gpu)):
        totals[f"memory-slice-{i}"] = 1
    return {k: v for k, v in totals.items() if v > 0}


def _counter_values(counters: Mapping[str, int]) -> dict[str, dict[str, str]]:
    return {
        name: {"value": binary_quantity(v) if name == "memory" else str(v)}
        for name, v in sorted(counters.items())
        if v > 0
    }


def _counter_set(gpu: Gpu, cache: _ShapeCache) -> dict[str, Any]:
    counters = _counter_values(_gpu_counter_totals(gpu, cache))
    if len(counters) > MAX_COUNTERS_PER_SET:
        raise SliceBuildError(
            f"GPU {gpu.uuid}: {len(counters)} counters needed for its MIG memory slices, "
            f"a counter set holds at most {MAX_COUNTERS_PER_SET}"
        )
    return {"name": counter_set_name(gpu), "counters": counters}


def _placement_device(
    gpu: Gpu, profile: MigProfile, pl: MigPlacement, inv: Inventory, settings: SliceSettings
) -> dict[str, Any]:
    name = mig_device_name(gpu, profile, pl)
    # A MIG device that exists at this placement (created on demand, or beforehand) is shown with its uuid; the
    # device and what it consumes stay the same, so the counters model does not change when instances come and go.
    existing = next((m for m in gpu.mig_devices if m.profile == profile.name and m.placement.start == pl.start), None)
    consumed = _profile_counters(profile)
    for i in range(pl.start, pl.start + pl.size):
        consumed[f"memory-slice-{i}"] = 1
    device: dict[str, Any] = {
        "name": name,
        "attributes": _mig_attributes(gpu, inv, profile.name, existing.uuid if existing is not None else None),
        "capacity": _mig_capacity(profile),
        "consumesCounters": [{"counterSet": counter_set_name(gpu), "counters": _counter_values(consumed)}],
    }
    _with_memory_slices(device, pl)
    if settings.binding_conditions:
        device["bindingConditions"], device["bindingFailureConditions"] = mig_conditions(settings.driver_name)
    # A fault charged to the MIG device living here taints the placement: they share one name, and the faulty
    # instance stays until its claim is unprepared (a recreated instance has a new UUID and starts healthy).
    taints = _taints_for(name, health_taints(mig_health(gpu, existing), settings.driver_name), settings)
    if taints:
        device["taints"] = taints
    return device


# Architectures whose MIG mode change only takes effect after a GPU reset (NVML reports it pending), which a
# node agent cannot do under running workloads: dynamic MIG there is offered only as the mode already is.
MIG_MODE_NEEDS_RESET: frozenset[str] = frozenset({"Ampere"})


def mig_mode_switchable(gpu: Gpu) -> bool:
    """Whether prepare can switch this GPU's MIG mode on and off at will (Hopper and later)."""
    return gpu.architecture not in MIG_MODE_NEEDS_RESET


def _partitionable_gpu(
    gpu: Gpu, inv: Inventory, settings: SliceSettings, cache: _ShapeCache
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    full = _gpu_device(gpu, inv, settings)
    pairs = _placements(gpu)
    if not (gpu.mig_capable and pairs):
        return None, [full]
    switchable = mig_mode_switchable(gpu)
    if not switchable and not gpu.mig_enabled:
        # Ampere with MIG mode off: a placement could only be prepared after a GPU reset. The whole GPU it is.
        return None, [full]
    counter_set = _counter_set(gpu, cache)
    placements = [_placement_device(gpu, p, pl, inv, settings) for p, pl in pairs]
    if not switchable:
        # Ampere with MIG mode on: placements only; the whole GPU would need MIG mode off (a reset) again.
        return counter_set, placements
    # The full GPU consumes every counter, so it excludes and is excluded by any MIG placement.
    full["consumesCounters"] = [{"counterSet": counter_set["name"], "counters": counter_set["counters"]}]
    return counter_set, [full] + placements


# --- slices --------------------------------------------------------------------------------


def _check_device(device: Mapping[str, Any], gpu: Gpu) -> None:
    entries = len(device.get("attributes", {})) + len(device.get("capacity", {}))
    if entries > MAX_ATTRIBUTES_AND_CAPACITIES:
        raise SliceBuildError(
            f"GPU {gpu.uuid}: device {device['name']} has {entries} attributes and capacities, "
            f"at most {MAX_ATTRIBUTES_AND_CAPACITIES} are accepted"
        )


def _chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def build_slices(inventory: Inventory, settings: SliceSettings) -> list[dict[str, Any]]:
    """The ResourceSlices (resource.k8s.io/v1 dicts) of the node's pool, in a deterministic order.

    One pool named after the node. Devices are ordered by PCI address, then UUID, so the result does
    not depend on NVML enumeration order. With `partitionable`, counter sets go into their own
    slices (1.35 forbids mixing them with devices) ahead of the device slices.
    """
    gpus = sorted(
        (g for g in inventory.gpus if g.uuid not in settings.reserved_uuids),
        key=lambda g: (g.pci_bus_id, g.uuid),
    )
    devices: list[dict[str, Any]] = []
    counter_sets: list[dict[str, Any]] = []
    owner: dict[str, str] = {}
    shapes: _ShapeCache = {}
    for gpu in gpus:
        if settings.partitionable:
            counter_set, gpu_devices = _partitionable_gpu(gpu, inventory, settings, shapes)
            if counter_set is not None:
                counter_sets.append(counter_set)
        elif gpu.mig_enabled:
            # A MIG-enabled GPU is not usable whole: only its MIG devices are offered.
            gpu_devices = [
                _mig_device(gpu, m, inventory, settings)
                for m in sorted(gpu.mig_devices, key=lambda m: (m.placement.start, m.profile))
            ]
        else:
            gpu_devices = [_gpu_device(gpu, inventory, settings)]
        for device in gpu_devices:
            _check_device(device, gpu)
            if device["name"] in owner:
                raise SliceBuildError(
                    f"device name {device['name']} is derived for both {owner[device['name']]} and {gpu.uuid}; "
                    "device names must be unique in the pool"
                )
            owner[device["name"]] = gpu.uuid
        devices.extend(gpu_devices)

    limited = any("taints" in d or "consumesCounters" in d for d in devices)
    per_slice = MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS if limited else MAX_DEVICES_PER_SLICE
    specs: list[dict[str, Any]] = [{"sharedCounters": list(c)} for c in _chunks(counter_sets, MAX_COUNTER_SETS_PER_SLICE)]
    specs += [{"devices": list(c)} for c in _chunks(devices, per_slice)]
    if not specs:
        # An empty pool is still published: it tells the scheduler this node has no devices of ours.
        specs = [{"devices": []}]

    slices: list[dict[str, Any]] = []
    for i, body in enumerate(specs):
        metadata: dict[str, Any] = {"name": slice_name(settings.node_name, settings.driver_name, i)}
        if settings.node_uid:
            metadata["ownerReferences"] = [node_owner_reference(settings.node_name, settings.node_uid)]
        spec: dict[str, Any] = {
            "driver": settings.driver_name,
            "nodeName": settings.node_name,
            "pool": {
                "name": settings.node_name,
                "generation": settings.generation,
                "resourceSliceCount": len(specs),
            },
            **body,
        }
        slices.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": metadata, "spec": spec})
    return slices


def node_owner_reference(node_name: str, node_uid: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid, "controller": True}
