"""An NVML simulator with pynvml's function names, return types and errors.

Handles are pynvml's own opaque pointer types (`c_nvmlDevice_t`, `c_nvmlGpuInstance_t`,
`c_nvmlEventSet_t`) holding synthetic addresses that are never dereferenced; structs are
pynvml's ctypes structures; failures raise `pynvml.NVMLError(code)`, i.e. the same
`NVMLError_*` subclasses the real library raises. Code written against pynvml therefore
runs unchanged against the simulator, and discovery cannot tell them apart.

State is guarded by one lock: the health monitor waits for events on one thread while
discovery, prepare and fault injection run on others.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
import time
import uuid as uuidlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pynvml

from driver.cdi import NVIDIA_MAJOR, DeviceNumbers
from driver.gputools import TIMESLICE_LEVELS, GpuToolError, MpsDirs
from sim.nvml.faults import CallFault, Faults, error_code, read_faults
from sim.nvml.profile import GpuModelSpec, GpuSpec, MigProfileSpec, Profile, nvml_constant, profile_for_node

_GPU_BASE = 0x1000_0000
_GPU_STRIDE = 0x10000
_MIG_OFFSET = 0x100
_GI_OFFSET = 0x8000
_EVENTSET_BASE = 0x7000_0000
_NOT_AVAILABLE = 0xFFFFFFFF
_MIB = 1024 * 1024
# How often a waiting nvmlEventSetWait re-reads the faults file written by another process.
_FAULTS_POLL_S = 0.05

_NVLINK_VERSION = {"VOLTA": 2, "TURING": 2, "AMPERE": 3, "ADA": 3, "HOPPER": 4, "BLACKWELL": 5, "RUBIN": 6}
# Full-size compute instance profile for a GPU instance of N compute slices.
# Stand-ins for the majors the kernel gives nvidia-uvm and nvidia-caps at load (dynamic on real nodes).
SIM_UVM_MAJOR = 237
SIM_CAPS_MAJOR = 238
_CI_PROFILE_FOR_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
_SUPPORTED_EVENTS = (
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeSingleBitEccError
    | pynvml.nvmlEventTypePState
    | pynvml.nvmlEventTypeClock
)


def _raise(code: int) -> None:
    raise pynvml.NVMLError(code)


def _address(handle: Any) -> int | None:
    if handle is None:
        return None
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return None


def _deref(ref: Any) -> Any:
    """The object behind byref(x), pointer(x) or x itself (pynvml callers pass all three)."""
    if ref is None:
        return None
    obj = getattr(ref, "_obj", None)
    if obj is not None:
        return obj
    if hasattr(ref, "contents"):
        return ref.contents
    return ref


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _nvml_bus_id(bus_id: str) -> tuple[str, str, int, int, int]:
    """'0000:1b:00.0' -> ('0000:1B:00.0', '00000000:1B:00.0', domain, bus, device)."""
    domain_s, bus_s, rest = bus_id.split(":")
    dev_s, fn_s = rest.split(".")
    domain, bus, dev = int(domain_s, 16), int(bus_s, 16), int(dev_s, 16)
    legacy = f"{domain:04X}:{bus:02X}:{dev:02X}.{fn_s}"
    full = f"{domain:08X}:{bus:02X}:{dev:02X}.{fn_s}"
    return legacy, full, domain, bus, dev


def _pci_info(bus_id: str, device_id: int = 0, subsystem_id: int = 0) -> pynvml.nvmlPciInfo_t:
    legacy, full, domain, bus, dev = _nvml_bus_id(bus_id)
    info = pynvml.nvmlPciInfo_t()
    info.busIdLegacy = legacy.encode()
    info.busId = full.encode()
    info.domain = domain
    info.bus = bus
    info.device = dev
    info.pciDeviceId = device_id
    info.pciSubSystemId = subsystem_id
    return info


def gpu_instance_id(placement_start: int, placement_size: int) -> int:
    """GPU instance id from its memory-slice placement, in the driver's slot numbering:
    0 the whole GPU, 1-2 the halves, 3-6 the quarters, 7-14 the eighths."""
    if placement_size >= 8:
        return 0
    if placement_size >= 4:
        return 1 + placement_start // 4
    if placement_size >= 2:
        return 3 + placement_start // 2
    return 7 + placement_start


@dataclass
class _SimMig:
    gi_id: int
    profile: MigProfileSpec
    start: int
    uuid: str
    has_ci: bool = True  # the GPU instance has its full compute instance (a usable MIG device)


@dataclass
class _SimGpu:
    index: int
    spec: GpuSpec
    model: GpuModelSpec
    address: int
    minor: int
    mig_current: bool
    mig_pending: bool
    migs: list[_SimMig] = field(default_factory=list)
    compute_mode: int = pynvml.NVML_COMPUTEMODE_DEFAULT
    timeslice: int = 0  # nvidia-smi compute-policy level; NVML has no call for it
    lost: bool = False


@dataclass(frozen=True)
class SimMpsDaemon:
    """A simulated MPS control daemon, as the simulator's `mps_daemon(dirs)` reports it."""

    device_uuids: tuple[str, ...]
    log_dir: str
    running: bool = True
    starts: int = 1
    active_thread_percentage: int | None = None
    # device (as named in the command: UUID or CUDA ordinal) -> limit as written ("4096M")
    pinned_limits: tuple[tuple[str, str], ...] = ()
    commands: tuple[str, ...] = ()
    multi_user: bool = False  # started with -M


_TOOL_FUNCTIONS = ("set_timeslice", "mps_start", "mps_command", "mps_stop")
_MPS_LIMIT = re.compile(r"^[1-9][0-9]*[MG]$")


@dataclass
class _EventSet:
    registered: dict[int, int] = field(default_factory=dict)  # gpu address -> event mask
    queue: deque[pynvml.c_nvmlEventData_t] = field(default_factory=deque)


def mig_uuid(gpu_uuid: str, profile: str, start: int) -> str:
    """The UUID the simulator gives the MIG device of `profile` at placement `start` (stable, so a testbed can
    know it before the device exists)."""
    return "MIG-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"gpu-dra-sim/{gpu_uuid}/{profile}@{start}"))


class SimulatedNvml:
    """NVML over a Profile. Construct with `SimulatedNvml(profile, faults_path=None, node=None)`.

    With `node`, GPU and MIG UUIDs are the node's own (`profile_for_node`), so that nodes running one profile
    never share GPU identities; `self.profile` is then that node's profile. Without it the profile's UUIDs are
    used verbatim."""

    def __init__(self, profile: Profile, faults_path: str | Path | None = None, node: str | None = None) -> None:
        self.node = node
        self.profile = profile_for_node(profile, node) if node else profile
        self._lock = threading.Condition(threading.RLock())
        self._init_count = 0
        self._faults_path = Path(faults_path) if faults_path else None
        self._faults_stamp: tuple[int, int] | None = None
        self._file_faults = Faults()
        self._file_xids_seen = 0
        self.faults_error: str | None = None  # last unreadable faults file, kept for diagnostics
        self._lost: set[str] = set()
        self._fail_calls: list[CallFault] = []
        self._event_sets: dict[int, _EventSet] = {}
        self._next_event_set = _EVENTSET_BASE
        self._gpus: list[_SimGpu] = []
        for i, spec in enumerate(self.profile.gpus):
            model = self.profile.models[spec.model]
            gpu = _SimGpu(
                index=i,
                spec=spec,
                model=model,
                address=_GPU_BASE + i * _GPU_STRIDE,
                minor=spec.minor if spec.minor is not None else i,
                mig_current=spec.mig_enabled,
                mig_pending=spec.mig_enabled,
            )
            by_name = {p.name: p for p in model.mig_profiles}
            for dev in spec.mig_devices:
                p = by_name[dev.profile]
                gpu.migs.append(
                    _SimMig(
                        gi_id=gpu_instance_id(dev.start, p.placement_size),
                        profile=p,
                        start=dev.start,
                        uuid=dev.uuid or mig_uuid(spec.uuid, p.name, dev.start),
                    )
                )
            gpu.migs.sort(key=lambda m: m.start)
            self._gpus.append(gpu)
        self._by_address = {g.address: g for g in self._gpus}
        self._mps: dict[str, SimMpsDaemon] = {}  # pipe dir -> daemon
        self._tool_faults: list[tuple[str, str | None, str]] = []  # (function, uuid or None, stderr)

    # ------------------------------------------------------------------ fault injection

    def inject_xid(self, uuid: str, xid: int) -> None:
        """Deliver an Xid critical-error event for a GPU or MIG device to every event set registered for it."""
        with self._lock:
            gpu, mig = self._find_uuid(uuid)
            if gpu is None:
                raise ValueError(f"inject_xid: no GPU or MIG device with uuid {uuid!r} in profile {self.profile.name}")
            for es in self._event_sets.values():
                mask = es.registered.get(gpu.address, 0)
                if mask & pynvml.nvmlEventTypeXidCriticalError:
                    data = pynvml.c_nvmlEventData_t()
                    data.device = self._gpu_handle(gpu)
                    data.eventType = pynvml.nvmlEventTypeXidCriticalError
                    data.eventData = xid
                    data.gpuInstanceId = mig.gi_id if mig else _NOT_AVAILABLE
                    data.computeInstanceId = 0 if mig else _NOT_AVAILABLE
                    es.queue.append(data)
            self._lock.notify_all()

    def mark_lost(self, uuid: str) -> None:
        """The GPU falls off the bus: every query on it raises GPU_IS_LOST, and Xid 79 is delivered."""
        with self._lock:
            gpu, _ = self._find_uuid(uuid)
            if gpu is None:
                raise ValueError(f"mark_lost: no GPU with uuid {uuid!r} in profile {self.profile.name}")
            self._lost.add(gpu.spec.uuid)
            self.inject_xid(gpu.spec.uuid, 79)

    def fail_call(self, function_name: str, uuid: str | None = None, error: str = "NOT_SUPPORTED") -> None:
        """Make `function_name` raise `error` (for one GPU/MIG device, or for all when uuid is None)."""
        if not hasattr(self, function_name):
            raise ValueError(f"fail_call: {function_name!r} is not a function of the simulator")
        with self._lock:
            self._fail_calls.append(CallFault(function_name, error.upper(), uuid))

    def fail_tool(self, function_name: str, uuid: str | None = None, stderr: str = "simulated failure") -> None:
        """Make a tool facility (set_timeslice, mps_start, mps_command, mps_stop) fail with `stderr`, as the
        real tool exiting non-zero would (for one GPU/MIG device, or for all when uuid is None)."""
        if function_name not in _TOOL_FUNCTIONS:
            raise ValueError(f"fail_tool: {function_name!r} is not one of {', '.join(_TOOL_FUNCTIONS)}")
        with self._lock:
            self._tool_faults.append((function_name, uuid, stderr))

    def kill_mps(self, dirs: MpsDirs) -> None:
        """The MPS control daemon of `dirs` dies (its control socket stops answering)."""
        with self._lock:
            daemon = self._mps.get(str(dirs.pipe))
            if daemon is None:
                raise ValueError(f"kill_mps: no MPS daemon was started with pipe directory {dirs.pipe}")
            self._mps[str(dirs.pipe)] = replace(daemon, running=False)

    def clear(self) -> None:
        """Forget in-process faults (lost GPUs, failing calls, failing tools, undelivered events)."""
        with self._lock:
            self._lost.clear()
            self._fail_calls.clear()
            self._tool_faults.clear()
            for es in self._event_sets.values():
                es.queue.clear()

    # ------------------------------------------------------------------ topology (not NVML)

    def device_numbers(self) -> DeviceNumbers:
        """The device numbers of a node whose driver is loaded (nvidia-uvm included): NVIDIA's fixed major for the
        GPU and control nodes, fixed stand-ins for the dynamic nvidia-uvm and nvidia-caps majors. Specs then name
        every node typed, so a runtime creates them in the container and stats nothing on the host (a kind
        node has no NVIDIA device nodes)."""
        return DeviceNumbers({"nvidia-frontend": NVIDIA_MAJOR, "nvidia-uvm": SIM_UVM_MAJOR, "nvidia-caps": SIM_CAPS_MAJOR})

    def pcie_root(self, pci_bus_id: str) -> str | None:
        """The PCIe root complex of a GPU, from the profile (the real backend reads sysfs)."""
        want = pci_bus_id.lower()
        for g in self._gpus:
            if g.spec.pci_bus_id.lower() == want or g.spec.pci_bus_id.lower().endswith(want[-12:]):
                return g.spec.pcie_root
        return None

    # ------------------------------------------------------------------ GPU tools (nvidia-smi, MPS; not NVML)

    def _tool_fault(self, fname: str, uuids: tuple[str, ...], what: str) -> None:
        for function, uuid, stderr in self._tool_faults:
            if function == fname and (uuid is None or uuid in uuids):
                raise GpuToolError(f"{what} exited with status 1: {stderr}")

    def _tool_gpu(self, uuid: str, what: str) -> tuple[_SimGpu, _SimMig | None]:
        gpu, mig = self._find_uuid(uuid)
        if gpu is None:
            raise GpuToolError(f"{what} exited with status 1: No device found with UUID {uuid}")
        if self._is_lost(gpu):
            raise GpuToolError(f"{what} exited with status 1: GPU {gpu.spec.uuid} is lost")
        return gpu, mig

    def set_timeslice(self, gpu_uuid: str, level: int) -> None:
        what = f"`nvidia-smi compute-policy -i {gpu_uuid} --set-timeslice {level}`"
        with self._lock:
            self._refresh_faults()
            gpu, mig = self._tool_gpu(gpu_uuid, what)
            if mig is not None:
                raise GpuToolError(f"{what} exited with status 1: the timeslice is a setting of a full GPU, {gpu_uuid} is a MIG device")
            if level not in TIMESLICE_LEVELS:
                raise GpuToolError(f"{what} exited with status 1: timeslice must be one of {TIMESLICE_LEVELS}")
            self._tool_fault("set_timeslice", (gpu_uuid,), what)
            gpu.timeslice = level

    def get_timeslice(self, gpu_uuid: str) -> int:
        """The simulated GPU's timeslice level (what `nvidia-smi compute-policy -l` would list)."""
        with self._lock:
            gpu, mig = self._find_uuid(gpu_uuid)
            if gpu is None or mig is not None:
                raise ValueError(f"get_timeslice: no GPU with uuid {gpu_uuid!r} in profile {self.profile.name}")
            return gpu.timeslice

    def mps_start(
        self, dirs: MpsDirs, device_uuids: Sequence[str], commands: Sequence[str] = (), *, multi_user: bool = False,
    ) -> None:
        self._mps_start(dirs, device_uuids, multi_user)
        for command in commands:
            self.mps_command(dirs, command)

    def mps_wait(self, dirs: MpsDirs) -> None:
        """A simulated daemon listens as soon as it is started."""
        if not self.mps_running(dirs):
            raise GpuToolError(f"the MPS control daemon of {dirs.pipe} is not running")

    def _mps_start(self, dirs: MpsDirs, device_uuids: Sequence[str], multi_user: bool) -> None:
        what = f"`CUDA_VISIBLE_DEVICES={','.join(device_uuids)} nvidia-cuda-mps-control -d{' -M' if multi_user else ''}`"
        with self._lock:
            self._refresh_faults()
            for uuid in device_uuids:
                self._tool_gpu(uuid, what)
            self._tool_fault("mps_start", tuple(device_uuids), what)
            previous = self._mps.get(str(dirs.pipe))
            if previous is not None and previous.running:
                raise GpuToolError(f"{what} exited with status 1: An instance of this daemon is already running")
            self._mps[str(dirs.pipe)] = SimMpsDaemon(
                device_uuids=tuple(device_uuids), log_dir=str(dirs.log), starts=(previous.starts + 1) if previous else 1,
                multi_user=multi_user,
            )

    def mps_command(self, dirs: MpsDirs, command: str) -> str:
        what = f"`echo {command} | nvidia-cuda-mps-control`"
        with self._lock:
            self._refresh_faults()  # a fault file written by another process applies to every call, as to the others
            daemon = self._mps.get(str(dirs.pipe))
            if daemon is None or not daemon.running:
                raise GpuToolError(f"{what} exited with status 1: Cannot find MPS control daemon process")
            self._tool_fault("mps_command", daemon.device_uuids, what)
            words = command.split()
            daemon = replace(daemon, commands=(*daemon.commands, command))
            reply = ""
            if words == ["quit"]:
                daemon = replace(daemon, running=False)
            elif len(words) == 2 and words[0] == "set_default_active_thread_percentage":
                if not words[1].isdigit() or not 1 <= int(words[1]) <= 100:
                    raise GpuToolError(f"{what} exited with status 1: invalid percentage {words[1]!r}")
                daemon = replace(daemon, active_thread_percentage=int(words[1]))
            elif words == ["get_default_active_thread_percentage"]:
                reply = f"{daemon.active_thread_percentage or 100}.0\n"
            elif len(words) == 3 and words[0] == "set_default_device_pinned_mem_limit":
                ordinals = [str(i) for i in range(len(daemon.device_uuids))]
                if words[1] not in daemon.device_uuids and words[1] not in ordinals:
                    raise GpuToolError(f"{what} exited with status 1: device {words[1]} is not visible to this daemon")
                if not _MPS_LIMIT.match(words[2]):
                    raise GpuToolError(f"{what} exited with status 1: invalid limit {words[2]!r}, expected e.g. 4096M or 10G")
                limits = dict(daemon.pinned_limits)
                limits[words[1]] = words[2]
                daemon = replace(daemon, pinned_limits=tuple(sorted(limits.items())))
            else:
                raise GpuToolError(f"{what} exited with status 1: unsupported command {command!r}")
            self._mps[str(dirs.pipe)] = daemon
            return reply

    def mps_stop(self, dirs: MpsDirs) -> None:
        if self.mps_running(dirs):  # nothing to stop otherwise
            self.mps_command(dirs, "quit")

    def mps_running(self, dirs: MpsDirs) -> bool:
        with self._lock:
            daemon = self._mps.get(str(dirs.pipe))
            return daemon is not None and daemon.running

    def mps_daemon(self, dirs: MpsDirs) -> SimMpsDaemon | None:
        """The simulated daemon last started with `dirs` (running or stopped), None if never started."""
        with self._lock:
            return self._mps.get(str(dirs.pipe))

    # ------------------------------------------------------------------ internals

    def _refresh_faults(self) -> None:
        if self._faults_path is None:
            return
        try:
            st = os.stat(self._faults_path)
            stamp = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp == self._faults_stamp:
            return
        self._faults_stamp = stamp
        try:
            faults = read_faults(self._faults_path)
        except (ValueError, OSError) as exc:
            # A half-written or bad file must not break the simulated driver: keep the last good state.
            self.faults_error = str(exc)
            return
        self.faults_error = None
        if len(faults.xids) < self._file_xids_seen:
            self._file_xids_seen = 0  # the file was rewritten from scratch
        new = faults.xids[self._file_xids_seen:]
        self._file_xids_seen = len(faults.xids)
        newly_lost = faults.lost - self._file_faults.lost
        self._file_faults = faults
        for x in new:
            if self._find_uuid(x.uuid)[0] is not None:
                self.inject_xid(x.uuid, x.xid)
        for u in newly_lost:
            if self._find_uuid(u)[0] is not None:
                self.inject_xid(u, 79)

    def _find_uuid(self, uuid: str) -> tuple[_SimGpu | None, _SimMig | None]:
        for g in self._gpus:
            if g.spec.uuid == uuid:
                return g, None
            for m in g.migs:
                if m.uuid == uuid:
                    return g, m
        return None, None

    def _is_lost(self, gpu: _SimGpu) -> bool:
        return gpu.spec.uuid in self._lost or gpu.spec.uuid in self._file_faults.lost

    def _check_call(self, fname: str, gpu: _SimGpu | None, mig: _SimMig | None) -> None:
        for c in list(self._fail_calls) + list(self._file_faults.fail_calls):
            if c.function != fname:
                continue
            if c.uuid is None or (gpu is not None and c.uuid == gpu.spec.uuid) or (mig is not None and c.uuid == mig.uuid):
                _raise(error_code(c.error))

    def _enter(self, fname: str) -> None:
        if self._init_count <= 0:
            _raise(pynvml.NVML_ERROR_UNINITIALIZED)
        self._refresh_faults()
        self._check_call(fname, None, None)

    def _resolve(self, fname: str, handle: Any) -> tuple[_SimGpu, _SimMig | None]:
        if self._init_count <= 0:
            _raise(pynvml.NVML_ERROR_UNINITIALIZED)
        self._refresh_faults()
        addr = _address(handle)
        if addr is None:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        base = _GPU_BASE + ((addr - _GPU_BASE) // _GPU_STRIDE) * _GPU_STRIDE
        gpu = self._by_address.get(base)
        if gpu is None:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        assert gpu is not None
        mig: _SimMig | None = None
        offset = addr - base
        if offset:
            slot = offset - _MIG_OFFSET
            mig = next((m for m in gpu.migs if m.gi_id == slot and m.has_ci), None)
            if mig is None or not gpu.mig_current:
                _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self._is_lost(gpu):
            _raise(pynvml.NVML_ERROR_GPU_IS_LOST)
        self._check_call(fname, gpu, mig)
        return gpu, mig

    def _gpu(self, fname: str, handle: Any) -> _SimGpu:
        gpu, mig = self._resolve(fname, handle)
        if mig is not None:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu

    @staticmethod
    def _gpu_handle(gpu: _SimGpu) -> Any:
        return ctypes.cast(ctypes.c_void_p(gpu.address), pynvml.c_nvmlDevice_t)

    @staticmethod
    def _mig_handle(gpu: _SimGpu, mig: _SimMig) -> Any:
        return ctypes.cast(ctypes.c_void_p(gpu.address + _MIG_OFFSET + mig.gi_id), pynvml.c_nvmlDevice_t)

    @staticmethod
    def _gi_handle(gpu: _SimGpu, mig: _SimMig) -> Any:
        return ctypes.cast(ctypes.c_void_p(gpu.address + _GI_OFFSET + mig.gi_id), pynvml.c_nvmlGpuInstance_t)

    @staticmethod
    def _ci_handle(gpu: _SimGpu, mig: _SimMig) -> Any:
        return ctypes.cast(ctypes.c_void_p(gpu.address + _GI_OFFSET + 0x100 + mig.gi_id), pynvml.c_nvmlComputeInstance_t)

    def _gi(self, fname: str, handle: Any, ci: bool = False) -> tuple[_SimGpu, _SimMig]:
        if self._init_count <= 0:
            _raise(pynvml.NVML_ERROR_UNINITIALIZED)
        addr = _address(handle)
        if addr is None:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        base = _GPU_BASE + ((addr - _GPU_BASE) // _GPU_STRIDE) * _GPU_STRIDE
        gpu = self._by_address.get(base)
        offset = addr - base - _GI_OFFSET - (0x100 if ci else 0)
        mig = next((m for m in gpu.migs if m.gi_id == offset), None) if gpu else None
        if gpu is None or mig is None or (ci and not mig.has_ci):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        assert gpu is not None and mig is not None
        if self._is_lost(gpu):
            _raise(pynvml.NVML_ERROR_GPU_IS_LOST)
        self._check_call(fname, gpu, mig)
        return gpu, mig

    def _profile_by_id(self, gpu: _SimGpu, profile_id: int) -> MigProfileSpec:
        if not gpu.model.mig_capable:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        p = next((p for p in gpu.model.mig_profiles if p.id == profile_id), None)
        if p is None:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        assert p is not None
        return p

    # ------------------------------------------------------------------ system

    def nvmlInit(self) -> None:
        with self._lock:
            self._init_count += 1
            self._refresh_faults()
            self._check_call("nvmlInit", None, None)

    def nvmlInitWithFlags(self, flags: int) -> None:
        self.nvmlInit()

    def nvmlShutdown(self) -> None:
        with self._lock:
            if self._init_count <= 0:
                _raise(pynvml.NVML_ERROR_UNINITIALIZED)
            self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        with self._lock:
            self._enter("nvmlSystemGetDriverVersion")
            return self.profile.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        with self._lock:
            self._enter("nvmlSystemGetNVMLVersion")
            return f"{self.profile.cuda_driver_version // 1000}.{self.profile.driver_version}"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        with self._lock:
            self._enter("nvmlSystemGetCudaDriverVersion")
            return self.profile.cuda_driver_version

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        with self._lock:
            self._enter("nvmlSystemGetCudaDriverVersion_v2")
            return self.profile.cuda_driver_version

    # ------------------------------------------------------------------ devices

    def nvmlDeviceGetCount(self) -> int:
        with self._lock:
            self._enter("nvmlDeviceGetCount")
            return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        with self._lock:
            self._enter("nvmlDeviceGetHandleByIndex")
            if not 0 <= int(index) < len(self._gpus):
                _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            gpu = self._gpus[int(index)]
            self._check_call("nvmlDeviceGetHandleByIndex", gpu, None)
            return self._gpu_handle(gpu)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Any:
        with self._lock:
            self._enter("nvmlDeviceGetHandleByUUID")
            gpu, mig = self._find_uuid(_text(uuid))
            if gpu is None or (mig is not None and not (mig.has_ci and gpu.mig_current)):
                _raise(pynvml.NVML_ERROR_NOT_FOUND)
            assert gpu is not None
            if self._is_lost(gpu):
                _raise(pynvml.NVML_ERROR_GPU_IS_LOST)
            return self._mig_handle(gpu, mig) if mig else self._gpu_handle(gpu)

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str | bytes) -> Any:
        with self._lock:
            self._enter("nvmlDeviceGetHandleByPciBusId")
            want = _text(bus_id).lower()
            for g in self._gpus:
                legacy, full, *_ = _nvml_bus_id(g.spec.pci_bus_id)
                if want in (legacy.lower(), full.lower(), g.spec.pci_bus_id.lower()):
                    if self._is_lost(g):
                        _raise(pynvml.NVML_ERROR_GPU_IS_LOST)
                    return self._gpu_handle(g)
            _raise(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        with self._lock:
            return self._gpu("nvmlDeviceGetIndex", handle).index

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        with self._lock:
            gpu, mig = self._resolve("nvmlDeviceGetUUID", handle)
            return mig.uuid if mig else gpu.spec.uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        with self._lock:
            gpu, mig = self._resolve("nvmlDeviceGetName", handle)
            if mig:
                return f"{gpu.model.product_name} MIG {mig.profile.name}"
            return gpu.model.product_name

    def nvmlDeviceGetBrand(self, handle: Any) -> int:
        with self._lock:
            gpu, _ = self._resolve("nvmlDeviceGetBrand", handle)
            return nvml_constant("NVML_BRAND_", gpu.model.brand)

    def nvmlDeviceGetArchitecture(self, handle: Any) -> int:
        with self._lock:
            gpu, _ = self._resolve("nvmlDeviceGetArchitecture", handle)
            return nvml_constant("NVML_DEVICE_ARCH_", gpu.model.architecture)

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        with self._lock:
            gpu, _ = self._resolve("nvmlDeviceGetCudaComputeCapability", handle)
            major, minor = gpu.model.cuda_compute_capability.split(".")
            return (int(major), int(minor))

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        with self._lock:
            gpu, mig = self._resolve("nvmlDeviceGetMemoryInfo", handle)
            total = (mig.profile.memory_mib if mig else gpu.model.memory_mib) * _MIB
            if version:
                mem2 = pynvml.c_nvmlMemory_v2_t()
                mem2.version = version
                mem2.total, mem2.reserved, mem2.free, mem2.used = total, 0, total, 0
                return mem2
            mem = pynvml.c_nvmlMemory_t()
            mem.total, mem.free, mem.used = total, total, 0
            return mem

    def nvmlDeviceGetPciInfo(self, handle: Any) -> pynvml.nvmlPciInfo_t:
        with self._lock:
            gpu, _ = self._resolve("nvmlDeviceGetPciInfo", handle)
            return _pci_info(gpu.spec.pci_bus_id, gpu.model.pci_device_id, gpu.model.pci_subsystem_id)

    def nvmlDeviceGetPciInfo_v3(self, handle: Any) -> pynvml.nvmlPciInfo_t:
        return self.nvmlDeviceGetPciInfo(handle)

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        with self._lock:
            return self._gpu("nvmlDeviceGetMinorNumber", handle).minor

    def nvmlDeviceGetAddressingMode(self, handle: Any) -> int:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetAddressingMode", handle)
            if gpu.model.addressing_mode is None:
                _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return nvml_constant("NVML_DEVICE_ADDRESSING_MODE_", str(gpu.model.addressing_mode).upper())

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetNumaNodeId", handle)
            if gpu.spec.numa_node is None:
                _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return int(gpu.spec.numa_node)  # type: ignore[arg-type]

    def nvmlDeviceGetAttributes(self, handle: Any) -> pynvml.c_nvmlDeviceAttributes:
        with self._lock:
            gpu, mig = self._resolve("nvmlDeviceGetAttributes", handle)
            attrs = pynvml.c_nvmlDeviceAttributes()
            if mig:
                p = mig.profile
                attrs.multiprocessorCount = p.multiprocessors
                attrs.sharedCopyEngineCount = p.copy_engines
                attrs.sharedDecoderCount = p.decoders
                attrs.sharedEncoderCount = p.encoders
                attrs.sharedJpegCount = p.jpeg_engines
                attrs.sharedOfaCount = p.ofa_engines
                attrs.gpuInstanceSliceCount = p.slices
                attrs.computeInstanceSliceCount = p.slices
                attrs.memorySizeMB = p.memory_mib
            else:
                attrs.memorySizeMB = gpu.model.memory_mib
            return attrs

    def nvmlDeviceGetAttributes_v2(self, handle: Any) -> pynvml.c_nvmlDeviceAttributes:
        return self.nvmlDeviceGetAttributes(handle)

    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        with self._lock:
            return self._gpu("nvmlDeviceGetComputeMode", handle).compute_mode

    def nvmlDeviceSetComputeMode(self, handle: Any, mode: int) -> None:
        with self._lock:
            gpu = self._gpu("nvmlDeviceSetComputeMode", handle)
            allowed = (
                pynvml.NVML_COMPUTEMODE_DEFAULT,
                pynvml.NVML_COMPUTEMODE_PROHIBITED,
                pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
            )
            if int(mode) not in allowed:
                _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            gpu.compute_mode = int(mode)

    # ------------------------------------------------------------------ MIG

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetMigMode", handle)
            if not gpu.model.mig_capable:
                _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return [int(gpu.mig_current), int(gpu.mig_pending)]

    def nvmlDeviceSetMigMode(self, handle: Any, mode: int) -> int:
        """Sets the pending mode; like a GPU reset with no instances, it applies at once when none exist."""
        with self._lock:
            gpu = self._gpu("nvmlDeviceSetMigMode", handle)
            if not gpu.model.mig_capable:
                _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if int(mode) not in (pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_ENABLE):
                _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if gpu.migs:
                _raise(pynvml.NVML_ERROR_IN_USE)
            gpu.mig_pending = bool(mode)
            gpu.mig_current = bool(mode)
            return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int, version: int = 2) -> Any:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetGpuInstanceProfileInfo", handle)
            if not gpu.model.mig_capable:
                _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if not 0 <= int(profile) < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
                _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            p = next((p for p in gpu.model.mig_profiles if p.enum_value == int(profile)), None)
            if p is None:
                _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
            assert p is not None
            if version == 2:
                info: Any = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
                info.name = f"MIG {p.name}".encode()
            elif version == 1:
                info = pynvml.c_nvmlGpuInstanceProfileInfo_t()
            else:
                _raise(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            info.id = p.id
            info.isP2pSupported = int(p.p2p)
            info.sliceCount = p.slices
            info.instanceCount = p.instance_count
            info.multiprocessorCount = p.multiprocessors
            info.copyEngineCount = p.copy_engines
            info.decoderCount = p.decoders
            info.encoderCount = p.encoders
            info.jpegCount = p.jpeg_engines
            info.ofaCount = p.ofa_engines
            info.memorySizeMB = p.memory_mib
            return info

    def nvmlDeviceGetGpuInstanceProfileInfoV(self, handle: Any, profile: int, version: int = 2) -> Any:
        return self.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile, version)

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, handle: Any, profile_id: int, placements_ref: Any, count_ref: Any) -> int:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetGpuInstancePossiblePlacements", handle)
            p = self._profile_by_id(gpu, int(profile_id))
            count = _deref(count_ref)
            if count is None:
                _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            starts = p.placement_starts
            array = _deref(placements_ref)
            if array is None:
                count.value = len(starts)
                return pynvml.NVML_SUCCESS
            if count.value < len(starts) or len(array) < len(starts):
                count.value = len(starts)
                _raise(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
            for i, s in enumerate(starts):
                array[i].start = s
                array[i].size = p.placement_size
            count.value = len(starts)
            return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, handle: Any, profile_id: int) -> int:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetGpuInstanceRemainingCapacity", handle)
            p = self._profile_by_id(gpu, int(profile_id))
            if not gpu.mig_current:
                _raise(pynvml.NVML_ERROR_INVALID_STATE)
            return sum(1 for s in p.placement_starts if self._placement_free(gpu, p, s))

    def _placement_free(self, gpu: _SimGpu, p: MigProfileSpec, start: int) -> bool:
        want = set(range(start, start + p.placement_size))
        used_compute = sum(m.profile.slices for m in gpu.migs)
        max_compute = max(q.slices for q in gpu.model.mig_profiles)
        same = sum(1 for m in gpu.migs if m.profile.id == p.id)
        for m in gpu.migs:
            if want & set(range(m.start, m.start + m.profile.placement_size)):
                return False
        return used_compute + p.slices <= max_compute and same < p.instance_count

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Any, profile_id: int, placement: Any) -> Any:
        with self._lock:
            gpu = self._gpu("nvmlDeviceCreateGpuInstanceWithPlacement", handle)
            p = self._profile_by_id(gpu, int(profile_id))
            if not gpu.mig_current:
                _raise(pynvml.NVML_ERROR_INVALID_STATE)
            pl = _deref(placement)
            start = int(pl.start)
            if start not in p.placement_starts or int(pl.size) != p.placement_size:
                _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if not self._placement_free(gpu, p, start):
                _raise(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            mig = _SimMig(gpu_instance_id(start, p.placement_size), p, start, mig_uuid(gpu.spec.uuid, p.name, start), has_ci=False)
            gpu.migs.append(mig)
            gpu.migs.sort(key=lambda m: m.start)
            return self._gi_handle(gpu, mig)

    def nvmlDeviceCreateGpuInstance(self, handle: Any, profile_id: int) -> Any:
        with self._lock:
            gpu = self._gpu("nvmlDeviceCreateGpuInstance", handle)
            p = self._profile_by_id(gpu, int(profile_id))
            if not gpu.mig_current:
                _raise(pynvml.NVML_ERROR_INVALID_STATE)
            # The driver fills from the highest slot down; any deterministic choice is faithful enough.
            for start in sorted(p.placement_starts, reverse=True):
                if self._placement_free(gpu, p, start):
                    pl = pynvml.c_nvmlGpuInstancePlacement_t(start, p.placement_size)
                    return self.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile_id, pl)
            _raise(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)

    def nvmlDeviceGetGpuInstances(self, handle: Any, profile_id: int, instances_ref: Any, count_ref: Any) -> int:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetGpuInstances", handle)
            p = self._profile_by_id(gpu, int(profile_id))
            found = [m for m in gpu.migs if m.profile.id == p.id]
            count = _deref(count_ref)
            array = _deref(instances_ref)
            if array is not None:
                if len(array) < len(found):
                    count.value = len(found)
                    _raise(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
                for i, m in enumerate(found):
                    array[i] = self._gi_handle(gpu, m)
            count.value = len(found)
            return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gi_id: int) -> Any:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetGpuInstanceById", handle)
            if not gpu.model.mig_capable:
                _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
            mig = next((m for m in gpu.migs if m.gi_id == int(gi_id)), None)
            if mig is None:
                _raise(pynvml.NVML_ERROR_NOT_FOUND)
            assert mig is not None
            return self._gi_handle(gpu, mig)

    def nvmlGpuInstanceGetInfo(self, gpu_instance: Any) -> pynvml.c_nvmlGpuInstanceInfo_t:
        with self._lock:
            gpu, mig = self._gi("nvmlGpuInstanceGetInfo", gpu_instance)
            info = pynvml.c_nvmlGpuInstanceInfo_t()
            info.device = self._gpu_handle(gpu)
            info.id = mig.gi_id
            info.profileId = mig.profile.id
            info.placement = pynvml.c_nvmlGpuInstancePlacement_t(mig.start, mig.profile.placement_size)
            return info

    def nvmlGpuInstanceDestroy(self, gpu_instance: Any) -> int:
        with self._lock:
            gpu, mig = self._gi("nvmlGpuInstanceDestroy", gpu_instance)
            if mig.has_ci:
                _raise(pynvml.NVML_ERROR_IN_USE)
            gpu.migs.remove(mig)
            return pynvml.NVML_SUCCESS

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gpu_instance: Any, profile: int, eng_profile: int, version: int = 2) -> Any:
        with self._lock:
            _, mig = self._gi("nvmlGpuInstanceGetComputeInstanceProfileInfo", gpu_instance)
            p = mig.profile
            # Only the full-size compute instance is simulated: one MIG device per GPU instance.
            if int(profile) != _CI_PROFILE_FOR_SLICES.get(p.slices) or int(eng_profile) != 0:
                _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
            info: Any = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t() if version == 2 else pynvml.c_nvmlComputeInstanceProfileInfo_t()
            if version == 2:
                info.name = f"MIG {p.name}".encode()
            info.id = int(profile)
            info.sliceCount = p.slices
            info.instanceCount = 1
            info.multiprocessorCount = p.multiprocessors
            info.sharedCopyEngineCount = p.copy_engines
            info.sharedDecoderCount = p.decoders
            info.sharedEncoderCount = p.encoders
            info.sharedJpegCount = p.jpeg_engines
            info.sharedOfaCount = p.ofa_engines
            return info

    def nvmlGpuInstanceGetComputeInstanceProfileInfoV(self, gpu_instance: Any, profile: int, eng_profile: int, version: int = 2) -> Any:
        return self.nvmlGpuInstanceGetComputeInstanceProfileInfo(gpu_instance, profile, eng_profile, version)

    def nvmlGpuInstanceCreateComputeInstance(self, gpu_instance: Any, profile_id: int) -> Any:
        with self._lock:
            gpu, mig = self._gi("nvmlGpuInstanceCreateComputeInstance", gpu_instance)
            if int(profile_id) != _CI_PROFILE_FOR_SLICES.get(mig.profile.slices):
                _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if mig.has_ci:
                _raise(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            mig.has_ci = True
            return self._ci_handle(gpu, mig)

    def nvmlGpuInstanceGetComputeInstanceById(self, gpu_instance: Any, ci_id: int) -> Any:
        with self._lock:
            gpu, mig = self._gi("nvmlGpuInstanceGetComputeInstanceById", gpu_instance)
            if int(ci_id) != 0 or not mig.has_ci:
                _raise(pynvml.NVML_ERROR_NOT_FOUND)
            return self._ci_handle(gpu, mig)

    def nvmlComputeInstanceGetInfo(self, compute_instance: Any) -> pynvml.c_nvmlComputeInstanceInfo_t:
        with self._lock:
            gpu, mig = self._gi("nvmlComputeInstanceGetInfo", compute_instance, ci=True)
            info = pynvml.c_nvmlComputeInstanceInfo_t()
            info.device = self._gpu_handle(gpu)
            info.gpuInstance = self._gi_handle(gpu, mig)
            info.id = 0
            info.profileId = _CI_PROFILE_FOR_SLICES[mig.profile.slices]
            info.placement = pynvml.c_nvmlComputeInstancePlacement_t(0, mig.profile.slices)
            return info

    def nvmlComputeInstanceGetInfo_v2(self, compute_instance: Any) -> pynvml.c_nvmlComputeInstanceInfo_t:
        return self.nvmlComputeInstanceGetInfo(compute_instance)

    def nvmlComputeInstanceDestroy(self, compute_instance: Any) -> int:
        with self._lock:
            _, mig = self._gi("nvmlComputeInstanceDestroy", compute_instance, ci=True)
            mig.has_ci = False
            return pynvml.NVML_SUCCESS

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetMaxMigDeviceCount", handle)
            if not gpu.model.mig_capable:
                _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return max(p.slices for p in gpu.model.mig_profiles)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any:
        with self._lock:
            gpu = self._gpu("nvmlDeviceGetMigDeviceHandleByIndex", handle)
            if not gpu.model.mig_capable:
                _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if not gpu.mig_current:
                _raise(pynvml.NVML_ERROR_INVALID_STATE)
            devices = [m for m in gpu.migs if m.has_ci]
            if not 0 <= int(index) < max(p.slices for p in gpu.model.mig_profiles):
                _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if int(index) >= len(devices):
                _raise(pynvml.NVML_ERROR_NOT_FOUND)
            return self._mig_handle(gpu, devices[int(index)])

    def nvmlDeviceIsMigDeviceHandle(self, handle: Any) -> ctypes.c_uint:
        with self._lock:
            _, mig = self._resolve("nvmlDeviceIsMigDeviceHandle", handle)
            # pynvml returns the c_uint itself, not its value.
            return ctypes.c_uint(1 if mig else 0)

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        with self._lock:
            _, mig = self._resolve("nvmlDeviceGetGpuInstanceId", handle)
            if mig is None:
                _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            assert mig is not None
            return mig.gi_id

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        with self._lock:
            _, mig = self._resolve("nvmlDeviceGetComputeInstanceId", handle)
            if mig is None:
                _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return 0

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any) -> Any:
        with self._lock:
            gpu, mig = self._resolve("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle)
            if mig is None:
                _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return self._gpu_handle(gpu)

    # ------------------------------------------------------------------ NVLink and fabric

    def _links(self, gpu: _SimGpu) -> list[tuple[bool, str | None, bool]]:
        """Per link: (active, remote PCI bus id, remote is an NVSwitch)."""
        n = gpu.model.nvlink_count
        if gpu.spec.nvlinks is not None:
            out: list[tuple[bool, str | None, bool]] = []
            for link in gpu.spec.nvlinks:
                if not link.active:
                    out.append((False, None, False))
                elif link.peer is not None:
                    out.append((True, self._gpus[link.peer].spec.pci_bus_id, False))
                else:
                    out.append((True, link.switch, True))
            return out + [(False, None, False)] * (n - len(out))
        if self.profile.nvswitch is not None:
            switches = self.profile.nvswitch.pci_bus_ids
            return [(True, switches[i % len(switches)], True) for i in range(n)]
        return [(False, None, False)] * n

    def _link(self, fname: str, handle: Any, link: int) -> tuple[bool, str | None, bool]:
        gpu = self._gpu(fname, handle)
        if gpu.model.nvlink_count == 0:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= int(link) < gpu.model.nvlink_count:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._links(gpu)[int(link)]

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        with self._lock:
            active, _, _ = self._link("nvmlDeviceGetNvLinkState", handle, link)
            return pynvml.NVML_FEATURE_ENABLED if active else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkVersion(self, handle: Any, link: int) -> int:
        with self._lock:
            self._link("nvmlDeviceGetNvLinkVersion", handle, link)
            return _NVLINK_VERSION.get(self._gpu("nvmlDeviceGetNvLinkVersion", handle).model.architecture, 1)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> pynvml.nvmlPciInfo_t:
        with self._lock:
            active, remote, _ = self._link("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
            if not active or remote is None:
                _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
            assert remote is not None
            return _pci_info(remote)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        with self._lock:
            active, _, is_switch = self._link("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
            if not active:
                return pynvml.NVML_NVLINK_DEVICE_TYPE_UNKNOWN
            return pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH if is_switch else pynvml.NVML_NVLINK_DEVICE_TYPE_GPU

    def _fill_fabric(self, fname: str, handle: Any, info_ref: Any) -> int:
        gpu = self._gpu(fname, handle)
        info = _deref(info_ref)
        if info is None:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not gpu.model.fabric_capable:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        fabric = self.profile.fabric
        if fabric is None:
            info.state = pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
            info.status = pynvml.NVML_ERROR_NOT_SUPPORTED
            info.cliqueId = 0
            return pynvml.NVML_SUCCESS
        raw = uuidlib.UUID(fabric.cluster_uuid).bytes
        for i, b in enumerate(raw):
            info.clusterUuid[i] = b
        info.status = pynvml.NVML_SUCCESS
        info.cliqueId = fabric.clique_id
        info.state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        if hasattr(info, "healthMask"):
            unhealthy = gpu.spec.uuid in self._file_faults.fabric_unhealthy
            info.healthMask = (
                ((pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE if unhealthy else
                  pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE)
                 << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW)
                | ((pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE if unhealthy else
                    pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_FALSE)
                   << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY))
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, info_ref: Any) -> int:
        with self._lock:
            return self._fill_fabric("nvmlDeviceGetGpuFabricInfo", handle, info_ref)

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info_ref: Any) -> int:
        with self._lock:
            return self._fill_fabric("nvmlDeviceGetGpuFabricInfoV", handle, info_ref)

    # ------------------------------------------------------------------ events

    def nvmlEventSetCreate(self) -> Any:
        with self._lock:
            self._enter("nvmlEventSetCreate")
            self._next_event_set += 0x10
            self._event_sets[self._next_event_set] = _EventSet()
            return ctypes.cast(ctypes.c_void_p(self._next_event_set), pynvml.c_nvmlEventSet_t)

    def _event_set(self, event_set: Any) -> _EventSet:
        es = self._event_sets.get(_address(event_set) or -1)
        if es is None:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        assert es is not None
        return es

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        with self._lock:
            self._gpu("nvmlDeviceGetSupportedEventTypes", handle)
            return _SUPPORTED_EVENTS

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        with self._lock:
            gpu = self._gpu("nvmlDeviceRegisterEvents", handle)
            es = self._event_set(event_set)
            if int(event_types) & ~_SUPPORTED_EVENTS:
                _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
            es.registered[gpu.address] = es.registered.get(gpu.address, 0) | int(event_types)

    def nvmlEventSetWait_v2(self, event_set: Any, timeoutms: int) -> pynvml.c_nvmlEventData_t:
        deadline = time.monotonic() + max(0, int(timeoutms)) / 1000.0
        with self._lock:
            self._enter("nvmlEventSetWait_v2")
            es = self._event_set(event_set)
            while True:
                self._refresh_faults()
                if es.queue:
                    return es.queue.popleft()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    _raise(pynvml.NVML_ERROR_TIMEOUT)
                # With a faults file the writer is another process that cannot notify us: poll it.
                self._lock.wait(min(remaining, _FAULTS_POLL_S) if self._faults_path else remaining)
                if _address(event_set) not in self._event_sets:
                    _raise(pynvml.NVML_ERROR_UNINITIALIZED)

    def nvmlEventSetWait(self, event_set: Any, timeoutms: int) -> pynvml.c_nvmlEventData_t:
        return self.nvmlEventSetWait_v2(event_set, timeoutms)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        with self._lock:
            self._event_set(event_set)
            del self._event_sets[_address(event_set)]  # type: ignore[arg-type]
            self._lock.notify_all()
