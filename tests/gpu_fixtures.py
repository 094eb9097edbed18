"""Hand-built inventories for slice and publisher tests (no NVML, no simulator)."""

from __future__ import annotations

from dataclasses import replace

from driver.inventory import Gpu, Health, Inventory, MigDevice, MigPlacement, MigProfile

MIB = 1024 * 1024

# H100 80GB HBM3 GPU-instance profiles:
# (name, id, count, MiB, SMs, CE, dec, enc, jpeg, ofa, starts, size, compute slices)
_H100: tuple[tuple[str, int, int, int, int, int, int, int, int, int, tuple[int, ...], int, int], ...] = (
    ("1g.10gb", 19, 7, 9856, 16, 1, 1, 0, 1, 0, (0, 1, 2, 3, 4, 5, 6), 1, 1),
    ("1g.10gb+me", 20, 1, 9856, 16, 1, 1, 0, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1, 1),
    ("1g.20gb", 15, 4, 19968, 26, 1, 1, 0, 1, 0, (0, 2, 4, 6), 2, 1),
    ("2g.20gb", 14, 3, 19968, 32, 2, 2, 0, 2, 0, (0, 2, 4), 2, 2),
    ("3g.40gb", 9, 2, 40192, 60, 3, 3, 0, 3, 0, (0, 4), 4, 3),
    ("4g.40gb", 5, 1, 40192, 64, 4, 4, 0, 4, 0, (0,), 4, 4),
    ("7g.80gb", 0, 1, 80768, 132, 8, 7, 0, 7, 1, (0,), 8, 7),
)

H100_PROFILES: tuple[MigProfile, ...] = tuple(
    MigProfile(
        name=n, profile_id=pid, count=c, memory_bytes=mib * MIB, multiprocessors=sm, copy_engines=ce,
        decoders=dec, encoders=enc, jpeg_engines=jpg, ofa_engines=ofa,
        placements=tuple(MigPlacement(start=s, size=size) for s in starts),
        memory_slices=size, compute_slices=cs,
    )
    for (n, pid, c, mib, sm, ce, dec, enc, jpg, ofa, starts, size, cs) in _H100
)


def h100(i: int, *, mig_enabled: bool = False, health: Health | None = None, bus: int | None = None) -> Gpu:
    b = 0x18 + 0x10 * i if bus is None else bus
    return Gpu(
        uuid=f"GPU-{i:08x}-1111-2222-3333-44445555{i:04x}",
        index=i,
        minor=i,
        product_name="NVIDIA H100 80GB HBM3",
        brand="Nvidia",
        architecture="Hopper",
        cuda_compute_capability="9.0",
        memory_bytes=81559 * MIB,
        pci_bus_id=f"0000:{b:02x}:00.0",
        pcie_root=f"pci0000:{b - 1:02x}",
        numa_node=0 if i < 4 else 1,
        mig_capable=True,
        mig_enabled=mig_enabled,
        mig_profiles=H100_PROFILES,
        nvlink_domain="nvlink-79fb5a60f134808e",  # the published format: nvlink- and 16 hex digits
        memory_slices=8,
        compute_slices=7,
        health=health or Health(),
    )


def mig_device(gpu: Gpu, profile_name: str, start: int, n: int) -> MigDevice:
    p = next(p for p in gpu.mig_profiles if p.name == profile_name)
    size = p.placements[0].size
    return MigDevice(
        uuid=f"MIG-{n:08x}-aaaa-bbbb-cccc-{gpu.index:012x}",
        profile=p.name,
        placement=MigPlacement(start=start, size=size),
        memory_bytes=p.memory_bytes,
        multiprocessors=p.multiprocessors,
        copy_engines=p.copy_engines,
        decoders=p.decoders,
        encoders=p.encoders,
        jpeg_engines=p.jpeg_engines,
        ofa_engines=p.ofa_engines,
        gpu_instance_id=n + 1,
        compute_instance_id=0,
    )


def t4(i: int) -> Gpu:
    """A GPU without MIG."""
    return Gpu(
        uuid=f"GPU-7474{i:04x}-0000-0000-0000-{i:012x}",
        index=i,
        minor=i,
        product_name="Tesla T4",
        brand="Tesla",
        architecture="Turing",
        cuda_compute_capability="7.5",
        memory_bytes=15360 * MIB,
        pci_bus_id=f"0000:{0x80 + i:02x}:00.0",
        pcie_root=None,
        numa_node=None,
        mig_capable=False,
        mig_enabled=False,
    )


def inventory(gpus: list[Gpu] | tuple[Gpu, ...], node: str = "node-a") -> Inventory:
    return Inventory(node=node, driver_version="580.95.05", cuda_driver_version="13.0", gpus=tuple(gpus))


def with_mig(gpu: Gpu, layout: list[tuple[str, int]]) -> Gpu:
    devs = tuple(mig_device(gpu, name, start, n) for n, (name, start) in enumerate(layout))
    return replace(gpu, mig_enabled=True, mig_devices=devs)
