"""The node's NVLink fabric as NVML reports it (nvmlDeviceGetGpuFabricInfoV): its clique, and whether every
fabric-attached GPU's route is healthy (healthMask)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import pynvml

from driver.inventory import Inventory


def node_clique(inventory: Inventory) -> str | None:
    """`<clusterUuid>.<cliqueId>` of the node's fabric-attached GPUs (GFD's nvidia.com/gpu.clique), or None."""
    for gpu in inventory.gpus:
        if gpu.fabric_cluster_uuid and gpu.fabric_clique_id is not None:
            return f"{gpu.fabric_cluster_uuid}.{gpu.fabric_clique_id}"
    return None


@dataclass(frozen=True)
class FabricHealth:
    healthy: bool
    problems: tuple[str, ...] = ()


def _field(mask: int, shift: str, true_value: str) -> bool:
    width_mask = 0x3
    return ((mask >> int(getattr(pynvml, shift))) & width_mask) == int(getattr(pynvml, true_value))


def fabric_health(nvml: Any, inventory: Inventory) -> FabricHealth:
    """Unhealthy when any fabric GPU's route is unhealthy or its bandwidth degraded, or its fabric info is gone."""
    problems: list[str] = []
    for gpu in inventory.gpus:
        if gpu.fabric_clique_id is None:
            continue
        info: Any = pynvml.c_nvmlGpuFabricInfoV_t()
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
            nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
        except Exception as exc:  # noqa: BLE001 - any NVML failure means the fabric state is unknown
            problems.append(f"GPU {gpu.uuid}: fabric info unavailable ({exc})")
            continue
        if int(info.state) != pynvml.NVML_GPU_FABRIC_STATE_COMPLETED or int(info.status) != pynvml.NVML_SUCCESS:
            problems.append(f"GPU {gpu.uuid}: fabric registration not completed")
            continue
        mask = int(info.healthMask)
        if _field(mask, "NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY", "NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE"):
            problems.append(f"GPU {gpu.uuid}: NVLink fabric route unhealthy")
        elif _field(mask, "NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW", "NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE"):
            problems.append(f"GPU {gpu.uuid}: NVLink fabric bandwidth degraded")
    return FabricHealth(not problems, tuple(problems))
