"""Server-side printing (`meta.k8s.io/v1` Table), as kube-apiserver's printers produce it.

Columns, their types and priorities, and the cell formats follow Kubernetes' pkg/printers/internalversion
printers for the kinds served here; like kube-apiserver, every row carries the wide (priority 1) cells too
and kubectl hides them unless `-o wide`. Kinds without a printer get Name and Age, as upstream's default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from gpudra.timestamps import parse_rfc3339
from controlplane.crds import columns as crd_columns
from controlplane.resources import ResourceType
from controlplane.workloadtables import printers as workload_printers

INCLUDE_OBJECT = ("None", "Metadata", "Object")
# Descriptions kube-apiserver attaches to the two columns every table has (ObjectMeta's swagger docs).
_NAME_DOC = ("Name must be unique within a namespace. Is required when creating resources, although some "
             "resources may allow a client to request the generation of an appropriate name automatically. "
             "Name is primarily intended for creation idempotence and configuration definition. Cannot be "
             "updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names")
_AGE_DOC = ("CreationTimestamp is a timestamp representing the server time when this object was created. It is "
            "not guaranteed to be set in happens-before order across separate operations. Clients may not set "
            "this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. "
            "Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/"
            "api-conventions.md#metadata")


def wants_table(accept: str | None) -> bool:
    return bool(accept) and "as=Table" in accept  # type: ignore[operator]


def human_duration(seconds_total: float) -> str:
    """apimachinery's duration.HumanDuration."""
    seconds = int(seconds_total)
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        s = seconds % 60
        return f"{minutes}m" if s == 0 else f"{minutes}m{s}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = seconds // 3600
    if hours < 8:
        m = minutes % 60
        return f"{hours}h" if m == 0 else f"{hours}h{m}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        h = hours % 24
        return f"{hours // 24}d" if h == 0 else f"{hours // 24}d{h}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        dy = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if dy == 0 else f"{hours // 24 // 365}y{dy}d"
    return f"{hours // 24 // 365}y"


def since(timestamp: Any, now: datetime | None = None) -> str:
    """translateTimestampSince: `<unknown>` for an absent time."""
    then = parse_rfc3339(timestamp)
    if then is None:
        return "<unknown>"
    return human_duration(((now or datetime.now(timezone.utc)) - then).total_seconds())


def _get(obj: Any, *path: str) -> Any:
    cur: Any = obj
    for p in path:
        cur = cur.get(p) if isinstance(cur, dict) else None
    return cur


def _list(obj: Any, *path: str) -> list[Any]:
    value = _get(obj, *path)
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _or_none(value: Any) -> Any:
    return "<none>" if value in (None, "") else value


# ----- pods ------------------------------------------------------------------------------------------------------


def _later(a: datetime | None, b: datetime | None) -> datetime | None:
    return b if a is None or (b is not None and b > a) else a


def _pod_cells(pod: dict[str, Any], now: datetime) -> list[Any]:
    status = pod.get("status")
    if not isinstance(status, dict):
        status = {}
    total = len(_list(pod, "spec", "containers"))
    reason = status.get("phase") or ""
    if status.get("reason"):
        reason = status["reason"]
    for cond in _list(status, "conditions"):
        if cond.get("type") == "PodScheduled" and cond.get("reason") == "SchedulingGated":
            reason = "SchedulingGated"
    init_specs = {c.get("name"): c for c in _list(pod, "spec", "initContainers")}
    sidecars = {name for name, c in init_specs.items() if c.get("restartPolicy") == "Always"}
    total += len(sidecars)
    restarts = sidecar_restarts = 0
    last_restart: datetime | None = None
    last_sidecar_restart: datetime | None = None
    ready = 0
    initializing = False
    init_statuses = _list(status, "initContainerStatuses")
    for i, cs in enumerate(init_statuses):
        restarts += int(cs.get("restartCount") or 0)
        finished = parse_rfc3339(_get(cs, "lastState", "terminated", "finishedAt"))
        last_restart = _later(last_restart, finished)
        if cs.get("name") in sidecars:
            sidecar_restarts += int(cs.get("restartCount") or 0)
            last_sidecar_restart = _later(last_sidecar_restart, finished)
        terminated = _get(cs, "state", "terminated")
        waiting_reason = _get(cs, "state", "waiting", "reason")
        if isinstance(terminated, dict) and int(terminated.get("exitCode") or 0) == 0:
            continue
        if cs.get("name") in sidecars and cs.get("started"):
            ready += 1 if cs.get("ready") else 0
            continue
        if isinstance(terminated, dict):
            if terminated.get("reason"):
                reason = "Init:" + terminated["reason"]
            elif terminated.get("signal"):
                reason = f"Init:Signal:{terminated['signal']}"
            else:
                reason = f"Init:ExitCode:{terminated.get('exitCode', 0)}"
        elif waiting_reason and waiting_reason != "PodInitializing":
            reason = "Init:" + waiting_reason
        else:
            reason = f"Init:{i}/{len(init_specs)}"
        initializing = True
        break
    initialized = any(c.get("type") == "Initialized" and c.get("status") == "True"
                      for c in _list(status, "conditions"))
    if not initializing or initialized:
        reason, restarts, last_restart, ready = _container_states(status, reason, sidecar_restarts,
                                                                  last_sidecar_restart, ready)
    return _pod_row(pod, status, ready, total, reason, restarts, last_restart, now)


def _container_states(status: dict[str, Any], reason: str, restarts: int, last_restart: datetime | None,
                      ready: int) -> tuple[str, int, datetime | None, int]:
    """The regular containers, last first: their restarts, readiness and the reason the last one gives."""
    has_running = False
    for cs in reversed(_list(status, "containerStatuses")):
        restarts += int(cs.get("restartCount") or 0)
        last_restart = _later(last_restart, parse_rfc3339(_get(cs, "lastState", "terminated", "finishedAt")))
        state = cs.get("state")
        if not isinstance(state, dict):
            state = {}
        waiting, terminated = state.get("waiting"), state.get("terminated")
        if isinstance(waiting, dict) and waiting.get("reason"):
            reason = waiting["reason"]
        elif isinstance(terminated, dict) and terminated.get("reason"):
            reason = terminated["reason"]
        elif isinstance(terminated, dict):
            reason = (f"Signal:{terminated['signal']}" if terminated.get("signal")
                      else f"ExitCode:{terminated.get('exitCode', 0)}")
        elif cs.get("ready") and isinstance(state.get("running"), dict):
            has_running = True
            ready += 1
    if reason == "Completed" and has_running:
        ready_cond = any(c.get("type") == "Ready" and c.get("status") == "True" for c in _list(status, "conditions"))
        reason = "Running" if ready_cond else "NotReady"
    return reason, restarts, last_restart, ready


def _pod_row(pod: dict[str, Any], status: dict[str, Any], ready: int, total: int, reason: str, restarts: int,
             last_restart: datetime | None, now: datetime) -> list[Any]:
    if _get(pod, "metadata", "deletionTimestamp"):
        if status.get("reason") == "NodeLost":
            reason = "Unknown"
        elif status.get("phase") not in ("Succeeded", "Failed"):
            reason = "Terminating"
    restarts_text = str(restarts)
    if restarts and last_restart is not None:
        restarts_text = f"{restarts} ({human_duration((now - last_restart).total_seconds())} ago)"
    ips = _list(status, "podIPs")
    ip = (ips[0].get("ip") if ips else None) or status.get("podIP")
    gates = _list(pod, "spec", "readinessGates")
    if gates:
        true_conds = {c.get("type") for c in _list(status, "conditions") if c.get("status") == "True"}
        gates_text = f"{sum(1 for g in gates if g.get('conditionType') in true_conds)}/{len(gates)}"
    else:
        gates_text = "<none>"
    return [_get(pod, "metadata", "name"), f"{ready}/{total}", reason, restarts_text,
            since(_get(pod, "metadata", "creationTimestamp"), now), _or_none(ip),
            _or_none(_get(pod, "spec", "nodeName")), _or_none(status.get("nominatedNodeName")), gates_text]


def _pod_conditions(pod: dict[str, Any]) -> list[dict[str, Any]] | None:
    phase = _get(pod, "status", "phase")
    if phase == "Succeeded":
        return [{"type": "Completed", "status": "True", "reason": "Succeeded",
                 "message": "The pod has completed successfully."}]
    if phase == "Failed":
        return [{"type": "Completed", "status": "True", "reason": "Failed", "message": "The pod failed."}]
    return None


# ----- nodes -----------------------------------------------------------------------------------------------------


def node_status_text(node: dict[str, Any]) -> str:
    status = []
    for cond in _list(node, "status", "conditions"):
        if cond.get("type") == "Ready":
            status = ["Ready" if cond.get("status") == "True" else "NotReady"]
    if not status:
        status = ["Unknown"]
    if _get(node, "spec", "unschedulable"):
        status.append("SchedulingDisabled")
    return ",".join(status)


def node_roles(node: dict[str, Any]) -> list[str]:
    roles = set()
    for key, value in (_get(node, "metadata", "labels") or {}).items():
        if key.startswith("node-role.kubernetes.io/") and key[len("node-role.kubernetes.io/"):]:
            roles.add(key[len("node-role.kubernetes.io/"):])
        elif key == "kubernetes.io/role" and value:
            roles.add(value)
    return sorted(roles)


def _node_cells(node: dict[str, Any], now: datetime) -> list[Any]:
    info = _get(node, "status", "nodeInfo") or {}
    internal = next((a.get("address") for a in _list(node, "status", "addresses") if a.get("type") == "InternalIP"),
                    None)
    external = next((a.get("address") for a in _list(node, "status", "addresses") if a.get("type") == "ExternalIP"),
                    None)
    return [_get(node, "metadata", "name"), node_status_text(node), ",".join(node_roles(node)) or "<none>",
            since(_get(node, "metadata", "creationTimestamp"), now), info.get("kubeletVersion") or "",
            _or_none(internal), _or_none(external), info.get("osImage") or "<unknown>",
            info.get("kernelVersion") or "<unknown>", info.get("containerRuntimeVersion") or "<unknown>"]


# ----- events ----------------------------------------------------------------------------------------------------


def _event_cells(ev: dict[str, Any], now: datetime) -> list[Any]:
    first = since(ev.get("firstTimestamp"), now) if ev.get("firstTimestamp") else since(ev.get("eventTime"), now)
    last = since(ev.get("lastTimestamp"), now) if ev.get("lastTimestamp") else first
    count = ev.get("count") or 0
    series = ev.get("series")
    if isinstance(series, dict):
        last = since(series.get("lastObservedTime"), now)
        count = series.get("count") or 0
    elif not count:
        count = 1
    kind = str(_get(ev, "involvedObject", "kind") or "").lower()
    name = _get(ev, "involvedObject", "name")
    target = f"{kind}/{name}" if name else kind
    component = _get(ev, "source", "component") or ev.get("reportingComponent") or ""
    instance = _get(ev, "source", "host") or ev.get("reportingInstance") or ""
    source = f"{component}, {instance}" if instance else component
    return [last, ev.get("type") or "", ev.get("reason") or "", target,
            _get(ev, "involvedObject", "fieldPath") or "", source, str(ev.get("message") or "").strip(), first,
            int(count), _get(ev, "metadata", "name")]


# ----- the rest --------------------------------------------------------------------------------------------------


def _quota_cells(quota: dict[str, Any], now: datetime) -> list[Any]:
    # What the quota controller has recorded (status.hard), as upstream prints it: nothing before it has run.
    requests: list[str] = []
    limits: list[str] = []
    used = _get(quota, "status", "used") or {}
    hard = _get(quota, "status", "hard") or {}
    for resource in sorted(hard):
        text = f"{resource}: {used.get(resource, '0')}/{hard.get(resource, '0')}"
        (limits if resource.split(".")[0] == "limits" and "." in resource else requests).append(text)
    return [_get(quota, "metadata", "name"), ", ".join(requests), ", ".join(limits),
            since(_get(quota, "metadata", "creationTimestamp"), now)]


def claim_state(claim: dict[str, Any]) -> str:
    states = []
    deleted = bool(_get(claim, "metadata", "deletionTimestamp"))
    if deleted:
        states.append("deleted")
    if _get(claim, "status", "allocation") is None:
        if not deleted:
            states.append("pending")
    else:
        states.append("allocated")
        if _get(claim, "status", "reservedFor"):
            states.append("reserved")
    return ",".join(states)


def _external_ip(svc: dict[str, Any]) -> str:
    spec = svc.get("spec") or {}
    kind = spec.get("type") or "ClusterIP"
    if kind == "ExternalName":
        return str(spec.get("externalName") or "<none>")
    ips = list(spec.get("externalIPs") or [])
    if kind == "LoadBalancer":
        ingress = [i.get("ip") or i.get("hostname") for i in _get(svc, "status", "loadBalancer", "ingress") or []]
        ips += [i for i in ingress if i]
        return ",".join(ips) if ips else "<pending>"
    return ",".join(ips) if ips else "<none>"


def _service_ports(svc: dict[str, Any]) -> str:
    out = []
    for port in _get(svc, "spec", "ports") or []:
        node = f":{port['nodePort']}" if port.get("nodePort") else ""
        out.append(f"{port.get('port')}{node}/{port.get('protocol') or 'TCP'}")
    return ",".join(out) or "<none>"


def _slice_ports(eps: dict[str, Any]) -> str:
    ports = [str(p.get("port")) for p in eps.get("ports") or [] if p.get("port") is not None]
    return ",".join(ports) if ports else "<unset>"


def _slice_endpoints(eps: dict[str, Any]) -> str:
    addresses = [a for e in eps.get("endpoints") or [] for a in e.get("addresses") or []]
    if not addresses:
        return "<unset>"
    shown = ",".join(addresses[:3])
    return shown + (f" + {len(addresses) - 3} more..." if len(addresses) > 3 else "")


def _int_or_na(value: Any) -> str:
    return "N/A" if value is None else str(value)


def _age(obj: dict[str, Any], now: datetime) -> str:
    return since(_get(obj, "metadata", "creationTimestamp"), now)


@dataclass(frozen=True)
class Printer:
    """One kind's columns: (name, type, priority, description) and the cells of a row, in that order."""

    columns: tuple[tuple[str, str, int, str], ...]
    cells: Callable[[dict[str, Any], datetime], list[Any]]


_NAME = ("Name", "string", 0, _NAME_DOC)
_AGE = ("Age", "string", 0, _AGE_DOC)

PRINTERS: dict[str, Printer] = {
    "Pod": Printer((
        _NAME,
        ("Ready", "string", 0, "The aggregate readiness state of this pod for accepting traffic."),
        ("Status", "string", 0, "The aggregate status of the containers in this pod."),
        ("Restarts", "string", 0, "The number of times the containers in this pod have been restarted and "
                                  "when the last container in this pod has restarted."),
        _AGE,
        ("IP", "string", 1, "podIP address allocated to the pod. Routable at least within the cluster. Empty if "
                            "not yet allocated."),
        ("Node", "string", 1, "NodeName indicates in which node this pod is scheduled."),
        ("Nominated Node", "string", 1, "nominatedNodeName is set only when this pod preempts other pods on the "
                                        "node."),
        ("Readiness Gates", "string", 1, "If specified, all readiness gates will be evaluated for pod readiness."),
    ), _pod_cells),
    "Node": Printer((
        _NAME,
        ("Status", "string", 0, "The status of the node"),
        ("Roles", "string", 0, "The roles of the node"),
        _AGE,
        ("Version", "string", 0, "Kubelet Version reported by the node."),
        ("Internal-IP", "string", 1, "List of addresses reachable to the node."),
        ("External-IP", "string", 1, "List of addresses reachable to the node."),
        ("OS-Image", "string", 1, "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 "
                                  "(wheezy))."),
        ("Kernel-Version", "string", 1, "Kernel Version reported by the node from 'uname -r'."),
        ("Container-Runtime", "string", 1, "ContainerRuntime Version reported by the node through runtime remote "
                                           "API (e.g. containerd://1.4.2)."),
    ), _node_cells),
    "Event": Printer((
        ("Last Seen", "string", 0, "The time at which the most recent occurrence of this event was recorded."),
        ("Type", "string", 0, "Type of this event (Normal, Warning), new types could be added in the future"),
        ("Reason", "string", 0, "This should be a short, machine understandable string that gives the reason "
                                "for the transition into the object's current status."),
        ("Object", "string", 0, "The object that this event is about."),
        ("Subobject", "string", 1, "If the referent is a portion of an object, the path to that portion."),
        ("Source", "string", 1, "The component reporting this event. Should be a short machine understandable "
                                "string."),
        ("Message", "string", 0, "A human-readable description of the status of this operation."),
        ("First Seen", "string", 1, "The time at which the event was first recorded. (Time of server receipt is "
                                    "in TypeMeta.)"),
        ("Count", "string", 1, "The number of times this event has occurred."),
        ("Name", "string", 1, _NAME_DOC),
    ), _event_cells),
    "Namespace": Printer((_NAME, ("Status", "string", 0, "The status of the namespace"), _AGE),
                         lambda o, now: [_get(o, "metadata", "name"), _get(o, "status", "phase") or "", _age(o, now)]),
    "ResourceQuota": Printer((
        _NAME,
        ("Request", "string", 0, "Request represents a minimum amount of cpu/memory that a container may consume."),
        ("Limit", "string", 0, "Limits control the maximum amount of cpu/memory that a container may use "
                               "independent of contention on the node."),
        _AGE,
    ), _quota_cells),
    "Lease": Printer((_NAME, ("Holder", "string", 0, "The holder of the lease"), _AGE),
                     lambda o, now: [_get(o, "metadata", "name"), _get(o, "spec", "holderIdentity") or "",
                                     _age(o, now)]),
    "Service": Printer((
        _NAME,
        ("Type", "string", 0, "type determines how the Service is exposed."),
        ("Cluster-IP", "string", 0, "clusterIP is the IP address of the service."),
        ("External-IP", "string", 0, "The list of external IPs of the service."),
        ("Port(s)", "string", 0, "The list of ports that are exposed by this service."),
        _AGE,
        ("Selector", "string", 1, "Route service traffic to pods with label keys and values matching this "
                                  "selector."),
    ), lambda o, now: [_get(o, "metadata", "name"), _get(o, "spec", "type") or "ClusterIP",
                       _get(o, "spec", "clusterIP") or "<none>", _external_ip(o), _service_ports(o), _age(o, now),
                       ",".join(f"{k}={v}" for k, v in sorted((_get(o, "spec", "selector") or {}).items())) or "<none>"]),
    "EndpointSlice": Printer((
        _NAME,
        ("AddressType", "string", 0, "addressType specifies the type of address carried by this EndpointSlice."),
        ("Ports", "string", 0, "ports specifies the list of network ports exposed by each endpoint in this slice."),
        ("Endpoints", "string", 0, "endpoints is a list of unique endpoints in this slice."),
        _AGE,
    ), lambda o, now: [_get(o, "metadata", "name"), o.get("addressType") or "", _slice_ports(o), _slice_endpoints(o),
                       _age(o, now)]),
    "PodDisruptionBudget": Printer((
        _NAME,
        ("Min Available", "string", 0, "The minimum number or percentage of available pods this budget requires."),
        ("Max Unavailable", "string", 0, "The maximum number or percentage of unavailable pods this budget "
                                         "requires."),
        ("Allowed Disruptions", "integer", 0, "Calculated number of pods that may be disrupted at this time."),
        _AGE,
    ), lambda o, now: [_get(o, "metadata", "name"), _int_or_na(_get(o, "spec", "minAvailable")),
                       _int_or_na(_get(o, "spec", "maxUnavailable")),
                       int(_get(o, "status", "disruptionsAllowed") or 0), _age(o, now)]),
    "PriorityClass": Printer((
        _NAME,
        ("Value", "integer", 0, "value represents the integer value of this priority class."),
        ("Global-Default", "boolean", 0, "globalDefault specifies whether this PriorityClass should be considered "
                                         "as the default priority for pods that do not have any priority class."),
        _AGE,
        ("PreemptionPolicy", "string", 0, "preemptionPolicy is the Policy for preempting pods with lower "
                                          "priority."),
    ), lambda o, now: [_get(o, "metadata", "name"), int(o.get("value") or 0), bool(o.get("globalDefault")),
                       _age(o, now), o.get("preemptionPolicy") or "PreemptLowerPriority"]),
    "ResourceClaim": Printer((
        _NAME,
        ("State", "string", 0, "A summary of the current state (allocated, pending, reserved, etc.)."),
        _AGE,
    ), lambda o, now: [_get(o, "metadata", "name"), claim_state(o), _age(o, now)]),
    "ResourceSlice": Printer((
        _NAME,
        ("Node", "string", 0, "nodeName identifies the node where the devices are available."),
        ("Driver", "string", 0, "driver identifies the DRA driver providing the capacity information."),
        ("Pool", "string", 0, "Name is used to identify the pool."),
        _AGE,
    ), lambda o, now: [_get(o, "metadata", "name"), _get(o, "spec", "nodeName") or "",
                       _get(o, "spec", "driver") or "", _get(o, "spec", "pool", "name") or "", _age(o, now)]),
}
PRINTERS.update({kind: Printer(columns, cells)
                 for kind, (columns, cells) in workload_printers(since, human_duration, _NAME, _AGE).items()})


def _daemonset_cells(ds: dict[str, Any], now: datetime) -> list[Any]:
    status = ds.get("status") or {}
    spec = _get(ds, "spec", "template", "spec") or {}
    selector = _get(ds, "spec", "selector") or {}
    match = ",".join(f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items()))
    node_selector = ",".join(f"{k}={v}" for k, v in sorted((spec.get("nodeSelector") or {}).items()))
    containers = spec.get("containers") or []
    return [_get(ds, "metadata", "name"), int(status.get("desiredNumberScheduled") or 0),
            int(status.get("currentNumberScheduled") or 0), int(status.get("numberReady") or 0),
            int(status.get("updatedNumberScheduled") or 0), int(status.get("numberAvailable") or 0),
            node_selector or "<none>", _age(ds, now), ",".join(str(c.get("name")) for c in containers),
            ",".join(str(c.get("image")) for c in containers), match or "<none>"]


PRINTERS["DaemonSet"] = Printer((
    _NAME,
    ("Desired", "integer", 0, "The total number of nodes that should be running the daemon pod."),
    ("Current", "integer", 0, "The number of nodes that are running at least 1 daemon pod and are supposed to run "
                              "the daemon pod."),
    ("Ready", "integer", 0, "numberReady is the number of nodes that should be running the daemon pod and have one "
                            "or more of the daemon pod running with a Ready Condition."),
    ("Up-to-date", "integer", 0, "The total number of nodes that are running updated daemon pod"),
    ("Available", "integer", 0, "The number of nodes that should be running the daemon pod and have one or more of "
                                "the daemon pod running and available (ready for at least spec.minReadySeconds)"),
    ("Node Selector", "string", 0, "NodeSelector is a selector which must be true for the pod to fit on a node. "
                                   "Selector which must match a node's labels for the pod to be scheduled on that "
                                   "node."),
    _AGE,
    ("Containers", "string", 1, "Names of each container in the template."),
    ("Images", "string", 1, "Images referenced by each container in the template."),
    ("Selector", "string", 1, "A label query over pods that are managed by the daemon set."),
), _daemonset_cells)


def _controller_revision_cells(cr: dict[str, Any], now: datetime) -> list[Any]:
    ref = next((r for r in _get(cr, "metadata", "ownerReferences") or [] if isinstance(r, dict) and r.get("controller")),
               None)
    controller = "<none>"
    if ref is not None:
        group = str(ref.get("apiVersion") or "").rpartition("/")[0]
        kind = str(ref.get("kind") or "").lower()
        controller = f"{kind}.{group}/{ref.get('name')}" if group else f"{kind}/{ref.get('name')}"
    return [_get(cr, "metadata", "name"), controller, int(cr.get("revision") or 0), _age(cr, now)]


PRINTERS["ControllerRevision"] = Printer((
    _NAME,
    ("Controller", "string", 0, "Controller of the object"),
    ("Revision", "integer", 0, "Revision represents the revision of the state represented by Data."),
    _AGE,
), _controller_revision_cells)
_DEFAULT = Printer((_NAME, _AGE), lambda o, now: [_get(o, "metadata", "name"), _age(o, now)])


def printer_for(kind: str) -> Printer:
    return PRINTERS.get(kind, _DEFAULT)


def column_definitions(kind: str) -> list[dict[str, Any]]:
    return [{"name": name, "type": typ, "format": "name" if name == "Name" else "", "description": doc,
             "priority": prio} for name, typ, prio, doc in printer_for(kind).columns]


def table_row(rt: ResourceType, obj: dict[str, Any], include: str, shown: dict[str, Any] | None = None,
              now: datetime | None = None) -> dict[str, Any]:
    """One row for a stored (v1) object; `shown` is the object as the request's version shows it."""
    now = now or datetime.now(timezone.utc)
    if rt.custom is not None:
        row: dict[str, Any] = {"cells": crd_columns.cells(rt, rt.version, obj, now, since)}
    else:
        row = {"cells": printer_for(rt.kind).cells(obj, now)}
    if rt.kind == "Pod":
        conditions = _pod_conditions(obj)
        if conditions:
            row["conditions"] = conditions
    if include == "Object":
        row["object"] = shown if shown is not None else obj
    elif include == "Metadata":
        row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                         "metadata": obj.get("metadata") or {}}
    return row


def to_table(rt: ResourceType, items: list[dict[str, Any]], resource_version: str, include: str = "Metadata",
             shown: Callable[[dict[str, Any]], dict[str, Any]] | None = None, headers: bool = True,
             meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Table of stored objects. `shown` converts an object to the request's version (for includeObject=
    Object); `headers=False` leaves out the column definitions, as on every watch event after the first."""
    now = datetime.now(timezone.utc)
    table_meta = {"resourceVersion": resource_version, **(meta or {})}
    out: dict[str, Any] = {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": table_meta}
    if headers:
        out["columnDefinitions"] = (crd_columns.column_definitions(rt, rt.version) if rt.custom is not None
                                    else column_definitions(rt.kind))
    out["rows"] = [table_row(rt, obj, include, shown(obj) if shown and include == "Object" else None, now)
                   for obj in items]
    return out
