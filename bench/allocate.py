"""`gpu-dra bench allocate [-o json] [--scenario a|b|all] [--nodes N[,N...]] [--devices D] [--seed N]`: placement
throughput, latency and CPU cost per claim; with several node counts, one run per size in one process, the
`curve` of their figures and `cpuMsPerClaimGrowth` (largest size over smallest).

(a) kube-scheduler scheduler_perf's SchedulingWithResourceClaimTemplate shape: by default 500 nodes x 10
    devices (one slice per node), a device class with a driver selector, one-device claims from a
    template (nodes x devices of them), placed one after another until the cluster is full.
(b) by default 1000 nodes x 8 GPUs (NVLink domains of 8, or two of 4), class and request CEL selectors,
    4- and 8-GPU claims with matchAttribute on gpu.nvidia.com/nvlinkDomain (1.4 claims per node).
Each placement runs the full Placer (allocator per candidate node, scoring, commit); latency is per
claim (per placement), wall-clock, single thread; `cpuMsPerClaim` is the process CPU time of the
placements divided by the claims, robust to other work sharing the machine. `placementDigest` is a
SHA-256 over every claim's node and devices in placement order: equal digests mean equal placements.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.report import emit
from controller.allocator import ClusterSnapshot, parse_claim
from controller.scoring import Placement, Placer
from controller.workload import claim_from_template
from gpudra import DEFAULT_DRIVER_NAME
from bench.stats import peak_rss_mib, percentile, placement_digest
from gpudra.features import Features


def _slice(node: str, driver: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-{driver}"},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices}}


@dataclass(frozen=True)
class Size:
    """Cluster size of a scenario; None takes the scenario's own default."""

    nodes: int | None = None
    devices: int | None = None


@dataclass(frozen=True)
class Scenario:
    """A scenario's objects as the API holds them (our bench parses them; kube-scheduler's allocator decodes them)."""

    slices: list[dict[str, Any]]
    classes: list[dict[str, Any]]
    claims: list[dict[str, Any]]


def scenario_a(seed: int, size: Size = Size()) -> Scenario:
    driver = "test-driver.cdi.k8s.io"
    nodes, devices = size.nodes or 500, size.devices or 10
    slices = [_slice(f"node-{n:03d}", driver, [{"name": f"device-{d}"} for d in range(devices)]) for n in range(nodes)]
    cls = {"kind": "DeviceClass", "metadata": {"name": "test-class"},
           "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]}}
    template = {"kind": "ResourceClaimTemplate", "metadata": {"name": "test-claim-template", "namespace": "default"},
                "spec": {"spec": {"devices": {"requests": [{"name": "req-0", "exactly": {"deviceClassName": "test-class"}}]}}}}
    claims = [claim_from_template(template, {"metadata": {"name": f"pod-{i:04d}", "namespace": "default"}}, "resource")
              for i in range(nodes * devices)]
    return Scenario(slices, [cls], claims)


def scenario_b(seed: int, size: Size = Size()) -> Scenario:
    rng = random.Random(seed)
    driver = DEFAULT_DRIVER_NAME
    nodes, gpus = size.nodes or 1000, size.devices or 8
    half = max(gpus // 2, 1)
    slices = []
    for n in range(nodes):
        node = f"gpu-node-{n:04d}"
        split = rng.random() < 0.3
        devices = []
        for g in range(gpus):
            domain = f"{node}-nvl{g // half if split else 0}"
            devices.append({"name": f"gpu-{g}", "attributes": {
                "type": {"string": "gpu"}, "productName": {"string": "NVIDIA H100 80GB HBM3"},
                "nvlinkDomain": {"string": domain}, "numaNode": {"int": g // half}, "index": {"int": g}},
                "capacity": {"memory": {"value": "80Gi"}}})
        slices.append(_slice(node, driver, devices))
    cls = {"kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
           "spec": {"selectors": [{"cel": {"expression":
                                           f'device.driver == "{driver}" && device.attributes["{driver}"].type == "gpu"'}}]}}
    claims = []
    for i in range(nodes * 14 // 10):
        count = 8 if rng.random() < 0.4 else 4
        claims.append({"kind": "ResourceClaim", "metadata": {"name": f"train-{i:04d}", "namespace": "ml"}, "spec": {"devices": {
            "requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": count, "selectors": [
                {"cel": {"expression": f'device.attributes["{driver}"].productName.startsWith("NVIDIA H100") && '
                                       f'device.capacity["{driver}"].memory.compareTo(quantity("40Gi")) >= 0'}}]}}],
            "constraints": [{"requests": ["gpus"], "matchAttribute": f"{driver}/nvlinkDomain"}]}}})
    return Scenario(slices, [cls], claims)


SCENARIOS: dict[str, Callable[[int, Size], Scenario]] = {
    "a": scenario_a, "b": scenario_b}


# (claim key, node or None, the claim's allocation results), in placement order.
Placements = list[tuple[str, str | None, list[dict[str, Any]]]]


def measure(name: str, seed: int, cel_env: Any, size: Size = Size()) -> dict[str, Any]:
    return place(SCENARIOS[name](seed, size), cel_env)[0]


def place(scenario: Scenario, cel_env: Any) -> tuple[dict[str, Any], Placements]:
    """Place the scenario's claims one after another; its figures and the placements."""
    snapshot, claim_dicts = ClusterSnapshot(scenario.slices, scenario.classes), scenario.claims
    placer = Placer(snapshot, Features(), cel_env)
    latencies: list[float] = []
    placements: Placements = []
    allocated = 0
    gc.collect()
    start = time.perf_counter()
    cpu_start = time.process_time()
    for obj in claim_dicts:
        t0 = time.perf_counter()
        claim = parse_claim(obj)
        placed = placer.place([claim])
        if isinstance(placed, Placement):
            placer.commit([claim.key], placed.allocations, placed.node)
            allocated += 1
            placements.append((claim.key, placed.node, placed.allocations))
        else:
            placements.append((claim.key, None, []))
        latencies.append((time.perf_counter() - t0) * 1000)
    cpu = time.process_time() - cpu_start
    elapsed = time.perf_counter() - start
    latencies.sort()
    return {"nodes": len(snapshot.node_names), "devices": sum(len(sl.devices) for sl in snapshot.slices), "claims": len(claim_dicts),
            "allocated": allocated, "seconds": round(elapsed, 3),
            "claimsPerSecond": round(len(claim_dicts) / elapsed, 1),
            "cpuMsPerClaim": round(cpu * 1000 / max(len(claim_dicts), 1), 4),
            "cpuClaimsPerSecond": round(len(claim_dicts) / cpu, 1) if cpu > 0 else 0.0,
            "p50Ms": round(percentile(latencies, 50), 3),
            "p99Ms": round(percentile(latencies, 99), 3), "maxMs": round(latencies[-1], 3) if latencies else 0.0,
            "placementDigest": placement_digest(placements)}, placements


@dataclass(frozen=True)
class Options:
    scenarios: list[str]
    node_counts: list[int | None]  # one run per size (the scale curve); None: the scenario's default
    devices: int | None
    seed: int


def options(args: argparse.Namespace) -> Options | None:
    """The run's scenarios, sizes and seed, or None after saying on stderr which flag is wrong (exit 2)."""
    wanted = ["a", "b"] if getattr(args, "scenario", "all") == "all" else [args.scenario]
    unknown = [w for w in wanted if w not in SCENARIOS]
    if unknown:
        print(f"--scenario {unknown[0]!r}: unknown scenario; accepted: a, b, all", file=sys.stderr)
        return None
    nodes = getattr(args, "nodes", None)
    node_counts: list[int | None] = [nodes] if nodes is None or isinstance(nodes, int) else list(nodes)
    devices = getattr(args, "devices", None)
    for flag, value in [*(("--nodes", n) for n in node_counts), ("--devices", devices)]:
        if value is not None and value < 1:
            print(f"{flag} {value}: must be at least 1", file=sys.stderr)
            return None
    return Options(wanted, node_counts, devices, int(getattr(args, "seed", 1) or 1))


def run(args: argparse.Namespace) -> int:
    from controller.cel import CelEnvironment

    opts = options(args)
    if opts is None:
        return 2
    wanted, node_counts, devices, seed = opts.scenarios, opts.node_counts, opts.devices, opts.seed
    # One run per size and scenario, in this process; the largest size's figures head the result.
    curve = {w: [measure(w, seed, CelEnvironment(), Size(n, devices)) for n in node_counts] for w in wanted}
    results = {w: runs[-1] for w, runs in curve.items()}
    head = results[wanted[0]]
    doc = {"benchmark": "allocate", "claimsPerSecond": head["claimsPerSecond"], "cpuMsPerClaim": head["cpuMsPerClaim"],
           "p50Ms": head["p50Ms"], "p99Ms": head["p99Ms"], "peakRssMiB": peak_rss_mib(),
           "placementDigest": head["placementDigest"], "seed": seed, "scenarios": results}
    if len(node_counts) > 1:
        doc["curve"] = {w: [{k: r[k] for k in CURVE_KEYS} for r in runs] for w, runs in curve.items()}
        # CPU per claim at the largest size over the smallest: 1.0 is a flat cost per claim.
        doc["cpuMsPerClaimGrowth"] = {w: round(runs[-1]["cpuMsPerClaim"] / runs[0]["cpuMsPerClaim"], 2)
                                      if runs[0]["cpuMsPerClaim"] else None for w, runs in curve.items()}
    emit("allocate", doc, getattr(args, "output", "table"))
    return 0


CURVE_KEYS = ("nodes", "claims", "cpuMsPerClaim", "claimsPerSecond", "p50Ms", "p99Ms", "placementDigest")
