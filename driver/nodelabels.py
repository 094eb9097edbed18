"""Node labels in NVIDIA GPU Feature Discovery's convention, so nodeSelectors and affinities written for GFD work.

With `--node-labels` the node agent sets these on its own Node (keys and value formats as GFD writes them with
its default `--mig-strategy=none`):

    nvidia.com/gpu.product             NVIDIA-A100-SXM4-40GB   (NVML name, characters outside [A-Za-z0-9-_. ] dropped,
                                                               whitespace runs -> "-")
    nvidia.com/gpu.count               8                       (GPUs of that product; MIG mode on or off)
    nvidia.com/gpu.memory              40960                   (MiB)
    nvidia.com/gpu.family              ampere                  (from the compute capability)
    nvidia.com/gpu.compute.major/minor 8 / 0
    nvidia.com/gpu.replicas            1
    nvidia.com/gpu.sharing-strategy    none
    nvidia.com/mig.capable             true | false            (any GPU of the node)
    nvidia.com/mps.capable             false                   (GFD's value without a device plugin sharing config)
    nvidia.com/cuda.driver.major/minor/rev, nvidia.com/cuda.driver-version.major/minor/revision/full
                                       580 / 95 / 05, 580.95.05 (the kernel driver version, split)
    nvidia.com/cuda.runtime.major/minor, nvidia.com/cuda.runtime-version.major/minor/full
                                       13 / 0, 13.0            (the CUDA driver API version)

A node with several GPU products gets the labels of its first GPU's product (GFD writes one set per product and
the last one written wins; ours is deterministic). GFD's `gpu.mode`, `gpu.machine` and `gfd.timestamp` are not
written: the first two need PCI class and DMI data NVML does not give, the last changes on every start.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from driver.inventory import Inventory

PREFIX = "nvidia.com/"


def sanitise(text: str) -> str:
    """GFD's product-name rule: keep [A-Za-z0-9-_. ] and join the words with '-'."""
    return "-".join(re.sub(r"[^A-Za-z0-9\-_. ]", "", text).split())


def arch_family(major: int, minor: int) -> str:
    """GFD's family of a CUDA compute capability."""
    families = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper", 10: "blackwell",
                12: "blackwell", 13: "rubin"}
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return families.get(major, "undefined")


def gfd_labels(inventory: Inventory) -> dict[str, str]:
    """The GFD-convention labels for one node's inventory (empty when it has no GPU)."""
    if not inventory.gpus:
        return {}
    first = inventory.gpus[0]
    major, _, minor = first.cuda_compute_capability.partition(".")
    labels = {
        "gpu.product": sanitise(first.product_name),
        "gpu.count": str(sum(1 for g in inventory.gpus if g.product_name == first.product_name)),
        "gpu.memory": str(first.memory_bytes // (1024 * 1024)),
        "gpu.family": arch_family(int(major), int(minor or 0)),
        "gpu.compute.major": str(int(major)),
        "gpu.compute.minor": str(int(minor or 0)),
        "gpu.replicas": "1",
        "gpu.sharing-strategy": "none",
        "mig.capable": "true" if any(g.mig_capable for g in inventory.gpus) else "false",
        "mps.capable": "false",
    }
    parts = inventory.driver_version.split(".")
    if 2 <= len(parts) <= 3:
        rev = parts[2] if len(parts) == 3 else ""
        labels.update({
            "cuda.driver.major": parts[0], "cuda.driver.minor": parts[1], "cuda.driver.rev": rev,
            "cuda.driver-version.major": parts[0], "cuda.driver-version.minor": parts[1],
            "cuda.driver-version.revision": rev, "cuda.driver-version.full": inventory.driver_version,
        })
    cuda_major, _, cuda_minor = inventory.cuda_driver_version.partition(".")
    if cuda_major.isdigit() and (cuda_minor or "0").isdigit():
        cuda_minor = cuda_minor or "0"
        labels.update({
            "cuda.runtime.major": cuda_major, "cuda.runtime.minor": cuda_minor,
            "cuda.runtime-version.major": cuda_major, "cuda.runtime-version.minor": cuda_minor,
            "cuda.runtime-version.full": f"{cuda_major}.{cuda_minor}",
        })
    clique = next((f"{g.fabric_cluster_uuid}.{g.fabric_clique_id}" for g in inventory.gpus
                   if g.fabric_cluster_uuid and g.fabric_clique_id is not None), None)
    if clique is not None:
        labels["gpu.clique"] = clique  # GFD's NVLink clique label (GB200 NVL): "<clusterUuid>.<cliqueId>"
    return {PREFIX + k: v for k, v in labels.items()}


def label_patch(current: Mapping[str, str], wanted: Mapping[str, str]) -> dict[str, Any] | None:
    """The merge patch that puts `wanted` on a Node whose labels are `current`; None when nothing changes.
    Labels we do not write (an admin's, NFD's) are left alone."""
    changed = {k: v for k, v in wanted.items() if current.get(k) != v}
    return {"metadata": {"labels": changed}} if changed else None
