"""`gpu-dra bench store` and `gpu-dra bench serving`: the embedded control plane measured over real HTTP.

store: durable writes. Creates through HTTP by 1, 4 and 16 concurrent writers against a server whose state
is a database file (every 201 follows an fsync'd commit); prints writes/s, p50/p99 latency and how many
writes shared one commit (group commit), next to the same load in memory for comparison.

serving: the server runs as its own process (`gpu-dra apiserver`, in memory) so that its CPU time is its own:
requests/s and server CPU per request for GET, PUT and CREATE (4 clients on kept-alive connections) as a
ServiceAccount (token, RBAC, admission) and, alternately in the same server, as the admin (system:masters, which
the authorizer allows without RBAC; `serviceAccountCostPercent` is the difference), and the
cost of one event with 32 watchers: a PUT, then the time until all 32 watch streams have read the event, over
many events, with the server's CPU time per event (the PUT included).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from bench.report import emit
from bench.stats import peak_rss_mib, percentile
from controlplane import EmbeddedApiServer

_LEASES = "/apis/coordination.k8s.io/v1/namespaces/default/leases"


class _Client:
    """One kept-alive HTTP/1.1 connection, with a bearer token when given."""

    def __init__(self, url: str, token: str | None = None) -> None:
        u = urlsplit(url)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        self.auth = {"Authorization": f"Bearer {token}"} if token else {}

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json", **self.auth} if data is not None else dict(self.auth)
        self.conn.request(method, path, body=data, headers=headers)
        resp = self.conn.getresponse()
        return resp.status, resp.read()


def _lease(name: str, holder: str = "a") -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15}}


def _run_clients(url: str, clients: int, per_client: int, op: Any,
                 token: str | None = None) -> tuple[float, list[float]]:
    """Run `op(client, client_index, i)` per_client times on each of `clients` threads; (seconds, latencies)."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []
    barrier = threading.Barrier(clients + 1)

    def worker(ci: int) -> None:
        c = _Client(url, token)
        barrier.wait()
        for i in range(per_client):
            t0 = time.perf_counter()
            code, body = op(c, ci, i)
            latencies[ci].append(time.perf_counter() - t0)
            if code >= 300:
                errors.append(f"{code} {body[:200]!r}")
        c.conn.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed, first: {errors[0]}")
    return elapsed, [x for lat in latencies for x in lat]


def _figures(n: int, elapsed: float, lat: list[float]) -> dict[str, float]:
    return {"perSecond": round(n / elapsed, 1), "p50Ms": round(percentile(lat, 50) * 1000, 2),
            "p99Ms": round(percentile(lat, 99) * 1000, 2)}


def bench_store(writes: int = 1200, directory: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"writes": writes, "durable": {}, "memory": {}}
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        out["directory"] = str(Path(tmp).parent)
        for mode in ("durable", "memory"):
            for writers in (1, 4, 16):
                state = Path(tmp) / f"state-{writers}.db" if mode == "durable" else None
                with EmbeddedApiServer(state_file=state, unauthenticated_as_admin=False) as srv:
                    token = _service_account_token(srv.url, srv.admin_token)
                    before = srv.store.storage_stats()
                    per = max(1, writes // writers)
                    elapsed, lat = _run_clients(
                        srv.url, writers, per,
                        lambda c, ci, i: c.call("POST", _LEASES, _lease(f"w{ci}-{i}")), token)
                    fig = _figures(per * writers, elapsed, lat)
                    after = srv.store.storage_stats()
                    if before is not None and after is not None:
                        commits = after["commits"] - before["commits"]
                        fig["commits"] = commits
                        fig["writesPerCommit"] = round((after["writes"] - before["writes"]) / max(commits, 1), 2)
                    out[mode][f"writers{writers}"] = fig
    return out


def _watch_stream(url: str, path: str, ready: threading.Barrier, want: int, arrived: list[float],
                  lock: threading.Lock, counts: list[int], idx: int, token: str) -> None:
    u = urlsplit(url)
    sock = socket.create_connection((u.hostname, u.port))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += sock.recv(65536)
    buf = buf.split(b"\r\n\r\n", 1)[1]
    ready.wait()
    seen = 0
    while seen < want:
        if buf.count(b'"type":"MODIFIED"') <= seen:
            chunk = sock.recv(65536)
            if not chunk:
                break
            buf += chunk
            continue
        seen = buf.count(b'"type":"MODIFIED"')
        with lock:
            counts[idx] = seen
            arrived.append(time.perf_counter())
    sock.close()


# The benchmark's identity: a ServiceAccount whose RBAC grants what it does, so every request passes token
# authentication, the account lookup, RBAC and the admission chain (kube-apiserver's whole path).
_BENCH_RBAC = [
    ("/api/v1/namespaces/default/serviceaccounts", {"metadata": {"name": "bench"}}),
    ("/apis/rbac.authorization.k8s.io/v1/clusterroles", {"metadata": {"name": "bench"}, "rules": [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "verbs": ["get", "list", "watch", "create", "update"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["create", "update"]}]}),
    ("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "metadata": {"name": "bench"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "bench"},
        "subjects": [{"kind": "ServiceAccount", "name": "bench", "namespace": "default"}]}),
]


def _service_account_token(url: str, admin_token: str) -> str:
    admin = _Client(url, admin_token)
    for path, body in _BENCH_RBAC:
        code, raw = admin.call("POST", path, body)
        if code != 201:
            raise RuntimeError(f"bench setup: POST {path}: {code} {raw[:200]!r}")
    code, raw = admin.call("POST", "/api/v1/namespaces/default/serviceaccounts/bench/token", {"spec": {}})
    if code != 201:
        raise RuntimeError(f"bench setup: TokenRequest: {code} {raw[:200]!r}")
    admin.conn.close()
    return str(json.loads(raw)["status"]["token"])


@contextlib.contextmanager
def _server_process(audit_level: str | None = None) -> Iterator[tuple[str, int, str]]:
    """`gpu-dra apiserver` with credentials required, and an audit log at `audit_level` for every request when
    given; (url, pid, the admin token)."""
    root = Path(__file__).resolve().parent.parent
    tmp = tempfile.mkdtemp()
    kubeconfig = Path(tmp) / "kubeconfig"
    audit: list[str] = []
    if audit_level is not None:
        policy = Path(tmp) / "audit-policy.yaml"
        policy.write_text(json.dumps({"apiVersion": "audit.k8s.io/v1", "kind": "Policy",
                                      "rules": [{"level": audit_level}]}))
        audit = ["--audit-policy-file", str(policy), "--audit-log-path", str(Path(tmp) / "audit.log")]
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "apiserver", "--no-unauthenticated-as-admin", "--no-tls",
                             "--kubeconfig-out", str(kubeconfig), *audit], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, cwd=root,
                            env={**os.environ, "PYTHONPATH": str(root)})
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        if not url.startswith("http://"):
            raise RuntimeError("gpu-dra apiserver did not start")
        token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
        yield url, proc.pid, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_serving(requests: int = 2000, events: int = 200, watchers: int = 32,
                  audit_level: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with _server_process(audit_level) as (url, pid, admin_token):
        srv = argparse.Namespace(url=url)
        token = _service_account_token(url, admin_token)
        setup = _Client(srv.url, token)
        for i in range(4):
            setup.call("POST", _LEASES, _lease(f"get-{i}"))
        clients = 4
        per = max(1, requests // clients)

        def ops(prefix: str) -> dict[str, Any]:
            return {
                "get": lambda c, ci, i: c.call("GET", f"{_LEASES}/get-{ci}"),
                "put": lambda c, ci, i: c.call("PUT", f"{_LEASES}/get-{ci}", _lease(f"get-{ci}", f"h{i}")),
                "create": lambda c, ci, i: c.call("POST", _LEASES, _lease(f"{prefix}-{ci}-{i}")),
            }
        # The same requests as the admin (system:masters: its token is checked first and the authorizer
        # allows the group without consulting RBAC) and as the ServiceAccount, alternately, in one server: what
        # ServiceAccount authentication and RBAC cost (admission runs for both).
        admin: dict[str, Any] = {}
        for round_ in range(2):
            for who, who_token, figures in (("sa", token, out), ("admin", admin_token, admin)):
                for name, op in ops(f"{who}{round_}").items():
                    cpu0 = _cpu_s(pid)
                    elapsed, lat = _run_clients(srv.url, clients, per // 2, op, who_token)
                    cpu = _cpu_s(pid) - cpu0
                    fig = figures.setdefault(name, {"n": 0, "elapsed": 0.0, "lat": [], "cpu": 0.0})
                    fig["n"] += (per // 2) * clients
                    fig["elapsed"] += elapsed
                    fig["lat"] += lat
                    fig["cpu"] += cpu
        for figures in (out, admin):
            for name, fig in list(figures.items()):
                figures[name] = {**_figures(fig["n"], fig["elapsed"], fig["lat"]),
                                 "serverCpuMsPerRequest": round(fig["cpu"] / fig["n"] * 1000, 3)}
        out["asAdmin"] = admin
        out["serviceAccountCostPercent"] = {
            name: round(100 * (out[name]["serverCpuMsPerRequest"] / max(admin[name]["serverCpuMsPerRequest"], 1e-9)
                               - 1), 1) for name in admin}

        setup.call("POST", _LEASES, _lease("watched"))
        _, raw = setup.call("GET", f"{_LEASES}/watched")
        rv = json.loads(raw)["metadata"]["resourceVersion"]
        ready = threading.Barrier(watchers + 1)
        lock = threading.Lock()
        counts = [0] * watchers
        arrived: list[float] = []
        path = f"{_LEASES}?watch=true&resourceVersion={rv}&fieldSelector=metadata.name%3Dwatched"
        threads = [threading.Thread(target=_watch_stream, args=(srv.url, path, ready, events, arrived, lock, counts, i, token),
                                    daemon=True) for i in range(watchers)]
        for t in threads:
            t.start()
        ready.wait()
        per_event: list[float] = []
        cpu0 = _cpu_s(pid)
        t_all = time.perf_counter()
        for i in range(events):
            t0 = time.perf_counter()
            setup.call("PUT", f"{_LEASES}/watched", _lease("watched", f"e{i}"))
            deadline = time.monotonic() + 30
            while True:
                with lock:
                    if min(counts) > i:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"event {i} did not reach all {watchers} watchers within 30 s")
                time.sleep(0.0002)
            per_event.append(time.perf_counter() - t0)
        total = time.perf_counter() - t_all
        cpu = _cpu_s(pid) - cpu0
        out[f"event{watchers}Watchers"] = {
            "events": events, "p50Ms": round(percentile(per_event, 50) * 1000, 2),
            "p99Ms": round(percentile(per_event, 99) * 1000, 2), "eventsPerSecond": round(events / total, 1),
            "serverCpuMsPerEvent": round(cpu / events * 1000, 2)}
        # Writes of another resource while the 32 Lease watchers stay open: watchers woken per resource type
        # cost nothing here; woken by every event, each would wake up and scan.
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "unrelated"}}
        setup.call("POST", "/api/v1/nodes", node)
        n = max(1, requests // 4)
        cpu0 = _cpu_s(pid)
        t0 = time.perf_counter()
        for i in range(n):
            setup.call("PUT", "/api/v1/nodes/unrelated", {**node, "metadata": {"name": "unrelated",
                                                                               "labels": {"i": str(i)}}})
        out[f"otherPutWith{watchers}Watchers"] = {
            "perSecond": round(n / (time.perf_counter() - t0), 1),
            "serverCpuMsPerRequest": round((_cpu_s(pid) - cpu0) / n * 1000, 3)}
        setup.conn.close()
    out["peakRssMiB"] = peak_rss_mib()
    return out


def run_store(args: argparse.Namespace) -> int:
    figures = bench_store(getattr(args, "size", None) or 1200, directory=os.environ.get("TMPDIR"))
    emit("store", {"shape": "HTTP creates; durable = fsync'd before 201", **figures}, args.output)
    return 0


def run_serving(args: argparse.Namespace) -> int:
    audit_level = getattr(args, "audit_level", None)
    figures = bench_serving(getattr(args, "size", None) or 2000, audit_level=audit_level)
    emit("serving", {"shape": "4 kept-alive clients; one event to 32 watchers; every request as a ServiceAccount "
                               "(token, RBAC, admission); get/put/create also as the admin (system:masters) in "
                               "alternate rounds: asAdmin", "auditLevel": audit_level or "no audit log", **figures},
         args.output)
    return 0
