"""The DefaultTolerationSeconds admission plugin (on in every kube-apiserver): a pod created without a NoExecute
toleration of `node.kubernetes.io/not-ready` (or of `node.kubernetes.io/unreachable`) gets one for 300 s, so
that its node going away evicts it after five minutes rather than at once. `kubectl get pod -o yaml` and
`kubectl describe pod` show them on every pod of a real cluster."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

NOT_READY = "node.kubernetes.io/not-ready"
UNREACHABLE = "node.kubernetes.io/unreachable"
# kube-apiserver's --default-not-ready-toleration-seconds and --default-unreachable-toleration-seconds.
DEFAULT_SECONDS = 300


def _tolerates(tolerations: list[Any], key: str) -> bool:
    """Whether a toleration already covers `key`'s NoExecute taint (an empty key or effect matches any)."""
    return any(isinstance(t, Mapping) and t.get("key") in (key, "", None) and t.get("effect") in ("NoExecute", "", None)
               for t in tolerations)


def default_tolerations(pod: Any) -> Any:
    """The pod body with the two default tolerations added where it has none of its own."""
    if not isinstance(pod, dict) or not isinstance(pod.get("spec"), dict):
        return pod
    spec = pod["spec"]
    tolerations = spec.get("tolerations")
    current = list(tolerations) if isinstance(tolerations, list) else []
    if tolerations is not None and not isinstance(tolerations, list):
        return pod  # the wrong type: validation names it
    added = [{"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": DEFAULT_SECONDS}
             for key in (NOT_READY, UNREACHABLE) if not _tolerates(current, key)]
    if not added:
        return pod
    return {**pod, "spec": {**spec, "tolerations": current + added}}
