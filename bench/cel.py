"""`gpu-dra bench cel`: CEL selector evaluations per second over 10k simulated GPU devices.

Devices get realistic attributes (product, architecture, memory, compute capability, driver
version, MIG capability) from a fixed seed; several representative selectors are compiled once and
evaluated against every device, one DeviceView per device as the allocator uses them.

Two passes, so that the clock does not dominate what it measures (one evaluation is a few
microseconds, a clock read pair a fraction of one):

- throughput: every selector against every device, timed as one batch. Each view starts cold, so
  the batch includes building every device's evaluation data, as the allocator's first look does.
- latency: a sample of devices, rebuilt as fresh views, each evaluation timed on its own; p50/p99
  come from these and include the clock's own overhead (reported as ``clockOverheadMs``).

These two evaluate every device (the environment's result sharing is off). A third pass times the batch
again over fresh views with selectors that share results between devices by the values they read, as
the allocator evaluates them (``evalsPerSecondShared``). All passes must agree on every result.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.report import emit
from controller.cel import CelEnvironment, DeviceView
from gpudra import DEFAULT_DRIVER_NAME
from bench.stats import peak_rss_mib, percentile

DEVICES = 10_000
DRIVER = DEFAULT_DRIVER_NAME
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


LATENCY_SAMPLE_EVERY = 10


def _clock_overhead(clock: Callable[[], float], rounds: int = 10_000) -> float:
    """Median cost of one back-to-back pair of clock reads (what every latency sample carries)."""
    pairs = []
    for _ in range(rounds):
        t0 = clock()
        pairs.append(clock() - t0)
    return statistics.median(pairs)


def measure(seed: int, count: int = DEVICES) -> dict[str, Any]:
    rng = random.Random(seed)
    devices = [make_device(rng, i) for i in range(count)]
    env = CelEnvironment(share_results=False)
    selectors = [env.compile(expr) for expr in SELECTORS]
    clock = time.perf_counter

    views = [DeviceView.from_slice_device(DRIVER, device) for device in devices]
    start = clock()
    results = [selector.matches(view) for view in views for selector in selectors]
    elapsed = clock() - start
    evaluations = len(results)

    sample = devices[::LATENCY_SAMPLE_EVERY]
    sample_views = [DeviceView.from_slice_device(DRIVER, device) for device in sample]
    latencies: list[float] = []
    for index, view in zip(range(0, count, LATENCY_SAMPLE_EVERY), sample_views):
        for offset, selector in enumerate(selectors):
            t0 = clock()
            matched = selector.matches(view)
            latencies.append(clock() - t0)
            if matched != results[index * len(selectors) + offset]:
                raise RuntimeError(f"selector {selector.expression!r} on device {view.name}: latency pass "
                                   f"gave {matched}, throughput pass gave the opposite")
    latencies.sort()

    shared = [CelEnvironment().compile(expr) for expr in SELECTORS]
    shared_views = [DeviceView.from_slice_device(DRIVER, device) for device in devices]
    start = clock()
    shared_results = [selector.matches(view) for view in shared_views for selector in shared]
    shared_elapsed = clock() - start
    if shared_results != results:
        raise RuntimeError("selectors sharing results by footprint disagree with evaluating every device")
    return {
        "benchmark": "cel",
        "devices": count,
        "selectors": len(selectors),
        "evaluations": evaluations,
        "matches": sum(results),
        "evalsPerSecond": round(evaluations / elapsed, 1),
        "evalsPerSecondShared": round(evaluations / shared_elapsed, 1),
        "p50Ms": round(percentile(latencies, 50) * 1000, 4),
        "p99Ms": round(percentile(latencies, 99) * 1000, 4),
        "latencySamples": len(latencies),
        "clockOverheadMs": round(_clock_overhead(clock) * 1000, 5),
        "method": "evalsPerSecond: all evaluations timed as one batch over cold device views; "
                  "p50Ms/p99Ms: each evaluation timed alone on a sample of fresh views; "
                  "evalsPerSecondShared: the batch again with results shared by the device values read",
        "peakRssMiB": peak_rss_mib(),
        "seed": seed,
    }


def run(args: argparse.Namespace) -> int:
    result = measure(int(getattr(args, "seed", 1)), getattr(args, "size", None) or DEVICES)
    emit("cel", result, getattr(args, "output", "table"))
    return 0
