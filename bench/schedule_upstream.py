"""`gpu-dra bench schedule --kubernetes upstream`: the same pods and slices placed by the real kube-scheduler
1.37.2 and by our controller's embedded scheduler, in one run, and the ratio.

The upstream side is a control plane of real Kubernetes (sim/upstream, no kubelets): N Node objects made Ready
by a status patch, the slices the node agent publishes for a simulated DGX A100 (8 GPUs), the project's
DeviceClasses and the 1/2/4-GPU ResourceClaimTemplates; the pods come from `bench.podload` in a process of its own,
as in the embedded run, and kube-controller-manager makes their claims from the templates. Measured there:
pods/s from the first create to the last binding seen, latency p50/p99, and the CPU time per pod of
kube-scheduler and kube-controller-manager (/proc/PID/stat before and after), which together do what our
controller does alone. The embedded side is `bench schedule` itself (bench/schedule.py) with the same seed, so
the same pod sizes in the same order. Both outcomes are verified the same way (every pod bound, its claim
allocated on its node with the requested count, no device twice).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from bench.differential import ControlPlane
from bench.podload import NAMESPACE
from bench.report import emit
from bench.schedule import BenchFailed, LoadProcess, Shape, measure, pod_plan, populate, shape_from_args, verify
from bench.stats import percentile, process_cpu_seconds
from gpudra.kubeapi import KubeApi
from sim.upstream.commands import UpstreamError


def _pids(plane: ControlPlane) -> dict[str, int]:
    from sim.upstream import commands

    return {str(p["role"]): int(p["pid"]) for p in commands.read_status(plane.state).get("processes") or []
            if p.get("pid") and p.get("running")}


def _make_ready(api: KubeApi, nodes: int) -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for n in range(nodes):
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "no kubelet: set by the bench",
                 "lastHeartbeatTime": now, "lastTransitionTime": now}
        api.patch("Node", f"node-{n:03d}", {"status": {"conditions": [ready]}}, patch_type="strategic",
                  subresource="status")


def _wait_untainted(api: KubeApi, timeout: float = 30.0) -> None:
    """The node lifecycle controller may taint a node it first saw without a Ready condition; it lifts the taint
    once it sees the condition."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any((n.get("spec") or {}).get("taints") for n in api.list("Node")[0]):
            return
        time.sleep(0.5)
    raise BenchFailed(f"nodes still tainted after {timeout:.0f} s")


def _wait_service_account(api: KubeApi, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while api.try_get("ServiceAccount", "default", namespace=NAMESPACE) is None:
        if time.monotonic() > deadline:
            raise BenchFailed(f"namespace {NAMESPACE} has no default ServiceAccount after {timeout:.0f} s")
        time.sleep(0.5)


def measure_upstream(seed: int, shape: Shape) -> dict[str, Any]:
    sizes = pod_plan(seed, shape)
    with ControlPlane(f"bench{seed}") as plane:
        api = plane.api
        assert api is not None
        _wait_service_account(api)
        populate(api, shape.nodes)
        _make_ready(api, shape.nodes)
        _wait_untainted(api)
        pids = _pids(plane)
        scheduler, manager = pids["kube-scheduler"], pids["kube-controller-manager"]
        load = LoadProcess(str(plane.state / "kubeconfig.yaml"), seed, shape)
        try:
            before = process_cpu_seconds(scheduler), process_cpu_seconds(manager)
            result = load.run(shape.timeout)
            after = process_cpu_seconds(scheduler), process_cpu_seconds(manager)
        finally:
            load.stop()
        created_at: dict[str, float] = result["created"]
        bound_at: dict[str, float] = result["bound"]
        if len(bound_at) < len(sizes):
            raise BenchFailed(f"kube-scheduler bound only {len(bound_at)} of {len(sizes)} pods within "
                              f"{shape.timeout:.0f} s")
        digest = verify(api, sizes)
    latencies = sorted((bound_at[n] - created_at[n]) * 1000 for n in sizes)
    elapsed = max(bound_at.values())
    return {
        "podsPerSecond": round(len(sizes) / elapsed, 1),
        "schedulerCpuMsPerPod": round((after[0] - before[0]) * 1000 / len(sizes), 2),
        "controllerManagerCpuMsPerPod": round((after[1] - before[1]) * 1000 / len(sizes), 2),
        "cpuMsPerPod": round((after[0] - before[0] + after[1] - before[1]) * 1000 / len(sizes), 2),
        "clientCpuMsPerPod": round(float(result["cpuSeconds"]) * 1000 / len(sizes), 2),
        "p50Ms": round(percentile(latencies, 50), 1),
        "p99Ms": round(percentile(latencies, 99), 1),
        "seconds": round(elapsed, 2),
        "placementDigest": digest,
    }


def side_by_side(seed: int, shape: Shape) -> dict[str, Any]:
    upstream = measure_upstream(seed, shape)
    embedded = measure(seed, shape)
    ours = {k: embedded[k] for k in ("podsPerSecond", "cpuMsPerPod", "serverCpuMsPerPod", "clientCpuMsPerPod",
                                     "p50Ms", "p99Ms", "seconds", "placementDigest")}
    return {
        "benchmark": "schedule",
        "kubernetes": "upstream",
        "podsPerSecond": ours["podsPerSecond"],
        "cpuMsPerPod": ours["cpuMsPerPod"],
        "p50Ms": ours["p50Ms"],
        "p99Ms": ours["p99Ms"],
        "peakRssMiB": embedded["peakRssMiB"],
        "placementDigest": ours["placementDigest"],
        "embedded": ours,
        "kubeScheduler": upstream,
        # Above 1: ours is faster (pods/s) or cheaper (CPU: our controller against kube-scheduler plus
        # kube-controller-manager, which together do its work).
        "ratio": {
            "podsPerSecond": round(ours["podsPerSecond"] / upstream["podsPerSecond"], 2),
            "cpuPerPod": round(upstream["cpuMsPerPod"] / ours["cpuMsPerPod"], 2) if ours["cpuMsPerPod"] else None,
        },
        "pods": shape.pods,
        "nodes": shape.nodes,
        "seed": seed,
    }


def run(args: argparse.Namespace) -> int:
    """`bench schedule --kubernetes upstream`: the same pods placed by kube-scheduler and by our controller."""
    parsed = shape_from_args(args)
    if parsed is None:
        return 2
    try:
        doc = side_by_side(*parsed)
    except (BenchFailed, UpstreamError) as err:
        print(f"bench schedule FAILED: {err}", file=sys.stderr)
        return 1
    emit("schedule", doc, getattr(args, "output", "table"))
    return 0
