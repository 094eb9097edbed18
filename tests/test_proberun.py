"""Running one probe as the kubelet's probers do, against servers in this process's own network namespace (the
kubelet simulator enters a container's the same way): HTTP status codes, a refused TCP port, a gRPC health
service serving or not, an exec that times out, and the kubelet's words for each outcome."""

from __future__ import annotations

import http.server
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from typing import Any

import grpc
import pytest

from gpudra.kubeletapi.grpchealth.v1 import api_pb2 as health_pb
from gpudra.kubeletapi.grpchealth.v1 import api_pb2_grpc as health_grpc
from sim.kubelet.proberun import run_probe
from sim.kubelet.probes import probe_specs

POD_IP = "10.244.7.9"


class _Here:
    """A 'container' that is this process: exec runs the command here, its network namespace is ours."""

    def exec_argv(self, name: str, command: Sequence[str], *, tty: bool = False) -> list[str] | None:
        return list(command)

    def network_pid(self, name: str) -> int | None:
        return os.getpid()


def _spec(**probe: Any) -> Any:
    return probe_specs({"readinessProbe": {**probe, "timeoutSeconds": 1}})["readiness"]


def _run(container: dict[str, Any] | None = None, **probe: Any) -> tuple[bool, str]:
    return run_probe(_Here(), "c", container or {}, POD_IP, _spec(**probe))


@pytest.fixture(autouse=True)
def _may_enter_namespaces() -> None:
    if os.geteuid() != 0:
        pytest.skip("entering a network namespace (setns) needs root")


@pytest.fixture
def http_port() -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            code = {"/ok": 200, "/moved": 302, "/broken": 503}.get(self.path, 404)
            agent = self.headers.get("User-Agent", "")
            self.send_response(code if agent == "kube-probe/1.37" and self.headers.get("X-Probe") == "yes" else 400)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()


def test_http_probe_codes_and_refusal(http_port: int) -> None:
    headers = [{"name": "X-Probe", "value": "yes"}]
    assert _run(httpGet={"path": "/ok", "port": http_port, "httpHeaders": headers}) == (True, "")
    assert _run(httpGet={"path": "/moved", "port": http_port, "httpHeaders": headers}) == (True, "")
    assert _run(httpGet={"path": "/broken", "port": http_port, "httpHeaders": headers}) == (
        False, "HTTP probe failed with statuscode: 503")
    # A named port resolves through the container's ports.
    named = {"ports": [{"name": "web", "containerPort": http_port}]}
    assert _run(named, httpGet={"path": "/ok", "port": "web", "httpHeaders": headers}) == (True, "")
    assert _run(httpGet={"path": "/ok", "port": 1}) == (
        False, f'Get "http://{POD_IP}:1/ok": dial tcp {POD_IP}:1: connect: connection refused')


def test_tcp_probe(http_port: int) -> None:
    assert _run(tcpSocket={"port": http_port}) == (True, "")
    assert _run(tcpSocket={"port": 1}) == (False, f"dial tcp {POD_IP}:1: connect: connection refused")


def test_grpc_probe_serving_and_not() -> None:
    class Health(health_grpc.HealthServicer):
        def Check(self, request: Any, context: Any) -> Any:  # noqa: N802 - the service's name
            serving = health_pb.HealthCheckResponse.SERVING if request.service != "down" else \
                health_pb.HealthCheckResponse.NOT_SERVING
            return health_pb.HealthCheckResponse(status=serving)

    server = grpc.server(futures.ThreadPoolExecutor(2))
    health_grpc.add_HealthServicer_to_server(Health(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        assert _run(grpc={"port": port}) == (True, "")
        assert _run(grpc={"port": port, "service": "down"}) == (False, 'service unhealthy (responded with "NOT_SERVING")')
    finally:
        server.stop(0)
    ok, message = _run(grpc={"port": 1})
    assert not ok and message.startswith(f'timeout: failed to connect service "{POD_IP}:1" within 1s')


@pytest.mark.process
def test_exec_probe_output_and_timeout() -> None:
    assert _run(exec={"command": [sys.executable, "-c", "print('fine')"]}) == (True, "fine")
    assert _run(exec={"command": [sys.executable, "-c", "import sys; print('broken', file=sys.stderr); sys.exit(3)"]}) == (
        False, "broken")
    slow = [sys.executable, "-c", "import time; time.sleep(5)"]
    assert _run(exec={"command": slow}) == (False, f'command "{" ".join(slow)}" timed out')
