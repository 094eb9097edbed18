"""`python -m bench.podload URL|KUBECONFIG SEED PODS RATE TIMEOUT`: the pods of `bench schedule`, created from a process of
their own (as a cluster's users and workload controllers are), and when each one was bound.

The controller under test then shares its process with nobody: pod creation and the watch do not wait for its
interpreter lock, and their CPU time is reported apart from the controller's.

Protocol on stdin/stdout: once the watch on pods is open it prints `ready`; on a line `go` it creates the pods
(back to back, or RATE per second when RATE > 0), waits until every one has a nodeName (or TIMEOUT seconds pass)
and prints one JSON line: per pod, seconds from the first create to its create returning (`created`) and to its
binding seen by the watch (`bound`), this process's CPU seconds from `go`, and an `error` when the watch failed.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from dataclasses import dataclass, field

from controller import objects as o
from gpudra.kubeapi import KubeApi

NAMESPACE = "default"
# (GPUs per pod, weight): 1.8 GPUs per pod on average, so 400 pods take about 90% of 100 x 8 GPUs.
POD_SHAPES: tuple[tuple[int, float], ...] = ((1, 0.5), (2, 0.35), (4, 0.15))


def pod_sizes(seed: int, pods: int) -> list[int]:
    rng = random.Random(seed)
    counts = [c for c, _ in POD_SHAPES]
    weights = [w for _, w in POD_SHAPES]
    return rng.choices(counts, weights, k=pods)


def pod_object(name: str, gpus: int) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"gpus": str(gpus)}},
            "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": f"gpu-{gpus}"}]}}


@dataclass
class BindWatch:
    """Records, from a watch on its own connection, when each pod was first seen with a nodeName."""

    api: KubeApi
    expected: int
    bound_at: dict[str, float] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    all_bound: threading.Event = field(default_factory=threading.Event)
    error: str = ""

    def run(self, resource_version: str) -> None:
        # From the resourceVersion of a list made before any pod exists: no binding is missed, however late the
        # stream opens. Only bound pods: a pod appears (ADDED) in this watch when it gets its nodeName.
        try:
            for _, pod in self.api.watch("Pod", namespace=NAMESPACE, field_selector="spec.nodeName!=",
                                         resource_version=resource_version, stop=self.stop):
                if o.section(pod, "spec").get("nodeName") and o.name(pod) not in self.bound_at:
                    self.bound_at[o.name(pod)] = time.perf_counter()
                    if len(self.bound_at) >= self.expected:
                        self.all_bound.set()
        except Exception as err:  # noqa: BLE001 - reported to the parent, which fails the run
            self.error = f"pod watch failed: {err}"
            self.all_bound.set()


def main(argv: list[str]) -> int:
    url, seed, pods, rate, timeout = argv[0], int(argv[1]), int(argv[2]), float(argv[3]), float(argv[4])
    sizes = {f"pod-{i:04d}": g for i, g in enumerate(pod_sizes(seed, pods))}
    # The embedded server's plain URL, or the kubeconfig of a real cluster (TLS and client certificates).
    plain = url.startswith(("http://", "https://"))

    def connect() -> KubeApi:
        return KubeApi.connect(url=url) if plain else KubeApi.connect(kubeconfig=url)

    api = connect()
    watcher = BindWatch(connect(), expected=len(sizes))
    _, rv = api.list("Pod", namespace=NAMESPACE)
    threading.Thread(target=watcher.run, args=(str(rv),), name="bind-watch", daemon=True).start()
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 2
    cpu_start = time.process_time()
    start = time.perf_counter()
    created: dict[str, float] = {}
    for i, (name, gpus) in enumerate(sizes.items()):
        if rate > 0:
            pause = start + i / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
        api.create("Pod", pod_object(name, gpus), namespace=NAMESPACE)
        created[name] = time.perf_counter() - start
    watcher.all_bound.wait(timeout)
    cpu = time.process_time() - cpu_start
    watcher.stop.set()
    bound = {n: t - start for n, t in dict(watcher.bound_at).items()}
    print(json.dumps({"created": created, "bound": bound, "cpuSeconds": cpu, "error": watcher.error}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
