"""`gpu-dra bench cel`: CEL selector evaluations per second over 10k simulated GPU devices.

Devices get realistic attributes (product, architecture, memory, compute capability, driver
version, MIG capability) from a fixed seed; several representative selectors are compiled once and
evaluated against every device, one DeviceView per device as the allocator uses them.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import time
from typing import Any

from controller.cel import CelEnvironment, DeviceView

DEVICES = 10_000
DRIVER = "gpu.nvidia.com"
_PRODUCTS = (("NVIDIA H100 80GB HBM3", "Hopper", "80Gi", "9.0"), ("NVIDIA A100-SXM4-40GB", "Ampere", "40Gi", "8.0"),
             ("NVIDIA L4", "Ada Lovelace", "24Gi", "8.9"), ("NVIDIA H200", "Hopper", "141Gi", "9.0"))

SELECTORS = (
    'device.driver == "gpu.nvidia.com"',
    'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"',
    'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0',
    'device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("550.0.0")) && '
    'device.attributes["gpu.nvidia.com"].architecture in ["Hopper", "Ampere"]',
    'cel.bind(g, device.attributes["gpu.nvidia.com"], g.migCapable && g.index < 4 && '
    'g.productName.startsWith("NVIDIA H"))',
)


def make_device(rng: random.Random, i: int) -> dict[str, Any]:
    product, arch, memory, cc = rng.choice(_PRODUCTS)
    return {
        "name": f"gpu-{i}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": f"GPU-{rng.getrandbits(128):032x}"},
            "productName": {"string": product},
            "architecture": {"string": arch},
            "brand": {"string": "Nvidia"},
            "cudaComputeCapability": {"version": f"{cc}.0"},
            "driverVersion": {"version": rng.choice(("535.161.8", "550.54.15", "560.35.3"))},
            "cudaDriverVersion": {"version": "12.4.0"},
            "index": {"int": i % 8},
            "minor": {"int": i % 8},
            "migCapable": {"bool": arch != "Ada Lovelace"},
            "pcieBusID": {"string": f"0000:{rng.randrange(256):02x}:00.0"},
            "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{rng.randrange(8):02x}"},
        },
        "capacity": {"memory": {"value": memory}},
    }


def measure(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    views = [DeviceView.from_slice_device(DRIVER, make_device(rng, i)) for i in range(DEVICES)]
    env = CelEnvironment()
    selectors = [env.compile(expr) for expr in SELECTORS]
    latencies: list[float] = []
    matches = 0
    clock = time.perf_counter
    start = clock()
    for view in views:
        for selector in selectors:
            t0 = clock()
            matched = selector.matches(view)
            latencies.append(clock() - t0)
            matches += matched
    elapsed = clock() - start
    latencies.sort()
    evaluations = len(latencies)
    return {
        "benchmark": "cel",
        "devices": DEVICES,
        "selectors": len(selectors),
        "evaluations": evaluations,
        "matches": matches,
        "evalsPerSecond": round(evaluations / elapsed, 1),
        "p50Ms": round(statistics.median(latencies) * 1000, 4),
        "p99Ms": round(latencies[min(evaluations - 1, int(evaluations * 0.99))] * 1000, 4),
        "peakRssMiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "seed": seed,
    }


def run(args: argparse.Namespace) -> int:
    result = measure(int(getattr(args, "seed", 1)))
    if getattr(args, "output", "table") == "json":
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:16} {value}")
    return 0
