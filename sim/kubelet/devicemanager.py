"""A kubelet device manager simulator: the kubelet's side of the device plugin API v1beta1 (kubelet-wire.md 3).

- serves `Registration` on `<kubelet dir>/device-plugins/kubelet.sock`; Register checks the version (`v1beta1`)
  and that the resource name is an extended resource name, then, inside the call as the kubelet does, dials
  `<dir>/<endpoint>` (10 s), calls GetDevicePluginOptions and starts following ListAndWatch (latest full list
  kept per resource);
- `allocate` admits one container: healthy, unallocated devices; GetPreferredAllocation first when the plugin
  offers it; one Allocate with one ContainerAllocateRequest; at least one container response required; then
  the allocation is recorded and `kubelet_internal_checkpoint` rewritten (driver.kubeletcheckpoint);
- `remove_pod` forgets a finished pod's devices and rewrites the checkpoint (what the kubelet does lazily);
- `restart` is a kubelet restart: registrations dropped, every socket in the directory deleted (the checkpoint
  file stays), the checkpoint re-read, kubelet.sock created anew.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from driver import kubeletcheckpoint
from driver.deviceplugin import API_VERSION, DEVICE_PLUGIN_DIR, HEALTHY, KUBELET_SOCKET, extended_resource_name_error
from driver.kubeletcheckpoint import NO_TOPOLOGY_NUMA, PodDeviceEntry
from gpudra.kubeletapi.deviceplugin.v1beta1 import api_pb2 as pb
from gpudra.kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc

DIAL_TIMEOUT_SECONDS = 10.0
SUPPORTED_VERSIONS: tuple[str, ...] = (API_VERSION,)


class DeviceManagerError(Exception):
    """What the kubelet would report (a failed registration or a pod that cannot be admitted)."""


@dataclass(frozen=True)
class SimDevice:
    id: str
    health: str
    numa_nodes: tuple[int, ...]


@dataclass(frozen=True)
class Allocation:
    pod_uid: str
    container: str
    resource: str
    device_ids: tuple[str, ...]
    response: Any  # the ContainerAllocateResponse
    preferred: tuple[str, ...] | None  # what GetPreferredAllocation proposed, None if not asked


class PluginEndpoint:
    """One registered plugin: its connection, options and the device list its ListAndWatch stream sent last."""

    def __init__(self, resource: str, socket: Path, on_update: Callable[[], None]) -> None:
        self.resource = resource
        self.socket = socket
        self._on_update = on_update
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        try:
            grpc.channel_ready_future(self.channel).result(timeout=DIAL_TIMEOUT_SECONDS)
        except grpc.FutureTimeoutError as exc:
            self.channel.close()
            raise DeviceManagerError(f"failed to dial device plugin {socket}: not ready within {DIAL_TIMEOUT_SECONDS:.0f} s") from exc
        self.stub = pb_grpc.DevicePluginStub(self.channel)
        try:
            self.options = self.stub.GetDevicePluginOptions(pb.Empty(), timeout=DIAL_TIMEOUT_SECONDS)
        except grpc.RpcError as exc:
            self.channel.close()
            raise DeviceManagerError(f"GetDevicePluginOptions on {socket}: {exc.code().name}: {exc.details()}") from exc
        self.devices: dict[str, SimDevice] = {}
        self.updates = 0
        self.stream_ended = False
        self._stream = self.stub.ListAndWatch(pb.Empty())
        self._thread = threading.Thread(target=self._follow, name=f"listandwatch-{resource}", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        try:
            for response in self._stream:
                self.devices = {
                    d.ID: SimDevice(d.ID, d.health, tuple(n.ID for n in d.topology.nodes)) for d in response.devices
                }
                self.updates += 1
                self._on_update()
        except grpc.RpcError:
            pass  # the stream ending is a plugin disconnect, as for the kubelet
        finally:
            self.stream_ended = True
            self._on_update()

    def close(self) -> None:
        self._stream.cancel()
        self.channel.close()
        self._thread.join(timeout=5)


class RegistrationServicer(pb_grpc.RegistrationServicer):
    def __init__(self, sim: "DeviceManagerSim") -> None:
        self._sim = sim

    def Register(self, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            self._sim.register(request)
        except DeviceManagerError as exc:
            context.abort(grpc.StatusCode.UNKNOWN, str(exc))
        return pb.Empty()


class DeviceManagerSim:
    def __init__(self, kubelet_dir: Path) -> None:
        self.directory = kubelet_dir / DEVICE_PLUGIN_DIR
        self.endpoints: dict[str, PluginEndpoint] = {}
        self.entries: list[PodDeviceEntry] = []
        self.register_errors: list[str] = []
        self.register_requests: list[Any] = []  # every RegisterRequest received, accepted or not
        self.registrations = 0
        self._cond = threading.Condition()
        self._server: grpc.Server | None = None

    @property
    def kubelet_socket(self) -> Path:
        return self.directory / KUBELET_SOCKET

    # ---- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._remove_sockets()
        loaded = kubeletcheckpoint.read(self.directory)
        self.entries = list(loaded.entries) if loaded is not None else []
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubelet-dm"))
        pb_grpc.add_RegistrationServicer_to_server(RegistrationServicer(self), server)
        if server.add_insecure_port(f"unix://{self.kubelet_socket}") == 0:
            raise DeviceManagerError(f"could not listen on {self.kubelet_socket}")
        server.start()
        self._server = server

    def _remove_sockets(self) -> None:
        for path in self.directory.iterdir():
            if path.name != kubeletcheckpoint.CHECKPOINT_FILE and path.is_socket():
                path.unlink()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None
        with self._cond:
            endpoints = list(self.endpoints.values())
            self.endpoints.clear()
        for e in endpoints:
            e.close()

    def restart(self) -> None:
        """A kubelet restart: plugins must notice their socket is gone and kubelet.sock is new, and register again."""
        self.stop()
        self.start()

    # ---- registration -------------------------------------------------------------------------------------

    def register(self, request: Any) -> None:
        self.register_requests.append(request)
        try:
            if request.version not in SUPPORTED_VERSIONS:
                raise DeviceManagerError(
                    f"Register: version {request.version!r} of the device plugin for {request.resource_name!r} is not "
                    f"supported; supported versions: {list(SUPPORTED_VERSIONS)}"
                )
            error = extended_resource_name_error(request.resource_name)
            if error:
                raise DeviceManagerError(f"Register: {error}")
            if not request.endpoint or "/" in request.endpoint:
                raise DeviceManagerError(
                    f"Register: endpoint {request.endpoint!r} must be a socket file name in {self.directory}"
                )
            endpoint = PluginEndpoint(request.resource_name, self.directory / request.endpoint, self._notify)
        except DeviceManagerError as exc:
            self.register_errors.append(str(exc))
            raise
        with self._cond:
            old = self.endpoints.get(request.resource_name)
            self.endpoints[request.resource_name] = endpoint
            self.registrations += 1
            self._cond.notify_all()
        if old is not None:
            old.close()

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[["DeviceManagerSim"], bool], timeout: float = 10.0) -> None:
        """Block until `predicate(self)` holds (re-checked on every stream message and registration)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DeviceManagerError(f"condition not reached within {timeout} s")
                self._cond.wait(min(remaining, 0.1))

    def devices(self, resource: str) -> dict[str, SimDevice]:
        endpoint = self.endpoints.get(resource)
        return dict(endpoint.devices) if endpoint is not None else {}

    def health(self, resource: str) -> dict[str, str]:
        return {d.id: d.health for d in self.devices(resource).values()}

    # ---- allocation -----------------------------------------------------------------------------------------

    def allocated(self, resource: str) -> set[str]:
        return {d for e in self.entries if e.resource_name == resource for d in e.all_ids()}

    def allocate(self, pod_uid: str, container: str, resource: str, count: int) -> Allocation:
        """Admit one container asking for `count` devices of `resource`; raises DeviceManagerError when refused."""
        endpoint = self.endpoints.get(resource)
        if endpoint is None or endpoint.stream_ended:
            raise DeviceManagerError(f"pod {pod_uid} container {container}: no device plugin serves {resource}")
        devices = dict(endpoint.devices)
        used = self.allocated(resource)
        available = [d.id for d in devices.values() if d.health == HEALTHY and d.id not in used]
        if count > len(available):
            raise DeviceManagerError(
                f"pod {pod_uid} container {container}: requested {count} {resource}, available {len(available)}"
            )
        chosen = available[:count]
        preferred: tuple[str, ...] | None = None
        if endpoint.options.get_preferred_allocation_available:
            try:
                resp = endpoint.stub.GetPreferredAllocation(
                    pb.PreferredAllocationRequest(
                        container_requests=[pb.ContainerPreferredAllocationRequest(
                            available_deviceIDs=available, must_include_deviceIDs=[], allocation_size=count,
                        )]
                    )
                )
                preferred = tuple(resp.container_responses[0].deviceIDs) if resp.container_responses else ()
            except grpc.RpcError as exc:
                raise DeviceManagerError(f"GetPreferredAllocation {resource}: {exc.code().name}: {exc.details()}") from exc
            # Like the kubelet, a preference that is not a valid choice is ignored.
            if len(preferred) == count and set(preferred) <= set(available):
                chosen = list(preferred)
        try:
            response = endpoint.stub.Allocate(
                pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=chosen)])
            )
        except grpc.RpcError as exc:
            raise DeviceManagerError(f"Allocate {resource}: {exc.code().name}: {exc.details()}") from exc
        if not response.container_responses:
            raise DeviceManagerError(f"Allocate {resource}: no containers return in allocation response {response}")
        container_response = response.container_responses[0]
        per_numa: dict[int, list[str]] = {}
        for d in chosen:
            nodes = devices[d].numa_nodes or (NO_TOPOLOGY_NUMA,)
            for n in nodes:
                per_numa.setdefault(n, []).append(d)
        entry = PodDeviceEntry(
            pod_uid, container, resource, {n: tuple(ids) for n, ids in per_numa.items()},
            container_response.SerializeToString(),
        )
        self.entries.append(entry)
        self.write_checkpoint()
        return Allocation(pod_uid, container, resource, tuple(chosen), container_response, preferred)

    def remove_pod(self, pod_uid: str) -> None:
        self.entries = [e for e in self.entries if e.pod_uid != pod_uid]
        self.write_checkpoint()

    def write_checkpoint(self) -> None:
        registered: Mapping[str, list[str]] = {r: sorted(e.devices) for r, e in self.endpoints.items()}
        kubeletcheckpoint.write(self.directory, self.entries, registered)

