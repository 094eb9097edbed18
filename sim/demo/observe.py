"""What the demo saw, as plain data: API objects at the end of each act, the kubelets' records, the nodes' disks.

`workloads()` turns it into one row per workload (pod) with its claims and devices; pure, so the report and the
expectations are computed from the same rows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sim.demo.disk import NodeDisk
from sim.kubelet.pods import PodRecord

Obj = dict[str, Any]


@dataclass(frozen=True)
class ApiState:
    """Objects of the demo namespace (and the cluster's slices) at one moment."""

    pods: dict[str, Obj]  # name -> Pod
    claims: dict[str, Obj]  # name -> ResourceClaim
    events: list[Obj]
    slices: list[Obj]

    def events_for(self, pod_name: str) -> list[Obj]:
        return [e for e in self.events if (e.get("involvedObject") or {}).get("name") == pod_name]


@dataclass(frozen=True)
class Observed:
    act1: ApiState
    final: ApiState
    records: dict[str, dict[str, PodRecord]]  # node -> pod uid -> record (kept across both acts)
    disk: dict[str, NodeDisk]  # node -> what is on disk at the end
    gpus: dict[str, int]  # node -> physical GPUs NVML reports
    namespace: str
    driver: str
    runtime: str = "none"  # "podman" when containers really ran (their views are in the records)


@dataclass(frozen=True)
class DeviceRow:
    driver: str
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    shared: bool
    sharing: str  # "TimeSlicing", "MPS" or "" (exclusive)
    attributes: Mapping[str, Any]


@dataclass(frozen=True)
class ClaimRow:
    claim: str
    uid: str
    node: str
    devices: tuple[DeviceRow, ...]


@dataclass(frozen=True)
class ContainerView:
    """One container as the runtime ran it and what it saw from inside (its probe)."""

    name: str
    running: bool
    exit_code: int | None
    restart_count: int
    cdi_devices: tuple[str, ...]
    probed: bool  # False: the probe's output was not there (the container did not get that far)
    nvidia_smi: tuple[str, ...] = ()
    visible_devices: str | None = None
    device_nodes: tuple[str, ...] = ()

    @property
    def gpu_uuids(self) -> list[str]:
        """GPU UUIDs of its `nvidia-smi -L` lines, in order."""
        return [m.group(1) for line in self.nvidia_smi if (m := _GPU_LINE.match(line))]

    @property
    def mig_uuids(self) -> list[str]:
        return [m.group(1) for line in self.nvidia_smi if (m := _MIG_LINE.match(line))]

    @property
    def gpu_nodes(self) -> list[str]:
        """Its /dev/nvidia<N> GPU nodes (not nvidiactl, uvm or caps)."""
        return [n for n in self.device_nodes if _GPU_NODE.match(n)]


_GPU_LINE = re.compile(r"^GPU \d+: .* \(UUID: (GPU-[^)]+)\)$")
_MIG_LINE = re.compile(r"^\s+MIG .* \(UUID: (MIG-[^)]+)\)$")
_GPU_NODE = re.compile(r"^/dev/nvidia\d+$")


@dataclass(frozen=True)
class WorkloadRow:
    name: str
    uid: str
    phase: str
    reason: str
    message: str
    node: str
    claims: tuple[ClaimRow, ...]
    legacy_devices: tuple[str, ...] = ()  # device plugin device IDs (GPU UUIDs)
    legacy_cdi_devices: tuple[str, ...] = ()
    containers: tuple[ContainerView, ...] = ()  # with a runtime: each container's latest run


def slice_attributes(slices: list[Obj]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(driver, pool, device) -> attributes with the driver's domain stripped and values unwrapped."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for sl in slices:
        spec = sl.get("spec") or {}
        driver = str(spec.get("driver"))
        pool = str((spec.get("pool") or {}).get("name"))
        for dev in spec.get("devices") or []:
            attrs: dict[str, Any] = {}
            for key, value in (dev.get("attributes") or {}).items():
                short = key.split("/", 1)[1] if key.startswith(f"{driver}/") else key
                attrs[short] = next(iter(value.values())) if isinstance(value, Mapping) and value else None
            out[(driver, pool, str(dev.get("name")))] = attrs
    return out


def _claim_sharing(claim: Obj | None, driver: str) -> str:
    """The sharing strategy the claim's opaque GpuConfig asks for, or ""."""
    for entry in ((claim or {}).get("spec") or {}).get("devices", {}).get("config") or []:
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        sharing = (opaque.get("parameters") or {}).get("sharing") or {}
        if sharing.get("strategy"):
            return str(sharing["strategy"])
    return ""


def _pod_claim_names(pod: Obj) -> list[str]:
    statuses = {s.get("name"): s.get("resourceClaimName") for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
    names = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = entry.get("resourceClaimName") or statuses.get(entry.get("name"))
        if name:
            names.append(str(name))
    return names


def _latest_event(state: ApiState, pod_name: str) -> tuple[str, str]:
    events = [e for e in state.events_for(pod_name) if e.get("type") == "Warning"]
    if not events:
        return "", ""
    # Event times are whole seconds: of the events of the latest second, the controller's explanation (GpuDra*)
    # is shown over the scheduler's FailedScheduling of the same attempt, whichever was counted more often.
    last = max(events, key=lambda e: (str(e.get("lastTimestamp") or ""), str(e.get("reason") or "").startswith("GpuDra"),
                                      int(e.get("count") or 0)))
    return str(last.get("reason") or ""), str(last.get("message") or "")


def workloads(obs: Observed) -> list[WorkloadRow]:
    attrs = slice_attributes(obs.act1.slices + obs.final.slices)
    records = {uid: r for node in obs.records.values() for uid, r in node.items()}
    # How many pods used each device (by claim): a device is shared when more than one running pod uses it.
    users: dict[tuple[str, str, str], set[str]] = {}
    for pod in obs.final.pods.values():
        if (pod.get("status") or {}).get("phase") != "Running":
            continue
        for name in _pod_claim_names(pod):
            claim = obs.final.claims.get(name)
            for res in (((claim or {}).get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []:
                users.setdefault((res.get("driver"), res.get("pool"), res.get("device")), set()).add(pod["metadata"]["uid"])
    rows = []
    for name in sorted(obs.final.pods):
        pod = obs.final.pods[name]
        uid = str(pod["metadata"]["uid"])
        phase = str((pod.get("status") or {}).get("phase") or "Pending")
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        record = records.get(uid)
        prepared = {pc.claim.name: pc for pc in (record.claims if record else [])}
        claim_rows = []
        for cname in _pod_claim_names(pod):
            claim = obs.final.claims.get(cname) or obs.act1.claims.get(cname)
            alloc = ((claim or {}).get("status") or {}).get("allocation") or {}
            sharing = _claim_sharing(claim, obs.driver)
            devices = []
            pc = prepared.get(cname)
            if pc is not None:
                for d in pc.devices:
                    key = (obs.driver, d.pool_name, d.device_name)
                    devices.append(DeviceRow(obs.driver, d.pool_name, d.device_name, tuple(d.cdi_device_ids),
                                             len(users.get(key, ())) > 1 or bool(sharing), sharing, attrs.get(key, {})))
            else:
                for res in (alloc.get("devices") or {}).get("results") or []:
                    key = (str(res.get("driver")), str(res.get("pool")), str(res.get("device")))
                    devices.append(DeviceRow(*key, (), len(users.get(key, ())) > 1 or bool(sharing), sharing, attrs.get(key, {})))
            pools = sorted({d.pool for d in devices})
            claim_rows.append(ClaimRow(cname, str(((claim or {}).get("metadata") or {}).get("uid") or ""),
                                       ",".join(pools), tuple(devices)))
        reason, message = ("", "")
        if phase == "Pending":
            reason, message = _latest_event(obs.final, name)
        elif phase == "Succeeded":
            reason = "Completed"
        legacy = tuple(i for g in (record.legacy if record else []) for i in g.device_ids)
        legacy_cdi = tuple(i for g in (record.legacy if record else []) for i in g.cdi_devices)
        containers = tuple(
            ContainerView(c.container, c.running, c.exit_code, c.restart_count, c.cdi_devices, c.seen is not None,
                          *((c.seen.nvidia_smi, c.seen.visible_devices, c.seen.device_nodes) if c.seen else ()))
            for c in (record.containers if record else [])
        )
        rows.append(WorkloadRow(name, uid, phase, reason, message, node, tuple(claim_rows), legacy, legacy_cdi, containers))
    return rows


@dataclass(frozen=True)
class Utilization:
    allocated: int
    total: int
    devices: list[str] = field(default_factory=list)  # "pool/device" in use


def utilization(obs: Observed, rows: list[WorkloadRow]) -> dict[str, Utilization]:
    """Per node: physical GPUs in use (a GPU with any allocated device or MIG slice counts) of all GPUs."""
    attrs = slice_attributes(obs.act1.slices + obs.final.slices)
    used: dict[str, set[str]] = {node: set() for node in obs.gpus}
    devices: dict[str, set[str]] = {node: set() for node in obs.gpus}
    for claim in obs.final.claims.values():
        for res in (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []:
            key = (str(res.get("driver")), str(res.get("pool")), str(res.get("device")))
            a = attrs.get(key, {})
            gpu = a.get("parentUUID") or a.get("uuid") or key[2]
            used.setdefault(key[1], set()).add(str(gpu))
            devices.setdefault(key[1], set()).add(key[2])
    for row in rows:
        if row.phase == "Running" and row.legacy_devices:
            used.setdefault(row.node, set()).update(row.legacy_devices)
            devices.setdefault(row.node, set()).update(f"{d} (device plugin)" for d in row.legacy_devices)
    return {node: Utilization(len(used.get(node, ())), total, sorted(devices.get(node, ())))
            for node, total in sorted(obs.gpus.items())}
