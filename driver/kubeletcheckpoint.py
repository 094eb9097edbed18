"""The kubelet device manager's checkpoint file `<kubelet dir>/device-plugins/kubelet_internal_checkpoint`.

The kubelet (pkg/kubelet/cm/devicemanager/checkpoint, format used since 1.21) writes it after every device plugin
allocation, as JSON:

    {"Data": {"PodDeviceEntries": [{"PodUID": str, "ContainerName": str, "ResourceName": str,
                                    "DeviceIDs": {"<NUMA node>": [device ID, ...]},
                                    "AllocResp": <base64 of the marshalled ContainerAllocateResponse>}],
              "RegisteredDevices": {"<resource name>": [device ID, ...]}},
     "Checksum": <uint64>}

`DeviceIDs` is keyed by NUMA node id as a decimal string (Go encodes map[int64] keys that way); devices without
topology sit under "-1". The kubelet's checksum is a 32-bit FNV-1a over a Go-specific deep print of `Data`, which
cannot be reproduced outside Go; readers here therefore never verify it, and the kubelet simulator writes FNV-1a
over the canonical JSON of `Data` instead (the file is otherwise the same shape).

The kubelet drops the entries of terminated pods lazily: only the next allocation (of any resource) rewrites the
file. Readers must combine it with pod liveness from the API server to release devices promptly.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudra.atomicfile import atomic_write

CHECKPOINT_FILE = "kubelet_internal_checkpoint"
NO_TOPOLOGY_NUMA = -1


@dataclass(frozen=True)
class PodDeviceEntry:
    pod_uid: str
    container_name: str
    resource_name: str
    device_ids: Mapping[int, tuple[str, ...]]  # NUMA node -> device IDs
    alloc_resp: bytes = b""

    def all_ids(self) -> frozenset[str]:
        return frozenset(i for ids in self.device_ids.values() for i in ids)


@dataclass(frozen=True)
class KubeletCheckpoint:
    entries: tuple[PodDeviceEntry, ...] = ()
    registered: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # sha256 of the file's bytes: tells a reader whether the kubelet has written the file since it last looked.
    digest: str = ""

    def in_use(self, resource_name: str, live_pods: frozenset[str] | None = None) -> dict[str, str]:
        """Device ID -> pod UID for `resource_name`, counting only `live_pods` when that set is known."""
        out: dict[str, str] = {}
        for e in self.entries:
            if e.resource_name != resource_name or (live_pods is not None and e.pod_uid not in live_pods):
                continue
            for device in e.all_ids():
                out[device] = e.pod_uid
        return out


class KubeletCheckpointError(ValueError):
    pass


def fnv1a32(data: bytes) -> int:
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def _entry_from_json(i: int, raw: Any) -> PodDeviceEntry:
    where = f"Data.PodDeviceEntries[{i}]"
    if not isinstance(raw, Mapping):
        raise KubeletCheckpointError(f"{where}: must be an object")
    for key in ("PodUID", "ContainerName", "ResourceName"):
        if not isinstance(raw.get(key), str):
            raise KubeletCheckpointError(f"{where}.{key}: must be a string")
    ids_raw = raw.get("DeviceIDs") or {}
    if not isinstance(ids_raw, Mapping):
        raise KubeletCheckpointError(f"{where}.DeviceIDs: must be an object of NUMA node -> device IDs")
    ids: dict[int, tuple[str, ...]] = {}
    for numa, devices in ids_raw.items():
        try:
            node = int(numa)
        except ValueError:
            raise KubeletCheckpointError(f"{where}.DeviceIDs: key {numa!r} must be a NUMA node number") from None
        if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
            raise KubeletCheckpointError(f"{where}.DeviceIDs[{numa}]: must be a list of device ID strings")
        ids[node] = tuple(devices)
    resp = raw.get("AllocResp") or ""
    try:
        alloc = base64.b64decode(resp) if isinstance(resp, str) else b""
    except ValueError:
        alloc = b""  # informational only; a damaged cached response does not change which devices are used
    return PodDeviceEntry(raw["PodUID"], raw["ContainerName"], raw["ResourceName"], ids, alloc)


def parse(data: bytes) -> KubeletCheckpoint:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise KubeletCheckpointError(f"not valid JSON: {exc}") from exc
    if not isinstance(doc, Mapping) or not isinstance(doc.get("Data"), Mapping):
        raise KubeletCheckpointError('missing the "Data" object')
    body = doc["Data"]
    entries_raw = body.get("PodDeviceEntries") or []
    if not isinstance(entries_raw, list):
        raise KubeletCheckpointError("Data.PodDeviceEntries: must be a list")
    registered_raw = body.get("RegisteredDevices") or {}
    if not isinstance(registered_raw, Mapping):
        raise KubeletCheckpointError("Data.RegisteredDevices: must be an object of resource name -> device IDs")
    registered = {str(k): tuple(str(d) for d in v or ()) for k, v in registered_raw.items()}
    entries = tuple(_entry_from_json(i, e) for i, e in enumerate(entries_raw))
    return KubeletCheckpoint(entries, registered, hashlib.sha256(data).hexdigest())


def read(device_plugin_dir: Path) -> KubeletCheckpoint | None:
    """The kubelet's checkpoint, or None when there is none; raises KubeletCheckpointError when unreadable."""
    try:
        data = (device_plugin_dir / CHECKPOINT_FILE).read_bytes()
    except FileNotFoundError:
        return None
    return parse(data)


def render(entries: Iterable[PodDeviceEntry], registered: Mapping[str, Sequence[str]]) -> bytes:
    """The file content for these entries (entries in the given order, as the kubelet keeps its own order)."""
    data: dict[str, Any] = {
        "PodDeviceEntries": [
            {
                "PodUID": e.pod_uid,
                "ContainerName": e.container_name,
                "ResourceName": e.resource_name,
                "DeviceIDs": {str(numa): list(ids) for numa, ids in sorted(e.device_ids.items())},
                "AllocResp": base64.b64encode(e.alloc_resp).decode(),
            }
            for e in entries
        ],
        "RegisteredDevices": {name: list(ids) for name, ids in sorted(registered.items())},
    }
    checksum = fnv1a32(json.dumps(data, sort_keys=True, separators=(",", ":")).encode())
    return json.dumps({"Data": data, "Checksum": checksum}).encode()


def write(device_plugin_dir: Path, entries: Iterable[PodDeviceEntry], registered: Mapping[str, Sequence[str]]) -> None:
    device_plugin_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(device_plugin_dir / CHECKPOINT_FILE, render(entries, registered))
