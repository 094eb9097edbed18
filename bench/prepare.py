"""`gpu-dra bench prepare`: NodePrepareResources / NodeUnprepareResources latency over the real gRPC path.

An embedded API server holds 1000 allocated claims of 1-8 of a simulated DGX H100's GPUs (fixed seed); the node
agent runs in this process on real unix sockets; the kubelet simulator prepares each claim (one call per claim, as
for single-claim pods) and unprepares it later. Claims come and go like pods on one node: the GPUs are exclusive,
so a claim is prepared once enough of them are free and the oldest prepared claims are unprepared to free them
(the node refuses a second claim on a GPU it holds). Every call includes the API read, the CDI spec write and the
fsynced checkpoint transactions.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.report import emit
from bench.stats import peak_rss_mib, percentile

CLAIMS = 1000
TARGET_P99_MS = 25.0


@dataclass(frozen=True)
class Plan:
    devices: list[list[str]]  # per claim, the GPUs it is allocated
    steps: list[tuple[str, int]]  # ("prepare" | "unprepare", claim index), in order; every claim is unprepared
    held_mean: float  # claims prepared at once, on average over the prepares


def _plan(rng: random.Random, names: list[str], claims: int) -> Plan:
    """Claims of 1-8 GPUs in turn on one node: before a claim is prepared, the oldest prepared claims are
    unprepared until enough GPUs are free (the node never holds one GPU for two claims)."""
    free, held = set(names), deque[tuple[int, list[str]]]()
    devices: list[list[str]] = []
    steps: list[tuple[str, int]] = []
    held_total = 0
    for i in range(claims):
        n = rng.randint(1, min(8, len(names)))
        while len(free) < n:
            old, released = held.popleft()
            steps.append(("unprepare", old))
            free.update(released)
        chosen = rng.sample(sorted(free), n)
        free.difference_update(chosen)
        devices.append(chosen)
        held.append((i, chosen))
        held_total += len(held)
        steps.append(("prepare", i))
    steps += [("unprepare", old) for old, _ in held]
    return Plan(devices, steps, held_total / max(claims, 1))


def measure(seed: int, claims: int = CLAIMS) -> dict[str, Any]:
    from driver.discovery import discover
    from sim.kubelet.dra import ClaimInfo, KubeletSim
    from driver.nvml import load_backend
    from driver.plugin.agent import AgentSettings, NodeAgent, kubeapi_claim_getter
    from driver.slices import SliceSettings, build_slices
    from controlplane import EmbeddedApiServer
    from gpudra.kubeapi import KubeApi

    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix="gdb-", dir="/tmp"))
    server = EmbeddedApiServer()
    api = KubeApi.connect(url=server.start())
    agent = None
    kubelet = KubeletSim(work / "kubelet")
    try:
        nvml = load_backend("sim:dgx-h100", node="bench-node")
        inventory = discover(nvml, "bench-node")
        names = [d["name"] for s in build_slices(inventory, SliceSettings(node_name="bench-node")) for d in s["spec"]["devices"]]
        plan = _plan(rng, names, claims)
        api.create("Namespace", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}})
        refs: list[ClaimInfo] = []
        for i, chosen in enumerate(plan.devices):
            obj = {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": f"claim-{i}", "namespace": "bench"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                               "count": len(chosen)}}]}},
            }
            created = api.create("ResourceClaim", obj, namespace="bench")
            created["status"] = {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "bench-node", "device": d} for d in chosen
            ]}}}
            api.replace_status("ResourceClaim", created)
            refs.append(ClaimInfo("bench", created["metadata"]["uid"], f"claim-{i}"))
        settings = AgentSettings(
            node_name="bench-node", driver_name="gpu.nvidia.com", kubelet_dir=work / "kubelet", cdi_dir=work / "cdi",
        )
        agent = NodeAgent(settings, nvml=nvml, inventory=inventory, get_claim=kubeapi_claim_getter(api))
        agent.start()
        plugin = kubelet.wait_for_plugin("gpu.nvidia.com")
        prepare_ms: list[float] = []
        unprepare_ms: list[float] = []
        started = time.perf_counter()
        for op, index in plan.steps:
            call, times = (plugin.prepare, prepare_ms) if op == "prepare" else (plugin.unprepare, unprepare_ms)
            t = time.perf_counter()
            call([refs[index]])
            times.append((time.perf_counter() - t) * 1000)
        total = time.perf_counter() - started
        p99 = percentile(prepare_ms, 99)
        return {
            "benchmark": "prepare",
            "seed": seed,
            "claims": claims,
            "devicesPerClaimMean": round(statistics.fmean(len(d) for d in plan.devices), 2),
            "preparedAtOnceMean": round(plan.held_mean, 2),
            "claimsPerSecond": round(claims / total, 1),
            "p50Ms": round(percentile(prepare_ms, 50), 3),
            "p99Ms": round(p99, 3),
            "unprepareP50Ms": round(percentile(unprepare_ms, 50), 3),
            "unprepareP99Ms": round(percentile(unprepare_ms, 99), 3),
            "targetP99Ms": TARGET_P99_MS,
            "meetsTarget": p99 <= TARGET_P99_MS,
            "peakRssMiB": peak_rss_mib(),
        }
    finally:
        kubelet.close()
        if agent is not None:
            agent.stop()
        api.close()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace) -> int:
    result = measure(getattr(args, "seed", 1), getattr(args, "size", None) or CLAIMS)
    emit("prepare", result, getattr(args, "output", "table"))
    return 0
