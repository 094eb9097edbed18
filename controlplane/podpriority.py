"""The Priority admission plugin for pods created on the embedded control plane.

As kube-apiserver's plugin does: a pod naming a PriorityClass gets `spec.priority` (and the class's
`preemptionPolicy`) from it, a pod naming none gets the globalDefault class's (with its name) or 0, a pod
naming a class that does not exist is refused, and a pod whose own `spec.priority` disagrees is refused.
"""

from __future__ import annotations

from typing import Any

from controlplane import status as st
from controlplane.resources import Registry
from controlplane.selectors import FieldSelector, LabelSelector
from controlplane.store import Filter, Store

DEFAULT_PREEMPTION_POLICY = "PreemptLowerPriority"
# Kubernetes' built-in classes: kube-apiserver creates them at start, so they exist on every cluster.
SYSTEM_CLASSES = {"system-node-critical": 2000001000, "system-cluster-critical": 2000000000}
_SYSTEM_DESCRIPTIONS = {
    "system-node-critical": "Used for system critical pods that must not be moved from their current node.",
    "system-cluster-critical": "Used for system critical pods that must run in the cluster, but can be moved to "
                               "another node if necessary.",
}


def system_priority_classes() -> list[dict[str, Any]]:
    """The PriorityClasses kube-apiserver bootstraps."""
    return [{"metadata": {"name": name}, "value": value, "globalDefault": False,
             "description": _SYSTEM_DESCRIPTIONS[name], "preemptionPolicy": DEFAULT_PREEMPTION_POLICY}
            for name, value in SYSTEM_CLASSES.items()]


def _classes(store: Store, registry: Registry) -> list[dict[str, Any]]:
    rt = registry.by_kind("PriorityClass")
    if rt is None:
        return []
    items, _ = store.list(Filter(rt, None, LabelSelector(()), FieldSelector(())))
    return items


def admit_pod_priority(store: Store, registry: Registry, pod: Any) -> Any:
    """The pod body with its priority resolved; raises StatusError(403) as kube-apiserver would."""
    if not isinstance(pod, dict) or not isinstance(pod.get("spec"), dict):
        return pod
    pod_rt = registry.by_kind("Pod")
    assert pod_rt is not None
    spec = dict(pod["spec"])
    name = str((pod.get("metadata") or {}).get("name") or (pod.get("metadata") or {}).get("generateName") or "")
    classes = _classes(store, registry)
    class_name = spec.get("priorityClassName")
    value: int
    policy = DEFAULT_PREEMPTION_POLICY
    if class_name:
        found = next((pc for pc in classes if (pc.get("metadata") or {}).get("name") == class_name), None)
        if found is not None:
            value = int(found.get("value") or 0)
            policy = found.get("preemptionPolicy") or DEFAULT_PREEMPTION_POLICY
        elif class_name in SYSTEM_CLASSES:
            value = SYSTEM_CLASSES[class_name]
        else:
            raise st.forbidden(pod_rt, name, f"no PriorityClass with name {class_name} was found")
    else:
        default = next((pc for pc in classes if pc.get("globalDefault") is True), None)
        if default is not None:
            spec["priorityClassName"] = (default.get("metadata") or {}).get("name")
            value = int(default.get("value") or 0)
            policy = default.get("preemptionPolicy") or DEFAULT_PREEMPTION_POLICY
        else:
            value = 0
    given = spec.get("priority")
    if given is not None and given != value:
        raise st.forbidden(pod_rt, name, f"the integer value of priority ({given}) must not be provided in pod spec; "
                                         f"priority admission controller computed {value} from the given "
                                         "PriorityClass name")
    spec["priority"] = value
    spec.setdefault("preemptionPolicy", policy)
    return {**pod, "spec": spec}
