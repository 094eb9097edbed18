"""What the simulated controllers read of an object's metadata and a pod's state, as kube-controller-manager's
shared helpers (k8s.io/kubernetes/pkg/api/v1/pod, metav1.GetControllerOf) read them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def controller_ref(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference with `controller: true`, if any."""
    return next((r for r in meta(obj).get("ownerReferences") or [] if isinstance(r, Mapping) and r.get("controller")),
                None)


def terminating(obj: Mapping[str, Any]) -> bool:
    return bool(meta(obj).get("deletionTimestamp"))


def ready_not_terminating(pod: Mapping[str, Any]) -> bool:
    """Ready and not being deleted: what a Deployment counts available and a PodDisruptionBudget healthy."""
    return not terminating(pod) and ready(pod)


def ready(pod: Mapping[str, Any]) -> bool:
    """podutil.IsPodReady (and nodeutil.IsNodeReady, the same condition on a Node): the object's Ready condition
    is True, which a pod's kubelet sets only while it runs and a node's while it posts status."""
    return any(isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])
