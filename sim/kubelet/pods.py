"""The pod side of a simulated kubelet: what a node's kubelet does with pods bound to it, for the demo.

`sim.kubelet.dra.KubeletSim` speaks the kubelet's gRPC (plugin registration, NodePrepareResources) over the
node agent's real sockets; this module drives it from the API server, as the kubelet's pod workers do:

- pods are watched with `fieldSelector=spec.nodeName=<node>`;
- a bound pod that is not running yet is admitted once every claim it references (spec.resourceClaims, with
  generated names from status.resourceClaimStatuses) is allocated and reserved for it; then one
  NodePrepareResources call per driver with all of the pod's claims, and for `nvidia.com/gpu` limits one
  device plugin Allocate per container; then pods/status says Running (containers started);
- with a container runtime (sim.runtime, podman): each container is started with the CDI device ids of its
  claims (all of a claim's devices, or those of the request it names) and of its device plugin grant, the
  grant's env and the pod's env, command and args; pods/status follows the containers: Running while they run,
  then Succeeded (all exited 0) or Failed, with each container's exit code; restartPolicy Always restarts any
  exited container, OnFailure one that failed, Never none. A terminated pod's claims are unprepared; its
  exited containers stay (for `kubectl logs`) until the pod is deleted, which stops and removes them;
- without a runtime, containers are not started: pods/status says Running after prepare and `finish()` is
  what containers exiting with code 0 amount to (claims unprepared, then Succeeded);
- a deleted pod is unprepared too; a pod whose admission fails is retried on the next event or retry tick, as
  pod workers resync; a container the runtime refuses to start is retried with a growing back-off.
- running pods' `allocatedResourcesStatus` follows the driver's health stream (`sim.kubelet.podhealth`), as a
  1.36+ kubelet writes it.

What each pod got (CDI device ids, device plugin grants, what each container saw) is kept for the demo's report.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from sim.kubelet.devicemanager import DeviceManagerError, DeviceManagerSim
from sim.kubelet.heartbeat import heartbeat_loop
from sim.kubelet.dra import ClaimInfo, KubeletError, KubeletSim, Pod, PreparedDevice
from sim.kubelet.podhealth import PodHealthReporter, RunningPod
from gpudra.kubeapi import ApiError, KubeApi, NotFound
from sim.runtime.podman import ContainerRequest, ContainerStatus, RuntimeError_, Seen

log = logging.getLogger("sim.kubelet.pods")

EXTENDED_GPU_RESOURCE = "nvidia.com/gpu"
RETRY_SECONDS = 0.2
WATCH_BACKOFF_MAX_SECONDS = 5.0
# A container the runtime refused is retried after 1 s, doubling up to this (the kubelet's back-off is 10 s to 5 min).
MAX_START_BACKOFF_SECONDS = 10.0
# An exited container is restarted after 0.5 s, doubling per restart up to 10 s (the kubelet's CrashLoopBackOff
# is 10 s doubling to 5 min; shorter here so that tests and the demo see restarts).
FIRST_RESTART_DELAY_SECONDS = 0.5
MAX_RESTART_DELAY_SECONDS = 10.0


class ContainerRuntime(Protocol):
    """What the pod workers need of a runtime (sim.runtime.podman.PodmanRuntime)."""

    def run(self, request: ContainerRequest) -> ContainerStatus: ...

    def status(self, name: str) -> ContainerStatus: ...

    def remove(self, name: str, grace_seconds: int = 1) -> None: ...

    def seen(self, name: str) -> Seen | None: ...


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


@dataclass(frozen=True)
class ContainerRun:
    """One start of one of the pod's containers in the runtime."""

    container: str  # the container's name in the pod
    runtime_name: str
    restart_count: int
    cdi_devices: tuple[str, ...]
    started_at: str
    running: bool = True
    exit_code: int | None = None
    finished_at: str = ""
    seen: Seen | None = None  # what it saw of its GPUs, once its probe ran


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
    containers: list[ContainerRun] = field(default_factory=list)  # the latest run of each container
    start_failures: int = 0
    next_start: float = 0.0  # monotonic time before which a refused container is not retried
    restart_due: dict[str, float] = field(default_factory=dict)  # container -> when its back-off ends


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


def pod_claim_map(pod: Mapping[str, Any]) -> dict[str, str] | None:
    """spec.resourceClaims entry name -> ResourceClaim name, or None while a generated name is not recorded yet."""
    statuses = {
        str(s.get("name")): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if isinstance(s, Mapping)
    }
    out: dict[str, str] = {}
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        if entry.get("resourceClaimName"):
            out[str(entry.get("name"))] = str(entry["resourceClaimName"])
        elif entry.get("resourceClaimTemplateName"):
            generated = statuses.get(str(entry.get("name")))
            if not generated:
                return None
            out[str(entry.get("name"))] = str(generated)
    return out


def extended_claim_refs(pod: Mapping[str, Any]) -> tuple[str | None, dict[str, list[str]]]:
    """DRAExtendedResource: the scheduler's special claim for extended resources backed by a DeviceClass (from
    status.extendedResourceClaimStatus), and per container the requests of it that are the container's."""
    status = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    per_container: dict[str, list[str]] = {}
    for m in status.get("requestMappings") or []:
        if isinstance(m, Mapping):
            per_container.setdefault(str(m.get("containerName")), []).append(str(m.get("requestName")))
    name = status.get("resourceClaimName")
    return (str(name) if name else None), per_container


def pod_claim_names(pod: Mapping[str, Any]) -> list[str] | None:
    """The ResourceClaim names a pod uses, or None while a generated claim's name is not recorded yet."""
    mapping = pod_claim_map(pod)
    if mapping is None:
        return None
    extended, _ = extended_claim_refs(pod)
    return [*mapping.values(), *([extended] if extended else [])]


def container_cdi_devices(
    container: Mapping[str, Any], claim_map: Mapping[str, str], claims: list[PreparedClaim],
    legacy: list[LegacyGrant], extended: tuple[str | None, Mapping[str, list[str]]] = (None, {}),
) -> tuple[str, ...]:
    """The CDI ids a container gets, as the kubelet passes them to the runtime: for each entry of its
    resources.claims, the devices of that claim (only those of the named request when `request` is set; a
    subrequest result "req/sub" belongs to "req"), then its device plugin grant's."""
    by_name = {c.claim.name: c for c in claims}
    out: list[str] = []
    for ref in ((container.get("resources") or {}).get("claims")) or []:
        prepared = by_name.get(claim_map.get(str(ref.get("name")), ""))
        if prepared is None:
            continue
        request = ref.get("request")
        for device in prepared.devices:
            if request and not any(r == request or r.startswith(f"{request}/") for r in device.request_names):
                continue
            out += [i for i in device.cdi_device_ids if i not in out]
    special, requests = extended
    special_claim = by_name.get(special) if special else None
    if special_claim is not None:
        for request in requests.get(str(container.get("name")), []):
            for device in special_claim.devices:
                if request in device.request_names:
                    out += [i for i in device.cdi_device_ids if i not in out]
    for grant in legacy:
        if grant.container == container.get("name"):
            out += [i for i in grant.cdi_devices if i not in out]
    return tuple(out)


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of command and args: known variables are replaced, $$ escapes a $,
    unknown references are left as they are."""
    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR_REF.sub(sub, text)


def container_env(container: Mapping[str, Any], legacy: list[LegacyGrant]) -> dict[str, str]:
    """The device plugin grant's env, then the container's own `env` values (valueFrom is not simulated)."""
    env: dict[str, str] = {}
    for grant in legacy:
        if grant.container == container.get("name"):
            env.update(grant.envs)
    for entry in container.get("env") or []:
        if isinstance(entry, Mapping) and entry.get("name") and "valueFrom" not in entry:
            env[str(entry["name"])] = expand(str(entry.get("value") or ""), env)
    return env


def container_command(container: Mapping[str, Any], env: Mapping[str, str]) -> tuple[str, ...]:
    """command + args after $(VAR) expansion (the busybox image has no entrypoint; empty means its default)."""
    return tuple(expand(str(a), env) for a in [*(container.get("command") or []), *(container.get("args") or [])])


def runtime_container_name(namespace: str, pod: str, uid: str, container: str, restart: int) -> str:
    """Unique per node and per restart, in the dockershim's k8s_<container>_<pod>_<ns>_<uid>_<attempt> form."""
    return f"k8s_{container}_{pod}_{namespace}_{uid[:8]}_{restart}"


def pod_phase(restart_policy: str, runs: list[ContainerRun]) -> str | None:
    """The pod's phase once no container will be restarted (None while it runs): Succeeded when every container
    exited 0, Failed otherwise (kubelet's getPhase for terminated pods)."""
    if any(r.running for r in runs):
        return None
    if any(will_restart(restart_policy, r) for r in runs):
        return None
    return "Succeeded" if all(r.exit_code == 0 for r in runs) else "Failed"


def restart_delay(restart_count: int) -> float:
    return min(MAX_RESTART_DELAY_SECONDS, FIRST_RESTART_DELAY_SECONDS * 2.0 ** restart_count)


def will_restart(restart_policy: str, run: ContainerRun) -> bool:
    if run.running:
        return False
    if restart_policy == "Never":
        return False
    if restart_policy == "OnFailure":
        return run.exit_code != 0
    return True  # Always (the default)


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
        kubernetes_version: str = "1.37",
        runtime: ContainerRuntime | None = None,
        pod_logs_dir: Path | None = None,
    ) -> None:
        self.api = api
        self.runtime = runtime
        self.pod_logs_dir = pod_logs_dir
        self.node_name = node_name
        self.driver_name = driver_name
        self.sim = KubeletSim(kubelet_dir, kubernetes_version=kubernetes_version)
        self.health = PodHealthReporter(api, self.sim, driver_name, self._running_pods)
        self.device_manager = device_manager
        self.records: dict[str, PodRecord] = {}  # pod uid -> record
        self._lock = threading.Lock()
        self._events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pods: dict[str, dict[str, Any]] = {}  # uid -> latest pod object seen
        # uid -> driver -> KubeletSim's view (which of the pod's claims for that driver are prepared)
        self._sim_pods: dict[str, dict[str, Pod]] = {}
        self._active: dict[str, dict[str, Any]] = {}  # uid -> pod whose containers the runtime runs

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
        self.health.start()

    def stop(self) -> None:
        self._stop.set()
        self._events.put(("STOP", {}))
        self.health.stop()
        for t in self._threads:
            t.join(timeout=5)
        self._threads.clear()
        if self.runtime is not None:
            with self._lock:
                names = [c.runtime_name for r in self.records.values() for c in r.containers]
            for name in names:
                try:
                    self.runtime.remove(name, grace_seconds=0)  # the node is going away
                except RuntimeError_ as exc:
                    log.warning("event=container-remove-failed node=%s container=%s error=%r", self.node_name, name, str(exc))
        self.sim.close()

    # ---- what the demo asks of the node -----------------------------------------------------------------

    def finish(self, namespace: str, name: str) -> None:
        """Without a runtime: the pod's containers exited with code 0: tear down its resources, report Succeeded."""
        self._events.put(("FINISH", {"metadata": {"namespace": namespace, "name": name}}))

    def snapshot(self) -> dict[str, PodRecord]:
        with self._lock:
            return {uid: PodRecord(r.namespace, r.name, r.uid, r.phase, list(r.claims), list(r.legacy), r.last_error,
                                   r.unprepared, list(r.containers))
                    for uid, r in self.records.items()}

    def _running_pods(self) -> list[RunningPod]:
        with self._lock:
            return [RunningPod(r.namespace, r.name, r.uid, {c.claim.name: c.devices for c in r.claims})
                    for r in self.records.values() if r.phase == "Running" and r.claims]

    def container_runtime_name(self, namespace: str, pod: str, container: str | None) -> str | None:
        """The runtime's name for a pod's container (its latest run); `container` None: the pod's only one."""
        with self._lock:
            for r in self.records.values():
                if r.namespace == namespace and r.name == pod:
                    runs = [c for c in r.containers if container is None or c.container == container]
                    return runs[-1].runtime_name if runs else None
        return None

    # ---- threads ----------------------------------------------------------------------------------------

    def _watch(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                for kind, pod in self.api.watch("Pod", field_selector=f"spec.nodeName={self.node_name}", stop=self._stop):
                    failures = 0
                    self._events.put((kind, pod))
            except Exception as exc:  # noqa: BLE001 - the watch restarts; the demo's deadline bounds the wait
                if not self._stop.is_set():
                    # Backoff doubling to 5 s, one line per step: a control plane restarting (`gpu-dra cluster`)
                    # costs a few lines, not five per second per node.
                    failures += 1
                    wait = min(RETRY_SECONDS * 2 ** (failures - 1), WATCH_BACKOFF_MAX_SECONDS)
                    log.warning("event=watch-failed node=%s url=%s failures=%d retry_in=%.1fs error=%r",
                                self.node_name, self.api.host, failures, wait, str(exc))
                    self._stop.wait(wait)

    def _work(self) -> None:
        last_retry = time.monotonic()
        while not self._stop.is_set():
            work: list[tuple[str, dict[str, Any]]] = []
            try:
                work.append(self._events.get(timeout=RETRY_SECONDS))
            except queue.Empty:
                pass
            # The resync (waiting pods, running containers) runs every RETRY_SECONDS, however busy the events.
            if time.monotonic() - last_retry >= RETRY_SECONDS:
                last_retry = time.monotonic()
                work.append(("RETRY", {}))
            for kind, pod in work:
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
            for uid in list(self._active):
                self._check_containers(uid)
            return
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if not uid:
            return
        if kind == "DELETED":
            self._pods.pop(uid, None)
            self._active.pop(uid, None)
            self._remove_containers(uid)
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
                dm.wait_for(lambda sim, last=last: counts(sim) != last, timeout=RETRY_SECONDS * 5)
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
        if meta.get("deletionTimestamp"):
            self._active.pop(uid, None)
            self._remove_containers(uid)
        if meta.get("deletionTimestamp") or phase in ("Succeeded", "Failed"):
            self._teardown(uid)
            self._pods.pop(uid, None)
            return
        if uid in self._active:
            self._active[uid] = pod  # the latest object (restartPolicy and containers are immutable)
            return
        with self._lock:
            known = self.records.get(uid)
        if known is not None and known.phase in ("Succeeded", "Failed"):
            self._pods.pop(uid, None)  # a stale event from before the pod terminated: a terminated pod stays so
            return
        if phase == "Running" and self.runtime is None:
            return
        record = self._record(pod)
        try:
            self._admit(pod, record)
            if self.runtime is not None:
                self._start_containers(pod, record)
        except (KubeletError, ApiError, _NotReady) as exc:
            if str(exc) != record.last_error:
                log.info("event=pod-waiting node=%s pod=%s/%s reason=%r", self.node_name, record.namespace, record.name, str(exc))
            record.last_error = str(exc)
            return
        record.last_error = ""
        record.phase = "Running"
        started = _now()
        if self.runtime is not None:
            statuses = self._container_statuses(record)
        else:
            statuses = [
                {"name": c.get("name"), "ready": True, "restartCount": 0, "image": str(c.get("image") or ""), "imageID": "",
                 "started": True, "state": {"running": {"startedAt": started}}}
                for c in (pod.get("spec") or {}).get("containers") or []
            ]
        self.api.patch("Pod", record.name, {"status": {
            "phase": "Running", "hostIP": "127.0.0.1", "startTime": started,
            "conditions": [{"type": t, "status": "True", "lastTransitionTime": started}
                           for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
            "containerStatuses": statuses,
        }}, namespace=record.namespace, subresource="status")
        self._pods.pop(uid, None)
        if self.runtime is not None:
            self._active[uid] = pod
        log.info("event=pod-running node=%s pod=%s/%s", self.node_name, record.namespace, record.name)

    # ---- containers (with a runtime) --------------------------------------------------------------------

    def _start_containers(self, pod: Mapping[str, Any], record: PodRecord, only: set[str] | None = None) -> None:
        """Start each container of the pod that has no run yet (or those in `only`, as restarts)."""
        assert self.runtime is not None
        if time.monotonic() < record.next_start:
            raise _NotReady(record.last_error or "waiting to retry a container start")
        claim_map = pod_claim_map(pod) or {}
        spec = pod.get("spec") or {}
        for container in spec.get("containers") or []:
            cname = str(container.get("name"))
            previous = next((c for c in record.containers if c.container == cname), None)
            if previous is not None and (only is None or cname not in only):
                continue
            restart = previous.restart_count + 1 if previous is not None else 0
            env = container_env(container, record.legacy)
            request = ContainerRequest(
                runtime_container_name(record.namespace, record.name, record.uid, cname, restart),
                container_command(container, env), env,
                container_cdi_devices(container, claim_map, record.claims, record.legacy, extended_claim_refs(pod)),
                log_path=self.pod_log_path(record, cname, restart),
            )
            try:
                status = self.runtime.run(request)
            except RuntimeError_ as exc:
                record.start_failures += 1
                record.next_start = time.monotonic() + min(MAX_START_BACKOFF_SECONDS, 2.0 ** (record.start_failures - 1))
                raise KubeletError(f"CreateContainerError: {exc}") from exc
            record.start_failures = 0
            if previous is not None:
                try:
                    self.runtime.remove(previous.runtime_name)  # the kubelet keeps one dead instance; we keep none
                except RuntimeError_ as exc:
                    log.warning("event=container-remove-failed node=%s container=%s error=%r",
                                self.node_name, previous.runtime_name, str(exc))
            run = ContainerRun(cname, request.name, restart, request.cdi_devices, status.started_at)
            with self._lock:
                record.containers = [c for c in record.containers if c.container != cname] + [run]
            log.info("event=container-started node=%s pod=%s/%s container=%s restart=%d devices=%s", self.node_name,
                     record.namespace, record.name, cname, restart, ",".join(request.cdi_devices) or "-")

    def pod_log_path(self, record: PodRecord, container: str, restart: int) -> Path | None:
        """/var/log/pods layout: <dir>/<namespace>_<pod>_<uid>/<container>/<restart>.log (None: the runtime's own)."""
        if self.pod_logs_dir is None:
            return None
        return self.pod_logs_dir / f"{record.namespace}_{record.name}_{record.uid}" / container / f"{restart}.log"

    def _container_statuses(self, record: PodRecord) -> list[dict[str, Any]]:
        out = []
        for c in record.containers:
            if c.running:
                state: dict[str, Any] = {"running": {"startedAt": c.started_at}}
            else:
                state = {"terminated": {"exitCode": c.exit_code, "reason": "Completed" if c.exit_code == 0 else "Error",
                                        "startedAt": c.started_at, "finishedAt": c.finished_at,
                                        "containerID": f"podman://{c.runtime_name}"}}
            out.append({"name": c.container, "ready": c.running, "restartCount": c.restart_count, "image": "",
                        "imageID": "", "started": c.running, "containerID": f"podman://{c.runtime_name}", "state": state})
        return out

    def _check_containers(self, uid: str) -> None:
        """Notice exited containers: restart them per restartPolicy, or end the pod Succeeded/Failed."""
        assert self.runtime is not None
        pod = self._active.get(uid)
        with self._lock:
            record = self.records.get(uid)
        if pod is None or record is None:
            return
        changed = False
        runs = []
        for c in record.containers:
            if c.running:
                status = self.runtime.status(c.runtime_name)
                if status.error:
                    log.warning("event=container-status-failed node=%s container=%s error=%r",
                                self.node_name, c.runtime_name, status.error)
                if not status.running and status.exit_code is not None:
                    c = ContainerRun(c.container, c.runtime_name, c.restart_count, c.cdi_devices, c.started_at,
                                     False, status.exit_code, status.finished_at, self.runtime.seen(c.runtime_name))
                    changed = True
                    log.info("event=container-exited node=%s pod=%s/%s container=%s exit_code=%d", self.node_name,
                             record.namespace, record.name, c.container, status.exit_code)
                elif c.seen is None:
                    seen = self.runtime.seen(c.runtime_name)
                    if seen is not None:
                        c = ContainerRun(c.container, c.runtime_name, c.restart_count, c.cdi_devices, c.started_at,
                                         seen=seen)
            runs.append(c)
        with self._lock:
            record.containers = runs
        policy = str((pod.get("spec") or {}).get("restartPolicy") or "Always")
        now = time.monotonic()
        restart = set()
        for c in runs:
            if will_restart(policy, c):
                due = record.restart_due.setdefault(c.container, now + restart_delay(c.restart_count))
                if now >= due:
                    restart.add(c.container)
        for name in restart:
            record.restart_due.pop(name, None)
        if restart:
            try:
                self._start_containers(pod, record, only=restart)
            except KubeletError as exc:
                record.last_error = str(exc)
            changed = True
        if not changed:
            return
        phase = pod_phase(policy, record.containers)
        if phase is None:
            self.api.patch("Pod", record.name, {"status": {"containerStatuses": self._container_statuses(record)}},
                           namespace=record.namespace, subresource="status")
            return
        self._active.pop(uid, None)
        self._teardown(uid)  # the kubelet unprepares a terminated pod's claims; its containers stay for logs
        self._post_terminated(record, phase, self._container_statuses(record))

    def _post_terminated(self, record: PodRecord, phase: str, statuses: list[dict[str, Any]]) -> None:
        finished = _now()
        self.api.patch("Pod", record.name, {"status": {
            "phase": phase,
            "conditions": [{"type": t, "status": s, **({"reason": "PodCompleted"} if s == "False" else {}),
                            "lastTransitionTime": finished}
                           for t, s in (("PodScheduled", "True"), ("Initialized", "True"), ("ContainersReady", "False"),
                                        ("Ready", "False"))],
            "containerStatuses": statuses,
        }}, namespace=record.namespace, subresource="status")
        with self._lock:
            record.phase = phase
        log.info("event=pod-%s node=%s pod=%s/%s", phase.lower(), self.node_name, record.namespace, record.name)

    def _remove_containers(self, uid: str) -> None:
        if self.runtime is None:
            return
        with self._lock:
            record = self.records.get(uid)
            names = [c.runtime_name for c in record.containers] if record is not None else []
        for name in names:
            try:
                self.runtime.remove(name)
            except RuntimeError_ as exc:
                log.warning("event=container-remove-failed node=%s container=%s error=%r", self.node_name, name, str(exc))

    def _admit(self, pod: Mapping[str, Any], record: PodRecord) -> None:
        uid = record.uid
        names = pod_claim_names(pod)
        if names is None:
            raise _NotReady("waiting for the pod's generated ResourceClaim names in status.resourceClaimStatuses")
        by_driver: dict[str, list[ClaimInfo]] = {}
        for name in names:
            try:
                claim = self.api.get("ResourceClaim", name, namespace=record.namespace)
            except NotFound:
                raise _NotReady(f"ResourceClaim {record.namespace}/{name} does not exist") from None
            cstatus = claim.get("status") or {}
            if not cstatus.get("allocation"):
                raise _NotReady(f"ResourceClaim {record.namespace}/{name} is not allocated")
            group = ((pod.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName")
            if not any(r.get("uid") == uid or (group and r.get("resource") == "podgroups" and r.get("name") == group)
                       for r in cstatus.get("reservedFor") or []):  # a PodGroup's shared claim counts for its pods
                raise _NotReady(f"ResourceClaim {record.namespace}/{name} is not reserved for this pod")
            results = ((cstatus["allocation"].get("devices") or {}).get("results")) or []
            # One NodePrepareResources call per driver with that driver's claims, as the kubelet's DRA manager
            # does (a claim with devices of two drivers goes to both).
            for driver in dict.fromkeys(str(r.get("driver")) for r in results):
                by_driver.setdefault(driver, []).append(ClaimInfo(record.namespace, str(claim["metadata"]["uid"]), name))
        if by_driver:
            self.sim.sync()  # a re-registered plugin (restart) is picked up before the call, as inotify would
            prepared: list[PreparedClaim] = []
            for driver, infos in by_driver.items():
                pods = self._sim_pods.setdefault(uid, {})
                sim_pod = pods.get(driver)
                if sim_pod is None:
                    sim_pod = Pod(record.name, infos)
                    pods[driver] = sim_pod
                self.sim.prepare_pod(driver, sim_pod)
                prepared += [PreparedClaim(c, tuple(sim_pod.prepared[c.uid])) for c in infos]
            with self._lock:
                record.claims = prepared
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
        for driver, sim_pod in list((self._sim_pods.get(uid) or {}).items()):
            if not sim_pod.prepared:
                continue
            try:
                self.sim.unprepare_pod(driver, sim_pod)
            except KubeletError as exc:
                log.warning("event=unprepare-failed node=%s pod=%s driver=%s error=%r", self.node_name, sim_pod.name,
                            driver, str(exc))
                return
        self._sim_pods.pop(uid, None)
        with self._lock:
            record = self.records.get(uid)
            if record is not None:
                record.unprepared = True
        if record is not None and record.legacy and self.device_manager is not None:
            self.device_manager.remove_pod(uid)  # a terminated pod's device plugin devices are free again

    def _finish(self, namespace: str, name: str) -> None:
        try:
            pod = self.api.get("Pod", name, namespace=namespace)
        except NotFound:
            return
        uid = str(pod["metadata"]["uid"])
        self._teardown(uid)
        finished = _now()
        containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
        record = self._record(pod)
        self._post_terminated(record, "Succeeded", [
            {"name": n, "ready": False, "restartCount": 0, "image": "", "imageID": "", "started": False,
             "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": finished}}}
            for n in containers
        ])


class _NotReady(Exception):
    """The pod cannot be admitted yet; retried on the next event or tick."""

