"""The typed inventory of one node's GPUs: what discovery produces and what slices are built from.

Plain frozen dataclasses, independent of NVML and of Kubernetes, so that the
inventory -> ResourceSlices step stays a pure function and is easy to test.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class MigPlacement:
    """A slot range on the GPU where a MIG GPU instance of some profile may live."""

    start: int
    size: int


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile the GPU supports, e.g. `1g.10gb`."""

    name: str  # e.g. "1g.10gb", "1g.20gb+me", "7g.80gb"
    profile_id: int  # NVML_GPU_INSTANCE_PROFILE_* value
    count: int  # how many instances of this profile fit on an empty GPU
    memory_bytes: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    placements: tuple[MigPlacement, ...] = ()
    # Memory slices this profile consumes out of the GPU's memory_slices (for partitionable devices).
    memory_slices: int = 0
    # Compute slices (GPCs) this profile consumes out of the GPU's compute_slices.
    compute_slices: int = 0


# Xids that report application faults (NVIDIA's device plugin skips them): the GPU stays healthy and schedulable.
APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})


@dataclass(frozen=True)
class Health:
    """Health signals of one GPU (or MIG device) as last seen by discovery or the health monitor."""

    xids: tuple[int, ...] = ()  # Xid events seen (application errors included), most recent last
    lost: bool = False  # fell off the bus / NVML_ERROR_GPU_IS_LOST
    # Xid events cannot be registered for it: faults would go unseen (the GPU stays usable; an informational taint)
    unmonitored: bool = False

    @property
    def healthy(self) -> bool:
        """No lost GPU and no Xid other than an application error."""
        return not self.lost and all(x in APPLICATION_XIDS for x in self.xids)

    def combined(self, own: Health) -> Health:
        """The health of a device that fails with its parent: `self` the parent's, `own` the device's own.

        A MIG device is unusable when its GPU is lost or has a critical Xid, and also when an Xid was charged
        to it alone. The order of parent and own Xids is not recorded; the device's own go last, so that when
        both have a critical Xid the published taint names the device's own fault.
        """
        if own == Health():
            return self
        return Health(xids=(*self.xids, *own.xids), lost=self.lost or own.lost,
                      unmonitored=self.unmonitored or own.unmonitored)


@dataclass(frozen=True)
class MigDevice:
    """An existing MIG device (a GPU instance with its full compute instance)."""

    uuid: str  # "MIG-..."
    profile: str  # profile name, e.g. "3g.40gb"
    placement: MigPlacement
    memory_bytes: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    gpu_instance_id: int
    compute_instance_id: int
    # Faults charged to this MIG device alone (Xids carrying its GPU-instance id); the parent GPU's own
    # faults live in Gpu.health and apply to every MIG device on it (see Health.combined).
    health: Health = field(default_factory=Health)


@dataclass(frozen=True)
class NvLink:
    link: int
    active: bool
    remote_pci_bus_id: str | None  # None when the remote end is an NVSwitch or unknown
    remote_is_switch: bool = False


@dataclass(frozen=True)
class Gpu:
    uuid: str  # "GPU-..."
    index: int  # NVML enumeration index: internal only, never published
    minor: int  # /dev/nvidia<minor>: internal only, never published
    product_name: str  # e.g. "NVIDIA H100 80GB HBM3"
    brand: str  # e.g. "Nvidia", "Tesla", "Quadro" (NVML brand names without the NVML_BRAND_ prefix, lowercased per NVIDIA's driver)
    architecture: str  # e.g. "Hopper", "Ampere", "Volta", "Turing", "Ada Lovelace", "Blackwell"
    cuda_compute_capability: str  # "9.0"
    memory_bytes: int
    pci_bus_id: str  # normalised "0000:18:00.0" (lowercase hex, 4-digit domain)
    pcie_root: str | None  # e.g. "pci0000:15"
    numa_node: int | None
    mig_capable: bool
    mig_enabled: bool
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_devices: tuple[MigDevice, ...] = ()
    nvlinks: tuple[NvLink, ...] = ()
    nvlink_domain: str | None = None  # GPUs that reach each other over NVLink share one; None if PCIe-only
    # NVLink fabric (GB200-style): cluster uuid and clique id, None elsewhere.
    fabric_cluster_uuid: str | None = None
    fabric_clique_id: int | None = None
    # Totals used for partitionable MIG counters.
    memory_slices: int = 0
    compute_slices: int = 0
    health: Health = field(default_factory=Health)
    # NVML's memory addressing mode on coherent-memory platforms: "HMM", "ATS" or "None"; None where unsupported.
    addressing_mode: str | None = None


@dataclass(frozen=True)
class Inventory:
    node: str
    driver_version: str  # e.g. "580.95.05"
    cuda_driver_version: str  # e.g. "13.0"
    gpus: tuple[Gpu, ...] = ()
    # GPUs whose queries failed: (identifier, message). Reported, never fatal.
    skipped: tuple[tuple[str, str], ...] = ()
