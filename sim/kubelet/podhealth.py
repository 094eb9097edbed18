"""Resource health in pod status, as a 1.36+ kubelet writes it from a DRA driver's health stream (KEP-4680).

The kubelet keeps a health cache per driver fed by DRAResourceHealth (each message is the complete device list;
a device is stamped with the time its report arrived and reads Unknown once the timeout has passed; the driver's
entries are dropped when the stream ends). On every pod status sync it fills, for each container that names
claims in `resources.claims`, `status.containerStatuses[].allocatedResourcesStatus`:

- one entry per claim reference, `name: claim:<pod claim name>` or `claim:<pod claim name>/<request>`,
- `resources`: every device prepared for that claim, `resourceID` the device's first CDI id (else
  `<driver>/<pool>/<device>`), `health` Healthy | Unhealthy | Unknown, and `message` when the driver sent one
  (ResourceHealthStatusMessage, beta in 1.36),
- entries without devices are left out. The ResourceHealthStatus gate is beta (on) from 1.36; a 1.34/1.35
  kubelet (alpha, off) writes nothing.

`allocated_resources_status` is the pure part; `PodHealthReporter` follows the stream and patches pod status.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sim.kubelet.dra import HealthUpdate, KubeletDialect, KubeletError, KubeletSim, PreparedDevice
from gpudra.kubeapi import ApiError, KubeApi, NotFound

log = logging.getLogger("sim.kubelet.podhealth")

DEFAULT_HEALTH_TIMEOUT = 30.0  # seconds (the kubelet's healthTimeout)
STREAM_RETRY_SECONDS = 5.0  # the kubelet re-opens an ended stream after this long
_HEALTH_NAMES = {"HEALTHY": "Healthy", "UNHEALTHY": "Unhealthy"}


@dataclass(frozen=True)
class DeviceHealthInfo:
    health: str  # Healthy | Unhealthy | Unknown
    message: str
    received: float  # monotonic time the report arrived
    timeout: float


class HealthCache:
    """The kubelet's healthInfoCache for one driver."""

    def __init__(self, dialect: KubeletDialect) -> None:
        self._dialect = dialect
        self._lock = threading.Lock()
        self._devices: dict[tuple[str, str], DeviceHealthInfo] = {}

    def update(self, update: HealthUpdate, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        per_device_timeout = int(self._dialect.version.split(".")[1]) >= 35
        with self._lock:
            for i, (pool, device, health) in enumerate(update.devices):
                timeout = DEFAULT_HEALTH_TIMEOUT
                if per_device_timeout and i < len(update.timeouts) and update.timeouts[i] > 0:
                    timeout = float(update.timeouts[i])
                message = update.messages[i] if i < len(update.messages) else ""
                self._devices[(pool, device)] = DeviceHealthInfo(
                    _HEALTH_NAMES.get(health, "Unknown"), message, now, timeout)

    def clear(self) -> None:
        with self._lock:
            self._devices.clear()

    def get(self, pool: str, device: str, now: float | None = None) -> tuple[str, str]:
        """(health, message); Unknown for a device never reported or not reported within its timeout."""
        now = time.monotonic() if now is None else now
        with self._lock:
            info = self._devices.get((pool, device))
        if info is None or now - info.received > info.timeout:
            return "Unknown", ""
        return info.health, info.message


def pod_claim_references(pod: Mapping[str, Any]) -> dict[str, str]:
    """spec.resourceClaims[].name -> the ResourceClaim's name (generated names from status.resourceClaimStatuses)."""
    generated = {str(s.get("name")): s.get("resourceClaimName")
                 for s in (pod.get("status") or {}).get("resourceClaimStatuses") or [] if isinstance(s, Mapping)}
    out: dict[str, str] = {}
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = str(entry.get("name"))
        claim = entry.get("resourceClaimName") or generated.get(name)
        if claim:
            out[name] = str(claim)
    return out


def allocated_resources_status(
    pod: Mapping[str, Any],
    prepared: Mapping[str, Sequence[PreparedDevice]],
    driver_name: str,
    health: Callable[[str, str], tuple[str, str]],
    with_messages: bool = True,
) -> dict[str, list[dict[str, Any]]]:
    """Container name -> its allocatedResourcesStatus. `prepared`: ResourceClaim name -> devices the driver
    prepared for it; `health(pool, device)` -> (health, message)."""
    claims = pod_claim_references(pod)
    out: dict[str, list[dict[str, Any]]] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        statuses: dict[str, dict[str, Any]] = {}
        for ref in (container.get("resources") or {}).get("claims") or []:
            claim_ref = str(ref.get("name"))
            request = ref.get("request") or ""
            name = f"claim:{claim_ref}/{request}" if request else f"claim:{claim_ref}"
            resources = []
            for dev in prepared.get(claims.get(claim_ref, ""), ()):
                state, message = health(dev.pool_name, dev.device_name)
                entry: dict[str, Any] = {
                    "resourceID": dev.cdi_device_ids[0] if dev.cdi_device_ids
                    else f"{driver_name}/{dev.pool_name}/{dev.device_name}",
                    "health": state,
                }
                if with_messages and message:
                    entry["message"] = message
                resources.append(entry)
            if resources:
                statuses[name] = {"name": name, "resources": resources}
        if statuses:
            out[str(container.get("name"))] = [statuses[k] for k in sorted(statuses)]
    return out


@dataclass(frozen=True)
class RunningPod:
    namespace: str
    name: str
    uid: str
    prepared: Mapping[str, Sequence[PreparedDevice]]  # ResourceClaim name -> devices


class PodHealthReporter:
    """Follows the driver's health stream into the cache and keeps allocatedResourcesStatus of running pods
    current (a status sync on start and whenever a device's health changes or times out)."""

    def __init__(self, api: KubeApi, sim: KubeletSim, driver_name: str,
                 running_pods: Callable[[], list[RunningPod]], *, tick: float = 0.5) -> None:
        self.api = api
        self.sim = sim
        self.driver_name = driver_name
        self.running_pods = running_pods
        self.tick = tick
        self.cache = HealthCache(sim.dialect)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def enabled(self) -> bool:
        return self.sim.dialect.resource_health_status

    def start(self) -> None:
        if not self.enabled:
            return
        for name, target in (("stream", self._follow), ("status", self._sync_loop)):
            t = threading.Thread(target=target, name=f"kubelet-health-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        self._threads.clear()

    def _follow(self) -> None:
        while not self._stop.is_set():
            plugin = self.sim.plugins.get(self.driver_name)
            if plugin is None or not plugin.health_service:
                self._stop.wait(self.tick)
                continue
            try:
                for update in plugin.watch_health(self._stop):
                    self.cache.update(update)
                    if self._stop.is_set():
                        return
            except (KubeletError, ValueError) as exc:
                log.warning("event=health-stream-failed driver=%s error=%r", self.driver_name, str(exc))
            finally:
                self.cache.clear()  # the kubelet forgets a driver's health when its stream ends
            self._stop.wait(STREAM_RETRY_SECONDS)

    def _sync_loop(self) -> None:
        while not self._stop.wait(self.tick):
            try:
                self.sync()
            except Exception as exc:  # noqa: BLE001 - a failed status write is retried on the next tick
                log.warning("event=health-status-failed node-driver=%s error=%r", self.driver_name, exc)

    def sync(self) -> None:
        """Write allocatedResourcesStatus for every running pod whose status does not show the computed value."""
        for pod in self.running_pods():
            try:
                obj = self.api.get("Pod", pod.name, namespace=pod.namespace)
            except NotFound:
                continue
            if str(obj["metadata"].get("uid")) != pod.uid or (obj.get("status") or {}).get("phase") != "Running":
                continue
            desired = allocated_resources_status(obj, pod.prepared, self.driver_name, self.cache.get,
                                                 self.sim.dialect.health_messages)
            # Compared with what the pod carries, not with what was last written: other status writers (the
            # container runtime's state changes) replace containerStatuses wholesale.
            current = {str(c.get("name")): c.get("allocatedResourcesStatus")
                       for c in (obj.get("status") or {}).get("containerStatuses") or []}
            names = {str(c.get("name")) for c in (obj.get("status") or {}).get("containerStatuses") or []}
            if all(current.get(n) == desired.get(n) for n in names):
                continue
            self._write(obj, desired)

    def _write(self, pod: Mapping[str, Any], desired: Mapping[str, list[dict[str, Any]]]) -> None:
        statuses = []
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            status = dict(status)
            if status.get("name") in desired:
                status["allocatedResourcesStatus"] = desired[status["name"]]
            else:
                status.pop("allocatedResourcesStatus", None)
            statuses.append(status)
        meta = pod["metadata"]
        try:
            # resourceVersion makes the patch conditional: a status written meanwhile is re-read next tick.
            self.api.patch("Pod", meta["name"], {"metadata": {"resourceVersion": meta["resourceVersion"]},
                                                  "status": {"containerStatuses": statuses}},
                           namespace=meta["namespace"], subresource="status")
        except ApiError as exc:
            raise KubeletError(f"pod {meta['namespace']}/{meta['name']}: status update failed: {exc}") from exc
