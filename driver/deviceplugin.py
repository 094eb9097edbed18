"""The device plugin shim: `nvidia.com/gpu` (device plugin API v1beta1) served from the same node ledger as DRA.

NVIDIA's own stack refuses to run its device plugin and its DRA driver on one node, because both would hand out
the same GPUs. Here both paths go through one ledger (driver.checkpoint: GPU uuid -> holders), updated under the
checkpoint lock that DRA prepare takes (a thread lock plus flock), so no GPU is ever given to both:

- a GPU prepared for a DRA claim is reported `Unhealthy` in ListAndWatch, so the kubelet does not offer it; so is a
  GPU whose devices the scheduler has allocated to a claim of our driver on this node that is not prepared yet
  (driver.allocatedclaims, from the API server), which closes the window between the scheduler's allocation and
  NodePrepareResources in which the kubelet could otherwise hand that GPU to a legacy pod. Those allocations only
  shape what is reported and refused; the ledger remains the authority for holds, and without the API server the
  shim falls back to the ledger alone;
- a GPU the device plugin allocated is tainted `<driver>/device-plugin: NoSchedule` in the ResourceSlice
  (`slice_taints`, fed to SliceSettings.extra_taints), so the scheduler stops offering it to claims;
- Allocate of a GPU DRA holds (prepared, or allocated to a claim not yet prepared) fails with FAILED_PRECONDITION
  naming the GPU and the claim, and DRA prepare of a GPU the device plugin holds fails with a per-claim error
  (driver.prepare).

Wire order (kubelet-wire.md 3): serve `<kubelet dir>/device-plugins/<socket>` first, then Register on
`kubelet.sock` (the kubelet dials back inside Register). A watch loop re-serves the socket and registers again
when the kubelet restarts (it deletes every socket in the directory and recreates kubelet.sock).

Releasing allocations. The device plugin API has no release call, so holds are reconciled against the kubelet's
own record, `device-plugins/kubelet_internal_checkpoint` (driver.kubeletcheckpoint), which the kubelet rewrites
after every allocation. Each hold is named `deviceplugin:<nonce>.<d>`, `<d>` being a digest of that file at the
time of Allocate. A hold is kept while one of its GPUs is listed for our resource in an entry whose pod is alive
(pod phase not Succeeded/Failed and still present, from the API server when available), or while the file is
unchanged since the Allocate (the kubelet has not written it yet). Otherwise it is released. The kubelet drops
entries of finished pods only lazily, hence the pod check. A later Allocate of a GPU still held by an older
device plugin hold supersedes it: the kubelet only allocates devices it knows to be free. After a reboot the
checkpoint drops all device plugin holds (the kubelet allocates anew).

MIG: without `--reserved-gpus` the shim serves the GPUs that are not in MIG mode (a MIG-enabled GPU cannot be
used whole); with it, exactly the reserved GPUs, which DRA then never sees.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from driver import cdi, kubeletcheckpoint
from driver.allocatedclaims import AllocatedClaims
from gpudra.atomicfile import atomic_write
from driver.checkpoint import DEVICE_PLUGIN_HOLDER_PREFIX, DRA_HOLDER_PREFIX, Checkpoint, Ledger, Op
from driver.inventory import Gpu, Inventory
from driver.slices import gpu_device_name, mig_device_name
from driver.unixsocket import listening, SocketIdentity, listen, socket_identity
from gpudra.kubeletapi.deviceplugin.v1beta1 import api_pb2 as pb
from gpudra.kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc

log = logging.getLogger("gpu-dra.deviceplugin")

API_VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
DEVICE_PLUGIN_DIR = "device-plugins"
KUBELET_SOCKET = "kubelet.sock"
DEFAULT_RESOURCE_NAME = "nvidia.com/gpu"
REGISTER_TIMEOUT_SECONDS = 15.0  # the kubelet dials back within Register (10 s): leave it room
LEGACY_CDI_CLASS = "gpu"
LEGACY_CDI_KIND = f"{cdi.CDI_VENDOR}/{LEGACY_CDI_CLASS}"
LEGACY_SPEC_FILE = f"{cdi.CDI_VENDOR}-{LEGACY_CDI_CLASS}.json"
NO_KUBELET_CHECKPOINT = "none"
TERMINAL_POD_PHASES = frozenset({"Succeeded", "Failed"})
_STREAM_POLL_SECONDS = 1.0

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_NAME_PART_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


# ---- names ---------------------------------------------------------------------------------------------------


def extended_resource_name_error(name: str) -> str | None:
    """Why `name` is not an extended resource name (the kubelet's IsExtendedResourceName), or None."""
    accepted = "a <domain>/<name> name outside kubernetes.io, e.g. nvidia.com/gpu"
    if "/" not in name or "kubernetes.io/" in name:
        return f"resource name {name!r} is a native resource name; accepted: {accepted}"
    if name.startswith("requests."):
        return f"resource name {name!r} must not start with 'requests.'; accepted: {accepted}"
    prefix, _, short = ("requests." + name).partition("/")
    labels_ok = len(prefix) <= 253 and all(re.fullmatch(_DNS_LABEL, label) for label in prefix.split("."))
    short_ok = (
        0 < len(short) <= 63 and short[0].isalnum() and short[-1].isalnum() and set(short) <= _NAME_PART_CHARS
        and short.isascii()
    )
    if not labels_ok or not short_ok or "/" in short:
        return f"resource name {name!r} is not a qualified name; accepted: {accepted}"
    return None


def socket_name(resource_name: str) -> str:
    """Our socket's file name in the device-plugins dir (what RegisterRequest.endpoint carries)."""
    return "gpu-dra-" + resource_name.replace("/", "_") + ".sock"


def taint_key(driver_name: str) -> str:
    return f"{driver_name}/device-plugin"


def legacy_cdi_id(uuid: str) -> str:
    return f"{LEGACY_CDI_KIND}={uuid}"


# ---- pure core -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceState:
    id: str
    healthy: bool
    numa_node: int | None
    reason: str = ""  # why it is Unhealthy


def served_gpus(inventory: Inventory, reserved: frozenset[str]) -> tuple[Gpu, ...]:
    """The GPUs the device plugin offers: the reserved ones (static split) or every GPU not in MIG mode."""
    if reserved:
        gpus = [g for g in inventory.gpus if g.uuid in reserved]
    else:
        gpus = [g for g in inventory.gpus if not g.mig_enabled]
    return tuple(sorted(gpus, key=lambda g: (g.pci_bus_id, g.uuid)))


def allocated_gpus(gpus: Iterable[Gpu], allocated: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
    """GPU uuid -> labels of the claims allocated one of its devices (the GPU, its MIG devices or MIG placements),
    from `allocated`: device name -> claim labels (driver.allocatedclaims)."""
    out: dict[str, tuple[str, ...]] = {}
    if not allocated:
        return out
    for gpu in gpus:
        names = [gpu_device_name(gpu)] + [mig_device_name(gpu, m) for m in gpu.mig_devices]
        names += [mig_device_name(gpu, p, pl) for p in gpu.mig_profiles for pl in p.placements]
        labels = sorted({label for name in names for label in allocated.get(name, ())})
        if labels:
            out[gpu.uuid] = tuple(labels)
    return out


def device_states(
    gpus: Iterable[Gpu], ledger: Mapping[str, Sequence[str]], allocated: Mapping[str, Sequence[str]] | None = None
) -> tuple[DeviceState, ...]:
    """The device list; `allocated` is GPU uuid -> claims allocated it but not necessarily prepared yet."""
    out = []
    for g in gpus:
        reasons = []
        if not g.health.healthy:
            reasons.append(f"GPU unhealthy (xids={list(g.health.xids)} lost={g.health.lost})")
        dra = sorted(h[len(DRA_HOLDER_PREFIX):] for h in ledger.get(g.uuid, ()) if h.startswith(DRA_HOLDER_PREFIX))
        if dra:
            reasons.append(f"prepared for DRA claim(s) {', '.join(dra)}")
        pending = (allocated or {}).get(g.uuid, ())
        if pending:
            reasons.append(f"allocated to DRA {', '.join(pending)}")
        out.append(DeviceState(g.uuid, not reasons, g.numa_node, "; ".join(reasons)))
    return tuple(out)


def list_and_watch_response(states: Iterable[DeviceState]) -> Any:
    devices = []
    for s in states:
        d = pb.Device(ID=s.id, health=HEALTHY if s.healthy else UNHEALTHY)
        if s.numa_node is not None and s.numa_node >= 0:
            d.topology.nodes.append(pb.NUMANode(ID=s.numa_node))
        devices.append(d)
    return pb.ListAndWatchResponse(devices=devices)


Affinity = tuple[int, int, int]  # (NVLink-connected, same NUMA node, direct NVLink links)


def pair_affinity(a: Gpu, b: Gpu) -> Affinity:
    direct = sum(1 for link in a.nvlinks if link.active and link.remote_pci_bus_id == b.pci_bus_id)
    connected = 1 if direct or (a.nvlink_domain is not None and a.nvlink_domain == b.nvlink_domain) else 0
    numa = 1 if a.numa_node is not None and a.numa_node == b.numa_node else 0
    return (connected, numa, direct)


def _add(x: Affinity, y: Affinity) -> Affinity:
    return (x[0] + y[0], x[1] + y[1], x[2] + y[2])


class PreferenceError(ValueError):
    pass


def preferred_allocation(
    gpus: Mapping[str, Gpu], available: Sequence[str], must_include: Sequence[str], size: int
) -> list[str]:
    """The best `size` GPUs out of `available`, containing `must_include`: NVLink-connected first, then NUMA-local,
    then the most direct links; ties go to PCI bus order. Greedy growth from every seed (from `must_include` when
    given), so the cost is O(n^2 * size) for n available GPUs."""
    unknown = sorted({d for d in (*available, *must_include) if d not in gpus})
    if unknown:
        raise PreferenceError(
            f"GetPreferredAllocation: device ID(s) {', '.join(unknown)} are not GPUs this device plugin serves"
        )
    missing = sorted(set(must_include) - set(available))
    if missing:
        raise PreferenceError(
            f"GetPreferredAllocation: must_include_deviceIDs {', '.join(missing)} are not in available_deviceIDs"
        )
    if size <= 0 or size > len(set(available)):
        raise PreferenceError(
            f"GetPreferredAllocation: allocation_size {size} must be between 1 and the {len(set(available))} "
            "available devices"
        )
    order = {u: i for i, u in enumerate(sorted(set(available), key=lambda u: (gpus[u].pci_bus_id, u)))}
    must = list(dict.fromkeys(must_include))
    if len(must) >= size:
        return must[:size] if len(must) == size else must
    ids = sorted(order, key=order.__getitem__)
    matrix = {(a, b): pair_affinity(gpus[a], gpus[b]) for a in ids for b in ids if a != b}

    def grow(start: list[str]) -> tuple[Affinity, list[str]]:
        chosen = list(start)
        score: Affinity = (0, 0, 0)
        for i, a in enumerate(chosen):
            for b in chosen[i + 1 :]:
                score = _add(score, matrix[(a, b)])
        while len(chosen) < size:
            best: tuple[Affinity, int, str] | None = None
            for c in ids:
                if c in chosen:
                    continue
                gain: Affinity = (0, 0, 0)
                for a in chosen:
                    gain = _add(gain, matrix[(a, c)])
                key = (gain, -order[c], c)
                if best is None or key[:2] > best[:2]:
                    best = key
            assert best is not None  # size <= len(ids), so a candidate is always left
            chosen.append(best[2])
            score = _add(score, best[0])
        return score, chosen

    if must:
        return grow(must)[1]
    best_score: Affinity | None = None
    best_set: list[str] = []
    for seed in ids:
        score, chosen = grow([seed])
        if best_score is None or score > best_score:
            best_score, best_set = score, chosen
    return best_set


def container_allocate_response(gpus: Sequence[Gpu], numbers: cdi.DeviceNumbers | None = None,
                                 node_exists: Callable[[str], bool] = os.path.exists) -> Any:
    """What the container gets: CDI devices for CDI-enabled runtimes, and env + device nodes for the others
    (the control nodes that exist: /dev/nvidia-uvm* only with nvidia-uvm loaded).

    A device node is named as a DeviceSpec only where it exists on the host: containerd and CRI-O stat every
    DeviceSpec's host path and refuse the container when one is missing (`lstat /dev/nvidia0: no such file or
    directory`), which a node without device nodes of its own (a simulated one) meets on its first legacy pod. The
    CDI devices carry the same nodes typed (type, major, minor), which the runtime creates without a stat."""
    numbers = numbers or cdi.DeviceNumbers()
    resp = pb.ContainerAllocateResponse()
    resp.envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(g.uuid for g in gpus)
    for node in [numbers.gpu_node(g.minor) for g in gpus] + numbers.control_nodes():
        path = node["path"]
        if node_exists(path):
            resp.devices.append(pb.DeviceSpec(container_path=path, host_path=path, permissions="rw"))
    resp.cdi_devices.extend(pb.CDIDevice(name=legacy_cdi_id(g.uuid)) for g in gpus)
    return resp


def legacy_cdi_spec(
    gpus: Sequence[Gpu], common: Mapping[str, Any] | None = None, numbers: cdi.DeviceNumbers | None = None,
) -> dict[str, Any]:
    """One static spec for the GPUs the device plugin serves (kind k8s.gpu.nvidia.com/gpu, device name = UUID).

    `common` is the driver files' container edits (driver.driverfiles), the same the per-claim DRA specs carry.
    NVIDIA_VISIBLE_DEVICES is not in the spec: the set a container gets is only known at Allocate, which sets it
    through the response's envs (a per-device value would be overwritten by CDI's last-wins env merging)."""
    if not gpus:
        raise ValueError("the device plugin CDI spec needs at least one GPU")
    numbers = numbers or cdi.DeviceNumbers()
    spec: dict[str, Any] = {
        "cdiVersion": "",
        "kind": LEGACY_CDI_KIND,
        "devices": [{"name": g.uuid, "containerEdits": {"deviceNodes": [numbers.gpu_node(g.minor)]}} for g in gpus],
        "containerEdits": {**(common or {}), "deviceNodes": numbers.control_nodes()},
    }
    spec["cdiVersion"] = cdi.minimum_version(spec)
    return spec


def slice_taints(inventory: Inventory, ledger: Mapping[str, Sequence[str]], driver_name: str) -> dict[str, list[dict[str, str]]]:
    """Device name -> NoSchedule taint for every published device on a GPU the device plugin holds (the GPU,
    its MIG devices and its MIG placements), for SliceSettings.extra_taints."""
    taint = {"key": taint_key(driver_name), "effect": "NoSchedule"}
    out: dict[str, list[dict[str, str]]] = {}
    for gpu in inventory.gpus:
        if not any(h.startswith(DEVICE_PLUGIN_HOLDER_PREFIX) for h in ledger.get(gpu.uuid, ())):
            continue
        names = [gpu_device_name(gpu)] + [mig_device_name(gpu, m) for m in gpu.mig_devices]
        names += [mig_device_name(gpu, p, pl) for p in gpu.mig_profiles for pl in p.placements]
        for name in names:
            out[name] = [dict(taint)]
    return out


def allocation_id(kubelet_digest: str, nonce: str | None = None) -> str:
    """`<nonce>.<first 12 hex of the kubelet checkpoint digest at Allocate, or "none">`."""
    return f"{nonce or secrets.token_hex(4)}.{kubelet_digest[:12] or NO_KUBELET_CHECKPOINT}"


def _baseline(holder: str) -> str:
    return holder.rpartition(".")[2]


def device_plugin_allocations(ledger: Mapping[str, Sequence[str]]) -> dict[str, frozenset[str]]:
    out: dict[str, set[str]] = {}
    for uuid, holders in ledger.items():
        for h in holders:
            if h.startswith(DEVICE_PLUGIN_HOLDER_PREFIX):
                out.setdefault(h, set()).add(uuid)
    return {h: frozenset(u) for h, u in out.items()}


def stale_allocations(
    allocations: Mapping[str, frozenset[str]],
    kubelet: kubeletcheckpoint.KubeletCheckpoint | None,
    resource_name: str,
    live_pods: frozenset[str] | None,
) -> list[str]:
    """The device plugin holds the kubelet no longer uses (see the module doc for the rule)."""
    current = kubelet.digest[:12] if kubelet is not None else NO_KUBELET_CHECKPOINT
    used = kubelet.in_use(resource_name, live_pods) if kubelet is not None else {}
    stale = []
    for holder, uuids in sorted(allocations.items()):
        if uuids & used.keys():
            continue
        if _baseline(holder) == current:
            continue  # the kubelet has not written its checkpoint since this Allocate
        stale.append(holder)
    return stale


# ---- I/O -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DevicePluginSettings:
    kubelet_dir: Path
    cdi_dir: Path
    driver_name: str
    resource_name: str = DEFAULT_RESOURCE_NAME
    reserved_uuids: frozenset[str] = frozenset()
    watch_seconds: float = 1.0
    # How often pods are listed to release the GPUs of finished pods (when a pod source is given).
    pods_seconds: float = 10.0
    # The host driver's files as CDI container edits (libraries, binaries, hooks); empty on the simulator.
    common_edits: Mapping[str, Any] = field(default_factory=dict)
    # The node's device numbers (the agent's, see driver.cdi.DeviceNumbers); read once per spec write/Allocate.
    device_numbers: Callable[[], cdi.DeviceNumbers] = cdi.DeviceNumbers

    def __post_init__(self) -> None:
        error = extended_resource_name_error(self.resource_name)
        if error:
            raise ValueError(f"--device-plugin-resource: {error}")

    @property
    def directory(self) -> Path:
        return self.kubelet_dir / DEVICE_PLUGIN_DIR

    @property
    def socket(self) -> Path:
        return self.directory / socket_name(self.resource_name)

    @property
    def kubelet_socket(self) -> Path:
        return self.directory / KUBELET_SOCKET


class AllocateError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Board:
    """The latest device list, versioned; streams wait for a newer one."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._states: tuple[DeviceState, ...] = ()
        self._version = 0
        self._closed = False

    def update(self, states: tuple[DeviceState, ...]) -> bool:
        with self._cond:
            if states == self._states and self._version > 0:
                return False
            self._states = states
            self._version += 1
            self._cond.notify_all()
            return True

    def snapshot(self) -> tuple[int, tuple[DeviceState, ...]]:
        with self._cond:
            return self._version, self._states

    def wait_newer(self, version: int, timeout: float) -> tuple[int, tuple[DeviceState, ...]] | None:
        with self._cond:
            self._cond.wait_for(lambda: self._version != version or self._closed, timeout)
            if self._closed or self._version == version:
                return None
            return self._version, self._states

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed


class DevicePluginServicer(pb_grpc.DevicePluginServicer):
    def __init__(self, shim: "DevicePluginShim") -> None:
        self._shim = shim

    def GetDevicePluginOptions(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        board = self._shim.board
        version, states = board.snapshot()
        yield list_and_watch_response(states)
        while context.is_active() and not self._shim.stopping:
            newer = board.wait_newer(version, _STREAM_POLL_SECONDS)
            if newer is None:
                if board.closed:
                    return
                continue
            version, states = newer
            yield list_and_watch_response(states)

    def GetPreferredAllocation(self, request: Any, context: grpc.ServicerContext) -> Any:
        gpus = {g.uuid: g for g in self._shim.served()}
        response = pb.PreferredAllocationResponse()
        for i, c in enumerate(request.container_requests):
            try:
                ids = preferred_allocation(gpus, list(c.available_deviceIDs), list(c.must_include_deviceIDs), c.allocation_size)
            except PreferenceError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"container_requests[{i}]: {exc}")
            response.container_responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return response

    def Allocate(self, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            responses = self._shim.allocate([list(c.devices_ids) for c in request.container_requests])
        except AllocateError as exc:
            log.warning("event=allocate-refused resource=%s error=%r", self._shim.settings.resource_name, str(exc))
            context.abort(exc.code, str(exc))
        except Exception as exc:  # e.g. the checkpoint could not be written: the kubelet retries the pod
            log.exception("event=allocate-failed resource=%s", self._shim.settings.resource_name)
            context.abort(grpc.StatusCode.INTERNAL, f"Allocate {self._shim.settings.resource_name}: {exc}")
        return pb.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.PreStartContainerResponse()


PodSource = Callable[[], "frozenset[str] | None"]


class DevicePluginShim:
    """Serves the device plugin on its socket, keeps it registered and the ledger reconciled."""

    def __init__(
        self,
        settings: DevicePluginSettings,
        *,
        inventory: Callable[[], Inventory],
        checkpoint: Checkpoint,
        on_ledger_change: Callable[[], None] = lambda: None,
        live_pods: PodSource | None = None,
        allocations: AllocatedClaims | None = None,
        max_workers: int = 8,
        refusal: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.settings = settings
        # Why nothing may be allocated now (the DRA side's damaged checkpoint not rebuilt yet: a GPU its lost
        # records hold would look free); None: allocate.
        self._refusal = refusal
        self._inventory = inventory
        self.checkpoint = checkpoint
        self.ledger = Ledger(checkpoint)
        self._on_ledger_change = on_ledger_change
        self._live_pods = live_pods
        self._allocations = allocations
        self._max_workers = max_workers
        self.board = _Board()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # server (re)creation and registration
        self._server: grpc.Server | None = None
        self._own_identity: SocketIdentity | None = None
        self._kubelet_inode: tuple[int, int, int] | None = None
        self._registered = False
        self._thread: threading.Thread | None = None
        self._last_dp_gpus: frozenset[str] | None = None
        self._publish_lock = threading.Lock()
        self._published_seq = -1
        self._pods_checked_at: float | None = None
        self._last_live: frozenset[str] | None = None
        self.registrations = 0

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def served(self) -> tuple[Gpu, ...]:
        return served_gpus(self._inventory(), self.settings.reserved_uuids)

    # ---- lifecycle ---------------------------------------------------------------------------------------

    def _write_spec(self) -> None:
        """The static CDI spec of the GPUs served, written whenever this instance (re)binds the socket: an older
        instance that went away may have removed it while nobody served."""
        gpus = self.served()
        if gpus:
            self.settings.cdi_dir.mkdir(parents=True, exist_ok=True)
            atomic_write(
                self.settings.cdi_dir / LEGACY_SPEC_FILE,
                json.dumps(legacy_cdi_spec(gpus, self.settings.common_edits, self.settings.device_numbers()), indent=2, sort_keys=True).encode() + b"\n",
                mode=0o644,
            )
        else:
            log.warning("event=no-gpus resource=%s reserved=%s", self.settings.resource_name, sorted(self.settings.reserved_uuids))

    def start(self) -> None:
        if self._allocations is not None:
            # List once before the first device list, so a restarted shim never offers an allocated GPU.
            self._allocations.resync()
            self._allocations.start(on_change=self.republish)
        self.refresh()
        self.tick()
        self._thread = threading.Thread(target=self._run, name="device-plugin-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.settings.watch_seconds):
            try:
                self.tick()
                self.refresh()
            except Exception:  # the watch loop must outlive any single failure
                log.exception("event=device-plugin-tick-failed resource=%s", self.settings.resource_name)

    def stop(self, grace: float = 1.0) -> None:
        self._stop.set()
        self.board.close()
        if self._allocations is not None:
            self._allocations.stop()
        with self._lock:
            if self._server is not None:
                self._server.stop(grace=grace).wait(grace + 1)
                self._server = None
            ours = self._own_identity is not None and socket_identity(self.settings.socket) == self._own_identity
            if ours:
                self.settings.socket.unlink(missing_ok=True)
            if ours or not listening(self.settings.socket):
                # No other instance serves the resource (a rolling update's newer pod rebinds the socket and
                # rewrites the spec, and keeps both): the shim is going away, and its static CDI spec with it, so
                # an uninstall leaves none behind; a restarted shim writes it again before it registers.
                (self.settings.cdi_dir / LEGACY_SPEC_FILE).unlink(missing_ok=True)
        if self._thread is not None:
            self._thread.join(timeout=self.settings.watch_seconds + 2)

    # ---- serving and registration --------------------------------------------------------------------------

    def _serve(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None)
        self._write_spec()
        path = self.settings.socket
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="devplugin"))
        pb_grpc.add_DevicePluginServicer_to_server(DevicePluginServicer(self), server)
        listen(server, path)
        server.start()
        self._server = server
        self._own_identity = socket_identity(path)
        self._registered = False
        log.info("event=serving socket=%s resource=%s", path, self.settings.resource_name)

    def tick(self) -> bool:
        """Serve our socket again if it went away, and register when not registered with the current kubelet.
        True when a registration happened."""
        with self._lock:
            if self._stop.is_set():
                return False
            current = socket_identity(self.settings.socket)
            if self._server is None or current != self._own_identity:
                if current is not None and current != self._own_identity and listening(self.settings.socket):
                    # Another instance serves the resource on this node now: a rolling update's newer pod, which
                    # bound the socket after us. Leave it to that one (re-serving would take the socket back and
                    # each would then take it from the other); serve again only once its socket is gone or dead.
                    return self._yield_socket()
                if self._server is not None:
                    log.warning("event=socket-lost socket=%s action=re-serve", self.settings.socket)
                self._serve()
            kubelet = socket_identity(self.settings.kubelet_socket)
            if kubelet is None:
                self._registered = False
                return False
            if self._registered and kubelet == self._kubelet_inode:
                return False
            try:
                self._register()
            except grpc.RpcError as exc:
                log.warning("event=register-failed kubelet=%s code=%s error=%r", self.settings.kubelet_socket,
                            exc.code().name, exc.details())
                return False
            self._kubelet_inode = kubelet
            self._registered = True
            self.registrations += 1
            log.info("event=registered resource=%s endpoint=%s", self.settings.resource_name, self.settings.socket.name)
            return True

    def _yield_socket(self) -> bool:
        if self._server is not None:
            log.info("event=device-plugin-yielded socket=%s msg=%r", self.settings.socket,
                     "a newer agent instance on this node serves the resource; this one stops serving it")
            self._server.stop(grace=None)
            self._server = None
            self._registered = False
        return False

    def _register(self) -> None:
        with grpc.insecure_channel(f"unix://{self.settings.kubelet_socket}") as channel:
            pb_grpc.RegistrationStub(channel).Register(
                pb.RegisterRequest(
                    version=API_VERSION, endpoint=self.settings.socket.name, resource_name=self.settings.resource_name,
                    options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
                ),
                timeout=REGISTER_TIMEOUT_SECONDS, wait_for_ready=True,
            )

    # ---- ledger ----------------------------------------------------------------------------------------------

    def refresh(self, *, check_pods: bool | None = None) -> None:
        """Release unused holds, publish the device list, and report ledger changes (for slice taints)."""
        kubelet, readable = self._read_kubelet_checkpoint()
        live = self._pods(check_pods)
        if check_pods is None and live is not None and readable and stale_allocations(
            device_plugin_allocations(self.checkpoint.state.ledger), kubelet, self.settings.resource_name, live
        ):
            # The cached pod list may predate a pod the kubelet admitted since: release nothing on its word alone.
            live = self._pods(True)
        with self.checkpoint.locked():
            allocations = device_plugin_allocations(self.checkpoint.state.ledger)
            # An unreadable kubelet checkpoint says nothing about what is in use: release nothing on its account.
            stale = (
                stale_allocations(allocations, kubelet, self.settings.resource_name, live)
                if allocations and readable else []
            )
            ops: list[Op] = []
            for holder in stale:
                ops += self.ledger.release_ops(holder)
            self.checkpoint.commit(ops)
            ledger, seq = dict(self.checkpoint.state.ledger), self.checkpoint.state.seq
        for holder in stale:
            log.info("event=released holder=%s gpus=%s", holder, ",".join(sorted(allocations[holder])))
        self._publish(ledger, seq)

    def allocated(self) -> dict[str, tuple[str, ...]]:
        """GPU uuid -> claims the scheduler allocated it to (empty without an API server)."""
        if self._allocations is None:
            return {}
        return allocated_gpus(self.served(), self._allocations.snapshot())

    def republish(self) -> None:
        """Publish the device list again (the allocated claims changed; the ledger did not)."""
        with self.checkpoint.locked():
            ledger, seq = dict(self.checkpoint.state.ledger), self.checkpoint.state.seq
        self._publish(ledger, seq)

    def _publish(self, ledger: Mapping[str, Sequence[str]], seq: int) -> None:
        dp = frozenset(u for u, hs in ledger.items() if any(h.startswith(DEVICE_PLUGIN_HOLDER_PREFIX) for h in hs))
        with self._publish_lock:
            # Two threads may publish snapshots out of order: never replace a newer ledger with an older one.
            if seq < self._published_seq:
                return
            self._published_seq = seq
            self.board.update(device_states(self.served(), ledger, self.allocated()))
            changed = dp != self._last_dp_gpus
            self._last_dp_gpus = dp
        if changed:
            try:
                self._on_ledger_change()
            except Exception:
                log.exception("event=ledger-change-callback-failed")

    def _pods(self, check: bool | None) -> frozenset[str] | None:
        if self._live_pods is None:
            return None
        now = time.monotonic()
        if check is None:
            check = self._pods_checked_at is None or now - self._pods_checked_at >= self.settings.pods_seconds
        if not check:
            return self._last_live
        self._pods_checked_at = now
        try:
            self._last_live = self._live_pods()
        except Exception as exc:
            log.warning("event=pods-unavailable error=%r", str(exc))
            self._last_live = None
        return self._last_live

    def _read_kubelet_checkpoint(self) -> tuple[kubeletcheckpoint.KubeletCheckpoint | None, bool]:
        """(the kubelet's checkpoint or None when absent, readable)."""
        try:
            return kubeletcheckpoint.read(self.settings.directory), True
        except (kubeletcheckpoint.KubeletCheckpointError, OSError) as exc:
            log.warning("event=kubelet-checkpoint-unreadable dir=%s error=%r", self.settings.directory, str(exc))
            return None, False

    def _claim_text(self, holder: str) -> str:
        uid = holder[len(DRA_HOLDER_PREFIX):]
        record = self.checkpoint.claim(uid)
        if record is None:
            return f"ResourceClaim with uid {uid}"
        return f"ResourceClaim {record.namespace}/{record.name} (uid {uid})"

    def allocate(self, containers: Sequence[Sequence[str]]) -> list[Any]:
        """Hold the GPUs of each container request for a new device plugin allocation; all or nothing."""
        resource = self.settings.resource_name
        refused = self._refusal()
        if refused is not None:
            raise AllocateError(grpc.StatusCode.UNAVAILABLE, f"Allocate {resource}: {refused}")
        gpus = {g.uuid: g for g in self.served()}
        if not containers:
            raise AllocateError(grpc.StatusCode.INVALID_ARGUMENT, f"Allocate {resource}: container_requests is empty")
        for i, ids in enumerate(containers):
            where = f"Allocate {resource}: container_requests[{i}].devices_ids"
            if not ids:
                raise AllocateError(grpc.StatusCode.INVALID_ARGUMENT, f"{where}: at least one device ID is required")
            unknown = [d for d in ids if d not in gpus]
            if unknown:
                raise AllocateError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{where}: {', '.join(unknown)} not served by this device plugin; accepted: {', '.join(gpus) or 'none'}",
                )
            if len(set(ids)) != len(ids):
                raise AllocateError(grpc.StatusCode.INVALID_ARGUMENT, f"{where}: device IDs repeat: {list(ids)}")
        wanted = [u for ids in containers for u in ids]
        if len(set(wanted)) != len(wanted):
            raise AllocateError(grpc.StatusCode.INVALID_ARGUMENT, f"Allocate {resource}: one GPU is requested by two containers")
        kubelet, readable = self._read_kubelet_checkpoint()
        digest = kubelet.digest if kubelet is not None else ("" if readable else "unreadable")
        holders = [Ledger.device_plugin_holder(allocation_id(digest)) for _ in containers]
        with self.checkpoint.locked():
            ledger = self.checkpoint.state.ledger
            conflicts = {
                u: [h for h in ledger.get(u, ()) if h.startswith(DRA_HOLDER_PREFIX)] for u in wanted
            }
            conflicts = {u: hs for u, hs in conflicts.items() if hs}
            # Allocated by the scheduler but not prepared yet: the kubelet will prepare it for DRA shortly.
            pending = {u: labels for u, labels in self.allocated().items() if u in wanted and u not in conflicts}
            if conflicts or pending:
                parts = "; ".join(
                    [f"GPU {u} is prepared for {' and '.join(self._claim_text(h) for h in hs)} through DRA"
                     for u, hs in sorted(conflicts.items())]
                    + [f"GPU {u} is allocated to {' and '.join(labels)} through DRA (not yet prepared)"
                       for u, labels in sorted(pending.items())]
                )
                raise AllocateError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"Allocate {resource}: {parts}; a GPU is never given to DRA and the device plugin at once",
                )
            # The kubelet only allocates devices it considers free: older device plugin holds on them are over.
            superseded = sorted({h for u in wanted for h in ledger.get(u, ()) if h.startswith(DEVICE_PLUGIN_HOLDER_PREFIX)})
            table: dict[str, list[str]] = {u: list(hs) for u, hs in ledger.items()}
            for h in superseded:
                for u in list(table):
                    table[u] = [x for x in table[u] if x != h]
            for holder, ids in zip(holders, containers):
                for u in ids:
                    table.setdefault(u, []).append(holder)
            ops = [
                Op("ledger", u, sorted(hs) or None)
                for u, hs in sorted(table.items())
                if sorted(hs) != sorted(ledger.get(u, ()))
            ]
            self.checkpoint.commit(ops)
            ledger_now, seq = dict(self.checkpoint.state.ledger), self.checkpoint.state.seq
        for h in superseded:
            log.info("event=superseded holder=%s", h)
        for holder, ids in zip(holders, containers):
            log.info("event=allocated resource=%s holder=%s gpus=%s", resource, holder, ",".join(ids))
        self._publish(ledger_now, seq)
        numbers = self.settings.device_numbers()
        return [container_allocate_response([gpus[u] for u in ids], numbers) for ids in containers]


# ---- wiring into the node agent ------------------------------------------------------------------------------


def pod_source(api: Any, node_name: str) -> PodSource:
    """Pod UIDs bound to `node_name` that are still alive (phase neither Succeeded nor Failed), from the API."""

    def live() -> frozenset[str]:
        items, _ = api.list("Pod", field_selector=f"spec.nodeName={node_name}")
        return frozenset(
            str(p["metadata"]["uid"])
            for p in items
            if (p.get("status") or {}).get("phase") not in TERMINAL_POD_PHASES and (p.get("metadata") or {}).get("uid")
        )

    return live


def start_device_plugin(
    agent: Any, *, resource_name: str = DEFAULT_RESOURCE_NAME, api: Any | None = None, pods_seconds: float = 10.0,
    allocations_resync_seconds: float = 60.0,
) -> DevicePluginShim:
    """Start the shim beside a started NodeAgent, on the agent's checkpoint ledger; its holds become slice taints."""
    s = agent.settings
    settings = DevicePluginSettings(
        kubelet_dir=s.kubelet_dir, cdi_dir=s.cdi_dir, driver_name=s.driver_name, resource_name=resource_name,
        reserved_uuids=s.reserved_uuids, watch_seconds=s.watch_seconds, pods_seconds=pods_seconds,
        common_edits=agent.driver_files.container_edits(), device_numbers=agent.device_numbers,
    )
    checkpoint: Checkpoint = agent.checkpoint
    agent.extra_taints = lambda: slice_taints(agent.inventory(), checkpoint.state.ledger, s.driver_name)
    shim = DevicePluginShim(
        settings, inventory=agent.inventory, checkpoint=checkpoint, on_ledger_change=agent.request_publish,
        live_pods=pod_source(api, s.node_name) if api is not None else None,
        allocations=AllocatedClaims(api, s.driver_name, s.node_name, resync_seconds=allocations_resync_seconds)
        if api is not None else None,
        refusal=lambda: agent.preparer.recovery_pending,
    )
    shim.start()
    return shim
