"""The Job controller of `gpu-dra cluster` (kube-controller-manager's pkg/controller/job), pure: from a Job and its
pods, which pods to create and delete and the Job's status.

Facts followed: `parallelism` pods run at once (no more than the completions left); a failed pod is replaced
while `status.failed` stays within `spec.backoffLimit` (default 6), each replacement delayed by the pod failure
back-off (10 s doubling, at most 6 min, from the last failure); past the limit the running pods are deleted and
the Job gets `FailureTarget` and `Failed` (reason BackoffLimitExceeded). A NonIndexed Job with `completions`
completes when that many pods succeeded; without `completions` (a work queue) when one succeeded and none runs.
An Indexed Job runs one pod per completion index not yet succeeded (its pods carry the index, see
controller.expand.job_pod) and records `completedIndexes`. Complete Jobs get `SuccessCriteriaMet` and `Complete`
(reason CompletionsReached). `spec.suspend` stops new pods and deletes running ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from gpudra.timestamps import parse_rfc3339, rfc3339
from controller.expand import JOB_COMPLETION_INDEX, job_pod
from sim.cluster import podstate

DEFAULT_BACKOFF_LIMIT = 6
POD_FAILURE_BACKOFF_S = 10.0
MAX_POD_FAILURE_BACKOFF_S = 360.0
# apiserver's names.MaxGeneratedNameLength: a generateName longer than this is cut by the server.
MAX_GENERATED_NAME_LENGTH = 58


@dataclass
class JobPlan:
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)  # pod names
    status: dict[str, Any] = field(default_factory=dict)


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _index(pod: Mapping[str, Any]) -> int | None:
    meta = pod.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(JOB_COMPLETION_INDEX) or (meta.get("labels") or {}).get(JOB_COMPLETION_INDEX)
    try:
        return int(str(raw))
    except ValueError:
        return None


def _finished_at(pod: Mapping[str, Any]) -> datetime | None:
    latest = None
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        t = parse_rfc3339(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        if t is not None and (latest is None or t > latest):
            latest = t
    return latest


def format_indexes(indexes: set[int]) -> str:
    """completedIndexes: sorted intervals, "1,3-5,7"."""
    out: list[str] = []
    ordered = sorted(indexes)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def _condition(kind: str, reason: str, message: str, now: datetime) -> dict[str, Any]:
    stamp = rfc3339(now)
    return {"type": kind, "status": "True", "reason": reason, "message": message, "lastProbeTime": stamp,
            "lastTransitionTime": stamp}


def pod_failure_backoff(failed: int) -> float:
    return 0.0 if failed <= 0 else min(MAX_POD_FAILURE_BACKOFF_S, POD_FAILURE_BACKOFF_S * 2 ** (failed - 1))


def plan_job(job: Mapping[str, Any], pods: list[dict[str, Any]], now: datetime) -> JobPlan:
    spec = job.get("spec") or {}
    old = job.get("status") or {}
    out = JobPlan()
    conditions = [c for c in old.get("conditions") or [] if isinstance(c, dict)]
    finished = any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions)
    live = [p for p in pods if not podstate.terminating(p)]
    active = [p for p in live if _phase(p) not in ("Succeeded", "Failed")]
    succeeded_pods = [p for p in pods if _phase(p) == "Succeeded"]
    failed_pods = [p for p in pods if _phase(p) == "Failed"]
    indexed = spec.get("completionMode") == "Indexed"
    completions = spec.get("completions")
    parallelism = spec.get("parallelism", 1)
    parallelism = parallelism if isinstance(parallelism, int) else 1
    backoff_limit = spec.get("backoffLimit", DEFAULT_BACKOFF_LIMIT)
    backoff_limit = backoff_limit if isinstance(backoff_limit, int) else DEFAULT_BACKOFF_LIMIT
    # Terminated pods are counted once and stay counted (the controller's uncounted-pods finalizer bookkeeping).
    failed = max(int(old.get("failed") or 0), len(failed_pods))
    done_indexes = {i for p in succeeded_pods if (i := _index(p)) is not None}
    succeeded = len(done_indexes) if indexed else len(succeeded_pods)
    succeeded = max(int(old.get("succeeded") or 0), succeeded)
    status: dict[str, Any] = {"active": 0 if finished else len(active), "succeeded": succeeded, "failed": failed,
                              "ready": sum(1 for p in active if podstate.ready(p)),
                              "terminating": sum(1 for p in pods if podstate.terminating(p)
                                                 and _phase(p) not in ("Succeeded", "Failed")),
                              "startTime": old.get("startTime") or rfc3339(now)}
    if indexed:
        status["completedIndexes"] = format_indexes(done_indexes)
    if finished:
        # A finished Job's counts are final: pods stopped after it finished (its leftover active ones) do not count.
        status["failed"], status["succeeded"] = int(old.get("failed") or 0), int(old.get("succeeded") or 0)
        status["conditions"] = conditions
        if old.get("completionTime"):
            status["completionTime"] = old["completionTime"]
        status["active"] = len(active)
        out.delete = [str(p["metadata"]["name"]) for p in active]
        out.status = status
        return out
    if failed > backoff_limit:
        out.delete = [str(p["metadata"]["name"]) for p in active]
        message = "Job has reached the specified backoff limit"
        status["conditions"] = conditions + [_condition("FailureTarget", "BackoffLimitExceeded", message, now),
                                             _condition("Failed", "BackoffLimitExceeded", message, now)]
        out.status = status
        return out
    complete = (succeeded >= completions if isinstance(completions, int)
                else bool(succeeded_pods) and not active)
    if complete:
        message = "Reached expected number of succeeded pods"
        status["conditions"] = conditions + [_condition("SuccessCriteriaMet", "CompletionsReached", message, now),
                                             _condition("Complete", "CompletionsReached", message, now)]
        status["completionTime"] = rfc3339(now)
        out.delete = [str(p["metadata"]["name"]) for p in active]
        out.status = status
        return out
    if spec.get("suspend"):
        out.delete = [str(p["metadata"]["name"]) for p in active]
        status["conditions"] = conditions
        out.status = status
        return out
    status["conditions"] = conditions
    out.status = status
    # Replacements wait out the pod failure back-off from the newest failure.
    last_failure = max((t for p in failed_pods if (t := _finished_at(p)) is not None), default=None)
    if failed and last_failure is not None and now < last_failure + timedelta(seconds=pod_failure_backoff(failed)):
        return out
    def fresh(index: int | None) -> dict[str, Any]:
        """A new pod named by the API server from generateName, as the Job controller creates them: `<job>-`, or
        `<job>-<index>-` (the job name cut to fit 58 characters) for an Indexed Job; so a Job deleted and applied
        again never waits for its old pods' names, and no two pods ever share one."""
        pod = job_pod({**job, "kind": "Job"}, 0, index)
        meta = {k: v for k, v in pod["metadata"].items() if k != "name"}
        job_name = str((job.get("metadata") or {}).get("name") or "")
        suffix = f"-{index}-" if index is not None else "-"
        meta["generateName"] = job_name[:MAX_GENERATED_NAME_LENGTH - len(suffix)] + suffix
        return {**pod, "metadata": meta}

    if indexed:
        total = completions if isinstance(completions, int) else parallelism
        running = {i for p in active if (i := _index(p)) is not None}
        wanted = [i for i in range(total) if i not in done_indexes and i not in running]
        out.create = [fresh(i) for i in wanted[:max(0, parallelism - len(active))]]
    else:
        left = (completions - succeeded) if isinstance(completions, int) else (0 if succeeded_pods else parallelism)
        want = min(parallelism, left) - len(active)
        out.create = [fresh(None) for _ in range(max(0, want))]
    return out

