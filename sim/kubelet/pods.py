"""The pod side of a simulated kubelet: what a node's kubelet does with pods bound to it, for the demo.

`sim.kubelet.dra.KubeletSim` speaks the kubelet's gRPC (plugin registration, NodePrepareResources) over the
node agent's real sockets; this module drives it from the API server, as the kubelet's pod workers do:

- pods are watched with `fieldSelector=spec.nodeName=<node>`;
- a bound pod that is not running yet is admitted once every claim it references (spec.resourceClaims, with
  generated names from status.resourceClaimStatuses) is allocated and reserved for it; then one
  NodePrepareResources call per driver with all of the pod's claims, and for `nvidia.com/gpu` limits one
  device plugin Allocate per container; then pods/status says Running (containers started);
- `finish()` is what containers exiting with code 0 amount to: the claims are unprepared and pods/status
  says Succeeded; a deleted pod is unprepared too;
- a pod whose admission fails is retried on the next event or retry tick, as pod workers resync.

What each pod got (CDI device ids, device plugin grants) is kept for the demo's report.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sim.kubelet.devicemanager import DeviceManagerError, DeviceManagerSim
from sim.kubelet.heartbeat import heartbeat_loop
from sim.kubelet.dra import ClaimInfo, KubeletError, KubeletSim, Pod, PreparedDevice
from gpudra.kubeapi import ApiError, KubeApi, NotFound

log = logging.getLogger("sim.kubelet.pods")

EXTENDED_GPU_RESOURCE = "nvidia.com/gpu"
RETRY_SECONDS = 0.2


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class LegacyGrant:
    """What the device plugin's Allocate gave one container."""

    container: str
    device_ids: tuple[str, ...]
    envs: Mapping[str, str]
    cdi_devices: tuple[str, ...]


@dataclass(frozen=True)
class PreparedClaim:
    claim: ClaimInfo
    devices: tuple[PreparedDevice, ...]


@dataclass
class PodRecord:
    """One pod as this kubelet saw it."""

    namespace: str
    name: str
    uid: str
    phase: str = "Pending"
    claims: list[PreparedClaim] = field(default_factory=list)
    legacy: list[LegacyGrant] = field(default_factory=list)
    last_error: str = ""
    unprepared: bool = False


def _container_gpu_limit(container: Mapping[str, Any]) -> int:
    resources = container.get("resources") or {}
    for part in ("limits", "requests"):
        value = (resources.get(part) or {}).get(EXTENDED_GPU_RESOURCE)
        if value is not None:
            try:
                return int(str(value))
            except ValueError:
                return 0
    return 0


def pod_claim_names(pod: Mapping[str, Any]) -> list[str] | None:
    """The ResourceClaim names a pod uses, or None while a generated claim's name is not recorded yet."""
    statuses = {
        str(s.get("name")): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if isinstance(s, Mapping)
    }
    names: list[str] = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        if entry.get("resourceClaimName"):
            names.append(str(entry["resourceClaimName"]))
        elif entry.get("resourceClaimTemplateName"):
            generated = statuses.get(str(entry.get("name")))
            if not generated:
                return None
            names.append(str(generated))
    return names


class NodeKubelet:
    """A node's kubelet for the demo: one watch thread, one worker thread, one KubeletSim."""

    def __init__(
        self,
        api: KubeApi,
        node_name: str,
        kubelet_dir: Path,
        driver_name: str,
        *,
        device_manager: DeviceManagerSim | None = None,
    ) -> None:
        self.api = api
        self.node_name = node_name
        self.driver_name = driver_name
        self.sim = KubeletSim(kubelet_dir)
        self.device_manager = device_manager
        self.records: dict[str, PodRecord] = {}  # pod uid -> record
        self._lock = threading.Lock()
        self._events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pods: dict[str, dict[str, Any]] = {}  # uid -> latest pod object seen
        self._sim_pods: dict[str, Pod] = {}  # uid -> KubeletSim's view (which claims are prepared)

    # ---- lifecycle --------------------------------------------------------------------------------------

    def register_plugin(self, timeout: float) -> None:
        """Find the node agent's registration socket and register it (raises KubeletError on failure)."""
        self.sim.wait_for_plugin(self.driver_name, timeout=timeout)

    def start(self) -> None:
        targets = [("watch", self._watch), ("worker", self._work),
                   ("heartbeat", lambda: heartbeat_loop(self.api, self.node_name, self._stop))]
        if self.device_manager is not None:
            targets.append(("node-status", self._node_status))
        for name, target in targets:
            t = threading.Thread(target=target, name=f"kubelet-{self.node_name}-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        self._events.put(("STOP", {}))
        for t in self._threads:
            t.join(timeout=5)
        self._threads.clear()
        self.sim.close()

    # ---- what the demo asks of the node -----------------------------------------------------------------

    def finish(self, namespace: str, name: str) -> None:
        """The pod's containers exited with code 0: tear down its resources, then report Succeeded."""
        self._events.put(("FINISH", {"metadata": {"namespace": namespace, "name": name}}))

    def snapshot(self) -> dict[str, PodRecord]:
        with self._lock:
            return {uid: PodRecord(r.namespace, r.name, r.uid, r.phase, list(r.claims), list(r.legacy), r.last_error,
                                   r.unprepared)
                    for uid, r in self.records.items()}

    # ---- threads ----------------------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                for kind, pod in self.api.watch("Pod", field_selector=f"spec.nodeName={self.node_name}", stop=self._stop):
                    self._events.put((kind, pod))
            except Exception as exc:  # noqa: BLE001 - the watch restarts; the demo's deadline bounds the wait
                if not self._stop.is_set():
                    log.warning("event=watch-failed node=%s error=%r", self.node_name, exc)
                    self._stop.wait(RETRY_SECONDS)

    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                kind, pod = self._events.get(timeout=RETRY_SECONDS)
            except queue.Empty:
                kind, pod = "RETRY", {}
            try:
                self._handle(kind, pod)
            except Exception as exc:  # noqa: BLE001 - one bad pod must not stop the node
                log.exception("event=pod-sync-failed node=%s error=%r", self.node_name, exc)

    def _handle(self, kind: str, pod: dict[str, Any]) -> None:
        if kind == "STOP":
            return
        if kind == "FINISH":
            self._finish(pod["metadata"]["namespace"], pod["metadata"]["name"])
            return
        if kind == "RETRY":
            for uid in list(self._pods):
                self._sync(self._pods[uid])
            return
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if not uid:
            return
        if kind == "DELETED":
            self._pods.pop(uid, None)
            self._teardown(uid)
            return
        self._pods[uid] = pod
        self._sync(pod)

    def _node_status(self) -> None:
        """Node capacity/allocatable for the device plugin's resource follow its ListAndWatch, as the kubelet's do."""
        assert self.device_manager is not None
        dm = self.device_manager
        last: tuple[int, int] | None = None

        def counts(sim: DeviceManagerSim) -> tuple[int, int]:
            health = sim.health(EXTENDED_GPU_RESOURCE)
            return len(health), sum(1 for h in health.values() if h == "Healthy")

        while not self._stop.is_set():
            try:
                dm.wait_for(lambda sim: counts(sim) != last, timeout=RETRY_SECONDS * 5)
            except DeviceManagerError:
                continue  # nothing changed; look again (and notice stop)
            now = counts(dm)
            try:
                self.api.patch("Node", self.node_name, {"status": {
                    "capacity": {EXTENDED_GPU_RESOURCE: str(now[0])}, "allocatable": {EXTENDED_GPU_RESOURCE: str(now[1])},
                }}, subresource="status")
            except ApiError as exc:
                log.warning("event=node-status-failed node=%s error=%r", self.node_name, str(exc))
                self._stop.wait(RETRY_SECONDS)
                continue
            last = now
            log.info("event=node-status node=%s %s capacity=%d allocatable=%d", self.node_name, EXTENDED_GPU_RESOURCE, *now)

    # ---- one pod ----------------------------------------------------------------------------------------

    def _record(self, pod: Mapping[str, Any]) -> PodRecord:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid"))
        with self._lock:
            record = self.records.get(uid)
            if record is None:
                record = PodRecord(str(meta.get("namespace")), str(meta.get("name")), uid)
                self.records[uid] = record
            return record

    def _sync(self, pod: dict[str, Any]) -> None:
        status = pod.get("status") or {}
        phase = status.get("phase") or "Pending"
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid"))
        if meta.get("deletionTimestamp") or phase in ("Succeeded", "Failed"):
            self._teardown(uid)
            self._pods.pop(uid, None)
            return
        if phase == "Running":
            return
        record = self._record(pod)
        try:
            self._admit(pod, record)
        except (KubeletError, ApiError, _NotReady) as exc:
            if str(exc) != record.last_error:
                log.info("event=pod-waiting node=%s pod=%s/%s reason=%r", self.node_name, record.namespace, record.name, str(exc))
            record.last_error = str(exc)
            return
        record.last_error = ""
        record.phase = "Running"
        started = _now()
        containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
        self.api.patch("Pod", record.name, {"status": {
            "phase": "Running", "hostIP": "127.0.0.1", "startTime": started,
            "conditions": [{"type": t, "status": "True", "lastTransitionTime": started}
                           for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
            "containerStatuses": [
                {"name": n, "ready": True, "restartCount": 0, "image": "", "imageID": "", "started": True,
                 "state": {"running": {"startedAt": started}}}
                for n in containers
            ],
        }}, namespace=record.namespace, subresource="status")
        self._pods.pop(uid, None)
        log.info("event=pod-running node=%s pod=%s/%s", self.node_name, record.namespace, record.name)

    def _admit(self, pod: Mapping[str, Any], record: PodRecord) -> None:
        uid = record.uid
        names = pod_claim_names(pod)
        if names is None:
            raise _NotReady("waiting for the pod's generated ResourceClaim names in status.resourceClaimStatuses")
        infos: list[ClaimInfo] = []
        for name in names:
            try:
                claim = self.api.get("ResourceClaim", name, namespace=record.namespace)
            except NotFound:
                raise _NotReady(f"ResourceClaim {record.namespace}/{name} does not exist") from None
            cstatus = claim.get("status") or {}
            if not cstatus.get("allocation"):
                raise _NotReady(f"ResourceClaim {record.namespace}/{name} is not allocated")
            if not any(r.get("uid") == uid for r in cstatus.get("reservedFor") or []):
                raise _NotReady(f"ResourceClaim {record.namespace}/{name} is not reserved for this pod")
            results = ((cstatus["allocation"].get("devices") or {}).get("results")) or []
            if any(r.get("driver") == self.driver_name for r in results):
                infos.append(ClaimInfo(record.namespace, str(claim["metadata"]["uid"]), name))
        if infos:
            sim_pod = self._sim_pods.get(uid)
            if sim_pod is None:
                sim_pod = Pod(record.name, infos)
                self._sim_pods[uid] = sim_pod
            self.sim.sync()  # a re-registered plugin (restart) is picked up before the call, as inotify would
            self.sim.prepare_pod(self.driver_name, sim_pod)
            with self._lock:
                record.claims = [PreparedClaim(c, tuple(sim_pod.prepared[c.uid])) for c in infos]
        if not record.legacy:
            grants = []
            for container in (pod.get("spec") or {}).get("containers") or []:
                count = _container_gpu_limit(container)
                if count <= 0:
                    continue
                if self.device_manager is None:
                    raise KubeletError(f"node {self.node_name} has no device plugin for {EXTENDED_GPU_RESOURCE}")
                try:
                    got = self.device_manager.allocate(uid, str(container.get("name")), EXTENDED_GPU_RESOURCE, count)
                except DeviceManagerError as exc:
                    raise KubeletError(str(exc)) from exc
                grants.append(LegacyGrant(
                    got.container, got.device_ids, dict(got.response.envs), tuple(c.name for c in got.response.cdi_devices)
                ))
            with self._lock:
                record.legacy = grants

    def _teardown(self, uid: str) -> None:
        sim_pod = self._sim_pods.get(uid)
        if sim_pod is not None and sim_pod.prepared:
            try:
                self.sim.unprepare_pod(self.driver_name, sim_pod)
            except KubeletError as exc:
                log.warning("event=unprepare-failed node=%s pod=%s error=%r", self.node_name, sim_pod.name, str(exc))
                return
        self._sim_pods.pop(uid, None)
        with self._lock:
            record = self.records.get(uid)
            if record is not None:
                record.unprepared = True

    def _finish(self, namespace: str, name: str) -> None:
        try:
            pod = self.api.get("Pod", name, namespace=namespace)
        except NotFound:
            return
        uid = str(pod["metadata"]["uid"])
        self._teardown(uid)
        finished = _now()
        containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
        self.api.patch("Pod", name, {"status": {
            "phase": "Succeeded",
            "conditions": [{"type": t, "status": s, **({"reason": "PodCompleted"} if s == "False" else {}),
                            "lastTransitionTime": finished}
                           for t, s in (("PodScheduled", "True"), ("Initialized", "True"), ("ContainersReady", "False"),
                                        ("Ready", "False"))],
            "containerStatuses": [
                {"name": n, "ready": False, "restartCount": 0, "image": "", "imageID": "", "started": False,
                 "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": finished}}}
                for n in containers
            ],
        }}, namespace=namespace, subresource="status")
        with self._lock:
            record = self.records.get(uid)
            if record is not None:
                record.phase = "Succeeded"
        log.info("event=pod-succeeded node=%s pod=%s/%s", self.node_name, namespace, name)


class _NotReady(Exception):
    """The pod cannot be admitted yet; retried on the next event or tick."""

