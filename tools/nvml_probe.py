"""Probe a real GPU machine: the discovered inventory plus the raw NVML MIG answers behind it.

Run on a machine with NVIDIA GPUs:  python tools/nvml_probe.py [--nvml real] > probe.json
Compare its MIG tables with sim/nvml/profiles/*.yaml to keep the simulator honest.
Without a driver it exits 2 with one line saying so.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import socket
import sys
from pathlib import Path
from typing import Any

import pynvml

from driver.commands.inventory import inventory_to_json
from driver.discovery import discover
from driver.nvml import load_backend
from driver.nvmlapi import BackendConfigError, NvmlUnavailable


def _raw_mig(nvml: Any, handle: Any) -> dict[str, Any]:
    """Every GPU-instance profile NVML reports for one GPU, field by field, with its placements."""
    out: dict[str, Any] = {}
    try:
        out["migMode"] = list(nvml.nvmlDeviceGetMigMode(handle))
    except pynvml.NVMLError as exc:
        return {"migMode": f"error: {exc}"}
    profiles = []
    for enum in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum)
        except pynvml.NVMLError as exc:
            profiles.append({"enum": enum, "error": str(exc)})
            continue
        entry: dict[str, Any] = {"enum": enum}
        entry.update({name: (getattr(info, name).decode() if isinstance(getattr(info, name), bytes) else getattr(info, name))
                      for name, _ in info._fields_})
        count = ctypes.c_uint(0)
        try:
            nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, None, ctypes.byref(count))
            array = (pynvml.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
            nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, array, ctypes.byref(count))
            entry["placements"] = [[array[i].start, array[i].size] for i in range(count.value)]
        except pynvml.NVMLError as exc:
            entry["placements"] = f"error: {exc}"
        profiles.append(entry)
    out["profiles"] = profiles
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nvml", default="real", help="backend spec (default: real)")
    parser.add_argument("--driver-root", type=Path, help="load libnvidia-ml.so.1 by path from this driver root "
                        "(as the node agent does; default: by name)")
    args = parser.parse_args(argv)
    try:
        nvml = load_backend(args.nvml, driver_root=args.driver_root)
    except (NvmlUnavailable, BackendConfigError) as exc:
        print(f"nvml_probe: {exc}", file=sys.stderr)
        return 2
    inventory = discover(nvml, socket.gethostname())
    raw = []
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            raw.append({"index": index, "uuid": nvml.nvmlDeviceGetUUID(handle), "name": nvml.nvmlDeviceGetName(handle),
                        "memoryTotal": int(nvml.nvmlDeviceGetMemoryInfo(handle).total), "mig": _raw_mig(nvml, handle)})
        except pynvml.NVMLError as exc:
            raw.append({"index": index, "error": str(exc)})
    print(json.dumps({"inventory": inventory_to_json(inventory), "raw": raw}, indent=2, default=str))
    nvml.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
