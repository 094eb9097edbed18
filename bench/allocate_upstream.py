"""`gpu-dra bench allocate --kubernetes upstream`: the allocate scenarios placed by our placer and, claim by claim on
the same objects, by kube-scheduler 1.37's DRA allocator (k8s.io/dynamic-resource-allocation/structured, the code
its dynamicresources plugin calls), driven directly by sim/upstream/gotools/drabench (built from its Go module).

The scheduler's plugin builds an allocator over every slice and the allocated devices for each pod (PreFilter) and
asks it for the pod's claims on each node (Filter); drabench does that per claim on the node our placer chose (a
claim ours could not place is tried on every node), committing what it allocated before the next claim. Compared:
fits or not, and the devices in result order (kube-scheduler's order within a node is defined: pools, then slices
by name, then devices in order). kube-scheduler's CPU per claim is that of its allocator told the node; ours is
the whole placement (choosing the node included). Both run with 1.37's default feature gates (gpudra.features).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

from bench.allocate import SCENARIOS, Placements, Size, place
from bench.report import emit
from gpudra.defaults import apply_defaults
from gpudra.features import Features

EXAMPLES = 5  # disagreements listed per scenario


def kube_features(features: Features) -> dict[str, bool]:
    """structured.Features as kube-scheduler's plugin derives them from its gates (AllocatorFeatures); the alpha
    gates our table does not model (OptionalNodeOperations, DerivedAttributes, CompatibilityGroups) are off in 1.37."""
    return {
        "AdminAccess": features.admin_access, "PrioritizedList": features.prioritized_list,
        "PartitionableDevices": features.partitionable_devices, "DeviceTaints": features.device_taints,
        "DeviceBindingAndStatus": features.device_binding_conditions and features.resource_claim_device_status,
        "ConsumableCapacity": features.consumable_capacity,
        "FractionalCapacityRange": features.fractional_capacity_range,
        "ListTypeAttributes": features.list_type_attributes,
    }


def _defaulted(claim: dict[str, Any]) -> dict[str, Any]:
    """The claim as the API server stores it (allocationMode ExactCount, count 1), which the allocator expects."""
    stored = json.loads(json.dumps(claim))
    apply_defaults("resource.k8s.io", "ResourceClaim", stored)
    return stored


def _devices(allocations: list[dict[str, Any]]) -> list[str]:
    return [f"{r['pool']}/{r['device']}" for a in allocations for r in (a.get("devices") or {}).get("results") or []]


def compare(ours: Placements, theirs: list[dict[str, Any]]) -> dict[str, Any]:
    """Agreement per claim: both placed with the same devices (on our node), or neither placed anywhere."""
    same_devices = both_unplaced = 0
    differences: list[dict[str, Any]] = []
    for (key, node, allocations), kube in zip(ours, theirs, strict=True):
        mine = _devices(allocations)
        if node is not None and kube.get("node") == node and kube["devices"] == mine:
            same_devices += 1
        elif node is None and not kube.get("node"):
            both_unplaced += 1
        else:
            differences.append({"claim": key, "ours": {"node": node, "devices": mine},
                                "kubeScheduler": {"node": kube.get("node"), "devices": kube["devices"],
                                                  "error": kube.get("error", "")}})
    agreed = same_devices + both_unplaced
    return {"claims": len(ours), "agree": agreed, "agreementPercent": round(100 * agreed / max(len(ours), 1), 2),
            "sameDevices": same_devices, "unplacedInBoth": both_unplaced, "disagree": len(differences),
            "examples": differences[:EXAMPLES]}


def measure(name: str, seed: int, size: Size, drabench: str) -> dict[str, Any]:
    from controller.cel import CelEnvironment

    scenario = SCENARIOS[name](seed, size)
    ours, placements = place(scenario, CelEnvironment())
    steps = [{"claim": _defaulted(claim), "node": node or ""} for claim, (_, node, _) in zip(scenario.claims, placements)]
    body = json.dumps({"features": kube_features(Features()), "classes": scenario.classes, "slices": scenario.slices,
                       "steps": steps})
    done = subprocess.run([drabench], input=body, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"drabench failed ({done.returncode}): {done.stderr.strip()}")
    kube = json.loads(done.stdout)
    claims = len(scenario.claims)
    pinned = sum(1 for _, node, _ in placements if node is not None)
    theirs = {"allocated": sum(1 for r in kube["results"] if r.get("node")),
              "cpuMsPerClaim": round(kube["cpuSeconds"] * 1000 / max(claims, 1), 4),
              "newAllocatorCpuMsPerClaim": round(kube["newAllocatorCpuSeconds"] * 1000 / max(claims, 1), 4),
              "claimsPerSecond": round(claims / kube["wallSeconds"], 1) if kube["wallSeconds"] else 0.0,
              "triedOnOurNode": pinned, "triedOnEveryNode": claims - pinned,
              "features": kube["allocatorFeatures"]}
    mine = {k: ours[k] for k in ("allocated", "cpuMsPerClaim", "claimsPerSecond", "p50Ms", "p99Ms", "placementDigest")}
    return {"nodes": ours["nodes"], "claims": claims, "ours": mine, "kubeScheduler": theirs,
            "cpuRatio": round(theirs["cpuMsPerClaim"] / mine["cpuMsPerClaim"], 2) if mine["cpuMsPerClaim"] else None,
            "agreement": compare(placements, kube["results"])}


def run(args: argparse.Namespace) -> int:
    from sim.upstream.drabench import BuildError, binary, version

    wanted = ["a", "b"] if getattr(args, "scenario", "all") == "all" else [args.scenario]
    unknown = [w for w in wanted if w not in SCENARIOS]
    if unknown:
        print(f"--scenario {unknown[0]!r}: unknown scenario; accepted: a, b, all", file=sys.stderr)
        return 2
    nodes = getattr(args, "nodes", None)
    if isinstance(nodes, list) and len(nodes) > 1:
        print("--nodes: one size with --kubernetes upstream (the scale curve is ours alone)", file=sys.stderr)
        return 2
    size = Size(nodes[0] if isinstance(nodes, list) else nodes, getattr(args, "devices", None))
    for flag, value in (("--nodes", size.nodes), ("--devices", size.devices)):
        if value is not None and value < 1:
            print(f"{flag} {value}: must be at least 1", file=sys.stderr)
            return 2
    try:
        drabench = str(binary())
    except BuildError as exc:
        print(f"bench allocate --kubernetes upstream: {exc}", file=sys.stderr)
        return 1
    seed = int(getattr(args, "seed", 1) or 1)
    results = {w: measure(w, seed, size, drabench) for w in wanted}
    agree = sum(r["agreement"]["agree"] for r in results.values())
    claims = sum(r["claims"] for r in results.values())
    doc = {"benchmark": "allocate", "kubernetes": "upstream", "kubeSchedulerAllocator": version(), "seed": seed,
           "agreementPercent": round(100 * agree / max(claims, 1), 2), "claims": claims,
           "cpuRatio": {w: r["cpuRatio"] for w, r in results.items()}, "scenarios": results}
    emit("allocate", doc, getattr(args, "output", "table"))
    return 0 if agree == claims else 1
