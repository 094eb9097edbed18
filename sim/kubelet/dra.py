"""A kubelet simulator for the DRA plugin side: registration, prepare/unprepare batching and health streams.

It talks to a plugin over its real unix sockets and applies the kubelet's rules (kubelet-wire.md 1.4 and 2):
- watches `<kubelet dir>/plugins_registry` (polling; sub-directories allowed, names starting with "." ignored),
- GetInfo (1 s timeout), handler by type (only DRAPlugin here), validation of the advertised services (the first
  entry of the plugin's list that the kubelet knows wins; empty list or no match fails), then
  NotifyRegistrationStatus(true) (5 s timeout); any failure is notified as (false, message),
- one NodePrepareResources call per driver per pod with all of that pod's not-yet-prepared claims, 45 s timeout;
  responses are checked like the kubelet does (unknown claim UID, skipped claims, per-claim errors),
- follows the DRAResourceHealth stream of the version its release picks: a 1.37 kubelet prefers
  `v1.DRAResourceHealth` and falls back to `v1alpha1.DRAResourceHealth`; 1.34-1.36 kubelets know only v1alpha1
  (and 1.34/1.35 ignore the per-device `message`, added in 1.36). `KubeletSim(..., kubernetes_version=)` selects
  the release whose dialect it speaks (default the newest).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from driver.unixsocket import SocketIdentity, socket_identity
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

# Newest first, as the kubelet's servicesSupportedByKubelet (the same in 1.34 to 1.37).
KUBELET_SERVICES: tuple[str, ...] = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
HEALTH_V1 = "v1.DRAResourceHealth"
HEALTH_V1ALPHA1 = "v1alpha1.DRAResourceHealth"
_HEALTH_MODULES: dict[str, tuple[Any, Any]] = {
    HEALTH_V1: (health_v1, health_v1_grpc),
    HEALTH_V1ALPHA1: (health_v1alpha1, health_v1alpha1_grpc),
}


@dataclass(frozen=True)
class KubeletDialect:
    """What one kubelet release speaks on the DRA plugin socket and writes from it."""

    version: str
    dra_services: tuple[str, ...]
    health_services: tuple[str, ...]  # in the kubelet's order of preference (healthServicesSupportedByKubelet)
    health_messages: bool  # DeviceHealth.message is read (1.36+)
    resource_health_status: bool  # ResourceHealthStatus gate default: health goes into pod status (beta 1.36)

    @classmethod
    def for_version(cls, version: str = "1.37") -> "KubeletDialect":
        minor = int(version.split(".")[1])
        if not 34 <= minor <= 37:
            raise ValueError(f"kubelet simulator: Kubernetes {version} is not supported (1.34 to 1.37)")
        health = (HEALTH_V1, HEALTH_V1ALPHA1) if minor >= 37 else (HEALTH_V1ALPHA1,)
        return cls(version, KUBELET_SERVICES, health, minor >= 36, minor >= 36)

    def pick_health_service(self, supported: Sequence[str]) -> str:
        """The kubelet's pickHealthService: its most preferred health service the plugin advertises, "" for none
        (then no stream is opened), whatever the plugin's order."""
        return next((s for s in self.health_services if s in supported), "")
CALL_TIMEOUT_SECONDS = 45.0
GET_INFO_TIMEOUT_SECONDS = 1.0
NOTIFY_TIMEOUT_SECONDS = 5.0
DIAL_TIMEOUT_SECONDS = 10.0


class KubeletError(Exception):
    """What the kubelet would report for a failed prepare/unprepare (the pod's sync fails and is retried)."""


class RegistrationFailed(KubeletError):
    pass


@dataclass(frozen=True)
class ClaimInfo:
    namespace: str
    uid: str
    name: str


@dataclass(frozen=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None


@dataclass(frozen=True)
class HealthUpdate:
    devices: tuple[tuple[str, str, str], ...]  # (pool, device, HEALTHY|UNHEALTHY|UNKNOWN)
    messages: tuple[str, ...] = ()  # per device, "" when none or when the kubelet's release ignores them
    timeouts: tuple[int, ...] = ()  # per device health_check_timeout_seconds (0: the kubelet's default)
    service: str = ""  # the health service it came from


def _wait_ready(channel: grpc.Channel, what: str) -> None:
    try:
        grpc.channel_ready_future(channel).result(timeout=DIAL_TIMEOUT_SECONDS)
    except grpc.FutureTimeoutError as exc:
        raise KubeletError(f"{what}: could not connect within {DIAL_TIMEOUT_SECONDS:.0f} s") from exc


def choose_service(supported: Sequence[str], known: Sequence[str] = KUBELET_SERVICES) -> str:
    """The kubelet's validateSupportedServices: the first of the plugin's entries the kubelet supports."""
    if not supported:
        raise RegistrationFailed("empty list of supported gRPC services (aka supported versions)")
    for service in supported:
        if service in known:
            return service
    raise RegistrationFailed(
        f"none of services supported by the plugin {list(supported)} are supported by the kubelet {list(known)}"
    )


class RegisteredPlugin:
    """One registered DRA plugin instance, as the kubelet's DRA manager holds it."""

    def __init__(self, name: str, endpoint: str, service: str, health_service: str,
                 dialect: KubeletDialect | None = None) -> None:
        self.name = name
        self.endpoint = endpoint
        self.service = service
        self.health_service = health_service  # "" when the plugin advertises none this kubelet knows
        self.dialect = dialect or KubeletDialect.for_version()
        self._channel = grpc.insecure_channel(f"unix://{endpoint}")
        if service == "v1.DRAPlugin":
            self._pb: Any = dra_v1
            self._stub: Any = dra_v1_grpc.DRAPluginStub(self._channel)
        else:
            self._pb = dra_v1beta1
            self._stub = dra_v1beta1_grpc.DRAPluginStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def _call(self, op: str, claims: Sequence[ClaimInfo], timeout: float) -> Any:
        """One NodePrepareResources/NodeUnprepareResources call, its response checked as the kubelet does."""
        request = getattr(self._pb, f"{op}Request")(
            claims=[self._pb.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]
        )
        try:
            response = getattr(self._stub, op)(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise KubeletError(f"{op}: {exc.code().name}: {exc.details()}") from exc
        self._check(op, claims, response)
        return response

    def _check(self, op: str, claims: Sequence[ClaimInfo], response: Any) -> None:
        by_uid = {c.uid: c for c in claims}
        for uid, entry in response.claims.items():
            if uid not in by_uid:
                raise KubeletError(f"{op}: returned result for unknown claim UID {uid}")
            if entry.error:
                raise KubeletError(f"{op} failed for ResourceClaim {by_uid[uid].name}: {entry.error}")
        missing = [c for c in claims if c.uid not in response.claims]
        if missing:
            raise KubeletError(f"{op} skipped {len(missing)} ResourceClaims")

    def prepare(self, claims: Sequence[ClaimInfo], timeout: float = CALL_TIMEOUT_SECONDS) -> dict[str, list[PreparedDevice]]:
        """One NodePrepareResources call; raises KubeletError as the kubelet would fail the pod."""
        response = self._call("NodePrepareResources", claims, timeout)
        out: dict[str, list[PreparedDevice]] = {}
        for uid, entry in response.claims.items():
            out[uid] = [
                PreparedDevice(
                    request_names=tuple(d.request_names), pool_name=d.pool_name, device_name=d.device_name,
                    cdi_device_ids=tuple(d.cdi_device_ids),
                    share_id=d.share_id if "share_id" in d.DESCRIPTOR.fields_by_name and d.HasField("share_id") else None,
                )
                for d in entry.devices
            ]
        return out

    def unprepare(self, claims: Sequence[ClaimInfo], timeout: float = CALL_TIMEOUT_SECONDS) -> None:
        """One NodeUnprepareResources call; raises KubeletError as the kubelet would fail the pod."""
        self._call("NodeUnprepareResources", claims, timeout)

    @property
    def health_advertised(self) -> bool:
        return bool(self.health_service)

    def watch_health(self, stop: threading.Event | None = None) -> Iterator[HealthUpdate]:
        """Follow the health stream of the chosen version (each message is the complete device list); ends when
        the stream does, or when `stop` is set (the stream is cancelled at once)."""
        if not self.health_service:
            return
        health_pb, health_grpc = _HEALTH_MODULES[self.health_service]
        stub = health_grpc.DRAResourceHealthStub(self._channel)
        names = {v.number: v.name for v in health_pb.HealthStatus.DESCRIPTOR.values}
        stream = stub.NodeWatchResources(health_pb.NodeWatchResourcesRequest())
        if stop is not None:
            def cancel_on_stop() -> None:
                while not stop.wait(0.2):
                    if stream.done():
                        return
                stream.cancel()

            threading.Thread(target=cancel_on_stop, name="health-stream-cancel", daemon=True).start()
        with_messages = self.dialect.health_messages
        try:
            for response in stream:
                yield HealthUpdate(
                    tuple((d.device.pool_name, d.device.device_name, names[d.health]) for d in response.devices),
                    tuple(d.message if with_messages else "" for d in response.devices),
                    tuple(d.health_check_timeout_seconds for d in response.devices),
                    self.health_service,
                )
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                raise KubeletError(f"NodeWatchResources: {exc.code().name}: {exc.details()}") from exc
        finally:
            stream.cancel()


@dataclass
class Pod:
    """A pod's claims for one driver and the kubelet-side memory of which are prepared."""

    name: str
    claims: list[ClaimInfo]
    prepared: dict[str, list[PreparedDevice]] = field(default_factory=dict)


class KubeletSim:
    def __init__(self, kubelet_dir: Path, known_services: Sequence[str] | None = None,
                 kubernetes_version: str = "1.37") -> None:
        self.registry_dir = kubelet_dir / "plugins_registry"
        self.dialect = KubeletDialect.for_version(kubernetes_version)
        self.known_services = tuple(known_services) if known_services is not None else self.dialect.dra_services
        self.plugins: dict[str, RegisteredPlugin] = {}  # driver name -> newest registered instance
        # Every registered instance, oldest first, with its registration socket: the kubelet's plugin watcher
        # deregisters an instance when its socket goes, and the newest remaining one serves the driver.
        self._instances: dict[str, list[tuple[Path, RegisteredPlugin]]] = {}
        self._registered_sockets: dict[Path, SocketIdentity] = {}  # socket path -> the socket we registered
        self._lock = threading.Lock()

    def close(self) -> None:
        for instances in self._instances.values():
            for _, p in instances:
                p.close()
        self._instances.clear()
        self.plugins.clear()

    def instances(self, driver_name: str) -> list[RegisteredPlugin]:
        """The registered instances of a driver, oldest first."""
        return [p for _, p in self._instances.get(driver_name, [])]

    def sockets(self) -> list[Path]:
        if not self.registry_dir.is_dir():
            return []
        return sorted(
            p for p in self.registry_dir.rglob("*") if not p.name.startswith(".") and p.is_socket()
        )

    def register(self, socket: Path) -> RegisteredPlugin:
        channel = grpc.insecure_channel(f"unix://{socket}")
        try:
            _wait_ready(channel, f"registration socket {socket}")
            stub = reg_grpc.RegistrationStub(channel)
            try:
                info = stub.GetInfo(reg_pb.InfoRequest(), timeout=GET_INFO_TIMEOUT_SECONDS)
            except grpc.RpcError as exc:
                raise RegistrationFailed(f"GetInfo on {socket}: {exc.code().name}: {exc.details()}") from exc
            try:
                plugin = self._validate(info, socket)
            except RegistrationFailed as exc:
                try:
                    stub.NotifyRegistrationStatus(
                        reg_pb.RegistrationStatus(plugin_registered=False, error=str(exc)), timeout=NOTIFY_TIMEOUT_SECONDS
                    )
                except grpc.RpcError:
                    pass  # the plugin answers a failed registration with an error, as the Go helper does
                raise
            stub.NotifyRegistrationStatus(reg_pb.RegistrationStatus(plugin_registered=True), timeout=NOTIFY_TIMEOUT_SECONDS)
        finally:
            channel.close()
        with self._lock:
            instances = self._instances.setdefault(plugin.name, [])
            for replaced in [p for s, p in instances if s == socket]:
                replaced.close()
            instances[:] = [(s, p) for s, p in instances if s != socket] + [(socket, plugin)]
            self.plugins[plugin.name] = plugin
            identity = socket_identity(socket)
            if identity is not None:
                self._registered_sockets[socket] = identity
        return plugin

    def _validate(self, info: Any, socket: Path) -> RegisteredPlugin:
        if info.type != "DRAPlugin":
            raise RegistrationFailed(f"no handler registered for plugin type: {info.type} at socket {socket}")
        if not info.name:
            raise RegistrationFailed(f"plugin at {socket} has an empty name")
        service = choose_service(list(info.supported_versions), self.known_services)
        endpoint = info.endpoint or str(socket)
        health = self.dialect.pick_health_service(list(info.supported_versions))
        return RegisteredPlugin(info.name, endpoint, service, health, self.dialect)

    def _deregister_gone(self) -> None:
        """Drop instances whose registration socket was removed (the plugin watcher's delete event)."""
        with self._lock:
            for name, instances in list(self._instances.items()):
                kept = []
                for socket, plugin in instances:
                    if socket_identity(socket) == self._registered_sockets.get(socket):
                        kept.append((socket, plugin))
                        continue
                    plugin.close()
                    if socket_identity(socket) is None:
                        self._registered_sockets.pop(socket, None)
                instances[:] = kept
                if kept:
                    self.plugins[name] = kept[-1][1]
                else:
                    del self._instances[name]
                    self.plugins.pop(name, None)

    def sync(self) -> list[RegisteredPlugin]:
        """Register sockets that are new or were replaced since last time, and deregister instances whose socket
        went (what inotify would trigger)."""
        self._deregister_gone()
        done = []
        for socket in self.sockets():
            identity = socket_identity(socket)
            if identity is None or self._registered_sockets.get(socket) == identity:
                continue
            done.append(self.register(socket))
        return done

    def wait_for_plugin(self, driver_name: str, timeout: float = 10.0, poll: float = 0.05) -> RegisteredPlugin:
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                self.sync()
            except KubeletError as exc:
                last_error = exc
            if driver_name in self.plugins:
                return self.plugins[driver_name]
            time.sleep(poll)
        raise KubeletError(f"plugin {driver_name} did not register within {timeout} s (last error: {last_error})")

    def restart(self) -> None:
        """Forget every registration, as a restarted kubelet does; plugins are found again by `sync`."""
        with self._lock:
            self.close()
            self._registered_sockets.clear()

    # ---- pods ---------------------------------------------------------------------------------------------

    def _plugin(self, driver_name: str) -> RegisteredPlugin:
        plugin = self.plugins.get(driver_name)
        if plugin is None:
            raise KubeletError(f"DRA driver {driver_name} is not registered")
        return plugin

    def prepare_pod(self, driver_name: str, pod: Pod) -> None:
        """One call with all of the pod's claims for this driver that are not prepared yet."""
        pending = [c for c in pod.claims if c.uid not in pod.prepared]
        if not pending:
            return
        pod.prepared.update(self._plugin(driver_name).prepare(pending))

    def unprepare_pod(self, driver_name: str, pod: Pod) -> None:
        prepared = [c for c in pod.claims if c.uid in pod.prepared]
        if not prepared:
            return
        self._plugin(driver_name).unprepare(prepared)
        for c in prepared:
            pod.prepared.pop(c.uid, None)
