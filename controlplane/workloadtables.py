"""kube-apiserver's table printers for the workload kinds (pkg/printers/internalversion: printDeployment,
printReplicaSet, printStatefulSet, printJob, printCronJob): their columns, wide columns and cells."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from gpudra.timestamps import parse_rfc3339

Column = tuple[str, str, int, str]
Cells = Callable[[dict[str, Any], datetime], list[Any]]

_CONTAINERS: Column = ("Containers", "string", 1, "Names of each container in the template.")
_IMAGES: Column = ("Images", "string", 1, "Images referenced by each container in the template.")
_READY: Column = ("Ready", "string", 0, "Number of the pod with ready state")
_LABELS_DOC = "https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors"


def _get(obj: Any, *path: str) -> Any:
    cur: Any = obj
    for p in path:
        cur = cur.get(p) if isinstance(cur, dict) else None
    return cur


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def container_cells(template: Any) -> tuple[str, str]:
    """layoutContainerCells: the template's container names and images, comma-separated."""
    containers = [c for c in _get(template, "spec", "containers") or [] if isinstance(c, dict)]
    return ",".join(str(c.get("name") or "") for c in containers), ",".join(str(c.get("image") or "") for c in containers)


def format_label_selector(selector: Any) -> str:
    """metav1.FormatLabelSelector: requirements sorted by key; `<none>` for an empty selector."""
    if not isinstance(selector, dict):
        return "<none>"
    parts: list[tuple[str, str]] = []
    for key, value in (selector.get("matchLabels") or {}).items():
        parts.append((str(key), f"{key}={value}"))
    for expr in selector.get("matchExpressions") or []:
        if not isinstance(expr, dict):
            continue
        key, op = str(expr.get("key")), expr.get("operator")
        values = ",".join(sorted(str(v) for v in expr.get("values") or []))
        text = {"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})", "Exists": key,
                "DoesNotExist": f"!{key}"}.get(str(op), f"{key} {op}")
        parts.append((key, text))
    if not parts:
        return "<none>"
    return ",".join(t for _, t in sorted(parts))


def _has_condition(job: dict[str, Any], kind: str) -> bool:
    return any(isinstance(c, dict) and c.get("type") == kind and c.get("status") == "True"
               for c in _get(job, "status", "conditions") or [])


def job_status_text(job: dict[str, Any]) -> str:
    for condition, text in (("Complete", "Complete"), ("Failed", "Failed")):
        if _has_condition(job, condition):
            return text
    if _get(job, "metadata", "deletionTimestamp"):
        return "Terminating"
    for condition in ("Suspended", "FailureTarget", "SuccessCriteriaMet"):
        if _has_condition(job, condition):
            return condition
    return "Running"


def job_completions_text(job: dict[str, Any]) -> str:
    succeeded = _int(_get(job, "status", "succeeded"))
    completions = _get(job, "spec", "completions")
    if isinstance(completions, int):
        return f"{succeeded}/{completions}"
    parallelism = _int(_get(job, "spec", "parallelism"))
    return f"{succeeded}/1 of {parallelism}" if parallelism > 1 else f"{succeeded}/1"


def job_duration_text(job: dict[str, Any], now: datetime, human: Callable[[float], str]) -> str:
    start = parse_rfc3339(_get(job, "status", "startTime"))
    if start is None:
        return ""
    end = parse_rfc3339(_get(job, "status", "completionTime")) or now
    return human((end - start).total_seconds())


def printers(since: Callable[[Any, datetime], str], human: Callable[[float], str],
             name_col: Column, age_col: Column) -> dict[str, tuple[tuple[Column, ...], Cells]]:
    """The workload kinds' (columns, cells), built with tables.py's Name/Age columns and time formats."""

    def age(o: dict[str, Any], now: datetime) -> str:
        return since(_get(o, "metadata", "creationTimestamp"), now)

    def name(o: dict[str, Any]) -> Any:
        return _get(o, "metadata", "name")

    def desired(o: dict[str, Any]) -> int:
        return _int(_get(o, "spec", "replicas"), 1)

    def deployment(o: dict[str, Any], now: datetime) -> list[Any]:
        names, images = container_cells(_get(o, "spec", "template"))
        return [name(o), f"{_int(_get(o, 'status', 'readyReplicas'))}/{desired(o)}",
                _int(_get(o, "status", "updatedReplicas")), _int(_get(o, "status", "availableReplicas")), age(o, now),
                names, images, format_label_selector(_get(o, "spec", "selector"))]

    def replicaset(o: dict[str, Any], now: datetime) -> list[Any]:
        names, images = container_cells(_get(o, "spec", "template"))
        return [name(o), desired(o), _int(_get(o, "status", "replicas")), _int(_get(o, "status", "readyReplicas")),
                age(o, now), names, images, format_label_selector(_get(o, "spec", "selector"))]

    def statefulset(o: dict[str, Any], now: datetime) -> list[Any]:
        names, images = container_cells(_get(o, "spec", "template"))
        return [name(o), f"{_int(_get(o, 'status', 'readyReplicas'))}/{desired(o)}", age(o, now), names, images]

    def job(o: dict[str, Any], now: datetime) -> list[Any]:
        names, images = container_cells(_get(o, "spec", "template"))
        return [name(o), job_status_text(o), job_completions_text(o), job_duration_text(o, now, human), age(o, now),
                names, images, format_label_selector(_get(o, "spec", "selector"))]

    def cronjob(o: dict[str, Any], now: datetime) -> list[Any]:
        template = _get(o, "spec", "jobTemplate", "spec", "template")
        names, images = container_cells(template)
        suspend = _get(o, "spec", "suspend")
        last = _get(o, "status", "lastScheduleTime")
        return [name(o), _get(o, "spec", "schedule") or "", _get(o, "spec", "timeZone") or "<none>",
                "<unset>" if suspend is None else str(bool(suspend)), len(_get(o, "status", "active") or []),
                since(last, now) if last else "<none>", age(o, now), names, images,
                format_label_selector(_get(o, "spec", "jobTemplate", "spec", "selector"))]

    return {
        "Deployment": ((
            name_col, _READY,
            ("Up-to-date", "string", 0, "Total number of non-terminating pods targeted by this deployment that have "
                                        "the desired template spec."),
            ("Available", "string", 0, "Total number of available non-terminating pods (ready for at least "
                                       "minReadySeconds) targeted by this deployment."),
            age_col, _CONTAINERS, _IMAGES,
            ("Selector", "string", 1, "Label selector for pods. Existing ReplicaSets whose pods are selected by this "
                                      "will be the ones affected by this deployment. It must match the pod "
                                      "template's labels."),
        ), deployment),
        "ReplicaSet": ((
            name_col,
            ("Desired", "integer", 0, "Replicas is the number of desired pods. This is a pointer to distinguish "
                                      "between explicit zero and unspecified. Defaults to 1. More info: "
                                      "https://kubernetes.io/docs/concepts/workloads/controllers/replicaset"),
            ("Current", "integer", 0, "Replicas is the most recently observed number of non-terminating pods. More "
                                      "info: https://kubernetes.io/docs/concepts/workloads/controllers/replicaset"),
            ("Ready", "integer", 0, "The number of non-terminating pods targeted by this ReplicaSet with a Ready "
                                    "Condition."),
            age_col, _CONTAINERS, _IMAGES,
            ("Selector", "string", 1, "Selector is a label query over pods that should match the replica count. "
                                      "Label keys and values that must match in order to be controlled by this "
                                      "replica set. It must match the pod template's labels. More info: "
                                      + _LABELS_DOC),
        ), replicaset),
        "StatefulSet": ((name_col, _READY, age_col, _CONTAINERS, _IMAGES), statefulset),
        "Job": ((
            name_col, ("Status", "string", 0, "Status of the job."),
            ("Completions", "string", 0, "The number of pods which reached phase Succeeded. The value increases "
                                         "monotonically for a given spec. However, it may decrease in reaction to "
                                         "scale down of elastic indexed jobs."),
            ("Duration", "string", 0, "Time required to complete the job."), age_col, _CONTAINERS, _IMAGES,
            ("Selector", "string", 1, "A label query over pods that should match the pod count. Normally, the "
                                      "system sets this field for you. More info: " + _LABELS_DOC),
        ), job),
        "CronJob": ((
            name_col, ("Schedule", "string", 0, "The schedule in Cron format, see https://en.wikipedia.org/wiki/Cron."),
            ("Timezone", "string", 0, "The time zone name for the given schedule, see "
                                      "https://en.wikipedia.org/wiki/List_of_tz_database_time_zones."),
            ("Suspend", "boolean", 0, "This flag tells the controller to suspend subsequent executions, it does not "
                                      "apply to already started executions.  Defaults to false."),
            ("Active", "integer", 0, "A list of pointers to currently running jobs."),
            ("Last Schedule", "string", 0, "Information when was the last time the job was successfully scheduled."),
            age_col, _CONTAINERS, _IMAGES,
            ("Selector", "string", 1, "A label query over pods that should match the pod count. Normally, the "
                                      "system sets this field for you. More info: " + _LABELS_DOC),
        ), cronjob),
    }
