"""Through a GPU Operator driver upgrade: NVML released while the driver is replaced, the agent back on the new one.

The Operator's driver container unloads the kernel modules before it installs the new driver (its init container,
NVIDIA's k8s-driver-manager). A module in use cannot be unloaded, and the agent holds it: NVML is initialised for
the agent's whole life (the health monitor's event set, device handles, the /dev/nvidia* descriptors NVML opens).
The driver manager knows nothing of gpu-dra; it stops the Operator's own operands by switching their
`nvidia.com/gpu.deploy.<component>` node labels from "true" to "paused-for-driver-upgrade", and does the same to one
more label of the administrator's choice (`NODE_LABEL_FOR_GPU_POD_EVICTION` in the ClusterPolicy's
`driver.manager.env`). With the Operator's upgrade controller (`driver.upgradePolicy.autoUpgrade`) the node's
`nvidia.com/gpu-driver-upgrade-state` label says where the node is; the driver pod is restarted, and the modules
unloaded, in `pod-restart-required`.

The agent reads its Node every few seconds and releases NVML while either says the driver is being replaced:
the health monitor and rediscovery stop (the event set is freed), and `nvmlShutdown` closes NVML's descriptors.
Slices, the health stream and the kubelet plugin keep serving from the last inventory (the node is drained of
GPU pods meanwhile). Once neither label says so any more and the new driver is there (its NVML library in the
driver root and the kernel module loaded), the agent exits so that its DaemonSet starts it again on the new
driver: the library NVML was loaded from, and every driver file in the CDI specs, belong to the old one (the same
exit as driver.rediscovery's on a driver change).

Pure decisions (`release_reason`) and a small state machine (`UpgradeGate`) with the I/O passed in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("gpu-dra.driverupgrade")

# Set by the GPU Operator's upgrade controller (k8s-operator-libs upgrade states) on each node it upgrades.
UPGRADE_STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
# The states in which the driver pod is restarted and its init container unloads the modules.
RELEASE_STATES = frozenset({"pod-restart-required"})
# What k8s-driver-manager puts into the eviction labels it pauses ("true" becomes this; other values get it appended).
PAUSED_FOR_DRIVER_UPGRADE = "paused-for-driver-upgrade"
# The label the agent offers the driver manager: set NODE_LABEL_FOR_GPU_POD_EVICTION to it. Named as the
# Operator's operand labels are; the agent sets it to "true" on its node when it is absent.
DEFAULT_EVICTION_LABEL = "nvidia.com/gpu.deploy.gpu-dra"


def release_reason(labels: Mapping[str, str], eviction_label: str | None) -> str | None:
    """Why NVML must be released now, from the Node's labels, or None."""
    state = labels.get(UPGRADE_STATE_LABEL, "")
    if state in RELEASE_STATES:
        return f"node label {UPGRADE_STATE_LABEL}={state}: the GPU Operator restarts the driver pod"
    if eviction_label and PAUSED_FOR_DRIVER_UPGRADE in labels.get(eviction_label, ""):
        return (f"node label {eviction_label}={labels[eviction_label]}: the GPU Operator's driver manager is "
                "replacing the driver")
    return None


@dataclass
class UpgradeGate:
    """Release on a reason, come back (`resume`) once there is none and `driver_ready()` says the driver is there."""

    release: Callable[[str], None]
    resume: Callable[[], None]
    driver_ready: Callable[[], str | None]  # None when the driver is there, else what is missing
    released: str | None = None
    _waiting: str | None = field(default=None, repr=False)

    def observe(self, labels: Mapping[str, str], eviction_label: str | None) -> None:
        reason = release_reason(labels, eviction_label)
        if reason is not None:
            if self.released is None:
                self.released = reason
                log.warning("event=nvml-releasing reason=%r", reason)
                self.release(reason)
            return
        if self.released is None:
            return
        missing = self.driver_ready()
        if missing is not None:
            if missing != self._waiting:
                log.warning("event=waiting-for-driver reason=%r msg=%r", missing,
                            "the upgrade labels are clear; NVML stays released until the new driver is there")
            self._waiting = missing
            return
        log.warning("event=driver-back previous_release=%r msg=%r", self.released,
                    "the new driver is there; restarting the agent on it")
        self.resume()


class NodeUpgradeWatch:
    """Reads the agent's Node for the gate (`check`, every few seconds from the agent's main loop), and offers the
    driver manager the eviction label: set to "true" when absent, so that the manager, told to use it, pauses it."""

    def __init__(self, api: Any, node_name: str, eviction_label: str | None, gate: UpgradeGate) -> None:
        self._api = api
        self._node = node_name
        self._label = eviction_label or None
        self._gate = gate
        self._offered = False
        self._offer_error = ""

    def check(self) -> bool:
        """True when the Node was read (and acted on)."""
        try:
            node = self._api.try_get("Node", self._node)
        except Exception as exc:  # noqa: BLE001 - a long-running agent retries at the next check
            log.warning("event=node-read-failed node=%s error=%r", self._node, str(exc))
            return False
        if node is None:
            return True  # no Node object (an agent beside a bare control plane): no Operator either
        labels = (node.get("metadata") or {}).get("labels") or {}
        if self._label and not self._offered:
            self._offered = self._offer(labels)
        self._gate.observe(labels, self._label)
        return True

    def _offer(self, labels: Mapping[str, str]) -> bool:
        if self._label is None or self._label in labels:
            return True  # already there: whatever value it has is the driver manager's to change
        try:
            self._api.patch("Node", self._node, {"metadata": {"labels": {self._label: "true"}}})
        except Exception as exc:  # noqa: BLE001 - retried at the next check
            if str(exc) != self._offer_error:  # once per distinct error: the check runs every few seconds
                log.warning("event=eviction-label-failed node=%s label=%s error=%r", self._node, self._label, str(exc))
            self._offer_error = str(exc)
            return False
        log.info("event=eviction-label-set node=%s label=%s", self._node, self._label)
        return True
