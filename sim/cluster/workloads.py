"""The workload controllers of `gpu-dra cluster`: what kube-controller-manager's Deployment, ReplicaSet,
StatefulSet, Job, CronJob and ResourceQuota controllers do, so that a user's own workloads run on the simulated
cluster as they would on a real one.

Pods are made by `controller.expand`, the same expansion `gpu-dra allocate` uses, so the cluster and the offline
tools name them alike. Each pass lists the workloads, rolls Deployments out through their ReplicaSets
(sim.cluster.deployments), runs Jobs to completion or failure (sim.cluster.jobs), creates the pods ReplicaSets and
StatefulSets should have, deletes pods a workload no longer wants (scaled down, workload deleted: Kubernetes'
garbage collector), writes the workloads' status and the quotas' status.hard/used. A CronJob starts its Job at once
rather than at the next scheduled time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from dataclasses import dataclass, field
from typing import Any

from controller.expand import WORKLOAD_KINDS, ExpandError, cronjob_job, replicaset_pods, statefulset_pods
from gpudra.kubeapi import AlreadyExists, ApiError, Conflict, KubeApi, NotFound
from gpudra.timestamps import rfc3339
from controlplane.quota import QUOTA_KINDS
from controlplane.quota import used as quota_used
from sim.cluster import endpointslices
from sim.cluster.deployments import REPLICA_FAILURE, plan_deployment
from sim.cluster.disruption import budget_status, same_status
from sim.cluster.jobs import plan_job
from sim.cluster.periodic import Periodic
from sim.cluster.workloadevents import WorkloadEvents
from sim.cluster import podstate
from sim.cluster.podstate import controller_ref as _controller, meta as _meta

log = logging.getLogger("gpu-dra.cluster.workloads")

# What owns what: Deployments own ReplicaSets, CronJobs own Jobs; ReplicaSets, StatefulSets and Jobs own pods
# (Jobs through sim.cluster.jobs, which follows their pods' outcomes).
# (Deployments through sim.cluster.deployments, which rolls them out.)
# StatefulSet pods have fixed names (their ordinals); a ReplicaSet counts its pods and names new ones by
# generateName, so a replaced pod comes back under a new name, as on a cluster.
PARENTS = {"CronJob": "Job"}
POD_OWNERS = ("StatefulSet",)
POD_MAKERS = {"StatefulSet": statefulset_pods}
CHILD_MAKERS = {"CronJob": cronjob_job}


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or "default"), str(meta.get("name"))


@dataclass
class Plan:
    create: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (kind, object)
    delete: list[tuple[str, tuple[str, str]]] = field(default_factory=list)  # (kind, (namespace, name))
    problems: list[str] = field(default_factory=list)
    statuses: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)  # (kind, ns, name) -> status
    patch: list[tuple[str, tuple[str, str], dict[str, Any]]] = field(default_factory=list)  # merge patches


def _reconcile_children(plan: Plan, child_kind: str, wanted: Mapping[tuple[str, str], dict[str, Any]],
                        have: list[dict[str, Any]], owner_kinds: set[str]) -> None:
    """Create what is wanted and missing; delete what a controller of `owner_kinds` owns and no longer wants
    (Kubernetes' garbage collector, and scaling down)."""
    existing = {_key(o): o for o in have}
    plan.create += [(child_kind, o) for k, o in wanted.items() if k not in existing]
    for k, o in existing.items():
        owner = _controller(o)
        if owner and owner.get("kind") in owner_kinds and k not in wanted \
                and not podstate.terminating(o):
            plan.delete.append((child_kind, k))


def _active(pod: Mapping[str, Any]) -> bool:
    """What a ReplicaSet counts: pods neither terminating nor finished (a failed pod is replaced, not deleted)."""
    return not podstate.terminating(pod) and \
        (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def _scale_down_order(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """kube-controller-manager's order for scaling down: unscheduled, then pending, then not ready, then the most
    restarted, then the newest pods go first."""
    def rank(pod: Mapping[str, Any]) -> tuple[bool, int, bool, int]:
        status = pod.get("status") or {}
        phase = {"Pending": 0, "Unknown": 1, "Running": 2}.get(str(status.get("phase") or "Pending"), 0)
        restarts = sum(int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or [] if isinstance(c, dict))
        return (bool((pod.get("spec") or {}).get("nodeName")), phase, podstate.ready(pod), -restarts)

    newest_first = sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""), reverse=True)
    return sorted(newest_first, key=rank)


def _plan_replicaset_pods(out: Plan, objects: Mapping[str, list[dict[str, Any]]]) -> None:
    """Each ReplicaSet's active pods brought to spec.replicas; pods of a ReplicaSet that is gone are deleted."""
    owned: dict[str, list[dict[str, Any]]] = {}
    for pod in objects.get("Pod", []):
        owner = _controller(pod)
        if owner and owner.get("kind") == "ReplicaSet":
            owned.setdefault(str(owner.get("uid") or ""), []).append(pod)
    for rs in objects.get("ReplicaSet", []):
        meta = rs.get("metadata") or {}
        try:
            wanted = replicaset_pods({**rs, "kind": "ReplicaSet"})
        except ExpandError as exc:
            out.problems.append(str(exc))
            owned.pop(str(meta.get("uid") or ""), None)
            continue
        active = [p for p in owned.pop(str(meta.get("uid") or ""), []) if _active(p)]
        for pod in wanted[len(active):]:
            pod_meta = {k: v for k, v in pod["metadata"].items() if k != "name"}
            out.create.append(("Pod", {**pod, "metadata": {**pod_meta, "generateName": f"{meta.get('name')}-"}}))
        for pod in _scale_down_order(active)[:max(0, len(active) - len(wanted))]:
            out.delete.append(("Pod", _key(pod)))
    for orphans in owned.values():
        out.delete += [("Pod", _key(p)) for p in orphans if not podstate.terminating(p)]


def plan(objects: Mapping[str, list[dict[str, Any]]], now: datetime | None = None) -> Plan:
    """One pass of the controllers over `objects` (kind -> live objects, Pods included): pure but for `now`."""
    out = Plan()
    now = now or datetime.now(timezone.utc)
    _plan_deployments(out, objects, now)
    for parent, child in PARENTS.items():
        wanted: dict[tuple[str, str], dict[str, Any]] = {}
        for obj in objects.get(parent, []):
            try:
                made = CHILD_MAKERS[parent]({**obj, "kind": parent})
            except ExpandError as exc:
                out.problems.append(str(exc))
                continue
            wanted[_key(made)] = made
        _reconcile_children(out, child, wanted, objects.get(child, []), {parent})
    pods: dict[tuple[str, str], dict[str, Any]] = {}
    for kind in POD_OWNERS:
        # Pods of live owners only: one created in this pass gets its pods (and its uid) next pass.
        for obj in objects.get(kind, []):
            try:
                pods.update({_key(p): p for p in POD_MAKERS[kind]({**obj, "kind": kind})})
            except ExpandError as exc:
                out.problems.append(str(exc))
    _reconcile_children(out, "Pod", pods, objects.get("Pod", []), set(POD_OWNERS))
    _plan_replicaset_pods(out, objects)
    by_owner: dict[str, list[dict[str, Any]]] = {}
    for pod in objects.get("Pod", []):
        owner = _controller(pod)
        if owner and owner.get("kind") == "Job":
            by_owner.setdefault(str(owner.get("uid")), []).append(pod)
    for job in objects.get("Job", []):
        uid = str((job.get("metadata") or {}).get("uid") or "")
        if not uid:
            continue
        try:
            todo = plan_job(job, by_owner.get(uid, []), now)
        except ExpandError as exc:
            out.problems.append(str(exc))
            continue
        ns, name = _key(job)
        out.create += [("Pod", p) for p in todo.create]
        out.delete += [("Pod", (ns, p)) for p in todo.delete]
        out.statuses[("Job", ns, name)] = todo.status
    return out


def _owned_by(objects: list[dict[str, Any]], kind: str) -> dict[str, list[dict[str, Any]]]:
    """owner uid -> the objects a `kind` controls."""
    out: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        owner = _controller(obj)
        if owner and owner.get("kind") == kind:
            out.setdefault(str(owner.get("uid")), []).append(obj)
    return out


def _plan_deployments(out: Plan, objects: Mapping[str, list[dict[str, Any]]], now: datetime) -> None:
    replicasets = _owned_by(objects.get("ReplicaSet", []), "Deployment")
    pods = _owned_by(objects.get("Pod", []), "ReplicaSet")
    live = {str((d.get("metadata") or {}).get("uid")) for d in objects.get("Deployment", [])}
    for owner, orphans in replicasets.items():  # the garbage collector's part: a Deployment gone, its ReplicaSets go
        if owner not in live:
            out.delete += [("ReplicaSet", _key(rs)) for rs in orphans
                           if not podstate.terminating(rs)]
    for deploy in objects.get("Deployment", []):
        uid = str((deploy.get("metadata") or {}).get("uid") or "")
        if not uid or podstate.terminating(deploy):
            continue
        ns, name = _key(deploy)
        try:
            todo = plan_deployment(deploy, replicasets.get(uid, []), pods, now)
        except ExpandError as exc:
            out.problems.append(str(exc))
            continue
        out.create += [("ReplicaSet", rs) for rs in todo.create]
        out.patch += [("ReplicaSet", (ns, rs), p) for rs, p in todo.patch]
        out.delete += [("ReplicaSet", (ns, rs)) for rs in todo.delete]
        if todo.deployment_patch:
            out.patch.append(("Deployment", (ns, name), todo.deployment_patch))
        out.statuses[("Deployment", ns, name)] = todo.status


def quota_statuses(objects: Mapping[str, list[dict[str, Any]]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The quota controller's part: each ResourceQuota whose status.hard/used is not what its namespace uses."""
    out = []
    for q in objects.get("ResourceQuota", []):
        ns = _key(q)[0]
        in_ns = {kind: [o for o in objects.get(kind, []) if _key(o)[0] == ns] for kind in QUOTA_KINDS}
        status = {"hard": dict((q.get("spec") or {}).get("hard") or {}), "used": quota_used(q, in_ns)}
        current = q.get("status") or {}
        if current.get("hard") != status["hard"] or current.get("used") != status["used"]:
            out.append((q, status))
    return out


def workload_status(kind: str, obj: Mapping[str, Any], objects: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The counts a controller reports in its object's status, from the pods (or ReplicaSets) it owns."""
    uid = (obj.get("metadata") or {}).get("uid")

    def owned(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [i for i in items if (_controller(i) or {}).get("uid") == uid and uid]

    if kind == "Deployment":
        pods = [p for rs in owned(objects.get("ReplicaSet", []))
                for p in objects.get("Pod", []) if (_controller(p) or {}).get("uid") == (rs.get("metadata") or {}).get("uid")]
    elif kind == "CronJob":
        return {"active": [{"kind": "Job", "name": j["metadata"]["name"], "namespace": j["metadata"].get("namespace"),
                            "uid": j["metadata"].get("uid")} for j in owned(objects.get("Job", []))]}
    elif kind == "ReplicaSet":
        pods = [p for p in owned(objects.get("Pod", [])) if _active(p)]  # what it counts: not terminating or done
    else:
        pods = owned(objects.get("Pod", []))
    running = sum(1 for p in pods if podstate.ready(p))
    status: dict[str, Any] = {"replicas": len(pods), "readyReplicas": running, "availableReplicas": running,
                              "observedGeneration": (obj.get("metadata") or {}).get("generation", 1)}
    if kind == "Deployment":
        status["updatedReplicas"] = len(pods)
    return status


MAX_CREATE_BACKOFF_S = 60.0


@dataclass(frozen=True)
class _Refused:
    message: str
    retry_at: float  # monotonic
    delay: float


def replica_failure(conditions: Any, message: str | None) -> list[dict[str, Any]] | None:
    """A ReplicaSet's new conditions after a pass whose creates failed with `message` (None: none failed), as
    the ReplicaSet controller keeps ReplicaFailure; None when they stay as they are."""
    current = [c for c in conditions or [] if isinstance(c, dict)]
    others = [c for c in current if c.get("type") != REPLICA_FAILURE]
    old = next((c for c in current if c.get("type") == REPLICA_FAILURE), None)
    if message is None:
        return others if old is not None else None
    if old is not None and old.get("message") == message:
        return None
    return [*others, {"type": REPLICA_FAILURE, "status": "True", "reason": "FailedCreate", "message": message,
                      "lastTransitionTime": (old or {}).get("lastTransitionTime") or rfc3339()}]


class WorkloadController:
    def __init__(self, api: KubeApi, *, interval: float = 1.0) -> None:
        self.api = api
        self._reported: set[str] = set()
        self._refused: dict[str, _Refused] = {}  # owner uid -> its last refused create, while it still has to create
        self.events = WorkloadEvents(api)
        self._loop = Periodic("workloads", self.reconcile, interval, log)

    def reconcile(self) -> None:
        objects = {kind: list(self.api.list(kind)[0])
                   for kind in (*WORKLOAD_KINDS, *QUOTA_KINDS, "ResourceQuota", "PodDisruptionBudget", "EndpointSlice")}
        todo = plan(objects)
        for problem in todo.problems:
            if problem not in self._reported:
                log.warning("event=workload-invalid problem=%r", problem)
        self._reported = set(todo.problems)
        now = time.monotonic()
        creating = {str((_controller(obj) or {}).get("uid") or "") for _, obj in todo.create}
        self._refused = {uid: r for uid, r in self._refused.items() if uid in creating}  # nothing to create: over
        for kind, obj in todo.create:
            ns, name = _key(obj)
            owner = str((_controller(obj) or {}).get("uid") or "")
            refused = self._refused.get(owner)
            if refused is not None and now < refused.retry_at:
                continue  # backing off, as the controller's rate-limited requeue does
            try:
                stored = self.api.create(kind, {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}, namespace=ns)
            except AlreadyExists:
                continue
            except ApiError as exc:
                # A refused create (a quota, an admission plugin) concerns its owner only: the rest of the pass goes on.
                log.warning("event=create-refused kind=%s object=%s/%s error=%r", kind, ns, name, exc.message)
                self.events.create_failed(kind, obj, exc.message)
                delay = min(2 * refused.delay, MAX_CREATE_BACKOFF_S) if refused is not None else self._loop.interval
                self._refused[owner] = _Refused(exc.message, now + delay, delay)
                continue
            self._refused.pop(owner, None)
            log.info("event=created kind=%s object=%s/%s", kind, ns, (stored.get("metadata") or {}).get("name", name))
            self.events.created(kind, stored)
        listed = {(kind, *_key(o)): o for kind, objs in objects.items() for o in objs}
        for kind, (ns, name), body in todo.patch:
            try:
                self.api.patch(kind, name, body, namespace=ns)
            except NotFound:
                continue  # deleted meanwhile
            replicas = (body.get("spec") or {}).get("replicas")
            if kind == "ReplicaSet" and isinstance(replicas, int) and (kind, ns, name) in listed:
                self.events.scaled(listed[(kind, ns, name)], replicas)
        for kind, (ns, name) in todo.delete:
            if self.api.delete(kind, name, namespace=ns):
                log.info("event=deleted kind=%s object=%s/%s", kind, ns, name)
                if (kind, ns, name) in listed:
                    self.events.deleted(kind, listed[(kind, ns, name)])
        for kind in WORKLOAD_KINDS:
            for obj in objects[kind]:
                ns, name = _key(obj)
                status = todo.statuses.get((kind, ns, name)) or workload_status(kind, obj, objects)
                current = obj.get("status") or {}
                if kind == "ReplicaSet":
                    refused = self._refused.get(str(_meta(obj).get("uid")))
                    conditions = replica_failure(current.get("conditions"), refused.message if refused else None)
                    if conditions is not None:
                        status["conditions"] = conditions or None  # None: the last condition removed
                if any(current.get(k) != v for k, v in status.items()):
                    self.api.patch(kind, name, {"status": status}, namespace=ns, subresource="status")
                    if kind == "Job":
                        self.events.job_finished(obj, status)

        self._budgets(objects)
        self._endpoint_slices(objects)
        for quota, status in quota_statuses(objects):
            ns, name = _key(quota)
            try:
                self.api.patch("ResourceQuota", name, {"status": status}, namespace=ns, subresource="status")
            except NotFound:
                pass

    def _endpoint_slices(self, objects: Mapping[str, list[dict[str, Any]]]) -> None:
        """The EndpointSlice controller's part (sim.cluster.endpointslices)."""
        todo = endpointslices.plan(objects["Service"], objects["EndpointSlice"], objects["Pod"])
        for body in todo.create:
            try:
                self.api.create("EndpointSlice", body, namespace=body["metadata"]["namespace"])
            except ApiError as exc:
                log.warning("event=endpointslice-refused service=%s error=%r", body["metadata"]["generateName"], str(exc))
        for body in todo.update:
            try:
                self.api.replace("EndpointSlice", body)
            except (Conflict, NotFound):
                pass  # changed meanwhile: the next pass reads it

    def _budgets(self, objects: Mapping[str, list[dict[str, Any]]]) -> None:
        """The disruption controller's part: each PodDisruptionBudget's status (sim.cluster.disruption)."""
        now = datetime.now(timezone.utc)
        for pdb in objects["PodDisruptionBudget"]:
            ns = _key(pdb)[0]
            pods = [p for p in objects.get("Pod", []) if _key(p)[0] == ns]
            status = budget_status(pdb, pods, objects, now)
            if same_status(pdb.get("status") or {}, status):
                continue
            try:
                self.api.replace_status("PodDisruptionBudget", {**pdb, "status": status})
            except (Conflict, NotFound):
                pass  # an eviction (or a deletion) came first: the next pass reads it

    @property
    def failure(self) -> str | None:
        """Why its last pass failed, None once one succeeds."""
        return self._loop.failure

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()
