"""Discovery over every shipped simulator profile, checked against each product's published facts."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from driver.discovery import cuda_version_text, discover, normalize_bus_id, nvlink_domain_id
from driver.inventory import Inventory, MigPlacement
from driver.nvml import load_backend
from sim.nvml.profile import shipped_profiles

MIB = 1024 * 1024


@dataclass(frozen=True)
class Product:
    name: str
    count: int
    memory_mib: int
    cc: str
    arch: str
    brand: str
    mig_capable: bool
    nvlink: str  # "switch" (one domain), "mesh" (one domain, direct links), "fabric", "none"


PRODUCTS: dict[str, Product] = {
    "dgx-a100": Product("NVIDIA A100-SXM4-80GB", 8, 81920, "8.0", "Ampere", "Nvidia", True, "switch"),
    "dgx-a100-mig": Product("NVIDIA A100-SXM4-80GB", 8, 81920, "8.0", "Ampere", "Nvidia", True, "switch"),
    "dgx-h100": Product("NVIDIA H100 80GB HBM3", 8, 81559, "9.0", "Hopper", "Nvidia", True, "switch"),
    "h100-mig": Product("NVIDIA H100 80GB HBM3", 8, 81559, "9.0", "Hopper", "Nvidia", True, "switch"),
    "hgx-h200": Product("NVIDIA H200", 8, 143771, "9.0", "Hopper", "Nvidia", True, "switch"),
    "l40s-4": Product("NVIDIA L40S", 4, 46068, "8.9", "Ada Lovelace", "Nvidia", False, "none"),
    "v100-4": Product("Tesla V100-SXM2-32GB", 4, 32768, "7.0", "Volta", "Tesla", False, "mesh"),
    "t4-1": Product("Tesla T4", 1, 15360, "7.5", "Turing", "Tesla", False, "none"),
    "dgx-a100-40gb": Product("NVIDIA A100-SXM4-40GB", 8, 40960, "8.0", "Ampere", "Nvidia", True, "switch"),
    "a30-4": Product("NVIDIA A30", 4, 24576, "8.0", "Ampere", "Nvidia", True, "none"),
    "gb200-nvl": Product("NVIDIA GB200", 4, 189471, "10.0", "Blackwell", "Nvidia", False, "fabric"),
}

# (name, count, MiB, SMs, copy engines, decoders, jpeg, ofa, placement starts, placement size)
A100_80GB = [
    ("1g.10gb", 7, 9728, 14, 1, 0, 0, 0, [0, 1, 2, 3, 4, 5, 6], 1),
    ("1g.10gb+me", 1, 9728, 14, 1, 1, 1, 1, [0, 1, 2, 3, 4, 5, 6], 1),
    ("1g.20gb", 4, 19968, 14, 1, 1, 0, 0, [0, 2, 4, 6], 2),
    ("2g.20gb", 3, 19968, 28, 2, 1, 0, 0, [0, 2, 4], 2),
    ("3g.40gb", 2, 40192, 42, 3, 2, 0, 0, [0, 4], 4),
    ("4g.40gb", 1, 40192, 56, 4, 2, 0, 0, [0], 4),
    ("7g.80gb", 1, 80896, 98, 7, 5, 1, 1, [0], 8),
]
# NVIDIA MIG User Guide, A100-SXM4-40GB and A30-24GB.
A100_40GB = [
    ("1g.5gb", 7, 4864, 14, 1, 0, 0, 0, [0, 1, 2, 3, 4, 5, 6], 1),
    ("1g.5gb+me", 1, 4864, 14, 1, 1, 1, 1, [0, 1, 2, 3, 4, 5, 6], 1),
    ("1g.10gb", 4, 9856, 14, 1, 1, 0, 0, [0, 2, 4, 6], 2),
    ("2g.10gb", 3, 9856, 28, 2, 1, 0, 0, [0, 2, 4], 2),
    ("3g.20gb", 2, 19968, 42, 3, 2, 0, 0, [0, 4], 4),
    ("4g.20gb", 1, 19968, 56, 4, 2, 0, 0, [0], 4),
    ("7g.40gb", 1, 40192, 98, 7, 5, 1, 1, [0], 8),
]
A30_24GB = [
    ("1g.6gb", 4, 5952, 14, 1, 1, 0, 0, [0, 1, 2, 3], 1),
    ("1g.6gb+me", 1, 5952, 14, 1, 1, 1, 1, [0, 1, 2, 3], 1),
    ("2g.12gb", 2, 11968, 28, 2, 2, 0, 0, [0, 2], 2),
    ("2g.12gb+me", 1, 11968, 28, 2, 2, 1, 1, [0, 2], 2),
    ("4g.24gb", 1, 24000, 56, 4, 4, 1, 1, [0], 4),
]
H100_80GB = [
    ("1g.10gb", 7, 9984, 16, 1, 1, 1, 0, [0, 1, 2, 3, 4, 5, 6], 1),
    ("1g.10gb+me", 1, 9984, 16, 1, 1, 1, 1, [0, 1, 2, 3, 4, 5, 6], 1),
    ("1g.20gb", 4, 20096, 26, 1, 1, 1, 0, [0, 2, 4, 6], 2),
    ("2g.20gb", 3, 20096, 32, 2, 2, 2, 0, [0, 2, 4], 2),
    ("3g.40gb", 2, 40448, 60, 3, 3, 3, 0, [0, 4], 4),
    ("4g.40gb", 1, 40448, 64, 4, 4, 4, 0, [0], 4),
    ("7g.80gb", 1, 81152, 132, 8, 7, 7, 1, [0], 8),
]


def _discover(profile: str) -> Inventory:
    return discover(load_backend(f"sim:{profile}"), "node-a")


def test_every_shipped_profile_is_covered() -> None:
    assert set(shipped_profiles()) == set(PRODUCTS)


@pytest.mark.parametrize("profile", sorted(PRODUCTS))
def test_product_facts(profile: str) -> None:
    facts = PRODUCTS[profile]
    inv = _discover(profile)
    assert inv.node == "node-a"
    assert inv.driver_version == "580.95.05"
    assert inv.cuda_driver_version == "13.0"
    assert inv.skipped == ()
    assert len(inv.gpus) == facts.count
    assert len({g.uuid for g in inv.gpus}) == facts.count
    for i, gpu in enumerate(inv.gpus):
        assert gpu.index == i
        assert gpu.product_name == facts.name
        assert gpu.memory_bytes == facts.memory_mib * MIB
        assert gpu.cuda_compute_capability == facts.cc
        assert gpu.architecture == facts.arch
        assert gpu.brand == facts.brand
        assert gpu.mig_capable is facts.mig_capable
        assert gpu.uuid.startswith("GPU-")
        assert gpu.pci_bus_id == normalize_bus_id(gpu.pci_bus_id)
        assert gpu.pcie_root is not None and gpu.pcie_root.startswith("pci")
        assert gpu.numa_node is not None
        assert gpu.health.healthy


@pytest.mark.parametrize("profile", sorted(PRODUCTS))
def test_nvlink_domains(profile: str) -> None:
    kind = PRODUCTS[profile].nvlink
    inv = _discover(profile)
    domains = {g.nvlink_domain for g in inv.gpus}
    if kind == "none":
        assert domains == {None}
        assert all(not g.nvlinks for g in inv.gpus)
    elif kind == "fabric":
        assert domains == {"5c1f5a3e-0b7d-4e61-9d2a-7c3b8e4f1a20.32766"}
        assert all(g.fabric_cluster_uuid == "5c1f5a3e-0b7d-4e61-9d2a-7c3b8e4f1a20" and g.fabric_clique_id == 32766 for g in inv.gpus)
    else:
        assert domains == {nvlink_domain_id([g.uuid for g in inv.gpus])}
        assert all(g.fabric_cluster_uuid is None for g in inv.gpus)


def test_nvswitch_links_point_at_switches() -> None:
    inv = _discover("dgx-h100")
    for gpu in inv.gpus:
        assert len(gpu.nvlinks) == 18
        assert all(nl.active and nl.remote_is_switch and nl.remote_pci_bus_id is None for nl in gpu.nvlinks)


def test_v100_cube_mesh_quad() -> None:
    inv = _discover("v100-4")
    bus = [g.pci_bus_id for g in inv.gpus]
    # Links per GPU pair within one DGX-1V quad: 0-1 x1, 0-2 x1, 0-3 x2, 1-2 x2, 1-3 x1, 2-3 x1.
    expected = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (1, 2): 2, (1, 3): 1, (2, 3): 1}
    for (a, b), n in expected.items():
        assert sum(1 for nl in inv.gpus[a].nvlinks if nl.active and nl.remote_pci_bus_id == bus[b]) == n
        assert sum(1 for nl in inv.gpus[b].nvlinks if nl.active and nl.remote_pci_bus_id == bus[a]) == n
    for gpu in inv.gpus:
        assert len(gpu.nvlinks) == 6
        assert sum(nl.active for nl in gpu.nvlinks) == 4  # the other two go to GPUs 4-7 of a full DGX-1


def _table(inv: Inventory) -> list[tuple[object, ...]]:
    return [
        (p.name, p.count, p.memory_bytes // MIB, p.multiprocessors, p.copy_engines, p.decoders, p.jpeg_engines, p.ofa_engines,
         [pl.start for pl in p.placements], p.placements[0].size)
        for p in inv.gpus[0].mig_profiles
    ]


def test_a100_mig_table() -> None:
    inv = _discover("dgx-a100")
    assert _table(inv) == [tuple(row) for row in A100_80GB]
    gpu = inv.gpus[0]
    assert (gpu.memory_slices, gpu.compute_slices) == (8, 7)
    assert [p.profile_id for p in gpu.mig_profiles] == [19, 20, 15, 14, 9, 5, 0]
    assert [p.compute_slices for p in gpu.mig_profiles] == [1, 1, 1, 2, 3, 4, 7]
    assert all(p.encoders == 0 for p in gpu.mig_profiles)


def test_a100_40gb_and_a30_mig_tables() -> None:
    a100 = _discover("dgx-a100-40gb")
    assert _table(a100) == [tuple(row) for row in A100_40GB]
    assert (a100.gpus[0].memory_slices, a100.gpus[0].compute_slices) == (8, 7)
    # NVIDIA's quickstart "half-balanced" layout: GPUs 0-3 in MIG mode, 4-7 full.
    assert [sorted(m.profile for m in g.mig_devices) for g in a100.gpus[:4]] == [["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]] * 4
    assert not any(g.mig_enabled for g in a100.gpus[4:])
    a30 = _discover("a30-4")
    assert _table(a30) == [tuple(row) for row in A30_24GB]
    assert (a30.gpus[0].memory_slices, a30.gpus[0].compute_slices) == (4, 4)
    assert [p.profile_id for p in a30.gpus[0].mig_profiles] == [14, 21, 5, 6, 0]


def test_addressing_mode_where_nvml_reports_one() -> None:
    assert {g.addressing_mode for g in _discover("gb200-nvl").gpus} == {"ATS"}
    assert {g.addressing_mode for g in _discover("dgx-h100").gpus} == {None}


@pytest.mark.parametrize("profile", ["dgx-h100", "h100-mig"])
def test_h100_mig_table(profile: str) -> None:
    assert _table(_discover(profile)) == [tuple(row) for row in H100_80GB]


def test_h200_mig_profiles() -> None:
    gpu = _discover("hgx-h200").gpus[0]
    assert [p.name for p in gpu.mig_profiles] == ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]
    assert [p.multiprocessors for p in gpu.mig_profiles] == [16, 16, 26, 32, 60, 64, 132]
    assert [p.count for p in gpu.mig_profiles] == [7, 1, 4, 3, 2, 1, 1]


def test_existing_mig_devices_a100() -> None:
    inv = _discover("dgx-a100-mig")
    g = inv.gpus
    assert [g[i].mig_enabled for i in range(8)] == [True] * 5 + [False] * 3
    assert [(m.profile, m.placement.start) for m in g[0].mig_devices] == [("1g.10gb", s) for s in range(7)]
    assert [(m.profile, m.placement) for m in g[1].mig_devices] == [("4g.40gb", MigPlacement(0, 4)), ("3g.40gb", MigPlacement(4, 4))]
    assert [m.profile for m in g[2].mig_devices] == ["2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb"]
    assert g[3].mig_devices == ()
    assert [m.profile for m in g[4].mig_devices] == ["7g.80gb"]
    three = g[1].mig_devices[1]
    assert three.memory_bytes == 40192 * MIB and three.multiprocessors == 42 and three.copy_engines == 3 and three.decoders == 2
    assert three.compute_instance_id == 0
    ids = [m.gpu_instance_id for m in g[0].mig_devices]
    assert ids == sorted(set(ids))
    uuids = [m.uuid for gpu in g for m in gpu.mig_devices]
    assert len(uuids) == len(set(uuids)) and all(u.startswith("MIG-") for u in uuids)


def test_h100_mig_node() -> None:
    inv = _discover("h100-mig")
    assert [len(g.mig_devices) for g in inv.gpus] == [7, 3, 2, 0, 0, 0, 0, 0]
    assert [(m.profile, m.placement.start) for m in inv.gpus[1].mig_devices] == [("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)]


def test_discovery_is_deterministic() -> None:
    assert _discover("dgx-a100-mig") == _discover("dgx-a100-mig")


def test_pcie_root_lookup_is_injectable() -> None:
    nvml = load_backend("sim:dgx-h100")
    seen: list[str] = []

    def lookup(bus: str) -> str | None:
        seen.append(bus)
        return "pci0000:99"

    inv = discover(nvml, "n", pcie_root_of=lookup)
    assert all(g.pcie_root == "pci0000:99" for g in inv.gpus)
    assert seen == [g.pci_bus_id for g in inv.gpus]


def test_optional_queries_degrade() -> None:
    nvml = load_backend("sim:dgx-h100")
    nvml.fail_call("nvmlDeviceGetNumaNodeId", error="NOT_SUPPORTED")
    nvml.fail_call("nvmlDeviceGetNvLinkState", error="NOT_SUPPORTED")
    nvml.fail_call("nvmlDeviceGetGpuFabricInfoV", error="UNKNOWN")
    inv = discover(nvml, "n")
    assert len(inv.gpus) == 8 and inv.skipped == ()
    assert all(g.numa_node is None and g.nvlinks == () and g.nvlink_domain is None for g in inv.gpus)


def test_mig_not_supported_means_not_capable() -> None:
    nvml = load_backend("sim:dgx-a100")
    victim = discover(nvml, "n").gpus[3].uuid
    nvml.fail_call("nvmlDeviceGetMigMode", uuid=victim, error="NOT_SUPPORTED")
    gpu = next(g for g in discover(nvml, "n").gpus if g.uuid == victim)
    assert not gpu.mig_capable and gpu.mig_profiles == () and gpu.memory_slices == 0


def test_failing_gpu_is_skipped_not_fatal() -> None:
    nvml = load_backend("sim:dgx-a100")
    before = discover(nvml, "n")
    bad, lost = before.gpus[2].uuid, before.gpus[5].uuid
    nvml.fail_call("nvmlDeviceGetMemoryInfo", uuid=bad, error="UNKNOWN")
    nvml.mark_lost(lost)
    inv = discover(nvml, "n")
    assert [g.uuid for g in inv.gpus] == [g.uuid for g in before.gpus if g.uuid not in (bad, lost)]
    reasons = dict(inv.skipped)
    assert set(reasons) == {bad, "index 5"}
    assert "Unknown" in reasons[bad] and "lost" in reasons["index 5"]
    # The remaining GPUs still form one NVSwitch domain.
    assert len({g.nvlink_domain for g in inv.gpus}) == 1


def test_failing_mig_device_is_skipped() -> None:
    nvml = load_backend("sim:dgx-a100-mig")
    mig = discover(nvml, "n").gpus[1].mig_devices[0]
    nvml.fail_call("nvmlDeviceGetGpuInstanceId", uuid=mig.uuid, error="UNKNOWN")
    inv = discover(nvml, "n")
    assert [m.profile for m in inv.gpus[1].mig_devices] == ["3g.40gb"]
    assert [ident for ident, _ in inv.skipped] == [mig.uuid]


def test_helpers() -> None:
    assert normalize_bus_id(b"00000000:1B:00.0") == "0000:1b:00.0"
    assert normalize_bus_id("0008:01:00.0") == "0008:01:00.0"
    assert cuda_version_text(13000) == "13.0" and cuda_version_text(12040) == "12.4"
    assert nvlink_domain_id(["b", "a"]) == nvlink_domain_id(["a", "b"]) != nvlink_domain_id(["a"])
