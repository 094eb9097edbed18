"""Running one container probe as the kubelet's probers do (pkg/probe): exec in the container; HTTP GET, TCP connect
and gRPC health Check against the container's port, reached inside its network namespace (the simulated pod has
no routable IP: the messages name the pod IP the kubelet would have dialed). Outputs are the kubelet's."""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import grpc

from gpudra.kubeletapi.grpchealth.v1 import api_pb2 as health_pb
from gpudra.kubeletapi.grpchealth.v1 import api_pb2_grpc as health_grpc
from sim.kubelet import netns
from sim.kubelet.probes import ProbeSpec

USER_AGENT = "kube-probe/1.37"


class ProbeRuntime(Protocol):
    def exec_argv(self, name: str, command: Sequence[str], *, tty: bool = False) -> list[str] | None: ...

    def network_pid(self, name: str) -> int | None: ...


def _port(raw: Any, container: Mapping[str, Any]) -> int | None:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if isinstance(raw, str):
        if raw.isdigit():
            return int(raw)
        for port in container.get("ports") or []:
            if isinstance(port, Mapping) and port.get("name") == raw and isinstance(port.get("containerPort"), int):
                return int(port["containerPort"])
    return None


def run_probe(runtime: ProbeRuntime, runtime_name: str, container: Mapping[str, Any], pod_ip: str,
              spec: ProbeSpec) -> tuple[bool, str]:
    """(succeeded, output) of one run of `spec` against the running container `runtime_name`."""
    if spec.handler == "exec":
        return _exec(runtime, runtime_name, [str(a) for a in spec.action.get("command") or []], spec.timeout)
    port = _port(spec.action.get("port"), container)
    if port is None:
        return False, f"invalid port {spec.action.get('port')!r}: no such container port"
    pid = runtime.network_pid(runtime_name)
    if pid is None:
        return False, "the container is not running"
    if spec.handler == "tcpSocket":
        return _tcp(pid, pod_ip, port, spec.timeout)
    if spec.handler == "httpGet":
        return _http(pid, pod_ip, port, spec.action, spec.timeout)
    return _grpc(pid, pod_ip, port, str(spec.action.get("service") or ""), spec.timeout)


def _exec(runtime: ProbeRuntime, name: str, command: list[str], timeout: float) -> tuple[bool, str]:
    argv = runtime.exec_argv(name, command)
    if argv is None:
        return False, "the container is not running"
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        joined = " ".join(command)
        return False, f'command "{joined}" timed out'
    except OSError as exc:
        return False, str(exc)
    return done.returncode == 0, (done.stdout + done.stderr).decode(errors="replace").strip()


def _dial(pid: int, pod_ip: str, port: int, timeout: float) -> socket.socket:
    try:
        return netns.dial(pid, port, timeout=timeout)
    except netns.DialError as exc:
        refused = "connection refused" in str(exc)
        raise ConnectionError(f"dial tcp {pod_ip}:{port}: "
                              + ("connect: connection refused" if refused else "i/o timeout")) from exc


def _tcp(pid: int, pod_ip: str, port: int, timeout: float) -> tuple[bool, str]:
    try:
        _dial(pid, pod_ip, port, timeout).close()
    except ConnectionError as exc:
        return False, str(exc)
    return True, ""


def _http(pid: int, pod_ip: str, port: int, action: Mapping[str, Any], timeout: float) -> tuple[bool, str]:
    scheme = str(action.get("scheme") or "HTTP").lower()
    path = str(action.get("path") or "/")
    path = path if path.startswith("/") else "/" + path
    host = str(action.get("host") or pod_ip)
    url = f"{scheme}://{host}:{port}{path}"
    headers = {"Host": f"{host}:{port}", "User-Agent": USER_AGENT, "Accept": "*/*", "Connection": "close"}
    for header in action.get("httpHeaders") or []:
        if isinstance(header, Mapping) and header.get("name"):
            headers[str(header["name"])] = str(header.get("value") or "")
    try:
        sock: socket.socket = _dial(pid, pod_ip, port, timeout)
    except ConnectionError as exc:
        return False, f'Get "{url}": {exc}'
    try:
        sock.settimeout(timeout)
        if scheme == "https":
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE  # the kubelet does not verify a probed certificate either
            sock = context.wrap_socket(sock, server_hostname=host)
        head = f"GET {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        sock.sendall(head.encode())
        status_line = sock.makefile("rb").readline(8192).decode("latin-1")
    except (OSError, ssl.SSLError) as exc:
        reason = "context deadline exceeded (Client.Timeout exceeded while awaiting headers)" \
            if isinstance(exc, TimeoutError) else str(exc)
        return False, f'Get "{url}": {reason}'
    finally:
        sock.close()
    parts = status_line.split()
    if len(parts) < 2 or not parts[1].isdigit():
        return False, f'Get "{url}": malformed HTTP response {status_line.strip()!r}'
    code = int(parts[1])
    if 200 <= code < 400:
        return True, ""
    return False, f"HTTP probe failed with statuscode: {code}"


class _Forwarder:
    """A loopback port whose connections are spliced to the container's port (grpc dials it)."""

    def __init__(self, pid: int, pod_ip: str, port: int, timeout: float) -> None:
        self._target = (pid, pod_ip, port, timeout)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self._stop = threading.Event()
        threading.Thread(target=self._accept, name="probe-grpc-forward", daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = _dial(*self._target)
            except ConnectionError:
                client.close()
                continue
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(a, b), name="probe-grpc-pump", daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self.listener.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _grpc(pid: int, pod_ip: str, port: int, service: str, timeout: float) -> tuple[bool, str]:
    address = f"{pod_ip}:{port}"
    forwarder = _Forwarder(pid, pod_ip, port, timeout)
    channel = grpc.insecure_channel(f"127.0.0.1:{forwarder.port}")
    try:
        reply = health_grpc.HealthStub(channel).Check(health_pb.HealthCheckRequest(service=service), timeout=timeout)
    except grpc.RpcError as exc:
        if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return False, f'timeout: failed to connect service "{address}" within {timeout:g}s: {exc.details()}'
        return False, f"rpc error: code = {exc.code().name} desc = {exc.details()}"
    finally:
        channel.close()
        forwarder.close()
    status = health_pb.HealthCheckResponse.ServingStatus.Name(reply.status)
    if status == "SERVING":
        return True, ""
    return False, f'service unhealthy (responded with "{status}")'
