"""`gpu-dra inventory`: discover GPUs through NVML (real or simulated) and print the inventory."""

from __future__ import annotations

import argparse
import socket
from typing import Any

from driver.commands.nvmlinventory import discover_once
from gpudra import cliopts
from driver.inventory import Gpu, Inventory, MigDevice, MigProfile


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nvml",
        default="real",
        metavar="real|sim:PROFILE|sim:FILE",
        help="NVML backend: the real driver, or the simulator with a shipped profile or a profile file (default: real)",
    )
    parser.add_argument("--node", default=None, help="node name to report (default: this host's name)")
    cliopts.add_output(parser)


def _profile_json(p: MigProfile) -> dict[str, Any]:
    return {
        "name": p.name,
        "profileId": p.profile_id,
        "count": p.count,
        "memoryBytes": p.memory_bytes,
        "multiprocessors": p.multiprocessors,
        "copyEngines": p.copy_engines,
        "decoders": p.decoders,
        "encoders": p.encoders,
        "jpegEngines": p.jpeg_engines,
        "ofaEngines": p.ofa_engines,
        "memorySlices": p.memory_slices,
        "computeSlices": p.compute_slices,
        "placements": [{"start": pl.start, "size": pl.size} for pl in p.placements],
    }


def _mig_json(m: MigDevice) -> dict[str, Any]:
    return {
        "uuid": m.uuid,
        "profile": m.profile,
        "placement": {"start": m.placement.start, "size": m.placement.size},
        "memoryBytes": m.memory_bytes,
        "multiprocessors": m.multiprocessors,
        "copyEngines": m.copy_engines,
        "decoders": m.decoders,
        "encoders": m.encoders,
        "jpegEngines": m.jpeg_engines,
        "ofaEngines": m.ofa_engines,
        "gpuInstanceId": m.gpu_instance_id,
        "computeInstanceId": m.compute_instance_id,
    }


def _gpu_json(g: Gpu) -> dict[str, Any]:
    return {
        "uuid": g.uuid,
        "productName": g.product_name,
        "brand": g.brand,
        "architecture": g.architecture,
        "memoryBytes": g.memory_bytes,
        "cudaComputeCapability": g.cuda_compute_capability,
        "pciBusID": g.pci_bus_id,
        "pcieRoot": g.pcie_root,
        "numaNode": g.numa_node,
        "migCapable": g.mig_capable,
        "migEnabled": g.mig_enabled,
        "memorySlices": g.memory_slices,
        "computeSlices": g.compute_slices,
        "nvlinkDomain": g.nvlink_domain,
        "fabricClusterUUID": g.fabric_cluster_uuid,
        "fabricCliqueID": g.fabric_clique_id,
        "nvlinks": [
            {"link": nl.link, "active": nl.active, "remotePciBusID": nl.remote_pci_bus_id, "remoteIsSwitch": nl.remote_is_switch}
            for nl in g.nvlinks
        ],
        "migProfiles": [_profile_json(p) for p in g.mig_profiles],
        "migDevices": [_mig_json(m) for m in g.mig_devices],
        "health": {"healthy": g.health.healthy, "xids": list(g.health.xids), "lost": g.health.lost},
    }


def inventory_to_json(inv: Inventory) -> dict[str, Any]:
    """The `gpu-dra inventory -o json` document."""
    return {
        "node": inv.node,
        "driverVersion": inv.driver_version,
        "cudaDriverVersion": inv.cuda_driver_version,
        "gpus": [_gpu_json(g) for g in inv.gpus],
        "skipped": [{"device": ident, "reason": reason} for ident, reason in inv.skipped],
    }


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f}GiB"


def inventory_table(inv: Inventory) -> str:
    lines = [f"node {inv.node}  driver {inv.driver_version}  CUDA {inv.cuda_driver_version}  GPUs {len(inv.gpus)}"]
    header = ("UUID", "PRODUCT", "MEMORY", "CC", "PCI", "PCIE ROOT", "NUMA", "MIG", "NVLINK DOMAIN")
    rows = []
    for g in inv.gpus:
        mig = "enabled" if g.mig_enabled else ("capable" if g.mig_capable else "-")
        rows.append(
            (
                g.uuid,
                g.product_name,
                _gib(g.memory_bytes),
                g.cuda_compute_capability,
                g.pci_bus_id,
                g.pcie_root or "-",
                "-" if g.numa_node is None else str(g.numa_node),
                mig,
                g.nvlink_domain or "-",
            )
        )
        for m in g.mig_devices:
            rows.append(
                (f"  {m.uuid}", f"MIG {m.profile}", _gib(m.memory_bytes), "", f"placement {m.placement.start}:{m.placement.size}", "", "", f"gi {m.gpu_instance_id}", "")
            )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip())
    for ident, reason in inv.skipped:
        lines.append(f"skipped {ident}: {reason}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    node = args.node or socket.gethostname()
    inv = discover_once(args.nvml, node, "gpu-dra inventory")
    if inv is None:
        return 2
    print(cliopts.render(inventory_to_json(inv), args.output, lambda: inventory_table(inv)))
    return 0
