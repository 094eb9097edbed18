"""Workload controllers expanded into the pods they would create, named as their controllers name them.

Offline tools see what a cluster would: a Deployment becomes a ReplicaSet `<deployment>-<pod-template-hash>` whose
pods are `<replicaset>-<suffix>`; a ReplicaSet's pods are `<replicaset>-<suffix>`; a StatefulSet's are
`<statefulset>-<ordinal>`; a Job runs `min(parallelism, completions)` pods `<job>-<suffix>` (Indexed:
`<job>-<index>-<suffix>`); a CronJob's job template becomes the Job `<cronjob>-<scheduled minute>`. Kubernetes
picks random 5-character suffixes from its safe alphabet; here they come from a hash of the owner and the pod's
position, so that the same input always gives the same names (and placements).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from gpudra.defaults import defaulted_pod_template

# k8s.io/apimachinery/pkg/util/rand: no vowels (no words), no 0/1/3 (confusable)
SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
WORKLOAD_KINDS = ("Deployment", "ReplicaSet", "StatefulSet", "Job", "CronJob")


class ExpandError(ValueError):
    """A workload object that cannot be expanded; the message names the object and field."""


def _fnv32a(data: bytes) -> int:
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def safe_encode(text: str) -> str:
    """rand.SafeEncodeString: each byte mapped onto the safe alphabet."""
    return "".join(SAFE_ALPHABET[b % len(SAFE_ALPHABET)] for b in text.encode())


def pod_template_hash(template: Mapping[str, Any]) -> str:
    """The `pod-template-hash` label: SafeEncodeString of the decimal fnv32a hash of the template (Kubernetes hashes
    the Go struct; the canonical JSON stands in for it, so the value differs but the shape is the same)."""
    # The template as the server stores it (defaulted), so that a manifest hashes alike offline and in a cluster.
    stored = defaulted_pod_template(template)
    return safe_encode(str(_fnv32a(json.dumps(stored, sort_keys=True, separators=(",", ":")).encode())))


def name_suffix(owner: str, position: int) -> str:
    """A deterministic stand-in for the 5 random characters of `generateName`."""
    h = _fnv32a(f"{owner}/{position}".encode())
    out = []
    for _ in range(5):
        out.append(SAFE_ALPHABET[h % len(SAFE_ALPHABET)])
        h //= len(SAFE_ALPHABET)
    return "".join(out)


def _label(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind')}/{meta.get('namespace') or 'default'}/{meta.get('name')}"


def _count(obj: Mapping[str, Any], field: str, default: int) -> int:
    value = (obj.get("spec") or {}).get(field, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ExpandError(f"{_label(obj)}: spec.{field}: {value!r}: expected a non-negative integer")
    return value


def _template(obj: Mapping[str, Any], path: str = "spec.template") -> Mapping[str, Any]:
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    if not isinstance(node, Mapping) or not isinstance(node.get("spec"), Mapping):
        raise ExpandError(f"{_label(obj)}: {path}.spec: required (the pod template)")
    return node


def _owner_ref(obj: Mapping[str, Any], kind: str, api_version: str, name: str) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": (obj.get("metadata") or {}).get("uid", ""),
            "controller": True, "blockOwnerDeletion": True}


def _pod(template: Mapping[str, Any], namespace: str, name: str, owner: dict[str, Any],
         extra_labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    tmeta = template.get("metadata") or {}
    labels = {**(tmeta.get("labels") or {}), **(extra_labels or {})}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "ownerReferences": [owner]}
    if labels:
        meta["labels"] = labels
    if tmeta.get("annotations"):
        meta["annotations"] = dict(tmeta["annotations"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": copy.deepcopy(dict(template["spec"]))}


def _ns(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("namespace") or "default")


def _name(obj: Mapping[str, Any]) -> str:
    name = (obj.get("metadata") or {}).get("name")
    if not name:
        raise ExpandError(f"{_label(obj)}: metadata.name: required")
    return str(name)


def replicaset_pods(rs: Mapping[str, Any], name: str | None = None, replicas: int | None = None,
                    extra_labels: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    name = name or _name(rs)
    count = _count(rs, "replicas", 1) if replicas is None else replicas
    template = _template(rs)
    owner = _owner_ref(rs, "ReplicaSet", "apps/v1", name)
    return [_pod(template, _ns(rs), f"{name}-{name_suffix(name, i)}", owner, extra_labels) for i in range(count)]


def deployment_replicaset(deploy: Mapping[str, Any]) -> dict[str, Any]:
    """The ReplicaSet the Deployment controller keeps for the current template: `<deployment>-<pod-template-hash>`,
    the hash also labelling it and its pods."""
    template = _template(deploy)
    phash = pod_template_hash(template)
    name = f"{_name(deploy)}-{phash}"
    tmeta = dict(template.get("metadata") or {})
    tmeta["labels"] = {**(tmeta.get("labels") or {}), "pod-template-hash": phash}
    selector = dict((deploy.get("spec") or {}).get("selector") or {})
    if selector.get("matchLabels") is not None:
        selector["matchLabels"] = {**selector["matchLabels"], "pod-template-hash": phash}
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": name, "namespace": _ns(deploy), "labels": dict(tmeta["labels"]),
                         "ownerReferences": [_owner_ref(deploy, "Deployment", "apps/v1", _name(deploy))]},
            "spec": {"replicas": _count(deploy, "replicas", 1), "selector": selector,
                     "template": {**template, "metadata": tmeta}}}


def deployment_pods(deploy: Mapping[str, Any]) -> list[dict[str, Any]]:
    return replicaset_pods(deployment_replicaset(deploy))


def statefulset_pods(sts: Mapping[str, Any]) -> list[dict[str, Any]]:
    name = _name(sts)
    template = _template(sts)
    start = ((sts.get("spec") or {}).get("ordinals") or {}).get("start", 0) or 0
    owner = _owner_ref(sts, "StatefulSet", "apps/v1", name)
    pods = []
    for ordinal in range(start, start + _count(sts, "replicas", 1)):
        pod_name = f"{name}-{ordinal}"
        pods.append(_pod(template, _ns(sts), pod_name, owner, {
            "statefulset.kubernetes.io/pod-name": pod_name, "apps.kubernetes.io/pod-index": str(ordinal)}))
    return pods


JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def job_pod(job: Mapping[str, Any], position: int, index: int | None, name: str | None = None) -> dict[str, Any]:
    """The Job controller's pod number `position` (its name suffix): for an Indexed Job, the pod of completion
    `index`, `<job>-<index>-<suffix>`, with the index as annotation and label, hostname `<job>-<index>` and the
    JOB_COMPLETION_INDEX env var (from the annotation) in every container, as the Job controller adds them."""
    name = name or _name(job)
    template: Mapping[str, Any] = _template(job)
    uid = str((job.get("metadata") or {}).get("uid") or "")
    labels = {"batch.kubernetes.io/job-name": name, "job-name": name}
    if uid:
        labels.update({"batch.kubernetes.io/controller-uid": uid, "controller-uid": uid})
    base = name
    if index is not None:
        labels[JOB_COMPLETION_INDEX] = str(index)
        base = f"{name}-{index}"
        spec = copy.deepcopy(dict(template["spec"]))
        env_ref = {"name": "JOB_COMPLETION_INDEX",
                   "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{JOB_COMPLETION_INDEX}']"}}}
        for key in ("initContainers", "containers"):
            for c in spec.get(key) or []:
                if isinstance(c, dict) and not any(e.get("name") == "JOB_COMPLETION_INDEX" for e in c.get("env") or []):
                    c["env"] = [*(c.get("env") or []), env_ref]
        spec.setdefault("hostname", f"{name}-{index}")
        tmeta = dict(template.get("metadata") or {})
        tmeta["annotations"] = {**(tmeta.get("annotations") or {}), JOB_COMPLETION_INDEX: str(index)}
        template = {**template, "metadata": tmeta, "spec": spec}
    owner = _owner_ref(job, "Job", "batch/v1", name)
    return _pod(template, _ns(job), f"{base}-{name_suffix(name, position)}", owner, labels)


def job_pods(job: Mapping[str, Any], name: str | None = None) -> list[dict[str, Any]]:
    """The pods a Job starts with: `min(parallelism, completions)` of them."""
    spec = job.get("spec") or {}
    parallelism = _count(job, "parallelism", 1)
    completions = spec.get("completions")
    if completions is not None:
        completions = _count(job, "completions", 1)
        running = min(parallelism, completions)
    else:
        running = parallelism
    indexed = spec.get("completionMode") == "Indexed"
    return [job_pod(job, i, i if indexed else None, name) for i in range(running)]


def cronjob_job(cron: Mapping[str, Any], now: datetime | None = None) -> dict[str, Any]:
    """The Job the CronJob starts: `<cronjob>-<minutes since the epoch>` of its creation time (or `now`), as the
    CronJob controller names jobs after their scheduled time."""
    name = _name(cron)
    job_template = (cron.get("spec") or {}).get("jobTemplate")
    if not isinstance(job_template, Mapping):
        raise ExpandError(f"{_label(cron)}: spec.jobTemplate: required")
    created = (cron.get("metadata") or {}).get("creationTimestamp")
    moment = now
    if created:
        try:
            moment = datetime.fromisoformat(str(created).replace("Z", "+00:00"))
        except ValueError:
            raise ExpandError(f"{_label(cron)}: metadata.creationTimestamp: {created!r}: expected RFC 3339") from None
    minutes = int(moment.timestamp() // 60) if moment is not None else 0
    jmeta = job_template.get("metadata") or {}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": f"{name}-{minutes}", "namespace": _ns(cron),
                         **({"labels": dict(jmeta["labels"])} if jmeta.get("labels") else {}),
                         "ownerReferences": [_owner_ref(cron, "CronJob", "batch/v1", name)]},
            "spec": copy.deepcopy(dict(job_template.get("spec") or {}))}


def cronjob_pods(cron: Mapping[str, Any], now: datetime | None = None) -> list[dict[str, Any]]:
    return job_pods(cronjob_job(cron, now))


def expand(objects: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The objects with every workload controller replaced by its pods, in place (input order kept)."""
    out: list[dict[str, Any]] = []
    for obj in objects:
        kind = obj.get("kind")
        if kind == "Deployment":
            out += deployment_pods(obj)
        elif kind == "ReplicaSet":
            out += replicaset_pods(obj)
        elif kind == "StatefulSet":
            out += statefulset_pods(obj)
        elif kind == "Job":
            out += job_pods(obj)
        elif kind == "CronJob":
            out += cronjob_pods(obj)
        else:
            out.append(dict(obj))
    return out
