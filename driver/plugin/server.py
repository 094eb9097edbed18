"""The kubelet plugin's gRPC side: registration socket, DRA service socket, re-registration after kubelet restarts.

Sockets (kubelet-wire.md 1.5):
- `<kubelet dir>/plugins_registry/<driver>-reg.sock`: pluginregistration.Registration (GetInfo, Notify...).
- `<kubelet dir>/plugins/<driver>/dra.sock`: DRAPlugin v1 and v1beta1, and DRAResourceHealth v1 and v1alpha1.
With an instance id (the pod's UID, for rolling updates where two agent pods overlap on a node) both names carry
it, as the kubeletplugin helper names them: `<driver>-<uid>-reg.sock` (or a hashed form when that does not fit a
unix socket path) and `dra-<uid>.sock`; each instance removes only its own sockets.

GetInfo advertises `v1.DRAPlugin`, `v1beta1.DRAPlugin`, `v1.DRAResourceHealth`, `v1alpha1.DRAResourceHealth` in
that order: the kubelet takes the first DRAPlugin service it supports; a 1.37 kubelet streams health from
`v1.DRAResourceHealth` when advertised (else v1alpha1), 1.34-1.36 kubelets know only v1alpha1. Each successful NotifyRegistrationStatus calls `on_registered` (slices must be
(re)published after every registration, since the kubelet wipes them when it starts). A watcher notices when
the registration socket is removed or replaced (kubelet restart, manual cleanup) and serves it again, so the
kubelet finds and registers the plugin anew.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc

from driver.plugin.health import DeviceHealthEntry, HealthBoard, truncate_message
from driver.plugin.metrics import PluginMetrics
from driver.prepare import ClaimRef, ClaimResult
from driver.unixsocket import MAX_UNIX_SOCKET_PATH, SocketIdentity, listen, listening, socket_identity
from gpudra.kubeletapi.dra.v1 import api_pb2 as dra_v1
from gpudra.kubeletapi.dra.v1 import api_pb2_grpc as dra_v1_grpc
from gpudra.kubeletapi.dra.v1beta1 import api_pb2 as dra_v1beta1
from gpudra.kubeletapi.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from gpudra.kubeletapi.drahealth.v1 import api_pb2 as health_v1
from gpudra.kubeletapi.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from gpudra.kubeletapi.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from gpudra.kubeletapi.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from gpudra.kubeletapi.pluginregistration.v1 import api_pb2 as reg_pb
from gpudra.kubeletapi.pluginregistration.v1 import api_pb2_grpc as reg_grpc

log = logging.getLogger("gpu-dra.plugin")

DRA_PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_SERVICES: tuple[str, ...] = (
    "v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth",
)
# Streams re-check for shutdown this often; health changes wake them at once.
_STREAM_POLL_SECONDS = 1.0
# The kubelet stamps each reported device with the time it received the report and treats it as Unknown 30 s
# later (healthInfoCache.getHealthInfo): the full list is sent again at least this often even when nothing changed.
HEALTH_RESEND_SECONDS = 10.0
# Other instances' dead sockets are looked for at start and every this many registration checks (30 s with the
# agent's 1 s check).
STALE_SWEEP_TICKS = 30


def _b64_hash(data: bytes, size: int) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()[:size]).decode().rstrip("=")


class ClaimPreparer(Protocol):
    """What the DRA service calls: the GPU driver's Preparer, or the compute-domain driver's."""

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]: ...

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]: ...


@dataclass(frozen=True)
class PluginPaths:
    kubelet_dir: Path
    driver_name: str
    # The agent pod's UID (or any id unique per running instance); "" for the fixed single-instance names.
    instance: str = ""

    @property
    def registry_dir(self) -> Path:
        return self.kubelet_dir / "plugins_registry"

    @property
    def registration_socket(self) -> Path:
        if not self.instance:
            return self.registry_dir / f"{self.driver_name}-reg.sock"
        # The kubeletplugin helper's choice: the first name whose path fits a unix socket.
        keyed = self.driver_name.encode() + b"\0" + self.instance.encode()
        candidates = (
            f"{self.driver_name}-{self.instance}-reg.sock",
            f"{self.driver_name}-{_b64_hash(self.instance.encode(), 8)}-reg.sock",
            f"dra-{_b64_hash(keyed, 16)}-reg.sock",
        )
        paths = [self.registry_dir / name for name in candidates]
        return next((p for p in paths if len(os.fsencode(str(p))) <= MAX_UNIX_SOCKET_PATH), paths[-1])

    @property
    def plugin_dir(self) -> Path:
        return self.kubelet_dir / "plugins" / self.driver_name

    @property
    def hook_dir(self) -> Path:
        """Where the agent installs its CDI hook (driver.cdihook): under the kubelet's plugins dir, which the
        agent sees at its host path, apart from the 0700 plugin dir so that a runtime in a user namespace can
        still run it."""
        return self.kubelet_dir / "plugins" / f"{self.driver_name}-cdi-hook"

    @property
    def dra_socket(self) -> Path:
        return self.plugin_dir / (f"dra-{self.instance}.sock" if self.instance else "dra.sock")

    def serving(self) -> bool:
        """Whether this instance's DRA socket accepts connections (its agent runs)."""
        return socket_identity(self.dra_socket) is not None and listening(self.dra_socket)

    def stale_sockets(self) -> list[Path]:
        """Sockets of this driver's other instances that nobody listens on any more (a pod killed before it could
        clean up): the kubelet would keep trying to register them. Live ones (an overlapping pod) are kept."""
        found = [*self.registry_dir.glob(f"{self.driver_name}-*reg.sock"), *self.plugin_dir.glob("dra*.sock")]
        own = {self.registration_socket, self.dra_socket}
        return [p for p in sorted(found) if p not in own and socket_identity(p) is not None and not listening(p)]


def _claims(request: Any) -> list[ClaimRef]:
    return [ClaimRef(uid=c.uid, namespace=c.namespace, name=c.name) for c in request.claims]


class DraServicer:
    """DRAPlugin for one API version (`pb` is the v1 or v1beta1 message module)."""

    def __init__(self, preparer: ClaimPreparer, metrics: PluginMetrics, pb: Any, api: str) -> None:
        self._preparer = preparer
        self._metrics = metrics
        self._pb = pb
        self._api = api

    def _device(self, d: Any) -> Any:
        msg = self._pb.Device(
            request_names=list(d.request_names), pool_name=d.pool_name, device_name=d.device_name,
            cdi_device_ids=list(d.cdi_device_ids),
        )
        if d.share_id is not None and "share_id" in self._pb.Device.DESCRIPTOR.fields_by_name:
            msg.share_id = d.share_id
        return msg

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        start = time.perf_counter()
        claims = _claims(request)
        results: dict[str, ClaimResult] = self._preparer.prepare(claims)
        response = self._pb.NodePrepareResourcesResponse()
        for uid, result in results.items():
            entry = response.claims[uid]
            if result.error:
                entry.error = result.error
                log.warning("event=prepare-error api=%s uid=%s error=%r", self._api, uid, result.error)
            else:
                entry.devices.extend(self._device(d) for d in result.devices)
            self._metrics.claims.labels("prepare", "error" if result.error else "ok").inc()
        elapsed = time.perf_counter() - start
        self._metrics.latency.labels("NodePrepareResources").observe(elapsed)
        self._metrics.calls.labels("NodePrepareResources", self._api, "ok").inc()
        if claims:  # an empty call is the health check's (driver.plugin.healthcheck), every few seconds
            log.info("event=node-prepare api=%s claims=%d errors=%d ms=%.2f", self._api, len(claims),
                     sum(1 for r in results.values() if r.error), elapsed * 1000)
        return response

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        start = time.perf_counter()
        claims = _claims(request)
        errors = self._preparer.unprepare(claims)
        response = self._pb.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            response.claims[uid].error = error
            self._metrics.claims.labels("unprepare", "error" if error else "ok").inc()
        elapsed = time.perf_counter() - start
        self._metrics.latency.labels("NodeUnprepareResources").observe(elapsed)
        self._metrics.calls.labels("NodeUnprepareResources", self._api, "ok").inc()
        log.info("event=node-unprepare api=%s claims=%d errors=%d ms=%.2f", self._api, len(claims),
                 sum(1 for e in errors.values() if e), elapsed * 1000)
        return response


class HealthServicer:
    """DRAResourceHealth of one API version (`health_pb`: the v1 or v1alpha1 messages, identical field for field)."""

    def __init__(self, board: HealthBoard, stopping: threading.Event, health_pb: Any = health_v1,
                 resend_seconds: float = HEALTH_RESEND_SECONDS) -> None:
        self._board = board
        self._stopping = stopping
        self._pb = health_pb
        self._resend = resend_seconds

    def _response(self, updated: int, entries: tuple[DeviceHealthEntry, ...]) -> Any:
        health_pb = self._pb
        status = {True: health_pb.HEALTHY, False: health_pb.UNHEALTHY, None: health_pb.UNKNOWN}
        return health_pb.NodeWatchResourcesResponse(
            devices=[
                health_pb.DeviceHealth(
                    device=health_pb.DeviceIdentifier(pool_name=e.pool_name, device_name=e.device_name),
                    health=status[e.healthy], last_updated_time=updated, message=truncate_message(e.message),
                )
                for e in entries
            ]
        )

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        version, updated, entries = self._board.snapshot()
        yield self._response(updated, entries)
        sent = time.monotonic()
        while context.is_active() and not self._stopping.is_set():
            newer = self._board.wait_newer(version, _STREAM_POLL_SECONDS)
            if newer is None:
                if self._board.closed:
                    return
                if time.monotonic() - sent >= self._resend:
                    yield self._response(updated, entries)  # unchanged: keeps the kubelet's entries fresh
                    sent = time.monotonic()
                continue
            version, updated, entries = newer
            yield self._response(updated, entries)
            sent = time.monotonic()


class RegistrationServicer:
    def __init__(self, paths: PluginPaths, on_status: Callable[[bool, str], None]) -> None:
        self._paths = paths
        self._on_status = on_status

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        return reg_pb.PluginInfo(
            type=DRA_PLUGIN_TYPE, name=self._paths.driver_name, endpoint=str(self._paths.dra_socket.absolute()),
            supported_versions=list(SUPPORTED_SERVICES),
        )

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._on_status(request.plugin_registered, request.error)
        if not request.plugin_registered:
            context.abort(grpc.StatusCode.UNKNOWN, f"plugin registration failed: {request.error}")
        return reg_pb.RegistrationStatusResponse()


class KubeletPlugin:
    """Serves the DRA socket and the registration socket and keeps the registration socket alive."""

    def __init__(
        self,
        paths: PluginPaths,
        preparer: ClaimPreparer,
        board: HealthBoard,
        *,
        metrics: PluginMetrics | None = None,
        on_registered: Callable[[], None] = lambda: None,
        watch_seconds: float = 1.0,
        max_workers: int = 8,
    ) -> None:
        self.paths = paths
        self.preparer = preparer
        self.board = board
        self.metrics = metrics or PluginMetrics()
        self._on_registered = on_registered
        self._watch_seconds = watch_seconds
        self._max_workers = max_workers
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._dra_server: grpc.Server | None = None
        self._reg_server: grpc.Server | None = None
        self._reg_identity: SocketIdentity | None = None
        self._dra_identity: SocketIdentity | None = None
        self._watcher: threading.Thread | None = None
        self._suspects: dict[Path, SocketIdentity] = {}  # other instances' sockets found dead at the last sweep
        self.registered = threading.Event()
        self.registration_status: tuple[bool, str] | None = None
        self.registrations = 0

    def start(self) -> None:
        os.makedirs(self.paths.plugin_dir, mode=0o700, exist_ok=True)
        os.chmod(self.paths.plugin_dir, 0o700)
        self.registry_dir_ready()
        for stale in self.paths.stale_sockets():
            log.warning("event=stale-socket-removed socket=%s", stale)
            stale.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="dra"))
        dra_v1_grpc.add_DRAPluginServicer_to_server(DraServicer(self.preparer, self.metrics, dra_v1, "v1"), server)
        dra_v1beta1_grpc.add_DRAPluginServicer_to_server(
            DraServicer(self.preparer, self.metrics, dra_v1beta1, "v1beta1"), server
        )
        health_v1_grpc.add_DRAResourceHealthServicer_to_server(
            HealthServicer(self.board, self._stopping, health_v1), server)
        health_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(
            HealthServicer(self.board, self._stopping, health_v1alpha1), server)
        listen(server, self.paths.dra_socket)
        server.start()
        os.chmod(self.paths.dra_socket, 0o600)
        self._dra_identity = socket_identity(self.paths.dra_socket)
        self._dra_server = server
        log.info("event=serving socket=%s services=%s", self.paths.dra_socket, ",".join(SUPPORTED_SERVICES))
        # The DRA service must be up before the kubelet can learn about it through registration.
        self._serve_registration()
        self._watcher = threading.Thread(target=self._watch, name="registration-watch", daemon=True)
        self._watcher.start()

    def _on_status(self, registered: bool, error: str) -> None:
        self.registration_status = (registered, error)
        self.metrics.registrations.labels(str(registered).lower()).inc()
        if registered:
            self.registrations += 1
            log.info("event=registered driver=%s endpoint=%s", self.paths.driver_name, self.paths.dra_socket)
            self.registered.set()
            # Publishing talks to the API server: never make the kubelet's 5 s Notify call wait for it.
            threading.Thread(target=self._notify_registered, name="on-registered", daemon=True).start()
        else:
            log.error("event=registration-failed driver=%s error=%r", self.paths.driver_name, error)

    def _notify_registered(self) -> None:
        try:
            self._on_registered()
        except Exception:
            log.exception("event=on-registered-failed driver=%s", self.paths.driver_name)

    def _serve_registration(self) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            if self._reg_server is not None:
                self._reg_server.stop(grace=None)
            self.registry_dir_ready()
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="reg"))
            reg_grpc.add_RegistrationServicer_to_server(RegistrationServicer(self.paths, self._on_status), server)
            listen(server, self.paths.registration_socket)
            server.start()
            os.chmod(self.paths.registration_socket, 0o600)
            self._reg_server = server
            self._reg_identity = socket_identity(self.paths.registration_socket)
            self.registered.clear()
            log.info("event=registration-socket socket=%s", self.paths.registration_socket)

    def registry_dir_ready(self) -> None:
        self.paths.registry_dir.mkdir(parents=True, exist_ok=True)

    def _registration_socket_intact(self) -> bool:
        identity = socket_identity(self.paths.registration_socket)
        return identity is not None and identity == self._reg_identity

    def _watch(self) -> None:
        ticks = 0
        while not self._stopping.wait(self._watch_seconds):
            self.check_registration_socket()
            ticks += 1
            if ticks % STALE_SWEEP_TICKS == 0:
                self.sweep_stale_sockets()

    def sweep_stale_sockets(self) -> list[Path]:
        """Remove other instances' sockets that nobody listened on at this sweep and the one before, unchanged
        (same identity): an old pod killed after this one started (the surge of a rolling update) leaves its
        sockets behind, which the kubelet would keep registered. Two sweeps, not one, so that a newer pod's
        socket caught between its bind and its listen is never taken for a dead one. Returns what was removed."""
        seen = {p: socket_identity(p) for p in self.paths.stale_sockets()}
        removed = []
        for path, identity in seen.items():
            if identity is not None and self._suspects.get(path) == identity == socket_identity(path):
                log.warning("event=stale-socket-removed socket=%s", path)
                path.unlink(missing_ok=True)
                removed.append(path)
        self._suspects = {p: i for p, i in seen.items() if i is not None and p not in removed}
        return removed

    def check_registration_socket(self) -> bool:
        """Serve the registration socket again if it vanished or was replaced; True when it did."""
        if self._stopping.is_set() or self._registration_socket_intact():
            return False
        log.warning("event=registration-socket-lost socket=%s action=re-serve", self.paths.registration_socket)
        try:
            self._serve_registration()
        except Exception:
            log.exception("event=registration-socket-failed socket=%s", self.paths.registration_socket)
            return False
        return True

    def stop(self, grace: float = 2.0) -> None:
        self._stopping.set()
        self.board.close()
        with self._lock:
            servers = [s for s in (self._reg_server, self._dra_server) if s is not None]
            for s in servers:
                s.stop(grace=grace)
            for s in servers:
                s.wait_for_termination(timeout=grace + 1)
            # Only our own sockets: another instance may have bound the same paths since (then the identity differs).
            if self._registration_socket_intact():
                self.paths.registration_socket.unlink(missing_ok=True)
            if self._dra_identity is not None and socket_identity(self.paths.dra_socket) == self._dra_identity:
                self.paths.dra_socket.unlink(missing_ok=True)
            self._reg_server = self._dra_server = None
        if self._watcher is not None:
            self._watcher.join(timeout=self._watch_seconds + 1)
        log.info("event=stopped driver=%s", self.paths.driver_name)
