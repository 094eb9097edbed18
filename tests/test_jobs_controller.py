"""The cluster's Job controller (sim.cluster.jobs), pure: failed pods replaced up to backoffLimit with the pod
failure back-off, then Failed; completions; Indexed Jobs with JOB_COMPLETION_INDEX."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from sim.cluster.jobs import format_indexes, plan_job
from sim.cluster.workloads import plan

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
TEMPLATE = {"spec": {"restartPolicy": "Never", "containers": [{"name": "w", "image": "busybox"}]}}


def _job(**spec: Any) -> dict[str, Any]:
    return {"kind": "Job", "metadata": {"name": "train", "namespace": "default", "uid": "job-uid"},
            "spec": {"template": TEMPLATE, **spec}}


def _finish(pod: dict[str, Any], phase: str, at: datetime) -> dict[str, Any]:
    code = 0 if phase == "Succeeded" else 1
    return {**pod, "status": {"phase": phase, "containerStatuses": [
        {"name": "w", "state": {"terminated": {"exitCode": code, "finishedAt": at.strftime("%Y-%m-%dT%H:%M:%SZ")}}}]}}


def _conditions(status: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["type"], c["reason"]) for c in status.get("conditions") or []]


def test_failed_pods_are_replaced_up_to_the_backoff_limit_then_the_job_fails() -> None:
    job = _job(backoffLimit=1)
    first = plan_job(job, [], NOW)
    (pod,) = first.create
    # named by the API server, as the Job controller's pods are: a re-applied Job never waits for old names
    assert "name" not in pod["metadata"] and pod["metadata"]["generateName"] == "train-"
    assert pod["metadata"]["labels"]["batch.kubernetes.io/job-name"] == "train"
    assert pod["metadata"]["labels"]["batch.kubernetes.io/controller-uid"] == "job-uid"
    job["status"] = first.status
    failed1 = _finish(pod, "Failed", NOW)
    # Within the 10 s pod failure back-off: no replacement yet.
    waiting = plan_job(job, [failed1], NOW + timedelta(seconds=5))
    assert waiting.create == [] and waiting.status["failed"] == 1 and _conditions(waiting.status) == []
    again = plan_job(job, [failed1], NOW + timedelta(seconds=11))
    (replacement,) = again.create
    assert replacement["metadata"]["generateName"] == "train-"
    job["status"] = again.status
    failed2 = _finish(replacement, "Failed", NOW + timedelta(seconds=12))
    done = plan_job(job, [failed1, failed2], NOW + timedelta(seconds=13))
    assert done.create == [] and done.status["failed"] == 2
    assert _conditions(done.status) == [("FailureTarget", "BackoffLimitExceeded"), ("Failed", "BackoffLimitExceeded")]
    assert done.status["conditions"][1]["message"] == "Job has reached the specified backoff limit"
    job["status"] = done.status
    assert plan_job(job, [failed1, failed2], NOW + timedelta(seconds=60)).create == []


def test_completions_and_parallelism() -> None:
    job = _job(completions=3, parallelism=2)
    first = plan_job(job, [], NOW)
    assert len(first.create) == 2
    job["status"] = first.status
    a, b = (_finish(p, "Succeeded", NOW) for p in first.create)
    second = plan_job(job, [a, b], NOW)
    assert len(second.create) == 1 and second.status["succeeded"] == 2
    c = _finish(second.create[0], "Succeeded", NOW)
    job["status"] = second.status
    done = plan_job(job, [a, b, c], NOW + timedelta(seconds=30))
    assert _conditions(done.status) == [("SuccessCriteriaMet", "CompletionsReached"), ("Complete", "CompletionsReached")]
    assert done.status["succeeded"] == 3 and done.status["completionTime"]


def test_indexed_job_pods_carry_their_completion_index() -> None:
    job = _job(completions=3, parallelism=3, completionMode="Indexed")
    first = plan_job(job, [], NOW)
    assert [p["metadata"]["generateName"] for p in first.create] == ["train-0-", "train-1-", "train-2-"]
    long_name = "j" * 60
    (cut,) = plan_job({**_job(completionMode="Indexed"), "metadata": {"name": long_name, "namespace": "default",
                                                                       "uid": "u"}}, [], NOW).create
    assert cut["metadata"]["generateName"] == "j" * 55 + "-0-"
    for i, pod in enumerate(first.create):
        assert pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == str(i)
        assert pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == str(i)
        assert pod["spec"]["hostname"] == f"train-{i}"
        assert {"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}} in \
            pod["spec"]["containers"][0]["env"]
    job["status"] = first.status
    p0, p1, p2 = first.create
    # Index 1 failed: only index 1 is run again (after the back-off), as a new pod.
    pods = [_finish(p0, "Succeeded", NOW), _finish(p1, "Failed", NOW), p2]
    later = plan_job(job, pods, NOW + timedelta(seconds=11))
    (retry,) = later.create
    assert retry["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "1"
    assert later.status["completedIndexes"] == "0"
    assert format_indexes({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"


def test_cluster_plan_runs_jobs_through_the_job_controller() -> None:
    job = _job(completions=1)
    first = plan({"Job": [job]}, NOW)
    assert [k for k, _ in first.create] == ["Pod"] and first.statuses[("Job", "default", "train")]["active"] == 0
