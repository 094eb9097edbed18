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
  what containers exiting with code 0 amount to (claims unprepared, then Succeeded); so is a pod the node's
  runtime does not run (`--runtime none` runs only our own image's pods, as host processes: `_runtime_for`);
- a deleted pod is unprepared too; a pod whose admission fails is retried on the next event or retry tick, as
  pod workers resync; a container the runtime refuses to start is retried with a growing back-off.
- running pods' `allocatedResourcesStatus` follows the driver's health stream (`sim.kubelet.podhealth`), as a
  1.36+ kubelet writes it.

What each pod got (CDI device ids, device plugin grants, what each container saw) is kept for the demo's report.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from sim.kubelet.backoff import RestartBackoff, duration_text
from sim.kubelet.devicemanager import DeviceManagerError, DeviceManagerSim
from sim.kubelet import claimstate, envvars, etchosts, hooks, netns, termination, volumes
from sim.kubelet.envvars import EnvError, Lookup, PodContext, expand
from sim.kubelet.events import KubeletEvents, format_pod
from sim.kubelet.execserver import ExecServer
from sim.kubelet.heartbeat import heartbeat_loop
from sim.kubelet.dra import ClaimInfo, KubeletError, KubeletSim, Pod, PreparedDevice
from sim.kubelet.podhealth import PodHealthReporter, RunningPod
from sim.kubelet.proberun import run_probe
from sim.kubelet.probes import TITLES, ContainerProber, ProbeSpec, probe_specs
from gpudra.kubeapi import ApiError, Conflict, KubeApi, NotFound
from gpudra.timestamps import rfc3339
from sim.runtime.podman import ContainerRequest, ContainerStatus, RuntimeError_, Seen

log = logging.getLogger("sim.kubelet.pods")

EXTENDED_GPU_RESOURCE = "nvidia.com/gpu"
RETRY_SECONDS = 0.2
PROBE_THREADS = 4  # probes of the node's containers run at once (each bounded by its timeoutSeconds)
WATCH_BACKOFF_MAX_SECONDS = 5.0
# A container the runtime refused is retried after 1 s, doubling up to this (the kubelet's back-off is 10 s to 5 min).
MAX_START_BACKOFF_SECONDS = 10.0
# A pod's claims that could not be unprepared (the node agent down or restarting) are retried after 0.5 s,
# doubling up to 8 s, until the call succeeds, as the kubelet's pod workers keep retrying a terminated pod's cleanup.
FIRST_UNPREPARE_RETRY_SECONDS = 0.5
MAX_UNPREPARE_RETRY_SECONDS = 8.0
# The kubelet never stops a container in less (minimumGracePeriodInSeconds), whatever grace it was given.
MIN_KILL_GRACE_SECONDS = 2
# The kubelet bounds no postStart hook; ours ends after this, so one that never returns holds no thread forever.
POST_START_TIMEOUT_SECONDS = 600.0


HOST_IP = "127.0.0.1"  # a node's InternalIP when it was given none (sim.demo.cluster.node_object's default)
# Pods' ServiceAccount tokens are not rotated in the simulated cluster (a kubelet refreshes them on a cluster).
TOKEN_SECONDS = 365 * 86400


class PodIPs:
    """Pod IPs of one node from its own /24 (10.244.X.0/24, X from the node's name, as kind gives each node one):
    .1 is the gateway, pods get .2 to .254, an address is free again once its pod is gone."""

    def __init__(self, node_name: str) -> None:
        digest = int(hashlib.sha256(node_name.encode()).hexdigest(), 16)
        self.prefix = f"10.244.{digest % 254 + 1}"
        self._by_uid: dict[str, str] = {}
        self._lock = threading.Lock()

    def get(self, uid: str) -> str:
        with self._lock:
            if uid not in self._by_uid:
                used = set(self._by_uid.values())
                free = next((f"{self.prefix}.{i}" for i in range(2, 255) if f"{self.prefix}.{i}" not in used), None)
                if free is None:
                    raise KubeletError(f"no pod IP left in {self.prefix}.0/24")
                self._by_uid[uid] = free
            return self._by_uid[uid]

    def release(self, uid: str) -> None:
        with self._lock:
            self._by_uid.pop(uid, None)


class ContainerRuntime(Protocol):
    """What the pod workers need of a runtime (sim.runtime.podman.PodmanRuntime)."""

    def run(self, request: ContainerRequest) -> ContainerStatus: ...

    def status(self, name: str) -> ContainerStatus: ...

    def remove(self, name: str, grace_seconds: int = 1) -> None: ...

    def kill(self, name: str) -> None: ...

    def seen(self, name: str) -> Seen | None: ...

    def exec_argv(self, name: str, command: Sequence[str], *, tty: bool = False) -> list[str] | None: ...

    def attach_argv(self, name: str, *, stdin: bool) -> list[str] | None: ...

    def tty_of(self, name: str) -> tuple[bool, bool]: ...

    def network_pid(self, name: str) -> int | None: ...




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
    finished_mono: float = 0.0  # monotonic time it was noticed exited (the back-off counts from it)
    waiting_message: str = ""  # set while a restart waits out its back-off (CrashLoopBackOff)
    last_state: Mapping[str, Any] | None = None  # the previous run's `terminated` state (lastState)
    ready: bool = True  # its readiness probe passes (or it has none); never before its startup probe passed
    started: bool = True  # its startup probe passed (or it has none)
    # Its postStart hook is still running: the kubelet's pod worker is inside the start, so the status it last
    # published still shows the container being created.
    hook_running: bool = False
    message_path: str = ""  # the file it may write its termination message to (sim.kubelet.termination)
    message: str = ""  # its termination message, once it exited
    start_failed: bool = False  # its command could not be started (StartError; `message` says why)

    def killed(self, mono: float) -> ContainerRun:
        """This run as the kubelet records a container it kills: exited 137, noticed at monotonic time `mono`."""
        return replace(self, running=False, exit_code=137, finished_at=rfc3339(), finished_mono=mono, ready=False,
                       hook_running=False)


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
    init_runs: list[ContainerRun] = field(default_factory=list)  # the latest run of each init container
    volumes: dict[str, Path] = field(default_factory=dict)  # volume name -> its directory on the node
    initialized: bool = False  # every init container completed
    unprepare_failures: int = 0
    unprepare_at: float = 0.0  # monotonic time of the next unprepare attempt, once one failed
    removed: bool = False  # deleted: its containers stopped, its claims unprepared, the pod object gone
    # As the kubelet's status manager caches the status it last wrote (seeded from the pod object, as a restarted
    # kubelet's is): a condition keeps its lastTransitionTime while its status stays, and startTime, set when the
    # kubelet first accepts the pod, never changes.
    conditions: list[dict[str, Any]] = field(default_factory=list)
    start_time: str = ""
    # container name -> (reason, message) of its latest failed start (CreateContainerConfigError,
    # CreateContainerError): it waits with that reason, as the kubelet's reasonCache reports it, until it starts.
    start_errors: dict[str, tuple[str, str]] = field(default_factory=dict)


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


def container_env(container: Mapping[str, Any], legacy: list[LegacyGrant], ctx: PodContext | None = None,
                  lookup: Lookup | None = None) -> dict[str, str]:
    """The device plugin grant's env, then the container's envFrom and env (sim.kubelet.envvars); without a pod
    context only literal values (what the pure tests check)."""
    base: dict[str, str] = {}
    for grant in legacy:
        if grant.container == container.get("name"):
            base.update(grant.envs)
    if ctx is None or lookup is None:
        literal = {**container, "envFrom": [], "env": [e for e in container.get("env") or []
                                                        if isinstance(e, Mapping) and "valueFrom" not in e]}
        return envvars.container_env(literal, PodContext({}, "", "", "", {}), lambda *_: None, base)
    return envvars.container_env(container, ctx, lookup, base)


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


def running_phase(runs: list[ContainerRun]) -> str:
    """The phase of a started pod: Pending while a container's first start is still in its postStart hook (getPhase
    counts a waiting container that never ran as pending), Running otherwise."""
    return "Pending" if any(r.hook_running and r.last_state is None for r in runs) else "Running"


def terminated_state(run: ContainerRun) -> dict[str, Any]:
    reason = "StartError" if run.start_failed else "Completed" if run.exit_code == 0 else "Error"
    out = {"exitCode": run.exit_code, "reason": reason,
           "startedAt": run.started_at, "finishedAt": run.finished_at, "containerID": f"podman://{run.runtime_name}"}
    if run.message:
        out["message"] = run.message
    return out


def container_status(run: ContainerRun) -> dict[str, Any]:
    """A container's status as the kubelet reports it: running (ready once its probes say so), waiting out its
    restart back-off (CrashLoopBackOff, its last run in lastState) or terminated."""
    if run.running and run.hook_running:
        state: dict[str, Any] = {"waiting": {"reason": "ContainerCreating"}}
    elif run.running:
        state = {"running": {"startedAt": run.started_at}}
    elif run.waiting_message:
        state = {"waiting": {"reason": "CrashLoopBackOff", "message": run.waiting_message}}
    else:
        state = {"terminated": terminated_state(run)}
    up = run.running and not run.hook_running
    out: dict[str, Any] = {"name": run.container, "ready": up and run.ready, "restartCount": run.restart_count,
                           "image": "", "imageID": "", "started": up and run.started,
                           "containerID": f"podman://{run.runtime_name}", "state": state}
    if run.waiting_message:
        out["lastState"] = {"terminated": terminated_state(run)}
    elif run.last_state is not None:
        out["lastState"] = {"terminated": dict(run.last_state)}
    return out


def waiting_status(name: str, waiting: Mapping[str, str], *, image: str = "",
                   previous: ContainerRun | None = None) -> dict[str, Any]:
    """A container that does not run yet: waiting (`waiting`: its reason, and message), its previous run, if any,
    in lastState and restartCount."""
    out: dict[str, Any] = {"name": name, "ready": False, "restartCount": previous.restart_count if previous else 0,
                           "image": image, "imageID": "", "started": False, "state": {"waiting": dict(waiting)}}
    if previous is not None and not previous.running:
        out["lastState"] = {"terminated": terminated_state(previous)}
    return out


def start_failed_status(name: str, reason: str, message: str, previous: ContainerRun | None, *,
                        image: str = "") -> dict[str, Any]:
    """A container the kubelet could not start (its create failed): waiting with the error's reason and message
    (a failed create does not count as a restart)."""
    return waiting_status(name, {"reason": reason, "message": message}, image=image, previous=previous)


def incomplete_init_containers(pod: Mapping[str, Any], init_runs: Sequence[ContainerRun]) -> list[str]:
    """The pod's init containers that have not completed (exited 0), a sidecar (restartPolicy Always) one that has
    not started."""
    return [str(c.get("name")) for c in (pod.get("spec") or {}).get("initContainers") or []
            if isinstance(c, Mapping) and not any(
                r.container == c.get("name") and ((not r.running and r.exit_code == 0) or
                                                  (r.running and c.get("restartPolicy") == "Always"))
                for r in init_runs)]


def pod_conditions(statuses: list[dict[str, Any]], now: str, *, terminated: str | None = None,
                   incomplete_init: Sequence[str] = (), sandbox: bool = True,
                   previous: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """The kubelet's conditions in generateAPIPodStatus's order: PodReadyToStartContainers (True while the pod's
    sandbox exists with its network: `sandbox`), then from the container statuses (status.go's
    GeneratePodInitializedCondition and GenerateContainersReadyCondition) Initialized (not while an init
    container has not completed), Ready and ContainersReady (not while any container is not, naming them), then
    PodScheduled. A pod `terminated` in phase Succeeded or Failed has Ready and ContainersReady False for that
    reason (PodCompleted, PodFailed), a Succeeded one Initialized True with PodCompleted. A condition whose status is that of the same type in `previous` (the status published before)
    keeps its lastTransitionTime, as the status manager's updateLastTransitionTime does; the others get `now`."""
    unready = [str(s.get("name")) for s in statuses if not s.get("ready")]
    out: list[dict[str, Any]] = [{"type": "PodReadyToStartContainers", "status": "True" if sandbox else "False"}]
    if terminated == "Succeeded":
        out.append({"type": "Initialized", "status": "True", "reason": "PodCompleted"})
    elif incomplete_init:
        out.append({"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized",
                    "message": f"containers with incomplete status: [{' '.join(incomplete_init)}]"})
    else:
        out.append({"type": "Initialized", "status": "True"})
    for kind in ("Ready", "ContainersReady"):
        cond: dict[str, Any] = {"type": kind, "status": "True" if not unready and not terminated else "False"}
        if terminated:
            cond["reason"] = "PodCompleted" if terminated == "Succeeded" else "PodFailed"
        elif unready:
            cond["reason"] = "ContainersNotReady"
            cond["message"] = f"containers with unready status: [{' '.join(unready)}]"
        out.append(cond)
    out.append({"type": "PodScheduled", "status": "True"})
    before = {c.get("type"): c for c in previous if isinstance(c, Mapping)}
    for cond in out:
        old = before.get(cond["type"])
        kept = old.get("lastTransitionTime") if old is not None and old.get("status") == cond["status"] else None
        cond["lastTransitionTime"] = kept or now
    return out


def kill_grace_seconds(pod: Mapping[str, Any], probe_grace: int | None = None) -> int:
    """The grace period a pod's containers are stopped with: a failed probe's own terminationGracePeriodSeconds,
    else the deletion's (deletionGracePeriodSeconds), else the pod's; at least MIN_KILL_GRACE_SECONDS."""
    spec = pod.get("spec") or {}
    value = probe_grace
    if value is None:
        value = (pod.get("metadata") or {}).get("deletionGracePeriodSeconds")
    if value is None:
        value = spec.get("terminationGracePeriodSeconds")
    return max(int(value) if value is not None else 30, MIN_KILL_GRACE_SECONDS)


def _pod_ref(pod: Mapping[str, Any]) -> dict[str, str]:
    meta = pod.get("metadata") or {}
    return {"namespace": str(meta.get("namespace")), "name": str(meta.get("name")), "uid": str(meta.get("uid"))}


def will_restart(restart_policy: str, run: ContainerRun) -> bool:
    if run.running:
        return False
    if restart_policy == "Never":
        return False
    if restart_policy == "OnFailure":
        return run.exit_code != 0
    return True  # Always (the default)


def _nobody(_authorization: str | None) -> bool:
    return False


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
        node_address: str | None = None,
        pod_logs_dir: Path | None = None,
        restart_backoff: RestartBackoff | None = None,
        clock: Callable[[], float] = time.monotonic,
        stream_client: Callable[[str | None], bool] | None = None,
    ) -> None:
        """`stream_client` tells the streaming server's caller (an Authorization header) is the API server (its
        kubelet client credential); without it the streaming server serves nobody."""
        self.api = api
        self.runtime = runtime
        self.node_address = node_address  # the pod IP of pods that share the node's network
        # Pods' hostIP (and the downward API's status.hostIP): the node's InternalIP, the address it registered with
        # (sim.cluster.nodes registers node_object(address=spec.address) and passes the same spec.address here).
        self.host_ip = node_address or HOST_IP
        self.pod_logs_dir = pod_logs_dir
        self.node_name = node_name
        self.driver_name = driver_name
        self.sim = KubeletSim(kubelet_dir, kubernetes_version=kubernetes_version)
        self.kubelet_dir = kubelet_dir
        self.events = KubeletEvents(api, node_name)
        self.backoff = restart_backoff if restart_backoff is not None else RestartBackoff()
        self._clock = clock
        self.health = PodHealthReporter(api, self.sim, driver_name, self._running_pods)
        self.device_manager = device_manager
        self.records: dict[str, PodRecord] = {}  # pod uid -> record
        self._lock = threading.Lock()
        self._events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pods: dict[str, dict[str, Any]] = {}  # uid -> latest pod object seen
        self._sim_pods: dict[str, Pod] = {}  # uid -> KubeletSim's view (which claims are prepared)
        # uid -> driver -> the same for the node's other DRA drivers (compute-domain.nvidia.com)
        self._other_pods: dict[str, dict[str, Pod]] = {}
        self._active: dict[str, dict[str, Any]] = {}  # uid -> pod whose containers the runtime runs
        # uids whose cleanup the resync retries: an unprepare call failed, or a terminating pod's final delete did
        self._unprepare_pending: set[str] = set()
        # uid -> the deleted pod whose containers are being stopped (or are stopped, its cleanup not yet done)
        self._terminating: dict[str, dict[str, Any]] = {}
        # uid -> (runtime names being stopped, monotonic time of their SIGKILL): a shorter grace period brings it on
        self._stopping: dict[str, tuple[list[str], float]] = {}
        self._stoppers: list[threading.Thread] = []  # threads stopping containers (`_background`)
        self._gone: set[str] = set()  # terminating pods the API server no longer has
        self._pod_ips = PodIPs(node_name)
        # The streaming server listens on the node's InternalIP, where the control plane dials it.
        self.exec_server = (ExecServer(_NodeStreams(self), stream_client or _nobody, self.host_ip)
                            if runtime is not None else None)
        self._allocatable: dict[str, str] | None = None  # the Node's status.allocatable, read once
        # Probe workers per pod uid and container run (sim.kubelet.probes), and the threads that run the probes.
        self._probers: dict[str, dict[str, ContainerProber]] = {}
        self._probe_pool: ThreadPoolExecutor | None = None

    # ---- lifecycle --------------------------------------------------------------------------------------

    def register_plugin(self, timeout: float) -> None:
        """Find the node agent's registration socket and register it (raises KubeletError on failure)."""
        self.sim.wait_for_plugin(self.driver_name, timeout=timeout)

    def _save_claim_state(self) -> None:
        try:
            claimstate.save(self.kubelet_dir, {uid: (p.name, [c for c in p.claims if c.uid in p.prepared])
                                               for uid, p in self._sim_pods.items()})
        except OSError as exc:
            log.warning("event=claim-state-write-failed node=%s error=%r", self.node_name, str(exc))

    def _recover_claims(self) -> None:
        """After a restart: the pods this kubelet had prepared claims for that no longer run here get their claims
        unprepared (retried like any unprepare); the others are adopted when their pod's event arrives."""
        saved = claimstate.load(self.kubelet_dir)
        if not saved:
            return
        try:
            live = {str(p["metadata"]["uid"]): p for p in self.api.list("Pod", field_selector=f"spec.nodeName={self.node_name}")[0]}
        except ApiError as exc:
            log.warning("event=claim-recovery-deferred node=%s error=%r", self.node_name, str(exc))
            live = None
        for uid, (name, claims) in saved.items():
            pod = live.get(uid) if live is not None else None
            gone = live is not None and (pod is None or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
                                         or bool((pod.get("metadata") or {}).get("deletionTimestamp")))
            if not gone:
                continue  # a running pod is prepared again on its first event (NodePrepareResources is idempotent)
            self._sim_pods[uid] = Pod(name, claims, {c.uid: [] for c in claims})
            self._record({"metadata": (pod or {}).get("metadata") or {"namespace": claims[0].namespace, "name": name,
                                                                       "uid": uid}})
            self._unprepare_pending.add(uid)
            log.info("event=claims-of-gone-pod node=%s pod=%s claims=%d", self.node_name, name, len(claims))

    def _publish_kubelet_port(self) -> None:
        """The Node's daemonEndpoints name the exec server's port, where the control plane proxies pods/exec."""
        if self.exec_server is None:
            return
        try:
            self.api.patch("Node", self.node_name, {"status": {"daemonEndpoints": {"kubeletEndpoint": {
                "Port": self.exec_server.port}}}}, subresource="status")
        except NotFound:
            log.info("event=no-node-object node=%s exec_port=%d", self.node_name, self.exec_server.port)
        except ApiError as exc:
            log.warning("event=kubelet-port-not-published node=%s error=%r", self.node_name, str(exc))

    def start(self) -> None:
        self._recover_claims()
        if self.exec_server is not None:
            self.exec_server.start()
            self._publish_kubelet_port()
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
        if self.exec_server is not None:
            self.exec_server.stop()
        self._events.put(("STOP", {}))
        self.health.stop()
        for t in self._threads:
            t.join(timeout=5)
        self._threads.clear()
        for uid in list(self._probers):
            self._stop_probes(uid)
        if self._probe_pool is not None:
            self._probe_pool.shutdown(wait=False, cancel_futures=True)
        if self.runtime is not None:
            with self._lock:
                names = [c.runtime_name for r in self.records.values() for c in r.containers]
            for name in names:
                try:
                    self.runtime.kill(name)  # the node is going away: no grace, and stops under way end now
                    self.runtime.remove(name, grace_seconds=0)
                except RuntimeError_ as exc:
                    log.warning("event=container-remove-failed node=%s container=%s error=%r", self.node_name, name, str(exc))
        with self._lock:
            stoppers, self._stoppers = self._stoppers, []
        for t in stoppers:
            t.join(timeout=5)
        self.sim.close()

    # ---- what the demo asks of the node -----------------------------------------------------------------

    def finish(self, namespace: str, name: str) -> None:
        """Without a runtime: the pod's containers exited with code 0: tear down its resources, report Succeeded."""
        self._events.put(("FINISH", {"metadata": {"namespace": namespace, "name": name}}))

    def snapshot(self) -> dict[str, PodRecord]:
        with self._lock:
            return {uid: replace(r, claims=list(r.claims), legacy=list(r.legacy), containers=list(r.containers))
                    for uid, r in self.records.items()}

    def _running_pods(self) -> list[RunningPod]:
        with self._lock:
            return [RunningPod(r.namespace, r.name, r.uid, {c.claim.name: c.devices for c in r.claims})
                    for r in self.records.values() if r.phase == "Running" and r.claims]

    def running_container_names(self, namespace: str, pod: str) -> tuple[str, list[str]] | None:
        """(uid, runtime names of the latest run of each of the pod's containers) for a pod this node runs."""
        with self._lock:
            for r in self.records.values():
                if r.namespace == namespace and r.name == pod:
                    return r.uid, [c.runtime_name for c in r.containers]
        return None

    def container_runtime_name(self, namespace: str, pod: str, container: str | None) -> str | None:
        """The runtime's name for a pod's container (its latest run); `container` None: the pod's only one. The
        newest pod of that name: a deleted pod's record may linger beside its same-named successor."""
        with self._lock:
            for r in reversed(list(self.records.values())):
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
            now = self._clock()
            for uid in list(self._unprepare_pending):
                with self._lock:
                    record = self.records.get(uid)
                if record is None or now >= record.unprepare_at:
                    if uid in self._terminating:
                        self._terminated(uid)
                    else:
                        self._teardown(uid)
            return
        if kind == "STOPPED":
            self._terminated(str(pod["metadata"]["uid"]))
            return
        if kind == "POST_START_FAILED":
            self._post_start_failed(str(pod["metadata"].get("uid")), str(pod["container"]))
            return
        if kind == "POST_START_DONE":
            self._post_start_done(str(pod["metadata"].get("uid")), str(pod["container"]))
            return
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if not uid:
            return
        if kind == "DELETED":
            with self._lock:
                record = self.records.get(uid)
            if record is not None and record.removed:
                return  # this kubelet's own final delete
            self._gone.add(uid)
            self._terminate(pod)  # deleted without a grace period (--force), or while this kubelet was away
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
                # First accepted now: the status manager's cache starts from the pod's status (a restarted kubelet
                # keeps what it published before, the scheduler's PodScheduled its time), startTime from now.
                status = pod.get("status") or {}
                record = PodRecord(str(meta.get("namespace")), str(meta.get("name")), uid,
                                   conditions=[dict(c) for c in status.get("conditions") or [] if isinstance(c, Mapping)],
                                   start_time=str(status.get("startTime") or rfc3339()))
                self.records[uid] = record
            return record

    def _sync(self, pod: dict[str, Any]) -> None:
        status = pod.get("status") or {}
        phase = status.get("phase") or "Pending"
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid"))
        if meta.get("deletionTimestamp"):
            self._terminate(pod)
            return
        if phase in ("Succeeded", "Failed"):
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
        runtime = self._runtime_for(pod)
        if phase == "Running" and runtime is None and known is not None and known.phase == "Running":
            return  # without a runtime nothing changes once Running; a restarted kubelet (no record) adopts it
        record = self._record(pod)
        try:
            self._admit(pod, record)
            self._check_env(pod, record)
            self._set_up_volumes(pod, record)
            if runtime is not None:
                if not record.initialized:
                    self._run_init_containers(pod, record)
                self._start_containers(pod, record)
        except (KubeletError, ApiError, _NotReady) as exc:
            if str(exc) != record.last_error:
                log.info("event=pod-waiting node=%s pod=%s/%s reason=%r", self.node_name, record.namespace, record.name, str(exc))
                if isinstance(exc, _PrepareFailed):
                    self.events.pod({"namespace": record.namespace, "name": record.name, "uid": uid},
                                    "FailedPrepareDynamicResources", f"Failed to prepare dynamic resources: {exc}")
                if isinstance(exc, _StartFailed):
                    self._report_start_failed(record, pod)
            record.last_error = str(exc)
            return
        record.last_error = ""
        record.phase = "Running"
        if runtime is not None:
            statuses = self._container_statuses(record)
        else:
            started = rfc3339()
            statuses = [
                {"name": c.get("name"), "ready": True, "restartCount": 0, "image": str(c.get("image") or ""), "imageID": "",
                 "started": True, "state": {"running": {"startedAt": started}}}
                for c in (pod.get("spec") or {}).get("containers") or []
            ]
        ip = self._pod_ip(pod)
        self._publish(record, {
            "phase": running_phase(record.containers), "podIP": ip, "podIPs": [{"ip": ip}],
            "initContainerStatuses": self._init_statuses(record, pod), "containerStatuses": statuses,
        })
        self._pods.pop(uid, None)
        if runtime is not None:
            self._active[uid] = pod
        log.info("event=pod-running node=%s pod=%s/%s", self.node_name, record.namespace, record.name)

    # ---- containers (with a runtime) --------------------------------------------------------------------

    def _runtime_for(self, pod: Mapping[str, Any]) -> ContainerRuntime | None:
        """The runtime that runs this pod's containers, None where the pod is simulated: no runtime, or one that
        runs only some images (sim.runtime.hostprocess.RoutingRuntime under `--runtime none`: our own image's)."""
        runs = getattr(self.runtime, "runs", None)
        if runs is None:
            return self.runtime
        spec = pod.get("spec") or {}
        images = [str(c.get("image") or "") for key in ("initContainers", "containers") for c in spec.get(key) or []
                  if isinstance(c, Mapping)]
        return self.runtime if runs(images) else None

    def _start_containers(self, pod: Mapping[str, Any], record: PodRecord, only: set[str] | None = None) -> None:
        """Start each container of the pod that has no run yet (or those in `only`, as restarts)."""
        spec = pod.get("spec") or {}
        for container in spec.get("containers") or []:
            cname = str(container.get("name"))
            previous = next((c for c in record.containers if c.container == cname), None)
            if previous is not None and (only is None or cname not in only):
                continue
            run = self._launch(pod, record, container, previous)
            with self._lock:
                record.containers = [c for c in record.containers if c.container != cname] + [run]

    def _launch(self, pod: Mapping[str, Any], record: PodRecord, container: Mapping[str, Any],
                previous: ContainerRun | None) -> ContainerRun:
        """Start one container (a restart of `previous` when given) in the runtime."""
        assert self.runtime is not None
        if time.monotonic() < record.next_start:
            raise _NotReady(record.last_error or "waiting to retry a container start")
        cname = str(container.get("name"))
        restart = previous.restart_count + 1 if previous is not None else 0
        last_state = terminated_state(previous) if previous is not None and not previous.running else None
        try:
            account_env, account_mounts = self._service_account(pod)
            env = {**account_env, **container_env(container, record.legacy, self._context(pod), self._lookup)}
            mounts = [(str(m.host), m.container, m.read_only)
                      for m in volumes.container_mounts(container, record.volumes, volumes.read_only_volumes(pod))]
        except (EnvError, volumes.VolumeError) as exc:
            raise self._start_failed(record, cname, "CreateContainerConfigError", str(exc)) from exc
        runtime_name = runtime_container_name(record.namespace, record.name, record.uid, cname, restart)
        try:
            message_path = termination.message_file(self.kubelet_dir, record.uid, cname, runtime_name)
            hosts = etchosts.write_hosts_file(self.kubelet_dir, pod, self._pod_ip(pod))
        except (OSError, volumes.VolumeError) as exc:
            raise self._start_failed(record, cname, "CreateContainerError", f"container files: {exc}") from exc
        mounts.append((str(message_path), termination.mount_path(container), False))
        if not any(m[1] == "/etc/hosts" for m in mounts):  # a volume the pod mounts there wins, as on a node
            mounts.append((str(hosts), "/etc/hosts", False))
        request = ContainerRequest(
            runtime_name, container_command(container, env), env,
            container_cdi_devices(container, pod_claim_map(pod) or {}, record.claims, record.legacy,
                                  extended_claim_refs(pod)),
            log_path=self.pod_log_path(record, cname, restart),
            mounts=tuple(mounts + account_mounts), image=str(container.get("image") or ""),
            stdin=container.get("stdin") is True, tty=container.get("tty") is True,
            hostname=etchosts.pod_hostname(pod),
        )
        try:
            status = self.runtime.run(request)
        except RuntimeError_ as exc:
            record.start_failures += 1
            record.next_start = time.monotonic() + min(MAX_START_BACKOFF_SECONDS, 2.0 ** (record.start_failures - 1))
            raise self._start_failed(record, cname, "CreateContainerError", str(exc)) from exc
        record.start_failures = 0
        with self._lock:
            record.start_errors.pop(cname, None)
        if previous is not None:
            try:
                self.runtime.remove(previous.runtime_name)  # the kubelet keeps one dead instance; we keep none
            except RuntimeError_ as exc:
                log.warning("event=container-remove-failed node=%s container=%s error=%r",
                            self.node_name, previous.runtime_name, str(exc))
            termination.remove(Path(previous.message_path) if previous.message_path else None)
        log.info("event=container-started node=%s pod=%s/%s container=%s restart=%d devices=%s", self.node_name,
                 record.namespace, record.name, cname, restart, ",".join(request.cdi_devices) or "-")
        ref = {"namespace": record.namespace, "name": record.name, "uid": record.uid}
        # What `kubectl describe pod` shows of a start; the image is the runtime's local one (no registry to pull from).
        for reason, message in (("Pulled", f'Container image "{request.image}" already present on machine'),
                                ("Created", f"Created container: {cname}"), ("Started", f"Started container {cname}")):
            self.events.pod(ref, reason, message, warning=False, container=cname)
        specs = probe_specs(container)
        if specs:
            self._start_probes(pod, record, container, request.name, specs)
        if (post_start := hooks.handler(container, hooks.POST_START)) is not None:
            self._background(f"poststart-{request.name}", self._post_start, dict(pod), request.name, container,
                             post_start)
        return ContainerRun(cname, request.name, restart, request.cdi_devices, status.started_at, last_state=last_state,
                            ready="readiness" not in specs and "startup" not in specs, started="startup" not in specs,
                            hook_running=post_start is not None, message_path=str(message_path))

    def _exited(self, pod: Mapping[str, Any], record: PodRecord, run: ContainerRun, exit_code: int,
                finished_at: str) -> ContainerRun:
        """The run as the kubelet records its container's exit, with the termination message it left."""
        spec = pod.get("spec") or {}
        container = next((c for key in ("initContainers", "containers") for c in spec.get(key) or []
                          if isinstance(c, Mapping) and c.get("name") == run.container), {})
        assert self.runtime is not None
        seen = self.runtime.seen(run.runtime_name)
        if seen is not None and seen.start_error:
            # What a containerd node reports of a command runc cannot exec, and the kubelet's Failed event.
            message = (f"failed to create containerd task: failed to create shim task: OCI runtime create failed: "
                       f"runc create failed: unable to start container process: error during container init: "
                       f"{seen.start_error}: unknown")
            self.events.pod(_pod_ref(pod), "Failed", f"Error: {message}", container=run.container)
            return replace(run, running=False, exit_code=128, finished_at=finished_at, finished_mono=self._clock(),
                           message=message, start_failed=True, seen=seen)
        message = termination.read_message(Path(run.message_path) if run.message_path else None, container, exit_code,
                                           self.pod_log_path(record, run.container, run.restart_count))
        return replace(run, running=False, exit_code=exit_code, finished_at=finished_at, finished_mono=self._clock(),
                       message=message, seen=seen)

    def _start_failed(self, record: PodRecord, cname: str, reason: str, message: str) -> _StartFailed:
        """Record a container's failed start, which its status reports until it starts; a Failed event when the
        error is new (the kubelet's each attempt's, which its event recorder aggregates)."""
        with self._lock:
            new = record.start_errors.get(cname) != (reason, message)
            record.start_errors[cname] = (reason, message)
        if new:
            self.events.pod({"namespace": record.namespace, "name": record.name, "uid": record.uid}, "Failed",
                            f"Error: {message}", container=cname)
        return _StartFailed(f"{reason}: {message}")

    def _report_start_failed(self, record: PodRecord, pod: Mapping[str, Any]) -> None:
        """The pod Pending because a container of it could not be created: its sandbox (and pod IP) exists, the
        container waits with the error (`_container_statuses`), the others as they are."""
        ip = self._pod_ip(pod)
        self._publish(record, {
            "phase": "Pending", "podIP": ip, "podIPs": [{"ip": ip}],
            "initContainerStatuses": self._init_statuses(record, pod),
            "containerStatuses": self._container_statuses(record, pod),
        }, incomplete_init=incomplete_init_containers(pod, record.init_runs))

    # ---- probes (sim.kubelet.probes decides, sim.kubelet.proberun runs them) ------------------------------------

    def _start_probes(self, pod: Mapping[str, Any], record: PodRecord, container: Mapping[str, Any], runtime_name: str,
                      specs: Mapping[str, ProbeSpec]) -> None:
        runtime = self.runtime
        assert runtime is not None
        if self._probe_pool is None:
            self._probe_pool = ThreadPoolExecutor(PROBE_THREADS, thread_name_prefix=f"probes-{self.node_name}")
        pod_ip = self._pod_ip(pod)
        ref = {"namespace": record.namespace, "name": record.name, "uid": record.uid}
        cname = str(container.get("name"))

        def report(spec: ProbeSpec, output: str) -> None:
            self.events.pod(ref, "Unhealthy", f"{TITLES[spec.kind]} probe failed: {output}", container=cname)

        prober = ContainerProber(cname, specs, self._clock(), pool=self._probe_pool, clock=self._clock, report=report,
                                 execute=lambda spec: run_probe(runtime, runtime_name, container, pod_ip, spec))
        self._probers.setdefault(record.uid, {})[runtime_name] = prober

    def _stop_probes(self, uid: str, runtime_name: str | None = None) -> None:
        probers = self._probers.get(uid, {})
        for name in [runtime_name] if runtime_name is not None else list(probers):
            prober = probers.pop(name, None)
            if prober is not None:
                prober.stop()
        if not probers:
            self._probers.pop(uid, None)

    def _probed(self, record: PodRecord, run: ContainerRun) -> ContainerRun:
        """The running container as its probes see it now; killed (exit 137) when liveness or startup gave up."""
        prober = self._probers.get(record.uid, {}).get(run.runtime_name)
        if prober is None:
            return run
        verdict = prober.poll()
        if not verdict.kill:
            return replace(run, ready=verdict.ready, started=verdict.started)
        assert self.runtime is not None
        self._stop_probes(record.uid, run.runtime_name)
        self.events.pod({"namespace": record.namespace, "name": record.name, "uid": record.uid}, "Killing",
                        verdict.kill, warning=False, container=run.container)
        # Stopped off the worker thread: a container that ignores SIGTERM holds its grace period, not the node.
        pod = self._active.get(record.uid) or {}
        self._background(f"stop-{run.runtime_name}", self._stop_container, pod, run.runtime_name, run.container,
                         kill_grace_seconds(pod, verdict.kill_grace))
        return run.killed(self._clock())

    def _run_init_containers(self, pod: Mapping[str, Any], record: PodRecord) -> None:
        """Init containers in order, each to completion (exit 0) before the next, restarted with the back-off
        when one fails unless restartPolicy is Never (the pod fails); raises _NotReady until all have completed.
        An init container with restartPolicy Always (a sidecar) counts as done once started."""
        assert self.runtime is not None
        spec = pod.get("spec") or {}
        inits = [c for c in spec.get("initContainers") or [] if isinstance(c, Mapping)]
        policy = str(spec.get("restartPolicy") or "Always")
        changed = False
        runs = []
        for r in record.init_runs:
            if r.running:
                st = self.runtime.status(r.runtime_name)
                if not st.running and st.exit_code is not None:
                    r = self._exited(pod, record, r, st.exit_code, st.finished_at)
                    changed = True
            runs.append(r)
        with self._lock:
            record.init_runs = runs
        pending = False
        for container in inits:
            name = str(container.get("name"))
            run = next((r for r in record.init_runs if r.container == name), None)
            sidecar = container.get("restartPolicy") == "Always"
            if run is not None and ((not run.running and run.exit_code == 0) or (sidecar and run.running)):
                continue
            pending = True
            if run is not None and run.running:
                break
            if run is not None:  # it failed
                if policy == "Never":
                    self._active.pop(record.uid, None)
                    self._teardown(record.uid)
                    self._post_terminated(record, "Failed", self._container_statuses(record, pod),
                                          incomplete_init=[str(c.get("name")) for c in inits[inits.index(container):]])
                    raise _NotReady(f"init container {name} failed")
                key = f"{record.uid}/{name}"
                now = self._clock()
                if self.backoff.in_backoff_since(key, run.finished_mono, now):
                    # The back-off supersedes a failed start's error: the kubelet reports each sync's outcome.
                    failed_start = record.start_errors.pop(name, None) is not None
                    if not run.waiting_message or failed_start:
                        message = (f"back-off {duration_text(self.backoff.get(key))} restarting failed container="
                                   f"{name} pod={format_pod(record.namespace, record.name, record.uid)}")
                        self._replace_init(record, replace(run, waiting_message=message))
                        self.events.pod({"namespace": record.namespace, "name": record.name, "uid": record.uid},
                                        "BackOff", f"Back-off restarting failed container {name} in pod "
                                        f"{format_pod(record.namespace, record.name, record.uid)}", container=name)
                        changed = True
                    break
                self.backoff.next(key, run.finished_mono, now)
            self._replace_init(record, self._launch(pod, record, container, run))
            changed = True
            break
        if not pending:
            record.initialized = True
            return
        if changed:
            self._publish(record, {
                "phase": "Pending", "podIP": self._pod_ips.get(record.uid), "podIPs": [{"ip": self._pod_ips.get(record.uid)}],
                "initContainerStatuses": self._init_statuses(record), "containerStatuses": self._container_statuses(record, pod),
            }, incomplete_init=incomplete_init_containers(pod, record.init_runs))
        raise _NotReady("init containers have not completed")

    def _replace_init(self, record: PodRecord, run: ContainerRun) -> None:
        with self._lock:
            record.init_runs = [r for r in record.init_runs if r.container != run.container] + [run]

    def _init_statuses(self, record: PodRecord, pod: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """The init containers' statuses; without a runtime (nothing runs) each one of `pod` as completed."""
        if pod is not None and self._runtime_for(pod) is None:
            return [{"name": c.get("name"), "ready": False, "restartCount": 0, "image": str(c.get("image") or ""),
                     "imageID": "", "started": False, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
                    for c in (pod.get("spec") or {}).get("initContainers") or []]
        with self._lock:
            out = [start_failed_status(r.container, *record.start_errors[r.container], r)
                   if r.container in record.start_errors else container_status(r) for r in record.init_runs]
            names = {r.container for r in record.init_runs}
            failed = [] if pod is None else [str(c.get("name")) for c in (pod.get("spec") or {}).get("initContainers") or []
                                             if c.get("name") not in names and c.get("name") in record.start_errors]
            return out + [start_failed_status(n, *record.start_errors[n], None) for n in failed]

    def _lookup(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.api.try_get(kind, name, namespace=namespace)

    def _context(self, pod: Mapping[str, Any]) -> PodContext:
        if self._allocatable is None:
            node = self.api.try_get("Node", self.node_name) or {}
            self._allocatable = {str(k): str(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()}
        return PodContext(pod, self.node_name, self._pod_ip(pod), self.host_ip, self._allocatable)

    def _pod_ip(self, pod: Mapping[str, Any]) -> str:
        """A pod whose containers all run as host processes (sim.runtime.hostprocess) is on the node's network
        and has its address; every other one gets one of the node's pod IPs."""
        on_host = getattr(self.runtime, "runs_on_host", None)
        containers = (pod.get("spec") or {}).get("containers") or []
        if self.node_address and on_host is not None and containers and all(
                on_host(str(c.get("image") or "")) for c in containers):
            return self.node_address
        return self._pod_ips.get(str((pod.get("metadata") or {}).get("uid")))

    def _cluster_ca(self) -> str | None:
        """The CA the kubelet trusts the API server with (its kubeconfig's), as the cluster's kube-root-ca.crt
        gives pods; None over plain HTTP."""
        path = self.api.client.configuration.ssl_ca_cert
        if not self.api.host.startswith("https://") or not path:
            return None
        try:
            return Path(path).read_text()
        except OSError:
            return None

    def _service_account(self, pod: Mapping[str, Any]) -> tuple[dict[str, str], list[tuple[str, str, bool]]]:
        """The env and mount of the pod's ServiceAccount token (a TokenRequest bound to the pod, as the kubelet
        asks for its projected token volume); none for a pod that does not name its account."""
        if not volumes.wants_token(pod):
            return {}, []
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        try:
            token = self.api.create_token(str(meta.get("namespace")), str(spec["serviceAccountName"]), {
                "expirationSeconds": TOKEN_SECONDS,
                "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": meta.get("name"), "uid": meta.get("uid")}})
        except ApiError as exc:
            raise KubeletError(f'MountVolume.SetUp failed for volume "kube-api-access" : failed to fetch token: '
                               f"{exc.message}") from exc
        directory = volumes.write_token(self.kubelet_dir, pod, token, self._cluster_ca())
        host, _, port = self.api.host.split("://", 1)[-1].rpartition(":")
        return ({"KUBERNETES_SERVICE_HOST": host.strip("[]"), "KUBERNETES_SERVICE_PORT": port},
                [(str(directory), volumes.TOKEN_MOUNT, True)])

    def _set_up_volumes(self, pod: Mapping[str, Any], record: PodRecord) -> None:
        """The pod's emptyDir, configMap and secret volumes (sim.kubelet.volumes); a missing ConfigMap or Secret
        keeps the pod in ContainerCreating with a FailedMount event, retried like any admission failure."""
        try:
            record.volumes = volumes.set_up(self.kubelet_dir, pod, self._lookup)
            return
        except (volumes.VolumeError, OSError) as exc:
            message = str(exc)
        if message != record.last_error:
            self._report_waiting(record, pod, {}, sandbox=False)  # volumes are mounted before the sandbox is made
            self.events.pod({"namespace": record.namespace, "name": record.name, "uid": record.uid}, "FailedMount",
                            message)
        raise KubeletError(message)

    def _check_env(self, pod: Mapping[str, Any], record: PodRecord) -> None:
        """Every container's env can be built (ConfigMaps, Secrets and their keys exist); otherwise the pod stays
        Pending with its containers waiting in CreateContainerConfigError, as the kubelet reports it."""
        spec = pod.get("spec") or {}
        containers = [c for c in spec.get("containers") or [] if isinstance(c, Mapping)]
        ctx = self._context(pod)
        problems: dict[str, str] = {}
        for c in containers:
            try:
                container_env(c, record.legacy, ctx, self._lookup)
            except EnvError as exc:
                problems[str(c.get("name"))] = str(exc)
        if not problems:
            return
        message = "; ".join(problems.values())
        if f"CreateContainerConfigError: {message}" != record.last_error:
            # A container's config is made after the pod's sandbox (and its pod IP).
            self._report_waiting(record, pod, {name: {"reason": "CreateContainerConfigError", "message": problem}
                                               for name, problem in problems.items()}, sandbox=True)
            self.events.pod({"namespace": record.namespace, "name": record.name, "uid": record.uid}, "Failed",
                            f"Error: {message}")
        raise KubeletError(f"CreateContainerConfigError: {message}")

    def _report_waiting(self, record: PodRecord, pod: Mapping[str, Any], waiting: Mapping[str, dict[str, str]], *,
                        sandbox: bool) -> None:
        """The pod Pending before any container started: each container waiting with its entry in `waiting`
        (by container name), ContainerCreating otherwise; `sandbox`: the pod's sandbox, and its pod IP, exist."""
        containers = [c for c in (pod.get("spec") or {}).get("containers") or [] if isinstance(c, Mapping)]
        statuses = [waiting_status(str(c.get("name")), waiting.get(str(c.get("name")), {"reason": "ContainerCreating"}),
                                   image=str(c.get("image") or "")) for c in containers]
        ip = self._pod_ip(pod) if sandbox else None
        addresses = {"podIP": ip, "podIPs": [{"ip": ip}]} if ip else {}
        self._publish(record, {"phase": "Pending", **addresses, "containerStatuses": statuses}, sandbox=sandbox)

    def _publish(self, record: PodRecord, status: dict[str, Any], *, sandbox: bool = True, terminated: str | None = None,
                 incomplete_init: Sequence[str] = ()) -> None:
        """Write the pod's status as the kubelet's status manager does: the conditions from its containerStatuses,
        each keeping its lastTransitionTime while its status stays; startTime as first set; hostIP the node's."""
        now = rfc3339()
        with self._lock:
            record.conditions = pod_conditions(status.get("containerStatuses") or [], now, terminated=terminated,
                                               incomplete_init=incomplete_init, sandbox=sandbox,
                                               previous=record.conditions)
            if not record.start_time:
                record.start_time = now
            full = {**status, "conditions": record.conditions, "startTime": record.start_time, "hostIP": self.host_ip,
                    "hostIPs": [{"ip": self.host_ip}]}
        self.api.patch("Pod", record.name, {"status": full}, namespace=record.namespace, subresource="status")

    def pod_log_path(self, record: PodRecord, container: str, restart: int) -> Path | None:
        """/var/log/pods layout: <dir>/<namespace>_<pod>_<uid>/<container>/<restart>.log (None: the runtime's own)."""
        if self.pod_logs_dir is None:
            return None
        return self.pod_logs_dir / f"{record.namespace}_{record.name}_{record.uid}" / container / f"{restart}.log"

    def _container_statuses(self, record: PodRecord, pod: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """The runs' statuses, a container whose latest start failed waiting with its error; with `pod`, its
        containers not started yet too (waiting PodInitializing, ContainerCreating once the pod is initialized)."""
        with self._lock:
            errors = dict(record.start_errors)
            out = [start_failed_status(c.container, *errors[c.container], c) if c.container in errors
                   else container_status(c) for c in record.containers]
        started = {s["name"] for s in out}
        pending = "ContainerCreating" if record.initialized else "PodInitializing"
        for c in (pod or {}).get("spec", {}).get("containers") or []:
            name = str(c.get("name"))
            if name in started:
                continue
            image = str(c.get("image") or "")
            out.append(start_failed_status(name, *errors[name], None, image=image) if name in errors
                       else waiting_status(name, {"reason": pending}, image=image))
        return out

    def _check_containers(self, uid: str) -> None:
        """Notice exited containers: restart them per restartPolicy once their back-off allows (CrashLoopBackOff
        until then, with a BackOff event), or end the pod Succeeded/Failed."""
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
                    c = self._exited(pod, record, c, status.exit_code, status.finished_at)
                    self._stop_probes(uid, c.runtime_name)
                    changed = True
                    log.info("event=container-exited node=%s pod=%s/%s container=%s exit_code=%d", self.node_name,
                             record.namespace, record.name, c.container, status.exit_code)
                else:
                    if c.seen is None:
                        seen = self.runtime.seen(c.runtime_name)
                        if seen is not None:
                            c = replace(c, seen=seen)
                    probed = self._probed(record, c)
                    changed = changed or (probed.running, probed.ready, probed.started) != (c.running, c.ready, c.started)
                    c = probed
            runs.append(c)
        policy = str((pod.get("spec") or {}).get("restartPolicy") or "Always")
        now = self._clock()
        restart = set()
        for i, c in enumerate(runs):
            if not will_restart(policy, c):
                continue
            key = f"{uid}/{c.container}"
            if self.backoff.in_backoff_since(key, c.finished_mono, now):
                # The back-off supersedes a failed restart's error: the kubelet reports each sync's outcome.
                failed_start = record.start_errors.pop(c.container, None) is not None
                if not c.waiting_message or failed_start:
                    message = (f"back-off {duration_text(self.backoff.get(key))} restarting failed container="
                               f"{c.container} pod={format_pod(record.namespace, record.name, uid)}")
                    runs[i] = replace(c, waiting_message=message)
                    changed = True
                    self.events.pod({"namespace": record.namespace, "name": record.name, "uid": uid}, "BackOff",
                                    f"Back-off restarting failed container {c.container} in pod "
                                    f"{format_pod(record.namespace, record.name, uid)}", container=c.container)
                continue
            self.backoff.next(key, c.finished_mono, now)
            restart.add(c.container)
        with self._lock:
            record.containers = runs
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
            self._publish_running(record)
            return
        self._active.pop(uid, None)
        self._teardown(uid)  # the kubelet unprepares a terminated pod's claims; its containers stay for logs
        self._post_terminated(record, phase, self._container_statuses(record))

    def _publish_running(self, record: PodRecord) -> None:
        """The status of a started pod whose containers run or restart."""
        self._publish(record, {"phase": running_phase(record.containers),
                               "containerStatuses": self._container_statuses(record),
                               "initContainerStatuses": self._init_statuses(record)})

    def _post_terminated(self, record: PodRecord, phase: str, statuses: list[dict[str, Any]],
                         incomplete_init: Sequence[str] = ()) -> None:
        # The kubelet stops a terminated pod's sandbox: PodReadyToStartContainers goes False.
        self._publish(record, {"phase": phase, "containerStatuses": statuses,
                               "initContainerStatuses": self._init_statuses(record)},
                      sandbox=False, terminated=phase, incomplete_init=incomplete_init)
        with self._lock:
            record.phase = phase
        log.info("event=pod-%s node=%s pod=%s/%s", phase.lower(), self.node_name, record.namespace, record.name)

    def _terminate(self, pod: Mapping[str, Any]) -> None:
        """A deleted pod: stop its containers (SIGTERM, SIGKILL after the grace period) off the worker thread, so
        that the node's other pods go on meanwhile; `_terminated` follows once they are stopped."""
        uid = str(pod["metadata"]["uid"])
        self._active.pop(uid, None)
        self._pods.pop(uid, None)
        if uid in self._terminating:
            self._shorten(uid, kill_grace_seconds(pod))
            return
        self._terminating[uid] = dict(pod)
        self._stop_probes(uid)
        with self._lock:
            record = self.records.get(uid)
            runs = [*record.init_runs, *record.containers] if record is not None else []
            killing = [c.container for c in record.containers if c.running] if record is not None else []
            if record is not None:
                now = self._clock()
                record.containers = [c.killed(now) if c.running else c for c in record.containers]
        if self.runtime is None or not runs:
            self._terminated(uid)
            return
        assert record is not None
        for cname in killing:
            self.events.pod({"namespace": record.namespace, "name": record.name, "uid": uid}, "Killing",
                            f"Stopping container {cname}", warning=False, container=cname)
        grace = kill_grace_seconds(pod)
        log.info("event=pod-stopping node=%s pod=%s/%s grace_seconds=%d", self.node_name, record.namespace,
                 record.name, grace)
        names = [r.runtime_name for r in runs]
        with self._lock:
            self._stopping[uid] = (names, self._clock() + grace)

        def stop_all() -> None:
            stoppers = [threading.Thread(target=self._stop_container, args=(pod, r.runtime_name, r.container, grace),
                                         kwargs={"hook": r.running}, daemon=True) for r in runs]
            for t in stoppers:
                t.start()
            for t in stoppers:
                t.join()
            with self._lock:
                self._stopping.pop(uid, None)
            self._events.put(("STOPPED", {"metadata": {"uid": uid}}))
        self._background(f"stop-{uid[:8]}", stop_all)

    def _shorten(self, uid: str, grace: int) -> None:
        """A later delete shortened the grace period (or forced the pod out): SIGKILL comes `grace` seconds from
        now if that is sooner, as the kubelet restarts a pod's termination with the shorter period."""
        with self._lock:
            stopping = self._stopping.get(uid)
            if stopping is None or self.runtime is None or self._clock() + grace >= stopping[1]:
                return
            names = stopping[0]
            self._stopping[uid] = (names, self._clock() + grace)
        log.info("event=pod-stop-shortened node=%s uid=%s grace_seconds=%d", self.node_name, uid, grace)
        runtime = self.runtime

        def kill_later() -> None:
            if not self._stop.wait(grace):
                for name in names:
                    runtime.kill(name)
        self._background(f"kill-{uid[:8]}", kill_later)

    def _background(self, name: str, target: Callable[..., None], *args: Any) -> None:
        """A container stop that may take its whole grace period, off the worker thread; `stop` waits for them."""
        t = threading.Thread(target=target, args=args, name=f"kubelet-{self.node_name}-{name}", daemon=True)
        with self._lock:
            self._stoppers = [s for s in self._stoppers if s.is_alive()] + [t]
        t.start()

    def _stop_container(self, pod: Mapping[str, Any], name: str, cname: str, grace: int, *, hook: bool = True) -> None:
        """Stop one container as the kubelet's killContainer does: its preStop hook first (`hook`: it is running),
        within the grace period, then SIGTERM with what is left of it (never under MIN_KILL_GRACE_SECONDS)."""
        assert self.runtime is not None
        container = next((c for c in (pod.get("spec") or {}).get("containers") or []
                          if isinstance(c, Mapping) and c.get("name") == cname), None)
        pre_stop = hooks.handler(container, hooks.PRE_STOP) if hook and container is not None else None
        if container is not None and pre_stop is not None:
            started = self._clock()
            error = hooks.run(self.runtime, name, container, self._pod_ip(pod), pre_stop, grace, self._stop)
            if error is not None:
                log.warning("event=pre-stop-hook-failed node=%s container=%s error=%r", self.node_name, name, error)
                self.events.pod(_pod_ref(pod), *hooks.FAILED[hooks.PRE_STOP], container=cname)
            grace = max(int(grace - (self._clock() - started)), MIN_KILL_GRACE_SECONDS)
        try:
            self.runtime.remove(name, grace_seconds=grace)
        except RuntimeError_ as exc:
            log.warning("event=container-remove-failed node=%s container=%s error=%r", self.node_name, name, str(exc))

    def _post_start(self, pod: Mapping[str, Any], name: str, container: Mapping[str, Any],
                    action: Mapping[str, Any]) -> None:
        """A container's postStart hook; when it fails the container is killed (and restarted per restartPolicy)."""
        assert self.runtime is not None
        error = hooks.run(self.runtime, name, container, self._pod_ip(pod), action, POST_START_TIMEOUT_SECONDS,
                          self._stop)
        if self._stop.is_set():
            return
        if error is not None:
            log.warning("event=post-start-hook-failed node=%s container=%s error=%r", self.node_name, name, error)
        self._events.put(("POST_START_FAILED" if error is not None else "POST_START_DONE",
                          {"metadata": pod.get("metadata") or {}, "container": name}))

    def _post_start_done(self, uid: str, name: str) -> None:
        """On the worker: the container's postStart hook succeeded, so the start is over and the container shows
        running (and the pod Running, when this was its first start)."""
        with self._lock:
            record = self.records.get(uid)
            run = next((c for c in record.containers if c.runtime_name == name and c.hook_running), None) if record else None
            if record is None or run is None or uid not in self._active:
                return  # stopped meanwhile (the pod deleted, or the container exited)
            record.containers = [replace(c, hook_running=False) if c is run else c for c in record.containers]
        self._publish_running(record)

    def _post_start_failed(self, uid: str, name: str) -> None:
        """On the worker: the container whose postStart hook failed is marked exited and killed, as the kubelet
        kills it (FailedPostStartHook); its restart follows from restartPolicy and the back-off."""
        pod = self._active.get(uid)
        with self._lock:
            record = self.records.get(uid)
            run = next((c for c in record.containers if c.runtime_name == name and c.running), None) if record else None
            if record is None or run is None or pod is None:
                return  # stopped meanwhile (the pod deleted, or the container exited)
            record.containers = [c.killed(self._clock()) if c is run else c for c in record.containers]
        self._stop_probes(uid, name)
        self.events.pod(_pod_ref(pod), *hooks.FAILED[hooks.POST_START], container=run.container)
        self.events.pod(_pod_ref(pod), "Killing", "FailedPostStartHook", warning=False, container=run.container)
        self._background(f"stop-{name}", self._stop_container, pod, name, run.container, kill_grace_seconds(pod))

    def _terminated(self, uid: str) -> None:
        """A deleted pod's containers are stopped: unprepare its claims (retried by the resync until that
        succeeds; the pod stays Terminating meanwhile), report it terminal and delete it for good, then free what
        the node held for it."""
        pod = self._terminating.get(uid)
        if pod is None:
            return
        self._teardown(uid)
        if uid in self._unprepare_pending:
            return
        meta = pod.get("metadata") or {}
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        if uid not in self._gone:
            record = self._record(pod)
            statuses = self._container_statuses(record)
            phase = "Succeeded" if statuses and all(
                (s.get("state") or {}).get("terminated", {}).get("exitCode") == 0 for s in statuses) else "Failed"
            try:
                self._post_terminated(record, phase, statuses)
                self.api.delete("Pod", name, namespace=namespace, uid=uid, grace_period_seconds=0)
            except (NotFound, Conflict):
                pass  # gone already: deleted for good, or replaced by a pod of the same name (the uid differs)
            except ApiError as exc:  # the API server away: the resync tries again
                log.warning("event=pod-delete-failed node=%s pod=%s/%s error=%r", self.node_name, namespace, name,
                            str(exc))
                self._unprepare_pending.add(uid)
                return
        del self._terminating[uid]
        self._gone.discard(uid)
        with self._lock:
            if (record := self.records.get(uid)) is not None:
                record.removed = True
        self.backoff.forget(f"{uid}/")
        self.events.forget(uid)
        self._pod_ips.release(uid)
        volumes.tear_down(self.kubelet_dir, uid)
        log.info("event=pod-terminated node=%s pod=%s/%s", self.node_name, namespace, name)

    def _admit(self, pod: Mapping[str, Any], record: PodRecord) -> None:
        uid = record.uid
        names = pod_claim_names(pod)
        if names is None:
            raise _NotReady("waiting for the pod's generated ResourceClaim names in status.resourceClaimStatuses")
        infos: list[ClaimInfo] = []
        # Claims of other drivers (compute-domain.nvidia.com): one NodePrepareResources call per driver, as the
        # kubelet's DRA manager makes; their state is not in the claim-state file (restart recovery is the GPU's).
        others: dict[str, list[ClaimInfo]] = {}
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
            for driver in dict.fromkeys(str(r.get("driver")) for r in results):
                info = ClaimInfo(record.namespace, str(claim["metadata"]["uid"]), name)
                if driver == self.driver_name:
                    infos.append(info)
                else:
                    others.setdefault(driver, []).append(info)
        prepared: list[PreparedClaim] = []
        if infos:
            sim_pod = self._sim_pods.get(uid)
            if sim_pod is None:
                sim_pod = Pod(record.name, infos)
                self._sim_pods[uid] = sim_pod
            try:
                self.sim.sync()  # a re-registered plugin (restart) is picked up before the call, as inotify would
                self.sim.prepare_pod(self.driver_name, sim_pod)
                self._save_claim_state()
            except KubeletError as exc:
                raise _PrepareFailed(str(exc)) from exc
            prepared += [PreparedClaim(c, tuple(sim_pod.prepared[c.uid])) for c in infos]
        for driver, driver_infos in others.items():
            pods = self._other_pods.setdefault(uid, {})
            other_pod = pods.get(driver)
            if other_pod is None:
                other_pod = Pod(record.name, driver_infos)
                pods[driver] = other_pod
            try:
                self.sim.sync()
                self.sim.prepare_pod(driver, other_pod)
            except KubeletError as exc:
                raise _PrepareFailed(str(exc)) from exc
            prepared += [PreparedClaim(c, tuple(other_pod.prepared[c.uid])) for c in driver_infos]
        if prepared:
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
        """Unprepare the pod's claims; a failure (the agent down or restarting) is retried with a back-off by the
        resync until it succeeds, as the kubelet never gives up a terminated pod's cleanup."""
        for driver, other_pod in list((self._other_pods.get(uid) or {}).items()):
            if not other_pod.prepared:
                continue
            try:
                self.sim.sync()
                self.sim.unprepare_pod(driver, other_pod)
            except KubeletError as exc:
                log.warning("event=unprepare-failed node=%s pod=%s driver=%s error=%r", self.node_name, other_pod.name,
                            driver, str(exc))
                return  # retried on the next resync, as the kubelet never gives up a terminated pod's cleanup
        self._other_pods.pop(uid, None)
        sim_pod = self._sim_pods.get(uid)
        with self._lock:
            record = self.records.get(uid)
        if sim_pod is not None and sim_pod.prepared:
            try:
                self.sim.sync()  # a restarted agent's new socket, as the plugin watcher's inotify would see it
                self.sim.unprepare_pod(self.driver_name, sim_pod)
            except KubeletError as exc:
                assert record is not None  # a pod's record is made before its claims are prepared
                record.unprepare_failures += 1
                wait = min(MAX_UNPREPARE_RETRY_SECONDS, FIRST_UNPREPARE_RETRY_SECONDS * 2 ** (record.unprepare_failures - 1))
                record.unprepare_at = self._clock() + wait
                self._unprepare_pending.add(uid)
                log.warning("event=unprepare-failed node=%s pod=%s failures=%d retry_in=%.1fs error=%r", self.node_name,
                            sim_pod.name, record.unprepare_failures, wait, str(exc))
                return
            if record is not None and record.unprepare_failures:
                log.info("event=unprepare-retried node=%s pod=%s failures=%d", self.node_name, sim_pod.name,
                         record.unprepare_failures)
        self._unprepare_pending.discard(uid)
        if self._sim_pods.pop(uid, None) is not None:
            self._save_claim_state()
        with self._lock:
            if record is not None:
                record.unprepared = True
                record.unprepare_failures = 0
        if record is not None and record.legacy and self.device_manager is not None:
            self.device_manager.remove_pod(uid)  # a terminated pod's device plugin devices are free again

    def _finish(self, namespace: str, name: str) -> None:
        try:
            pod = self.api.get("Pod", name, namespace=namespace)
        except NotFound:
            return
        uid = str(pod["metadata"]["uid"])
        self._teardown(uid)
        finished = rfc3339()
        containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
        record = self._record(pod)
        self._post_terminated(record, "Succeeded", [
            {"name": n, "ready": False, "restartCount": 0, "image": "", "imageID": "", "started": False,
             "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": finished}}}
            for n in containers
        ])


class _NotReady(Exception):
    """The pod cannot be admitted yet; retried on the next event or tick."""



class _PrepareFailed(KubeletError):
    """NodePrepareResources failed (FailedPrepareDynamicResources); retried like any admission failure."""


class _StartFailed(KubeletError):
    """A container could not be created (the kubelet's CreateContainerConfigError or CreateContainerError); its
    status says so (PodRecord.start_errors) and the start is retried."""


class _NodeStreams:
    """The node's containers as the streaming server (sim.kubelet.execserver) reaches them."""

    def __init__(self, kubelet: NodeKubelet) -> None:
        self.kubelet = kubelet

    def _runtime(self) -> ContainerRuntime:
        assert self.kubelet.runtime is not None  # the streaming server exists only with a runtime
        return self.kubelet.runtime

    def exec_argv(self, namespace: str, pod: str, container: str, command: Sequence[str], tty: bool) -> list[str] | None:
        name = self.kubelet.container_runtime_name(namespace, pod, container or None)
        return self._runtime().exec_argv(name, command, tty=tty) if name is not None else None

    def attach_argv(self, namespace: str, pod: str, container: str, stdin: bool) -> tuple[list[str], bool] | None:
        name = self.kubelet.container_runtime_name(namespace, pod, container or None)
        if name is None:
            return None
        has_stdin, has_tty = self._runtime().tty_of(name)
        argv = self._runtime().attach_argv(name, stdin=stdin and has_stdin)
        return (argv, has_tty) if argv is not None else None

    def pod_uid(self, namespace: str, pod: str) -> str | None:
        found = self.kubelet.running_container_names(namespace, pod)
        return found[0] if found is not None else None

    def dial(self, namespace: str, pod: str, port: int) -> socket.socket:
        # The simulated pod has no shared sandbox: each container has its own loopback-only network namespace,
        # so the port is looked for in each running container's, in the pod's order.
        found = self.kubelet.running_container_names(namespace, pod)
        pids = [pid for name in (found[1] if found else []) if (pid := self._runtime().network_pid(name)) is not None]
        if not pids:
            raise netns.DialError(f"failed to find the network namespace of pod {namespace}/{pod}: no container "
                                  "is running")
        errors: list[str] = []
        for pid in pids:
            try:
                return netns.dial(pid, port)
            except netns.DialError as exc:
                errors.append(str(exc))
        raise netns.DialError(f"failed to connect to localhost:{port} inside the network namespace of pod "
                              f"{namespace}/{pod}, IPv4: {errors[0]}")
