"""`gpu-dra bench kubeapi [-o json]`: client CPU per API call, the official client's request path against KubeApi's.

Both paths talk to one `gpu-dra apiserver` in a child process over the same ApiClient (configuration, auth,
urllib3 pool); only the client side differs:
- official: `ApiClient.param_serialize` + `ApiClient.call_api` (the generated client's generic request path, what
  KubeApi used before), JSON decoded from the response;
- kubeapi: `KubeApi._call` (one `json.dumps`, a connection of the host's pool, the response read by
  `gpudra.http1`, one `json.loads`).
Per path and call shape (GET of a pod, PUT of a claim's status with a 4-device allocation, POST of an Event),
N calls are timed with this thread's CPU time (robust to other load); the server's work is not counted.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections.abc import Callable
from typing import Any

from bench.report import emit
from bench.podload import pod_object
from bench.schedule import ServerProcess, node_object
from bench.stats import peak_rss_mib
from gpudra.kubeapi import KubeApi

CALLS = 300


def _official(api: KubeApi, method: str, path: str, body: Any = None) -> Any:
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    request = api.client.param_serialize(method=method, resource_path=path, query_params=[], header_params=headers,
                                         body=body, auth_settings=["BearerToken"])
    response = api.client.call_api(*request)
    if response.status >= 300:
        raise RuntimeError(f"{method} {path}: HTTP {response.status}")
    return json.loads(response.read() or b"null")


def _claim(name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 4}}]}}}


_EVENT_NAMES = itertools.count()


def _event() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": f"bench.{next(_EVENT_NAMES)}", "namespace": "default"},
            "involvedObject": {"kind": "Pod", "name": "bench", "namespace": "default"}, "reason": "Scheduled",
            "message": "Successfully assigned default/bench to node-000", "type": "Normal"}


def _cpu_us(fn: Callable[[int], Any], calls: int) -> float:
    start = time.thread_time()
    for i in range(calls):
        fn(i)
    return round((time.thread_time() - start) * 1e6 / calls, 1)


def measure(calls: int = CALLS) -> dict[str, Any]:
    server = ServerProcess()
    api = KubeApi.connect(url=server.url)
    try:
        api.create("Node", node_object("node-000"))
        api.create("Pod", pod_object("bench", 4), namespace="default")
        claim = api.create("ResourceClaim", _claim("bench"), namespace="default")
        pod_path = "/api/v1/namespaces/default/pods/bench"
        status_path = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/bench/status"
        results = [{"request": "gpus", "driver": "gpu.nvidia.com", "pool": "node-000", "device": f"gpu-{d}"} for d in range(4)]
        state = {"claim": claim}

        def put_status(path_fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[int], Any]:
            def call(i: int) -> None:
                body = dict(state["claim"])
                body["status"] = {"allocation": {"devices": {"results": results}}} if i % 2 == 0 else {}
                state["claim"] = path_fn(body)
            return call

        shapes: dict[str, dict[str, Callable[[int], Any]]] = {
            "getPod": {"official": lambda i: _official(api, "GET", pod_path),
                       "kubeapi": lambda i: api._call("GET", pod_path)},
            "putClaimStatus": {"official": put_status(lambda b: _official(api, "PUT", status_path, b)),
                               "kubeapi": put_status(lambda b: api._call("PUT", status_path, body=b))},
            "postEvent": {"official": lambda i: _official(api, "POST", "/api/v1/namespaces/default/events", _event()),
                          "kubeapi": lambda i: api._call("POST", "/api/v1/namespaces/default/events", body=_event())},
        }
        out: dict[str, dict[str, float]] = {}
        for shape, paths in shapes.items():
            for fn in paths.values():
                fn(0)  # warm the connection and caches
            out[shape] = {f"{name}CpuUsPerCall": _cpu_us(fn, calls) for name, fn in paths.items()}
        return {"benchmark": "kubeapi", "calls": calls, "shapes": out, "peakRssMiB": peak_rss_mib()}
    finally:
        api.close()
        server.stop()


def run(args: argparse.Namespace) -> int:
    doc = measure(getattr(args, "size", None) or CALLS)
    emit("kubeapi", doc, getattr(args, "output", "table"))
    return 0
