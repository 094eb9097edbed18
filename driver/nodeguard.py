"""What the agent checks on its own Node every resync: another device plugin advertising the GPUs, and who owns
GPU Feature Discovery's labels.

- **Coexistence.** When the Node advertises `nvidia.com/gpu` (allocatable, else capacity) while our device plugin
  shim is off, another device plugin (the GPU Operator's `nvidia-device-plugin`) hands out these GPUs by count;
  publishing them as DRA devices too would let two pods get one GPU. The agent then withholds its slices, says
  so loudly (a Warning Event on the Node and the Node condition `GpuDraDevicePluginConflict=True`), and publishes
  again once the resource is gone. `--allow-device-plugin-coexistence` publishes anyway (for nodes where the
  other plugin serves GPUs kept from DRA, e.g. with `--reserved-gpus`); the condition still reports it.
- **nvidia-uvm.** On a GPU node whose nvidia-uvm module could not be loaded (driver.gputools.ensure_uvm_loaded),
  CUDA in every container lacks /dev/nvidia-uvm and fails its first allocation: the Node condition
  `GpuDraNvidiaUvmMissing=True` says why, with a Warning Event `NvidiaUvmMissing` when it begins; rechecked every
  resync, so a module loaded later (by a driver container, or by hand) clears it.
- **Labels.** With `--node-labels`, GFD's labels are written and refreshed when they change (MIG
  reconfiguration, a driver upgrade) unless GFD runs on the node: GFD marks the labels it owns with
  `nvidia.com/gfd.timestamp`, and two writers would flip each other's values.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from driver.inventory import Inventory
from driver.nodelabels import gfd_labels, label_patch
from gpudra.logfmt import quote
from gpudra.quantity import Quantity
from gpudra.timestamps import rfc3339

log = logging.getLogger("gpu-dra.nodeguard")

CONDITION_TYPE = "GpuDraDevicePluginConflict"
EVENT_REASON = "DevicePluginConflict"
UVM_CONDITION_TYPE = "GpuDraNvidiaUvmMissing"
UVM_EVENT_REASON = "NvidiaUvmMissing"
GFD_MARKER_LABEL = "nvidia.com/gfd.timestamp"
COMPONENT = "gpu-dra-node-agent"


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def advertised(node: Mapping[str, Any], resource: str) -> int:
    """How many `resource` the Node advertises (allocatable, else capacity; 0 when neither names it)."""
    status = _map(node.get("status"))
    for field in ("allocatable", "capacity"):
        table = _map(status.get(field))
        if resource in table:
            try:
                return int(Quantity.parse(str(table[resource])).as_fraction())
            except (ValueError, TypeError):
                return 0
    return 0


def gfd_owns_labels(node: Mapping[str, Any]) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return GFD_MARKER_LABEL in labels


@dataclass(frozen=True)
class GuardSettings:
    node_name: str
    resource: str = "nvidia.com/gpu"
    shim_enabled: bool = False  # our own device plugin serves `resource`: its count is ours
    allow_coexistence: bool = False
    node_labels: bool = False


@dataclass(frozen=True)
class Conflict:
    count: int
    allowed: bool

    def message(self, s: GuardSettings) -> str:
        head = (f"node {s.node_name} advertises {self.count} {s.resource} from another device plugin "
                "(the gpu-dra device plugin shim is off)")
        if self.allowed:
            return head + "; publishing DRA GPUs anyway (--allow-device-plugin-coexistence): keep the two sets apart"
        return (head + "; gpu-dra withholds its ResourceSlices so that no GPU is handed out twice. Disable the other "
                "device plugin on this node, or run gpu-dra with --device-plugin (its shim shares one ledger with "
                "DRA), or pass --allow-device-plugin-coexistence")


def decide(node: Mapping[str, Any], s: GuardSettings) -> Conflict | None:
    if s.shim_enabled:
        return None
    count = advertised(node, s.resource)
    return Conflict(count, s.allow_coexistence) if count > 0 else None


class NodeGuard:
    """One `check()` per resync: reads the Node once, then withholds or releases the slices, reports a change of
    the conflict (Event + condition) and refreshes the labels. API failures are logged; the next check retries."""

    def __init__(self, api: Any, settings: GuardSettings, *, withhold: Callable[[str | None], None],
                 inventory: Callable[[], Inventory], uvm_missing: Callable[[], str | None] | None = None) -> None:
        self._api = api
        self.settings = settings
        self._withhold = withhold
        self._inventory = inventory
        # Why CUDA lacks /dev/nvidia-uvm on this node, None when it does not; None: not checked (simulated GPUs).
        self._uvm_missing = uvm_missing
        self._reported: Conflict | None = None  # the conflict last announced
        self._uvm_reported: str | None = None  # the nvidia-uvm problem last announced
        self._gfd_noted = False

    def check(self) -> bool:
        """True when the Node was read and acted on."""
        try:
            node = self._api.try_get("Node", self.settings.node_name)
        except Exception as exc:  # noqa: BLE001 - a long-running agent retries at the next resync
            log.warning("event=node-read-failed node=%s error=%r", self.settings.node_name, str(exc))
            return False
        if node is None:
            # No Node object (an agent beside a bare control plane): no kubelet, so no device plugin advertises here.
            self._withhold(None)
            return True
        conflict = decide(node, self.settings)
        self._withhold(conflict.message(self.settings) if conflict is not None and not conflict.allowed else None)
        uvm = self._uvm_missing() if self._uvm_missing is not None else None
        self._conditions(node, [self._conflict_condition(conflict)]
                         + ([self._uvm_condition(uvm)] if self._uvm_missing is not None else []))
        if conflict != self._reported:
            self._announce(node, conflict)
        if uvm != self._uvm_reported:
            self._announce_uvm(node, uvm)
        if self.settings.node_labels:
            self._labels(node)
        return True

    def _conflict_condition(self, conflict: Conflict | None) -> dict[str, str]:
        s = self.settings
        return {
            "type": CONDITION_TYPE, "status": "True" if conflict is not None else "False",
            "reason": ("CoexistenceAllowed" if conflict.allowed else EVENT_REASON) if conflict is not None else "NoConflict",
            "message": conflict.message(s) if conflict is not None else
            f"no other device plugin advertises {s.resource} on this node",
        }

    @staticmethod
    def _uvm_condition(missing: str | None) -> dict[str, str]:
        return {
            "type": UVM_CONDITION_TYPE, "status": "True" if missing is not None else "False",
            "reason": "NvidiaUvmNotLoaded" if missing is not None else "NvidiaUvmLoaded",
            "message": missing if missing is not None else "nvidia-uvm is loaded: containers get /dev/nvidia-uvm",
        }

    def _conditions(self, node: Mapping[str, Any], wanted: list[dict[str, str]]) -> None:
        """Keep the agent's Node conditions as the last check found them: written when one is missing or says
        otherwise (also after someone replaced the conditions list), all in one patch."""
        s = self.settings
        conditions = [c for c in _map(node.get("status")).get("conditions") or [] if isinstance(c, Mapping)]
        by_type = {c.get("type"): c for c in conditions}
        if all(by_type.get(w["type"]) is not None and all(by_type[w["type"]].get(k) == v for k, v in w.items())
               for w in wanted):
            return
        now = rfc3339()
        written = []
        for w in wanted:
            present = by_type.get(w["type"])
            same_status = present is not None and present.get("status") == w["status"]
            written.append({**w, "lastHeartbeatTime": now,
                            "lastTransitionTime": present.get("lastTransitionTime", now) if same_status and present else now})
        ours = {w["type"] for w in wanted}
        others = [dict(c) for c in conditions if c.get("type") not in ours]
        # The whole list, conditional on the version read: a merge patch replaces lists (kube-apiserver merges
        # Node conditions by type only for strategic patches), and the precondition keeps the kubelet's
        # concurrent updates; a conflict is retried at the next check.
        patch = {"metadata": {"resourceVersion": (node.get("metadata") or {}).get("resourceVersion")},
                 "status": {"conditions": [*others, *written]}}
        try:
            self._api.patch("Node", s.node_name, patch, subresource="status")
        except Exception as exc:  # noqa: BLE001 - written again at the next check
            log.warning("event=node-condition-failed node=%s error=%r", s.node_name, str(exc))

    def _announce_uvm(self, node: Mapping[str, Any], missing: str | None) -> None:
        """A change of the nvidia-uvm state: logged, and a Warning Event when the module goes missing."""
        s = self.settings
        if missing is not None:
            log.error("event=nvidia-uvm-missing node=%s msg=%s", s.node_name, quote(missing))
            try:
                self._event(node, UVM_EVENT_REASON, missing, rfc3339())
            except Exception as exc:  # noqa: BLE001 - announced again at the next check
                log.warning("event=nvidia-uvm-event-failed node=%s error=%r", s.node_name, str(exc))
                return
        elif self._uvm_reported is not None:
            log.info("event=nvidia-uvm-loaded node=%s", s.node_name)
        self._uvm_reported = missing

    def _announce(self, node: Mapping[str, Any], conflict: Conflict | None) -> None:
        """A change of the conflict: logged, and a Warning Event when one begins."""
        s = self.settings
        if conflict is not None:
            log.error("event=device-plugin-conflict node=%s resource=%s count=%d allowed=%s", s.node_name,
                      s.resource, conflict.count, conflict.allowed)
            try:
                self._event(node, EVENT_REASON, conflict.message(s), rfc3339())
            except Exception as exc:  # noqa: BLE001 - announced again at the next check
                log.warning("event=conflict-event-failed node=%s error=%r", s.node_name, str(exc))
                return
        elif self._reported is not None:
            log.info("event=device-plugin-conflict-cleared node=%s resource=%s", s.node_name, s.resource)
        self._reported = conflict

    def _event(self, node: Mapping[str, Any], reason: str, message: str, now: str) -> None:
        s = self.settings
        meta = node.get("metadata") or {}
        self._api.create("Event", {
            "apiVersion": "v1", "kind": "Event",
            # Node events live in "default", as the kubelet's do.
            "metadata": {"generateName": f"{s.node_name}.gpu-dra-", "namespace": "default"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": s.node_name, "uid": meta.get("uid", "")},
            "reason": reason, "message": message, "type": "Warning",
            "source": {"component": COMPONENT, "host": s.node_name},
            "reportingComponent": COMPONENT, "reportingInstance": s.node_name,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }, namespace="default")

    def _labels(self, node: Mapping[str, Any]) -> None:
        if gfd_owns_labels(node):
            if not self._gfd_noted:
                log.info("event=node-labels-skipped node=%s reason=%s", self.settings.node_name,
                         f"GPU Feature Discovery owns the labels ({GFD_MARKER_LABEL} is set)")
                self._gfd_noted = True
            return
        self._gfd_noted = False
        patch = label_patch((node.get("metadata") or {}).get("labels") or {}, gfd_labels(self._inventory()))
        if patch is None:
            return
        try:
            self._api.patch("Node", self.settings.node_name, patch)
        except Exception as exc:  # noqa: BLE001 - retried at the next check
            log.warning("event=node-labels-failed node=%s error=%r", self.settings.node_name, str(exc))
            return
        log.info("event=node-labels node=%s labels=%s", self.settings.node_name,
                 ",".join(f"{k}={v}" for k, v in sorted(patch["metadata"]["labels"].items())))
