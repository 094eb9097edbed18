"""The DaemonSet controller of `gpu-dra cluster`, as kube-controller-manager's: one pod per node the template
fits (nodeSelector, required node affinity, taints with the tolerations the controller adds), pinned to its node
by node affinity on `metadata.name` so that the scheduler binds it (and allocates its claims); status counts;
updates by `updateStrategy`: RollingUpdate with `maxUnavailable` (old pods deleted, at most that many of the
DaemonSet's nodes without an available pod at once) or `maxSurge` (the new pod started beside the old one on at most
that many nodes at once, the old one deleted once the new one is available), or OnDelete (new pods only where old
ones were deleted); the revision history in ControllerRevisions (sim.cluster.daemonhistory).

`plan` is pure: DaemonSets, nodes and pods in, what to create and delete and each DaemonSet's status out.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.expand import pod_template_hash
from controller.allocator import AllocationError
from sim.roles.nodefit import as_allocator_node, required_affinity, static_rejects
from gpudra.kubeapi import AlreadyExists, ApiError, KubeApi
from sim.cluster.periodic import Periodic
from sim.cluster.daemonhistory import REVISION_LABEL, HistoryPlan, plan_history
from sim.cluster.workloadevents import WorkloadEvents
from sim.cluster import podstate
from sim.cluster.podstate import meta as _meta, controller_ref as _controller

log = logging.getLogger("gpu-dra.cluster.daemonsets")

# The tolerations the DaemonSet controller adds to every daemon pod (pkg/controller/daemon/util).
DEFAULT_TOLERATIONS: tuple[dict[str, Any], ...] = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)


def _controller_uid(obj: Mapping[str, Any]) -> str | None:
    ref = _controller(obj)
    return str(ref.get("uid")) if ref and ref.get("kind") == "DaemonSet" else None


def _node_of(pod: Mapping[str, Any]) -> str | None:
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    for term in terms:
        for req in term.get("matchFields") or []:
            if req.get("key") == "metadata.name" and req.get("operator") == "In" and req.get("values"):
                return str(req["values"][0])
    return None


def _with_tolerations(spec: dict[str, Any]) -> None:
    tolerations = list(spec.get("tolerations") or [])
    for t in DEFAULT_TOLERATIONS:
        if not any(x.get("key") == t["key"] and x.get("effect") == t["effect"] for x in tolerations):
            tolerations.append(dict(t))
    spec["tolerations"] = tolerations


def _pinned(spec: dict[str, Any], node: str) -> None:
    """Node affinity to exactly `node`, as the controller writes it: every term gets the node's matchFields."""
    affinity = spec.setdefault("affinity", {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    terms = required.get("nodeSelectorTerms") or [{}]
    required["nodeSelectorTerms"] = [{**{k: v for k, v in t.items() if k != "matchFields"}, "matchFields": [pin]}
                                     for t in terms]


def should_run(ds: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether the DaemonSet wants a pod on `node`: its template fits, cordoning aside."""
    spec = copy.deepcopy(dict(((ds.get("spec") or {}).get("template") or {}).get("spec") or {}))
    _with_tolerations(spec)
    uncordoned = {**node, "spec": {k: v for k, v in (node.get("spec") or {}).items() if k != "unschedulable"}}
    probe = {"metadata": {"name": "probe"}, "spec": spec}
    try:
        affinity = required_affinity(probe)
    except AllocationError:
        return False  # a malformed affinity fits no node (the scheduler says why on the pods of a valid one)
    return static_rejects(probe, uncordoned, as_allocator_node(uncordoned), affinity) is None


def daemon_pod(ds: Mapping[str, Any], node: str) -> dict[str, Any]:
    """The daemon pod for `node`, named by the API server (`<daemonset>-<5 random chars>`), as the controller
    creates it: a replacement never waits for the name of the pod it replaces."""
    meta = _meta(ds)
    template = (ds.get("spec") or {}).get("template") or {}
    tmeta = template.get("metadata") or {}
    revision = pod_template_hash(template)
    spec = copy.deepcopy(dict(template.get("spec") or {}))
    _with_tolerations(spec)
    _pinned(spec, node)
    pod_meta: dict[str, Any] = {
        "generateName": f"{meta.get('name')}-", "namespace": meta.get("namespace") or "default",
        "labels": {**(tmeta.get("labels") or {}), REVISION_LABEL: revision,
                   "pod-template-generation": str((meta.get("annotations") or {}).get(
                       "deprecated.daemonset.template.generation") or meta.get("generation", 1))},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": meta.get("name"),
                             "uid": meta.get("uid", ""), "controller": True, "blockOwnerDeletion": True}]}
    if tmeta.get("annotations"):
        pod_meta["annotations"] = dict(tmeta["annotations"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec}


def _scaled(value: Any, total: int, default: int) -> int:
    """An int-or-percent of `total`, percentages rounded up (intstr's GetScaledValueFromIntOrPercent, roundUp)."""
    if isinstance(value, str) and value.endswith("%") and value[:-1].isdigit():
        return -(-total * int(value[:-1]) // 100)
    if isinstance(value, int) and value >= 0:
        return value
    return default


def rolling_budgets(ds: Mapping[str, Any], desired: int) -> tuple[int, int]:
    """(maxUnavailable, maxSurge) of a RollingUpdate DaemonSet over `desired` nodes; defaults 1 and 0, and never
    both 0 (validation forbids it; the controller then allows one unavailable)."""
    rolling = ((ds.get("spec") or {}).get("updateStrategy") or {}).get("rollingUpdate") or {}
    surge = _scaled(rolling.get("maxSurge"), desired, 0)
    unavailable = _scaled(rolling.get("maxUnavailable"), desired, 0 if surge else 1)
    return (unavailable if unavailable or surge else 1), surge


@dataclass
class Plan:
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[tuple[str, str]] = field(default_factory=list)  # (namespace, name)
    status: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    histories: dict[tuple[str, str], HistoryPlan] = field(default_factory=dict)


def _name(pod: Mapping[str, Any]) -> str:
    return str(_meta(pod).get("name"))


def _revision(pod: Mapping[str, Any]) -> str | None:
    labels = _meta(pod).get("labels") or {}
    return str(labels[REVISION_LABEL]) if REVISION_LABEL in labels else None


def _update(ds: Mapping[str, Any], per_node: dict[str, list[dict[str, Any]]], revision: str, desired: int,
            ns: str, out: Plan) -> None:
    """One RollingUpdate step over the nodes' pods, as the controller's rollingUpdate: without surge, old pods
    are deleted (an unavailable one always, available ones while fewer than maxUnavailable new pods are
    unavailable); with surge, a new pod is started beside an old one (always where the old one is unavailable, else
    on at most maxSurge nodes at a time) and the old one deleted once the new one is available."""
    max_unavailable, max_surge = rolling_budgets(ds, desired)
    nodes = [(n, [p for p in per_node[n] if _revision(p) == revision][:1],
              [p for p in per_node[n] if _revision(p) != revision]) for n in sorted(per_node)]
    if max_surge == 0:
        unavailable = sum(1 for _, new, _ in nodes if new and not podstate.ready(new[0]))
        replace: list[dict[str, Any]] = []
        candidates: list[dict[str, Any]] = []
        for _, new, old in nodes:
            if new or not old:
                continue
            (candidates if podstate.ready(old[0]) else replace).append(old[0])
        chosen = replace + candidates[:max(0, max_unavailable - unavailable)]
        out.delete += [(ns, _name(p)) for p in chosen]
        return
    surging = 0
    replace_nodes: list[str] = []
    candidate_nodes: list[str] = []
    for node, new, old in nodes:
        if not old:
            continue
        if not new:
            (candidate_nodes if podstate.ready(old[0]) else replace_nodes).append(node)
        elif podstate.ready(new[0]):
            out.delete += [(ns, _name(p)) for p in old]  # the new pod is available: the old one goes
        else:
            surging += 1  # the new pod is starting beside the old one
    for node in replace_nodes + candidate_nodes[:max(0, max_surge - surging)]:
        out.create.append(daemon_pod(ds, node))


def plan(daemonsets: list[dict[str, Any]], nodes: list[dict[str, Any]], pods: list[dict[str, Any]],
         revisions: Sequence[Mapping[str, Any]] = ()) -> Plan:
    out = Plan()
    for ds in daemonsets:
        meta = _meta(ds)
        if meta.get("deletionTimestamp"):
            continue
        key = (str(meta.get("namespace") or "default"), str(meta.get("name")))
        revision = pod_template_hash((ds.get("spec") or {}).get("template") or {})
        all_owned = [p for p in pods if _controller_uid(p) == meta.get("uid")]
        owned = [p for p in all_owned if not podstate.terminating(p)]
        # Without surge the controller waits for a terminating pod to be gone before it starts its replacement.
        strategy = ((ds.get("spec") or {}).get("updateStrategy") or {}).get("type") or "RollingUpdate"
        surge = strategy == "RollingUpdate" and rolling_budgets(ds, len(nodes))[1] > 0
        terminating = set() if surge else {_node_of(p) for p in all_owned if podstate.terminating(p)}
        by_node: dict[str, list[dict[str, Any]]] = {}
        for p in sorted(owned, key=lambda p: (_revision(p) != revision, _name(p))):  # new ones first
            by_node.setdefault(_node_of(p) or "", []).append(p)
        wanted = {str(_meta(n).get("name")) for n in nodes if should_run(ds, n)}
        per_node: dict[str, list[dict[str, Any]]] = {}
        for node in sorted(wanted):
            mine = by_node.get(node, [])
            if not mine:
                if node not in terminating:
                    out.create.append(daemon_pod(ds, node))
                continue
            # At most one pod per revision on a node (two only while a surge pod replaces an old one).
            keep = [p for i, p in enumerate(mine) if _revision(p) not in {_revision(q) for q in mine[:i]}][:2]
            out.delete += [(key[0], _name(p)) for p in mine if p not in keep]
            per_node[node] = keep
        misscheduled = [p for n, ps in by_node.items() if n not in wanted for p in ps]
        out.delete += [(key[0], _name(p)) for p in misscheduled]
        if strategy == "RollingUpdate":
            _update(ds, per_node, revision, len(wanted), key[0], out)
        updated = [n for n, ps in per_node.items() if any(_revision(p) == revision for p in ps)]
        ready = [n for n, ps in per_node.items() if any(podstate.ready(p) for p in ps)]
        out.status[key] = {
            "desiredNumberScheduled": len(wanted), "currentNumberScheduled": len(per_node),
            "numberMisscheduled": len(misscheduled), "numberReady": len(ready), "numberAvailable": len(ready),
            "numberUnavailable": len(wanted) - len(ready), "updatedNumberScheduled": len(updated),
            "observedGeneration": meta.get("generation", 1)}
        out.histories[key] = plan_history(ds, revisions, {r for p in owned if (r := _revision(p))})
    return out


class DaemonSetController:
    def __init__(self, api: KubeApi, *, interval: float = 1.0) -> None:
        self.api = api
        self.events = WorkloadEvents(api)
        self._loop = Periodic("daemonsets", self.reconcile, interval, log)

    def reconcile(self) -> None:
        daemonsets = self.api.list("DaemonSet")[0]
        if not daemonsets:
            return
        pods = list(self.api.list("Pod")[0])
        todo = plan(list(daemonsets), list(self.api.list("Node")[0]), pods, list(self.api.list("ControllerRevision")[0]))
        for (ns, _), history in todo.histories.items():
            self._write_history(ns, history)
        for pod in todo.create:
            ns = pod["metadata"]["namespace"]
            try:
                stored = self.api.create("Pod", {k: v for k, v in pod.items() if k not in ("apiVersion", "kind")}, namespace=ns)
            except ApiError as exc:
                log.warning("event=daemon-pod-refused object=%s/%s* error=%r", ns, pod["metadata"]["generateName"], str(exc))
                continue
            log.info("event=created kind=Pod object=%s/%s", ns, (stored.get("metadata") or {}).get("name"))
            self.events.created("Pod", stored)
        listed = {(str(_meta(p).get("namespace") or "default"), _name(p)): p for p in pods}
        for ns, name in todo.delete:
            if self.api.delete("Pod", name, namespace=ns):
                log.info("event=deleted kind=Pod object=%s/%s", ns, name)
                if (ns, name) in listed:
                    self.events.deleted("Pod", listed[(ns, name)])
        for ds in daemonsets:
            meta = ds.get("metadata") or {}
            status = todo.status.get((str(meta.get("namespace") or "default"), str(meta.get("name"))))
            if status is not None and any((ds.get("status") or {}).get(k) != v for k, v in status.items()):
                self.api.patch("DaemonSet", meta["name"], {"status": status}, namespace=meta.get("namespace"),
                               subresource="status")

    def _write_history(self, ns: str, history: HistoryPlan) -> None:
        for revision in history.create:
            try:
                self.api.create("ControllerRevision", {k: v for k, v in revision.items() if k not in ("apiVersion", "kind")},
                                namespace=ns)
            except AlreadyExists:
                pass
        for name, number in history.renumber:
            self.api.patch("ControllerRevision", name, {"revision": number}, namespace=ns)
        for name in history.delete:
            self.api.delete("ControllerRevision", name, namespace=ns)

    @property
    def failure(self) -> str | None:
        """Why its last pass failed, None once one succeeds."""
        return self._loop.failure

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()
