"""kube-apiserver's defaulting (the `SetDefaults_*` functions of each API group), applied by the embedded control
plane to every object a write stores, so that what one served version omits reads back the same through every
other, and by the offline tools where a controller's result depends on it (pod-template-hash).

Defaults are applied to the storage form (v1 for resource.k8s.io; v1beta1's own defaults run before its
conversion, in gpudra.conversion), on create, update and patch alike, as kube-apiserver's decoder defaults
every body it decodes. Only fields a client omitted are set; nothing present is changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpudra.jsoncopy import copy_json

_PROBE_DEFAULTS = {"timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3}
_FILE_MODE = 420  # 0644, the mode of projected files (configMap, secret, downwardAPI, projected volumes)


def _dict(parent: Any, key: str) -> dict[str, Any] | None:
    value = parent.get(key) if isinstance(parent, dict) else None
    return value if isinstance(value, dict) else None


def _items(parent: Any, key: str) -> list[dict[str, Any]]:
    value = parent.get(key) if isinstance(parent, dict) else None
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


# ----- resource.k8s.io/v1 ------------------------------------------------------------------------------------

def _count_defaults(request: dict[str, Any]) -> None:
    request.setdefault("allocationMode", "ExactCount")
    if request["allocationMode"] == "ExactCount" and not request.get("count"):
        request["count"] = 1
    for toleration in _items(request, "tolerations"):
        toleration.setdefault("operator", "Equal")


def _device_claim(claim: Any) -> None:
    for request in _items(_dict(claim, "devices"), "requests"):
        exactly = _dict(request, "exactly")
        if exactly is not None:
            _count_defaults(exactly)
        for sub in _items(request, "firstAvailable"):
            _count_defaults(sub)


def _resource_claim(obj: dict[str, Any]) -> None:
    _device_claim(_dict(obj, "spec"))


def _resource_claim_template(obj: dict[str, Any]) -> None:
    _device_claim(_dict(_dict(obj, "spec"), "spec"))


# ----- core/v1 pods and pod templates ------------------------------------------------------------------------

def _image_pull_policy(image: Any) -> str:
    """Always for `:latest` or an untagged image, IfNotPresent for any other tag or a digest."""
    if not isinstance(image, str):
        return "IfNotPresent"
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.rsplit(":", 1)[1] if ":" in last else ""
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def _probe(probe: dict[str, Any] | None) -> None:
    if probe is None:
        return
    for key, value in _PROBE_DEFAULTS.items():
        probe.setdefault(key, value)
    http_get = _dict(probe, "httpGet")
    if http_get is not None:
        http_get.setdefault("scheme", "HTTP")


def _field_ref(source: Any) -> None:
    ref = _dict(source, "fieldRef")
    if ref is not None:
        ref.setdefault("apiVersion", "v1")


def _container(c: dict[str, Any]) -> None:
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    c.setdefault("imagePullPolicy", _image_pull_policy(c.get("image")))
    for port in _items(c, "ports"):
        port.setdefault("protocol", "TCP")
    for env in _items(c, "env"):
        _field_ref(_dict(env, "valueFrom"))
    for key in ("livenessProbe", "readinessProbe", "startupProbe"):
        _probe(_dict(c, key))


_VOLUME_SOURCES_WITH_MODE = ("configMap", "secret", "downwardAPI", "projected")


def _volume(v: dict[str, Any]) -> None:
    if set(v) <= {"name"}:
        v["emptyDir"] = {}  # a volume that names no source is an emptyDir
    for source in _VOLUME_SOURCES_WITH_MODE:
        src = _dict(v, source)
        if src is not None:
            src.setdefault("defaultMode", _FILE_MODE)
    downward = _dict(v, "downwardAPI")
    for item in _items(downward, "items"):
        _field_ref(item)
    host_path = _dict(v, "hostPath")
    if host_path is not None:
        host_path.setdefault("type", "")


def pod_spec(spec: dict[str, Any] | None) -> None:
    """SetDefaults_PodSpec and what it reaches (containers, volumes), for pods and pod templates."""
    if spec is None:
        return
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for c in _items(spec, key):
            _container(c)
    for v in _items(spec, "volumes"):
        _volume(v)


def _pod(obj: dict[str, Any]) -> None:
    spec = _dict(obj, "spec")
    pod_spec(spec)
    if spec is None:
        return
    spec.setdefault("enableServiceLinks", True)
    # A container's requests default to its limits (SetDefaults_Pod).
    for key in ("initContainers", "containers"):
        for c in _items(spec, key):
            resources = _dict(c, "resources")
            limits = _dict(resources, "limits")
            if resources is not None and limits:
                requests = resources.setdefault("requests", {})
                if isinstance(requests, dict):
                    for name, value in limits.items():
                        requests.setdefault(name, value)


def _template(spec: dict[str, Any] | None) -> None:
    pod_spec(_dict(_dict(spec, "template"), "spec"))


# ----- apps/v1, batch/v1 -------------------------------------------------------------------------------------

def _deployment(obj: dict[str, Any]) -> None:
    spec = _dict(obj, "spec")
    if spec is None:
        return
    spec.setdefault("replicas", 1)
    strategy = spec.setdefault("strategy", {})
    if isinstance(strategy, dict):
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            rolling = strategy.setdefault("rollingUpdate", {})
            if isinstance(rolling, dict):
                rolling.setdefault("maxUnavailable", "25%")
                rolling.setdefault("maxSurge", "25%")
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    _template(spec)


def _replica_set(obj: dict[str, Any]) -> None:
    spec = _dict(obj, "spec")
    if spec is not None:
        spec.setdefault("replicas", 1)
        _template(spec)


def _stateful_set(obj: dict[str, Any]) -> None:
    spec = _dict(obj, "spec")
    if spec is None:
        return
    spec.setdefault("replicas", 1)
    spec.setdefault("podManagementPolicy", "OrderedReady")
    strategy = spec.setdefault("updateStrategy", {})
    if isinstance(strategy, dict):
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            rolling = strategy.setdefault("rollingUpdate", {})
            if isinstance(rolling, dict):
                rolling.setdefault("partition", 0)
    spec.setdefault("revisionHistoryLimit", 10)
    retention = spec.setdefault("persistentVolumeClaimRetentionPolicy", {})
    if isinstance(retention, dict):
        retention.setdefault("whenDeleted", "Retain")
        retention.setdefault("whenScaled", "Retain")
    _template(spec)


def job_spec(spec: dict[str, Any] | None) -> None:
    if spec is None:
        return
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
    spec.setdefault("parallelism", 1)
    if spec.get("backoffLimitPerIndex") is None:
        spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault("podReplacementPolicy", "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed")
    _template(spec)


def _job(obj: dict[str, Any]) -> None:
    job_spec(_dict(obj, "spec"))


def _cron_job(obj: dict[str, Any]) -> None:
    spec = _dict(obj, "spec")
    if spec is None:
        return
    spec.setdefault("concurrencyPolicy", "Allow")
    spec.setdefault("suspend", False)
    spec.setdefault("successfulJobsHistoryLimit", 3)
    spec.setdefault("failedJobsHistoryLimit", 1)
    _template(_dict(_dict(spec, "jobTemplate"), "spec"))


def _secret(obj: dict[str, Any]) -> None:
    if not obj.get("type"):
        obj["type"] = "Opaque"


def _service(obj: dict[str, Any]) -> None:
    spec = _dict(obj, "spec")
    if spec is None:
        return
    spec.setdefault("type", "ClusterIP")
    if spec["type"] == "ExternalName":
        return
    spec.setdefault("sessionAffinity", "None")
    spec.setdefault("internalTrafficPolicy", "Cluster")
    for port in _items(spec, "ports"):
        port.setdefault("protocol", "TCP")
        if port.get("targetPort") in (None, 0, ""):
            port["targetPort"] = port.get("port")


_DEFAULTERS: dict[tuple[str, str], Callable[[dict[str, Any]], None]] = {
    ("", "Secret"): _secret,
    ("", "Service"): _service,
    ("resource.k8s.io", "ResourceClaim"): _resource_claim,
    ("resource.k8s.io", "ResourceClaimTemplate"): _resource_claim_template,
    ("", "Pod"): _pod,
    ("apps", "Deployment"): _deployment,
    ("apps", "ReplicaSet"): _replica_set,
    ("apps", "StatefulSet"): _stateful_set,
    ("batch", "Job"): _job,
    ("batch", "CronJob"): _cron_job,
}


def apply_defaults(group: str, kind: str, obj: dict[str, Any]) -> None:
    """Set, in place, the defaults kube-apiserver gives an object of `group`/`kind` in its storage version."""
    defaulter = _DEFAULTERS.get((group, kind))
    if defaulter is not None:
        defaulter(obj)


def defaulted_pod_template(template: Any) -> Any:
    """A copy of a pod template (`{metadata, spec}`) as a server stores it in its owner: what the controllers
    hash for `pod-template-hash`, so that names made offline match the cluster's."""
    out = copy_json(template)
    if isinstance(out, dict):
        pod_spec(_dict(out, "spec"))
    return out
