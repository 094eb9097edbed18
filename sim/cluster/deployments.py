"""The Deployment controller of `gpu-dra cluster` (kube-controller-manager's pkg/controller/deployment), pure:
from a Deployment, the ReplicaSets it owns and their pods, what to create, scale and delete, and its status.

Facts followed: the ReplicaSet of the current template is `<deployment>-<pod-template-hash>`; an existing one
whose template equals the Deployment's (ignoring the hash label) is reused, as `kubectl rollout undo` relies on;
each ReplicaSet records `deployment.kubernetes.io/revision` (the new one gets the highest + 1; a reused one moves
its old number into `deployment.kubernetes.io/revision-history`), `desired-replicas` and `max-replicas`, and the
Deployment carries its newest revision and copies `kubernetes.io/change-cause`. RollingUpdate: the new ReplicaSet
grows while all ReplicaSets' replicas stay within replicas + maxSurge (default 25%, rounded up), old ones shrink
while available pods stay at least replicas - maxUnavailable (default 25%, rounded down; 1 when both round to 0);
Recreate: old ones go to 0 first, the new one grows once their pods are gone. Old ReplicaSets at 0 beyond
`revisionHistoryLimit` (default 10) are deleted, oldest revision first. `spec.paused` stops all of this. A
rollout that has not moved (updated or available replicas) for `progressDeadlineSeconds` (default 600) turns
Progressing False with ProgressDeadlineExceeded, which `kubectl rollout status` reports as a failure.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from gpudra.timestamps import parse_rfc3339, rfc3339
from controller.expand import deployment_replicaset
from sim.cluster import podstate
from sim.cluster.podstate import meta as _meta

REVISION = "deployment.kubernetes.io/revision"
REVISION_HISTORY = "deployment.kubernetes.io/revision-history"
DESIRED = "deployment.kubernetes.io/desired-replicas"
MAX_REPLICAS = "deployment.kubernetes.io/max-replicas"
CHANGE_CAUSE = "kubernetes.io/change-cause"
HASH_LABEL = "pod-template-hash"


@dataclass
class DeploymentPlan:
    create: list[dict[str, Any]] = field(default_factory=list)  # ReplicaSets
    patch: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (ReplicaSet name, merge patch)
    delete: list[str] = field(default_factory=list)  # ReplicaSet names
    deployment_patch: dict[str, Any] = field(default_factory=dict)  # metadata of the Deployment
    status: dict[str, Any] = field(default_factory=dict)


def _revision(rs: Mapping[str, Any]) -> int:
    try:
        return int(str((_meta(rs).get("annotations") or {}).get(REVISION, "0")))
    except ValueError:
        return 0


def _replicas(obj: Mapping[str, Any], default: int = 1) -> int:
    value = (obj.get("spec") or {}).get("replicas", default)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


# Struct fields whose empty value Go's JSON leaves out or writes as {} alike (`kubectl rollout undo` sends
# `resources: {}`): equal templates must compare and hash equal either way. Presence markers such as
# `emptyDir: {}` keep their meaning and are not among them.
_EMPTY_AS_ABSENT = frozenset({"resources", "securityContext", "labels", "annotations", "metadata", "limits",
                              "requests", "nodeSelector", "strategy"})


def canonical(value: Any, key: str = "") -> Any:
    """`value` without nulls, empty lists and the empty structs of _EMPTY_AS_ABSENT."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            v = canonical(v, k)
            if v is None or v == [] or (v == {} and k in _EMPTY_AS_ABSENT):
                continue
            out[k] = v
        return out
    if isinstance(value, list):
        return [canonical(v) for v in value]
    return value


def _without_hash(template: Any) -> Any:
    t = canonical(copy.deepcopy(template or {}))
    labels = (t.get("metadata") or {}).get("labels")
    if isinstance(labels, dict):
        labels.pop(HASH_LABEL, None)
        if not labels:
            t["metadata"].pop("labels")
    if isinstance(t.get("metadata"), dict) and not t["metadata"]:
        t.pop("metadata")
    return t


def scaled_value(value: Any, total: int, round_up: bool, default: str) -> int:
    """intstr.GetScaledValueFromIntOrPercent: an int, or a percentage of `total` rounded as asked."""
    value = default if value is None else value
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value)
    if not text.endswith("%"):
        try:
            return int(text)
        except ValueError:
            return 0
    try:
        percent = int(text[:-1])
    except ValueError:
        return 0
    exact = percent * total / 100
    return math.ceil(exact) if round_up else math.floor(exact)


def surge_and_unavailable(deploy: Mapping[str, Any]) -> tuple[int, int]:
    """ResolveFenceposts: (maxSurge, maxUnavailable) for RollingUpdate."""
    rolling = ((deploy.get("spec") or {}).get("strategy") or {}).get("rollingUpdate") or {}
    replicas = _replicas(deploy)
    surge = scaled_value(rolling.get("maxSurge"), replicas, True, "25%")
    unavailable = scaled_value(rolling.get("maxUnavailable"), replicas, False, "25%")
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


def plan_deployment(deploy: Mapping[str, Any], owned: list[dict[str, Any]],
                    pods_of: Mapping[str, list[dict[str, Any]]], now: datetime | None = None) -> DeploymentPlan:
    """`owned`: the Deployment's ReplicaSets; `pods_of`: ReplicaSet uid -> its pods; `now`: the clock (the progress
    deadline's)."""
    out = DeploymentPlan()
    spec = deploy.get("spec") or {}
    meta = _meta(deploy)
    replicas = _replicas(deploy)
    wanted_template = _without_hash(spec.get("template"))
    target = deployment_replicaset({**deploy, "kind": "Deployment", "spec": {**spec, "template": wanted_template}})
    new = next((rs for rs in owned if _meta(rs).get("name") == _meta(target).get("name")), None) or \
        next((rs for rs in owned if _without_hash((rs.get("spec") or {}).get("template")) == wanted_template), None)
    olds = [rs for rs in owned if rs is not new]
    max_old = max((_revision(rs) for rs in olds), default=0)
    strategy = (spec.get("strategy") or {}).get("type") or "RollingUpdate"
    surge, unavailable = surge_and_unavailable(deploy) if strategy == "RollingUpdate" else (0, replicas)
    annotations = {DESIRED: str(replicas), MAX_REPLICAS: str(replicas + surge)}
    cause = (meta.get("annotations") or {}).get(CHANGE_CAUSE)
    if cause:
        annotations[CHANGE_CAUSE] = cause
    paused = bool(spec.get("paused"))

    def avail(rs: Mapping[str, Any]) -> int:
        return sum(1 for p in pods_of.get(str(_meta(rs).get("uid")), []) if podstate.ready_not_terminating(p))

    def live(rs: Mapping[str, Any]) -> int:
        return sum(1 for p in pods_of.get(str(_meta(rs).get("uid")), []) if not podstate.terminating(p))

    scale: dict[str, int] = {str(_meta(rs)["name"]): _replicas(rs, 0) for rs in owned}
    if new is None:
        if paused:
            out.status = _status(deploy, owned, None, pods_of, unavailable)
            return out
        revision = max_old + 1
        created = copy.deepcopy(target)
        created["metadata"]["annotations"] = {**annotations, REVISION: str(revision)}
        first = 0 if olds and strategy == "Recreate" else None
        if first is None:
            total = sum(scale.values())
            first = replicas if not olds else max(0, min(replicas, replicas + surge - total))
        created["spec"]["replicas"] = first
        out.create.append(created)
        out.deployment_patch = {"metadata": {"annotations": {REVISION: str(revision)}}}
        new_name, new_replicas, new_avail = str(created["metadata"]["name"]), first, 0
    else:
        new_name = str(_meta(new)["name"])
        rs_annotations = dict(_meta(new).get("annotations") or {})
        want = dict(annotations)
        if _revision(new) <= max_old:  # an old template again (rollout undo): it becomes the newest revision
            history = [h for h in str(rs_annotations.get(REVISION_HISTORY) or "").split(",") if h]
            want[REVISION] = str(max_old + 1)
            want[REVISION_HISTORY] = ",".join([*history, str(_revision(new))])
        if any(rs_annotations.get(k) != v for k, v in want.items()) and not paused:
            out.patch.append((new_name, {"metadata": {"annotations": want}}))
        revision = int(want.get(REVISION) or _revision(new))
        if str((meta.get("annotations") or {}).get(REVISION)) != str(revision) and not paused:
            out.deployment_patch = {"metadata": {"annotations": {REVISION: str(revision)}}}
        new_replicas, new_avail = scale[new_name], avail(new)
    if paused:
        out.status = _status(deploy, owned, new, pods_of, unavailable)
        return out
    # Scale: the new ReplicaSet up, old ones down.
    old_names = [str(_meta(rs)["name"]) for rs in sorted(olds, key=_revision)]
    if strategy == "Recreate":
        for name in old_names:
            scale[name] = 0
        if all(live(rs) == 0 for rs in olds):
            new_replicas = replicas
    else:
        # One step per pass, as rolloutRolling: grow the new ReplicaSet if the surge allows, else shrink old ones.
        total = sum(scale[n] for n in old_names) + new_replicas
        if new_replicas > replicas:
            new_replicas = replicas
        elif new_replicas < replicas and total < replicas + surge:
            new_replicas = min(replicas, new_replicas + (replicas + surge - total))
        else:
            min_available = replicas - unavailable
            budget = total - min_available - max(0, new_replicas - new_avail)
            for rs in sorted(olds, key=_revision):  # unavailable old pods first: they cost no availability
                name = str(_meta(rs)["name"])
                take = min(max(0, budget), max(0, scale[name] - avail(rs)))
                scale[name] -= take
                budget -= take
            can_remove = new_avail + sum(min(avail(rs), scale[str(_meta(rs)["name"])]) for rs in olds) - min_available
            for name in old_names:
                if can_remove <= 0:
                    break
                take = min(scale[name], can_remove)
                scale[name] -= take
                can_remove -= take
    scale[new_name] = new_replicas
    for rs in owned:
        name = str(_meta(rs)["name"])
        if scale[name] != _replicas(rs, 0):
            out.patch.append((name, {"spec": {"replicas": scale[name]}}))
    if out.create:
        out.create[0]["spec"]["replicas"] = new_replicas
    # History: old ReplicaSets at 0 replicas and no pods beyond revisionHistoryLimit go, oldest first.
    limit = spec.get("revisionHistoryLimit", 10)
    limit = limit if isinstance(limit, int) else 10
    idle = [rs for rs in sorted(olds, key=_revision) if scale[str(_meta(rs)["name"])] == 0 and live(rs) == 0]
    out.delete = [str(_meta(rs)["name"]) for rs in idle[:max(0, len(idle) - limit)]]
    out.status = _status(deploy, owned, new, pods_of, unavailable, new_name=new_name, now=now)
    return out


def _status(deploy: Mapping[str, Any], owned: list[dict[str, Any]], new: Mapping[str, Any] | None,
            pods_of: Mapping[str, list[dict[str, Any]]], max_unavailable: int, new_name: str = "",
            now: datetime | None = None) -> dict[str, Any]:
    replicas = _replicas(deploy)
    pods = [p for rs in owned for p in pods_of.get(str(_meta(rs).get("uid")), [])
            if not podstate.terminating(p)]
    new_pods = pods_of.get(str(_meta(new).get("uid")), []) if new is not None else []
    updated = sum(1 for p in new_pods if not podstate.terminating(p))
    ready = sum(1 for p in pods if podstate.ready_not_terminating(p))
    available = ready
    old_conditions = {c.get("type"): c for c in (deploy.get("status") or {}).get("conditions") or [] if isinstance(c, dict)}
    enough = available >= replicas - max_unavailable
    conditions = [_condition(old_conditions.get("Available"), "Available", enough,
                             "MinimumReplicasAvailable" if enough else "MinimumReplicasUnavailable",
                             "Deployment has minimum availability." if enough
                             else "Deployment does not have minimum availability.")]
    if new_name:
        conditions.append(_progressing(deploy, old_conditions.get("Progressing"), new_name, updated, available,
                                       done=updated == replicas and len(pods) == replicas and available >= replicas,
                                       now=now or datetime.now(timezone.utc)))
    # The ReplicaSets' creation failures (a quota, an admission plugin) are the Deployment's too: the new one's first.
    failure = next((c for rs in sorted(owned, key=lambda r: r is not new) for c in (rs.get("status") or {}).get(
        "conditions") or [] if isinstance(c, dict) and c.get("type") == REPLICA_FAILURE and c.get("status") == "True"),
        None)
    if failure is not None:
        conditions.append(_condition(old_conditions.get(REPLICA_FAILURE), REPLICA_FAILURE, True,
                                     str(failure.get("reason") or ""), str(failure.get("message") or ""), now=now))
    status: dict[str, Any] = {"observedGeneration": _meta(deploy).get("generation", 1), "replicas": len(pods),
                              "updatedReplicas": updated, "readyReplicas": ready, "availableReplicas": available,
                              "conditions": conditions}
    status["unavailableReplicas"] = replicas - available if replicas > available else None  # None: removed
    return status


TIMED_OUT = "ProgressDeadlineExceeded"
REPLICA_FAILURE = "ReplicaFailure"


def _progressing(deploy: Mapping[str, Any], old: Mapping[str, Any] | None, new_name: str, updated: int, available: int,
                 *, done: bool, now: datetime) -> dict[str, Any]:
    """The Progressing condition: True while the rollout moves (its lastUpdateTime renewed by each change in updated
    or available replicas), False with ProgressDeadlineExceeded once it has not moved for progressDeadlineSeconds
    (default 600; not while paused), which `kubectl rollout status` reports as a failure."""
    if done:
        return _condition(old, "Progressing", True, "NewReplicaSetAvailable",
                          f'ReplicaSet "{new_name}" has successfully progressed.', now=now)
    before = deploy.get("status") or {}
    moved = (before.get("updatedReplicas"), before.get("availableReplicas")) != (updated, available)
    spec = deploy.get("spec") or {}
    deadline = spec.get("progressDeadlineSeconds", 600)
    last = parse_rfc3339((old or {}).get("lastUpdateTime"))
    stalled = old is not None and not moved and not spec.get("paused") and isinstance(deadline, int) and (
        old.get("reason") == TIMED_OUT or (last is not None and now - last > timedelta(seconds=deadline)))
    if stalled:
        return _condition(old, "Progressing", False, TIMED_OUT, f'ReplicaSet "{new_name}" has timed out progressing.',
                          now=now)
    return _condition(old, "Progressing", True, "ReplicaSetUpdated", f'ReplicaSet "{new_name}" is progressing.',
                      touch=moved, now=now)


def _condition(old: Mapping[str, Any] | None, kind: str, true: bool, reason: str, message: str, *,
               touch: bool = False, now: datetime | None = None) -> dict[str, Any]:
    """`touch`: something changed that the condition's lastUpdateTime records, even with the same reason."""
    stamp = rfc3339(now)
    state = "True" if true else "False"
    same = old is not None and old.get("status") == state
    kept = same and old is not None and old.get("reason") == reason and not touch
    return {"type": kind, "status": state, "reason": reason, "message": message,
            "lastUpdateTime": old.get("lastUpdateTime", stamp) if kept and old is not None else stamp,
            "lastTransitionTime": old.get("lastTransitionTime", stamp) if same and old is not None else stamp}
