"""`gpu-dra bench schedule [-o json] [--seed N] [--nodes N] [--pods P] [--rate R]`: the embedded controller
placing pods end to end.

The embedded API server runs in its own process (`gpu-dra apiserver`, validation admission on), as a real
cluster's would, and holds N simulated DGX A100 nodes (default 100; 8 GPUs each, slices as the node agent
publishes them), the project's DeviceClasses and three ResourceClaimTemplates (1, 2 and 4 GPUs). The
controller runs in this process in embedded mode on its own threads (informers + reconcile loop, no leader
election), exactly as `gpu-dra controller --embedded` does, and has finished its first pass. Then a third
process (`bench.podload`, as a cluster's users are) creates P pods (default 4 per node; 1, 2 or 4 GPUs, drawn
with a fixed seed) back to back, or at R pods per second with `--rate`, and a watch on its second connection
records when each pod gets its nodeName.

Measured: pods/s from the first create until the last pod is bound, per-pod latency (create returned ->
binding seen by the watch) p50/p99, controller passes, CPU time per pod of the controller's process, of the
API server's and of the pod creator's, peak RSS of the first two. `placementDigest` hashes each pod's node and
devices in pod order (equal digests, equal placements). The outcome is verified afterwards from the API: every
pod bound, every claim allocated on its pod's node with the requested number of devices, no device allocated
twice. Any violation fails the run (exit 1).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.podload import NAMESPACE, POD_SHAPES, pod_sizes
from bench.report import emit
from controller import objects as o
from controller.manager import ControllerConfig, ControllerManager
from sim.roles.embedded import EmbeddedRoles
from driver.discovery import discover
from driver.nvml import load_backend
from driver.slices import SliceSettings, build_slices
from gpudra import DEFAULT_DRIVER_NAME
from bench.stats import peak_rss_mib, percentile, placement_digest, process_cpu_seconds
from gpudra.kubeapi import KubeApi
from gpudra.manifests import load_objects

DRIVER = DEFAULT_DRIVER_NAME
DEVICE_CLASSES = Path(__file__).resolve().parents[1] / "manifests" / "base" / "deviceclasses.yaml"
PROFILE = "sim:dgx-a100"
GPUS_PER_NODE = 8


class BenchFailed(Exception):
    """The run did not reach the expected outcome; the message says what is wrong."""


@dataclass(frozen=True)
class Shape:
    nodes: int = 100
    pods: int = 400
    rate: float | None = None  # pods created per second; None: back to back
    timeout: float = 600.0


class CountingKubeApi(KubeApi):
    """KubeApi that counts its requests by verb and resource (the controller's round trips per pod)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: Counter[str] = Counter()
        self._count_lock = threading.Lock()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        parts = path.split("?")[0].strip("/").split("/")
        # .../<plural>[/<name>[/<subresource>]]: name the resource and subresource, not the object.
        plurals = [i for i, p in enumerate(parts) if p in _PLURALS]
        what = parts[plurals[-1]] if plurals else parts[-1]
        if plurals and len(parts) > plurals[-1] + 2:
            what += "/" + parts[plurals[-1] + 2]
        verb = "WATCH" if kwargs.get("stream") else method
        with self._count_lock:
            self.calls[f"{verb} {what}"] += 1
        return super()._call(method, path, **kwargs)


_PLURALS = frozenset({"pods", "resourceclaims", "resourceslices", "deviceclasses", "nodes", "events",
                      "resourceclaimtemplates", "priorityclasses", "resourcequotas", "leases", "namespaces"})


class ServerProcess:
    """`gpu-dra apiserver` in a child process: its URL, CPU time and peak memory."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            # The bench's clients connect by URL without credentials, as the admin on the plain port.
            [sys.executable, "-m", "cli", "apiserver", "--port", "0", "--driver-name", DRIVER,
             "--unauthenticated-as-admin"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=str(Path(__file__).resolve().parents[1]))
        line = self.proc.stdout.readline().strip() if self.proc.stdout is not None else ""
        if not line.startswith("http"):
            self.stop()
            raise BenchFailed(f"the API server process did not start (printed {line!r})")
        self.url = line

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process so far (Linux /proc)."""
        return process_cpu_seconds(self.proc.pid)

    def peak_rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
        return 0.0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def node_object(name: str) -> dict[str, Any]:
    """A node as its kubelet registers it: the scheduler fits pods against its allocatable (110 pods)."""
    resources = {"cpu": "64", "memory": "512Gi", "ephemeral-storage": "1Ti", "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"capacity": dict(resources), "allocatable": dict(resources)}}


def template(count: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": f"gpu-{count}", "namespace": NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": count}}]}}}}


def populate(api: KubeApi, nodes: int) -> None:
    for obj in load_objects([DEVICE_CLASSES]):
        api.create("DeviceClass", obj)
    for count in sorted({c for c, _ in POD_SHAPES}):
        api.create("ResourceClaimTemplate", template(count), namespace=NAMESPACE)
    for n in range(nodes):
        name = f"node-{n:03d}"
        api.create("Node", node_object(name))
        inventory = discover(load_backend(PROFILE, node=name), name)
        for piece in build_slices(inventory, SliceSettings(node_name=name, driver_name=DRIVER)):
            api.create("ResourceSlice", piece)


def verify(api: KubeApi, sizes: Mapping[str, int]) -> str:
    """Every pod bound, each claim allocated on its pod's node with the requested count, no device twice.
    Returns the placement digest: per pod, in pod name order, its node and its claims' devices."""
    pods = {o.name(p): p for p in api.list("Pod", namespace=NAMESPACE)[0]}
    claims = api.list("ResourceClaim", namespace=NAMESPACE)[0]
    problems: list[str] = []
    unbound = sorted(n for n in sizes if not o.section(pods.get(n, {}), "spec").get("nodeName"))
    if unbound:
        problems.append(f"{len(unbound)} pods not bound (first: {', '.join(unbound[:5])})")
    owners = {o.uid(p): p for p in pods.values()}
    holder: dict[tuple[str, str, str], str] = {}
    seen_pods: set[str] = set()
    for claim in claims:
        owner = owners.get(o.controller_owner_uid(claim) or "")
        if owner is None:
            problems.append(f"claim {o.key(claim)}: no owning pod")
            continue
        seen_pods.add(o.name(owner))
        devices = o.allocated_devices(claim)
        want = sizes.get(o.name(owner), -1)
        if len(devices) != want:
            problems.append(f"claim {o.key(claim)}: {len(devices)} devices allocated, pod {o.name(owner)} asked for {want}")
        node = o.section(owner, "spec").get("nodeName")
        for device in devices:
            if device[1] != node:
                problems.append(f"claim {o.key(claim)}: device {'/'.join(device)} is not on the pod's node {node}")
            if device in holder:
                problems.append(f"device {'/'.join(device)} allocated twice: claims {holder[device]} and {o.key(claim)}")
            holder[device] = o.key(claim)
    missing = sorted(set(sizes) - seen_pods)
    if missing:
        problems.append(f"{len(missing)} pods have no claim (first: {', '.join(missing[:5])})")
    if problems:
        raise BenchFailed("; ".join(problems[:10]) + (f"; and {len(problems) - 10} more" if len(problems) > 10 else ""))
    by_pod: dict[str, list[dict[str, Any]]] = {}
    for claim in claims:
        owner = owners[o.controller_owner_uid(claim) or ""]
        by_pod.setdefault(o.name(owner), []).append(o.allocation(claim) or {})
    return placement_digest((name, o.section(pods[name], "spec").get("nodeName"), by_pod.get(name, []))
                            for name in sorted(sizes))


def _passes(manager: ControllerManager) -> int:
    value = manager.metrics.registry.get_sample_value("gpudra_controller_reconcile_seconds_count", {"concern": "scheduler"})
    return int(value or 0)


class LoadProcess:
    """`python -m bench.podload` in a child process: it creates the pods and watches them get bound."""

    def __init__(self, url: str, seed: int, shape: Shape) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.podload", url, str(seed), str(shape.pods), str(shape.rate or 0),
             str(shape.timeout)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(Path(__file__).resolve().parents[1]))
        line = self.proc.stdout.readline().strip() if self.proc.stdout is not None else ""
        if line != "ready":
            self.stop()
            raise BenchFailed(f"the pod load process did not start (printed {line!r})")

    def run(self, timeout: float) -> dict[str, Any]:
        """Start creating; the result once every pod is bound (or the load process gave up)."""
        try:
            out, _ = self.proc.communicate("go\n", timeout=timeout + 60.0)
        except subprocess.TimeoutExpired:
            raise BenchFailed(f"the pod load process did not finish within {timeout + 60.0:.0f} s") from None
        try:
            result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise BenchFailed(f"the pod load process printed no result ({out.strip()[-200:]!r})") from None
        if result.get("error"):
            raise BenchFailed(str(result["error"]))
        return result

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def pod_plan(seed: int, shape: Shape) -> dict[str, int]:
    """GPUs per pod, by pod name; BenchFailed when they do not fit the cluster (every pod must be bound)."""
    sizes = {f"pod-{i:04d}": g for i, g in enumerate(pod_sizes(seed, shape.pods))}
    capacity = shape.nodes * GPUS_PER_NODE
    if sum(sizes.values()) > capacity:
        raise BenchFailed(f"--seed {seed}: the pods ask for {sum(sizes.values())} GPUs, more than the {capacity} "
                          "the cluster has; choose another seed, fewer pods or more nodes")
    return sizes


def measure(seed: int, shape: Shape = Shape()) -> dict[str, Any]:
    sizes = pod_plan(seed, shape)
    capacity = shape.nodes * GPUS_PER_NODE
    server = ServerProcess()
    url = server.url
    api = KubeApi.connect(url=url)
    config = ControllerConfig(driver_name=DRIVER, leader_elect=False, identity="bench-schedule",
                              tick=1.0, resync_period=600.0)
    controller_api = CountingKubeApi.connect(url=url)
    manager = ControllerManager(controller_api, config, roles=EmbeddedRoles)
    load: LoadProcess | None = None
    try:
        populate(api, shape.nodes)
        manager.start()
        if not manager.wait_synced(60.0):
            raise BenchFailed("the controller's informers did not sync within 60 s")
        # A running controller: its first pass (which builds the allocator snapshot) is over before pods come.
        settle = time.monotonic() + 120.0
        while _passes(manager) < 1:
            if time.monotonic() > settle:
                raise BenchFailed("the controller did not finish its first pass within 120 s")
            time.sleep(0.05)
        load = LoadProcess(url, seed, shape)
        passes_before = _passes(manager)
        calls_before = Counter(controller_api.calls)
        cpu_start, server_cpu_start = time.process_time(), server.cpu_seconds()
        result = load.run(shape.timeout)
        cpu, server_cpu = time.process_time() - cpu_start, server.cpu_seconds() - server_cpu_start
        created_at: dict[str, float] = result["created"]
        bound_at: dict[str, float] = result["bound"]
        if len(bound_at) < len(sizes):
            raise BenchFailed(f"only {len(bound_at)} of {len(sizes)} pods bound within {shape.timeout:.0f} s")
        passes = _passes(manager) - passes_before
        calls = Counter(controller_api.calls)
        calls.subtract(calls_before)
        assert isinstance(manager.roles, EmbeddedRoles)
        rebuilds = manager.roles.live.rebuilds
        digest = verify(api, sizes)
        server_rss = server.peak_rss_mib()
    finally:
        if load is not None:
            load.stop()
        manager.stop()
        api.close()
        controller_api.close()
        server.stop()
    latencies = sorted((bound_at[n] - created_at[n]) * 1000 for n in sizes)
    elapsed = max(bound_at.values())
    created = max(created_at.values())
    return {
        "benchmark": "schedule",
        "podsPerSecond": round(len(sizes) / elapsed, 1),
        "cpuMsPerPod": round(cpu * 1000 / len(sizes), 2),
        "serverCpuMsPerPod": round(server_cpu * 1000 / len(sizes), 2),
        "clientCpuMsPerPod": round(float(result["cpuSeconds"]) * 1000 / len(sizes), 2),
        "p50Ms": round(percentile(latencies, 50), 1),
        "p99Ms": round(percentile(latencies, 99), 1),
        "maxMs": round(latencies[-1], 1),
        "seconds": round(elapsed, 2),
        # The pods are created (from their own process) while the controller already places them.
        "createSeconds": round(created, 2),
        "peakRssMiB": peak_rss_mib(),
        "serverPeakRssMiB": server_rss,
        "pods": len(sizes),
        "nodes": shape.nodes,
        "gpus": capacity,
        "gpusRequested": sum(sizes.values()),
        "rate": shape.rate,
        "controllerPasses": passes,
        # The controller's requests while the pods were placed, per pod, by verb and resource.
        "apiCallsPerPod": {k: round(v / len(sizes), 2) for k, v in sorted(calls.items()) if v > 0},
        "snapshotRebuilds": rebuilds,
        "placementDigest": digest,
        "seed": seed,
    }


def shape_from_args(args: argparse.Namespace) -> tuple[int, Shape] | None:
    """(seed, shape) from `bench schedule`'s flags; None after saying on stderr what is wrong."""
    seed = int(getattr(args, "seed", 1) or 1)
    nodes = getattr(args, "nodes", None)
    if isinstance(nodes, list):
        if len(nodes) > 1:
            print(f"--nodes {','.join(map(str, nodes))}: schedule takes one cluster size", file=sys.stderr)
            return None
        nodes = nodes[0]
    nodes = 100 if nodes is None else nodes
    pods = getattr(args, "pods", None)
    pods = 4 * nodes if pods is None else pods
    rate = getattr(args, "rate", None)
    if nodes < 1 or pods < 1 or (rate is not None and rate <= 0):
        print("--nodes and --pods must be at least 1, --rate above 0", file=sys.stderr)
        return None
    return seed, Shape(nodes=nodes, pods=pods, rate=rate)


def run(args: argparse.Namespace) -> int:
    parsed = shape_from_args(args)
    if parsed is None:
        return 2
    try:
        doc = measure(*parsed)
    except BenchFailed as err:
        print(f"bench schedule FAILED: {err}", file=sys.stderr)
        return 1
    emit("schedule", doc, getattr(args, "output", "table"))
    return 0
