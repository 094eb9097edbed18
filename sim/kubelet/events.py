"""Events the kubelet records about pods: source component `kubelet`, host the node (sim.events aggregates them)."""

from __future__ import annotations

from collections.abc import Mapping

from gpudra.kubeapi import KubeApi
from sim.events import EventRecorder


def format_pod(namespace: str, name: str, uid: str) -> str:
    """The kubelet's format.Pod: name_namespace(uid)."""
    return f"{name}_{namespace}({uid})"


class KubeletEvents(EventRecorder):
    def __init__(self, api: KubeApi, node: str) -> None:
        super().__init__(api, "kubelet", node)

    def pod(self, pod: Mapping[str, str], reason: str, message: str, *, warning: bool = True,
            container: str | None = None) -> None:
        """Record an Event about a pod (`pod`: namespace, name, uid)."""
        involved = {"apiVersion": "v1", "kind": "Pod", "namespace": pod["namespace"], "name": pod["name"], "uid": pod["uid"]}
        if container:
            involved["fieldPath"] = f"spec.containers{{{container}}}"
        self.record(involved, reason, message, warning=warning)
