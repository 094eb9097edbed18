"""`gpu-dra bench allocate --kubernetes upstream`: the allocate scenarios placed by our placer and, claim by claim on
the same objects, by kube-scheduler 1.37's DRA allocator (k8s.io/dynamic-resource-allocation/structured, the code
its dynamicresources plugin calls), driven directly by sim/upstream/gotools/drabench (built from its Go module by
`sim/upstream/build.sh drabench`), and the figures of both side by side in one run.

The scheduler's plugin builds an allocator over every slice and the allocated devices for each pod (PreFilter) and
asks it for the pod's claims on each node (Filter). drabench does that per claim, committing what it allocated
before the next claim, in two passes over the same objects:
- search: every claim tries the nodes in name order and takes the first that fits. That is the order our placer
  packs these scenarios in (fewest free devices first, names in order within; every node starts equal, and a node
  it has started is the first one in name order with room), so both sides choose the node as well as the devices,
  and kube-scheduler's CPU per claim includes the Filter calls on the nodes that did not fit, as ours includes
  trying nodes. kube-scheduler's own node choice (its score plugins, percentageOfNodesToScore, 16 Filter workers)
  is not modelled here: `bench schedule --kubernetes upstream` runs the real one.
- given node: each claim is allocated on the node our placer chose (one ours could not place tries every node): the
  allocator alone, device for device.
Compared per claim: fits or not, the node, and the devices in result order (kube-scheduler's order within a node
is defined: pools, then slices by name, then devices in order). Both run with 1.37's default feature gates
(gpudra.features).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

from bench.allocate import SCENARIOS, Placements, Scenario, Size, options, place
from bench.report import emit
from bench.stats import peak_rss_mib
from gpudra.defaults import apply_defaults
from gpudra.features import Features

EXAMPLES = 5  # disagreements listed per scenario


class DrabenchFailed(RuntimeError):
    pass


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
    """Agreement per claim: both placed on the same node with the same devices in the same order, or neither placed
    anywhere. `fitAgree` counts the weaker agreement on fitting alone (both placed, wherever, or neither)."""
    same_devices = both_unplaced = both_placed = 0
    differences: list[dict[str, Any]] = []
    for (key, node, allocations), kube in zip(ours, theirs, strict=True):
        mine = _devices(allocations)
        both_placed += node is not None and bool(kube.get("node"))
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
            "fitAgree": both_placed + both_unplaced, "examples": differences[:EXAMPLES]}


def _drabench(drabench: str, scenario: Scenario, steps: list[dict[str, Any]]) -> dict[str, Any]:
    body = json.dumps({"features": kube_features(Features()), "classes": scenario.classes, "slices": scenario.slices,
                       "steps": steps})
    done = subprocess.run([drabench], input=body, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise DrabenchFailed(f"drabench failed ({done.returncode}): {done.stderr.strip()}")
    result: dict[str, Any] = json.loads(done.stdout)
    if len(result["results"]) != len(steps):
        raise DrabenchFailed(f"drabench answered {len(result['results'])} of {len(steps)} claims")
    return result


def _figures(kube: dict[str, Any], claims: int) -> dict[str, Any]:
    return {"allocated": sum(1 for r in kube["results"] if r.get("node")),
            "claimsPerSecond": round(claims / kube["wallSeconds"], 1) if kube["wallSeconds"] else 0.0,
            "cpuMsPerClaim": round(kube["cpuSeconds"] * 1000 / max(claims, 1), 4),
            # Of that, building the allocator over every slice, which its plugin does once per pod (PreFilter).
            "newAllocatorCpuMsPerClaim": round(kube["newAllocatorCpuSeconds"] * 1000 / max(claims, 1), 4),
            # Filter calls (Allocate on one node) per claim: what the search costs it in nodes.
            "nodesTriedPerClaim": round(kube["allocateCalls"] / max(claims, 1), 1)}


def _ratio(theirs: float, ours: float) -> float | None:
    return round(theirs / ours, 2) if ours else None


def measure(name: str, seed: int, size: Size, drabench: str) -> dict[str, Any]:
    from controller.cel import CelEnvironment

    scenario = SCENARIOS[name](seed, size)
    ours, placements = place(scenario, CelEnvironment())
    claims = [_defaulted(claim) for claim in scenario.claims]
    search = _drabench(drabench, scenario, [{"claim": claim, "node": ""} for claim in claims])
    given = _drabench(drabench, scenario, [{"claim": claim, "node": node or ""}
                                           for claim, (_, node, _) in zip(claims, placements, strict=True)])
    count = len(claims)
    pinned = sum(1 for _, node, _ in placements if node is not None)
    theirs = {**_figures(search, count), "features": search["allocatorFeatures"],
              "givenNode": {**_figures(given, count), "triedOnOurNode": pinned, "triedOnEveryNode": count - pinned}}
    mine = {k: ours[k] for k in ("allocated", "claimsPerSecond", "cpuMsPerClaim", "p50Ms", "p99Ms", "placementDigest")}
    return {"nodes": ours["nodes"], "claims": count, "ours": mine, "kubeScheduler": theirs,
            # Above 1: ours is cheaper. Both sides choose the node (search); then the allocator alone on our node.
            "cpuRatio": _ratio(theirs["cpuMsPerClaim"], mine["cpuMsPerClaim"]),
            "cpuRatioGivenNode": _ratio(theirs["givenNode"]["cpuMsPerClaim"], mine["cpuMsPerClaim"]),
            "agreement": compare(placements, search["results"]),
            "agreementGivenNode": compare(placements, given["results"])}


def run(args: argparse.Namespace) -> int:
    from sim.upstream.drabench import BuildError, binary, version

    opts = options(args)
    if opts is None:
        return 2
    if len(opts.node_counts) > 1:
        print("--nodes: one size with --kubernetes upstream (the scale curve is ours alone)", file=sys.stderr)
        return 2
    wanted, seed, size = opts.scenarios, opts.seed, Size(opts.node_counts[0], opts.devices)
    try:
        drabench = str(binary())
    except BuildError as exc:
        print(f"bench allocate --kubernetes upstream: {exc}", file=sys.stderr)
        return 1
    try:
        results = {w: measure(w, seed, size, drabench) for w in wanted}
    except DrabenchFailed as exc:
        print(f"bench allocate --kubernetes upstream: {exc}", file=sys.stderr)
        return 1
    # Agreement over both passes: a claim counts once per pass.
    agree = sum(r[k]["agree"] for r in results.values() for k in ("agreement", "agreementGivenNode"))
    compared = sum(r[k]["claims"] for r in results.values() for k in ("agreement", "agreementGivenNode"))
    head = results[wanted[0]]
    doc = {"benchmark": "allocate", "kubernetes": "upstream", "kubeSchedulerAllocator": version(),
           "claimsPerSecond": head["ours"]["claimsPerSecond"], "cpuMsPerClaim": head["ours"]["cpuMsPerClaim"],
           "p50Ms": head["ours"]["p50Ms"], "p99Ms": head["ours"]["p99Ms"], "peakRssMiB": peak_rss_mib(),
           "placementDigest": head["ours"]["placementDigest"], "seed": seed,
           "claims": sum(r["claims"] for r in results.values()),
           "agreementPercent": round(100 * agree / max(compared, 1), 2),
           "cpuRatio": {w: r["cpuRatio"] for w, r in results.items()},
           "cpuRatioGivenNode": {w: r["cpuRatioGivenNode"] for w, r in results.items()}, "scenarios": results}
    emit("allocate", doc, getattr(args, "output", "table"))
    # A disagreement is a finding, not a crash: the figures and the examples are printed, and the exit status says so.
    return 0 if agree == compared else 1
