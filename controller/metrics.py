"""Prometheus metrics of the cluster agent.

Each ControllerMetrics owns its own CollectorRegistry, so two controller instances in one
process (the leader-failover test, the demo) never share or clash over counters.
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer
from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import start_wsgi_server

GANG_STATES: tuple[str, ...] = ("waiting", "unschedulable", "allocated", "bound", "released")

# Reconcile passes take microseconds to a few hundred milliseconds (placing pods over many nodes).
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ControllerMetrics:
    """The controller's counters, gauges and histograms on a private registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.allocations = Counter(
            "gpudra_controller_allocations",
            "ResourceClaims the controller allocated, by path (scheduler: embedded placement; gang: pre-allocation).",
            ["path"],
            registry=self.registry,
        )
        self.failures = Counter(
            "gpudra_controller_allocation_failures",
            "Attempts that could not allocate or place, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.deallocations = Counter(
            "gpudra_controller_deallocations",
            "ResourceClaims whose allocation the controller removed, by cause.",
            ["cause"],
            registry=self.registry,
        )
        self.bindings = Counter(
            "gpudra_controller_pod_bindings",
            "Pods the embedded scheduler bound to a node, by kind (dra, extended-resource, plain).",
            ["kind"],
            registry=self.registry,
        )
        self.claims_created = Counter(
            "gpudra_controller_claims_created",
            "ResourceClaims created from pods' ResourceClaimTemplates.",
            registry=self.registry,
        )
        self.events = Counter(
            "gpudra_controller_events",
            "Kubernetes Events posted, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.conflicts = Counter(
            "gpudra_controller_write_conflicts",
            "Optimistic-concurrency conflicts met while writing (each is re-read and retried).",
            registry=self.registry,
        )
        self.gangs = Gauge(
            "gpudra_controller_gangs",
            "Gangs known to the controller, by state.",
            ["state"],
            registry=self.registry,
        )
        self.reconcile_seconds = Histogram(
            "gpudra_controller_reconcile_seconds",
            "Duration of one reconcile pass, by concern.",
            ["concern"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.leader = Gauge(
            "gpudra_controller_leader",
            "1 while this instance holds the leader lease, else 0.",
            registry=self.registry,
        )
        self.pending_pods = Gauge(
            "gpudra_controller_pending_pods",
            "Pods waiting for placement (embedded mode) or for their claims (cluster mode).",
            registry=self.registry,
        )
        for state in GANG_STATES:
            self.gangs.labels(state=state).set(0)
        self.leader.set(0)

    def set_gang_states(self, counts: Mapping[str, int]) -> None:
        for state in GANG_STATES:
            self.gangs.labels(state=state).set(counts.get(state, 0))

    def exposition(self) -> bytes:
        """The registry in Prometheus text format (what /metrics serves)."""
        return generate_latest(self.registry)


class MetricsServer:
    """Serves one registry on http://HOST:PORT/metrics from a daemon thread; port 0 picks a free port."""

    def __init__(self, registry: CollectorRegistry, port: int, host: str = "0.0.0.0") -> None:
        self._registry = registry
        self._port = port
        self._host = host
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("metrics server: port is known only after start()")
        return int(self._server.server_port)

    def start(self) -> None:
        self._server, self._thread = start_wsgi_server(self._port, self._host, self._registry)

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None


def sample_value(exposition: str, name: str, labels: Mapping[str, str] | None = None) -> float | None:
    """Read one sample from Prometheus text format (for tests and the demo report)."""
    wanted = labels or {}
    for line in exposition.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, raw_labels = head.partition("{")
        if metric != name:
            continue
        parsed = dict(_parse_labels(raw_labels.rstrip("}")))
        if all(parsed.get(k) == v for k, v in wanted.items()):
            return float(value)
    return None


def _parse_labels(text: str) -> Iterable[tuple[str, str]]:
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        yield key.strip(), value.strip().strip('"')
