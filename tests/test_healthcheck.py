"""The agent's grpc.health.v1 service, as the kubelet's grpc probe calls it: SERVING while the DRA socket, the
registration socket, the node lock and NVML answer; NOT_SERVING when any of them is wedged or gone."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from driver.checkpoint import LOCK_NAME
from driver.plugin.agent import NodeAgent
from driver.plugin.healthcheck import HealthServicer, lock_probe, nvml_probe, serve, socket_probes
from gpudra.kubeletapi.grpchealth.v1 import api_pb2 as health_pb
from gpudra.kubeletapi.grpchealth.v1 import api_pb2_grpc as health_grpc
from tests.plugin_helpers import DRIVER, short_tmp, start_agent

SERVING = health_pb.HealthCheckResponse.SERVING
NOT_SERVING = health_pb.HealthCheckResponse.NOT_SERVING


class WedgeableNvml:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.release.set()

    def nvmlDeviceGetCount(self) -> int:
        self.release.wait()
        return 8


@pytest.fixture
def agent(apiserver) -> Iterator[NodeAgent]:  # type: ignore[no-untyped-def]
    with short_tmp() as tmp:
        a = start_agent(tmp, apiserver.api, publish=False)
        try:
            yield a
        finally:
            a.stop()


def _check(port: int, service: str = "") -> Any:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return health_grpc.HealthStub(channel).Check(health_pb.HealthCheckRequest(service=service), timeout=30).status


def test_health_follows_sockets_lock_and_nvml(agent: NodeAgent) -> None:
    nvml = WedgeableNvml()
    probes = socket_probes(agent.paths) + [lock_probe(agent.paths.plugin_dir / LOCK_NAME), nvml_probe(nvml)]
    server, port = serve(HealthServicer(probes, frozenset({DRIVER}), timeout=0.5), 0, host="127.0.0.1")
    try:
        assert _check(port) == SERVING and _check(port, DRIVER) == SERVING
        with pytest.raises(grpc.RpcError) as err:
            _check(port, "other.example.com")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND

        # A prepare that hangs holding the node lock.
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            with agent.checkpoint.locked():
                held.set()
                release.wait(30)

        t = threading.Thread(target=hold, daemon=True)
        t.start()
        held.wait(10)
        assert _check(port) == NOT_SERVING
        release.set()
        t.join(10)
        assert _check(port) == SERVING

        # NVML stuck in a call.
        nvml.release.clear()
        assert _check(port) == NOT_SERVING
        nvml.release.set()
        time.sleep(0.05)
        assert _check(port) == SERVING

        # The DRA server gone (its socket with it).
        agent.plugin.stop(grace=0.1)
        assert _check(port) == NOT_SERVING
    finally:
        server.stop(grace=None)
