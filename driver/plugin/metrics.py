"""Prometheus metrics of the kubelet plugin, in a registry of their own (no process-global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class PluginMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter(
            "gpu_dra_plugin_calls_total", "DRA gRPC calls by method and outcome", ["method", "api", "outcome"],
            registry=self.registry,
        )
        self.claims = Counter(
            "gpu_dra_plugin_claims_total", "Claims handled by operation and outcome", ["operation", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gpu_dra_plugin_call_seconds", "DRA gRPC call latency", ["method"], buckets=_BUCKETS, registry=self.registry
        )
        self.registrations = Counter(
            "gpu_dra_plugin_registrations_total", "Registration status notifications from the kubelet", ["registered"],
            registry=self.registry,
        )

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)
