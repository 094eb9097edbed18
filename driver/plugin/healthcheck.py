"""The agent's own liveness: grpc.health.v1 on a TCP port for the kubelet's `grpc` probes.

Serving the metrics page proves only that one thread is alive. A Check here instead exercises what a stuck agent
would have stuck: the registration socket answers GetInfo, the DRA socket answers an empty NodePrepareResources
(through the real server, its worker pool and the preparer), the node lock (the checkpoint's flock, held by
every prepare) can be taken, and NVML answers a device count. Each part has a deadline; a Check that misses one
answers NOT_SERVING and names the part in the log.

Before the agent is up (waiting for the NVIDIA driver, then NVML init and the restore of prepared claims) there
is nothing to check yet: the service `liveness` (what the startup and liveness probes ask) answers SERVING, for at
most the startup budget once the driver is there, so that an agent waiting for a driver that comes late is not
restarted into a crash loop; every other name (the readiness probe's) answers NOT_SERVING until the probes are
installed (`HealthServicer.up`).
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from driver.plugin.server import PluginPaths
from gpudra.kubeletapi.dra.v1 import api_pb2 as dra_v1
from gpudra.kubeletapi.dra.v1 import api_pb2_grpc as dra_v1_grpc
from gpudra.kubeletapi.grpchealth.v1 import api_pb2 as health_pb
from gpudra.kubeletapi.grpchealth.v1 import api_pb2_grpc as health_grpc
from gpudra.kubeletapi.pluginregistration.v1 import api_pb2 as reg_pb
from gpudra.kubeletapi.pluginregistration.v1 import api_pb2_grpc as reg_grpc

log = logging.getLogger("gpu-dra.healthcheck")

# Per part: four parts fit the probes' 10 s timeoutSeconds.
CHECK_TIMEOUT_SECONDS = 2.0


@dataclass(frozen=True)
class Probe:
    name: str
    run: Callable[[float], None]  # raises (or overruns its deadline) when the part is wedged


def _call_with_deadline(fn: Callable[[], Any], timeout: float, what: str) -> None:
    """Run `fn` in a daemon thread: a call wedged in C (an NVML ioctl) cannot be interrupted, only outwaited."""
    done = threading.Event()
    error: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the prober
            error.append(exc)
        finally:
            done.set()

    threading.Thread(target=target, name=f"probe-{what}", daemon=True).start()
    if not done.wait(timeout):
        raise TimeoutError(f"{what} did not answer within {timeout:.0f} s")
    if error:
        raise error[0]


def socket_probes(paths: PluginPaths) -> list[Probe]:
    def registration(timeout: float) -> None:
        with grpc.insecure_channel(f"unix://{paths.registration_socket}") as channel:
            info = reg_grpc.RegistrationStub(channel).GetInfo(reg_pb.InfoRequest(), timeout=timeout)
            if info.name != paths.driver_name:
                raise RuntimeError(f"registration socket answers for {info.name!r}")

    def dra(timeout: float) -> None:
        with grpc.insecure_channel(f"unix://{paths.dra_socket}") as channel:
            dra_v1_grpc.DRAPluginStub(channel).NodePrepareResources(dra_v1.NodePrepareResourcesRequest(), timeout=timeout)

    return [Probe("registration-socket", registration), Probe("dra-socket", dra)]


def lock_probe(lock_path: Path) -> Probe:
    """The checkpoint's flock: taken and released at once, through a descriptor of our own (waiting no longer
    than the deadline), so a prepare that hangs while holding it shows here."""

    def run(timeout: float) -> None:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"node lock {lock_path} held for more than {timeout:.0f} s") from None
                    time.sleep(0.05)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    return Probe("node-lock", run)


def nvml_probe(nvml: Any, released: Callable[[], str | None] = lambda: None) -> Probe:
    """NVML answers a device count; skipped while the agent released NVML on purpose (a driver upgrade,
    driver.driverupgrade): failing then would have the kubelet restart the agent into the driver being unloaded."""

    def run(timeout: float) -> None:
        if released() is not None:
            return
        _call_with_deadline(nvml.nvmlDeviceGetCount, timeout, "NVML nvmlDeviceGetCount")

    return Probe("nvml", run)


LIVENESS_SERVICE = "liveness"


class HealthServicer:
    """grpc.health.v1.Health: the empty service name, `liveness` and the driver's name all mean the whole agent once
    it is up; before, see the module's docstring."""

    def __init__(self, probes: list[Probe], service_names: frozenset[str], timeout: float = CHECK_TIMEOUT_SECONDS) -> None:
        self._probes = probes
        self._names = service_names | {"", LIVENESS_SERVICE}
        self._timeout = timeout
        self._lock = threading.Lock()  # one check at a time: probes of several kubelet probe kinds queue here
        self._pending: tuple[str, float | None] | None = None  # (why not up, liveness deadline on time.monotonic)

    def pending(self, why: str, budget_s: float | None = None) -> None:
        """The agent is not up yet (`why`): `liveness` answers SERVING for `budget_s` from now (None: as long as it
        waits), everything else NOT_SERVING."""
        self._pending = (why, None if budget_s is None else time.monotonic() + budget_s)

    def up(self, probes: list[Probe]) -> None:
        """The agent is up: every Check runs `probes`."""
        self._probes = probes
        self._pending = None

    def status(self, service: str = "") -> tuple[Any, str]:
        """(a HealthCheckResponse.ServingStatus, the failed part and why, or "")."""
        pending = self._pending
        if pending is not None:
            why, deadline = pending
            if service == LIVENESS_SERVICE and (deadline is None or time.monotonic() < deadline):
                return health_pb.HealthCheckResponse.SERVING, ""
            return health_pb.HealthCheckResponse.NOT_SERVING, f"not up: {why}"
        with self._lock:
            for probe in self._probes:
                try:
                    probe.run(self._timeout)
                except Exception as exc:  # noqa: BLE001 - any failure means not serving
                    log.warning("event=healthcheck-failed part=%s error=%r", probe.name, str(exc))
                    return health_pb.HealthCheckResponse.NOT_SERVING, f"{probe.name}: {exc}"
        return health_pb.HealthCheckResponse.SERVING, ""

    def Check(self, request: Any, context: grpc.ServicerContext) -> Any:
        if request.service not in self._names:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        status, _ = self.status(request.service)
        return health_pb.HealthCheckResponse(status=status)

    def Watch(self, request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "Watch is not served; use Check")


def serve(servicer: HealthServicer, port: int, host: str = "0.0.0.0") -> tuple[grpc.Server, int]:
    """Start the health server; returns it and the bound port (port 0 picks one)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="healthz"))
    health_grpc.add_HealthServicer_to_server(servicer, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise RuntimeError(f"could not listen on {host}:{port} for the health service")
    server.start()
    log.info("event=healthcheck-serving address=%s port=%d", host, bound)
    return server, bound
