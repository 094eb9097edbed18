"""Events the kubelet records about pods (source component `kubelet`, host the node), aggregated as client-go's
event correlator does: the same reason and message for the same object bumps `count` and `lastTimestamp` of one
Event instead of writing a new one."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from gpudra.timestamps import rfc3339
from gpudra.kubeapi import ApiError, KubeApi, NotFound

log = logging.getLogger("sim.kubelet.events")


def format_pod(namespace: str, name: str, uid: str) -> str:
    """The kubelet's format.Pod: name_namespace(uid)."""
    return f"{name}_{namespace}({uid})"


class KubeletEvents:
    def __init__(self, api: KubeApi, node: str) -> None:
        self.api = api
        self.node = node
        self._sent: dict[tuple[str, str, str, str], tuple[str, int]] = {}  # key -> (event name, count)
        self._lock = threading.Lock()

    def pod(self, pod: Mapping[str, str], reason: str, message: str, *, warning: bool = True,
            container: str | None = None) -> None:
        """Record an Event about a pod (`pod`: namespace, name, uid); a failure to write is logged, never raised."""
        ns, name, uid = pod["namespace"], pod["name"], pod["uid"]
        key = (uid, container or "", reason, message)
        now = rfc3339()
        with self._lock:
            sent = self._sent.get(key)
        try:
            if sent is not None:
                event_name, count = sent
                try:
                    self.api.patch("Event", event_name, {"count": count + 1, "lastTimestamp": now}, namespace=ns)
                except NotFound:
                    pass  # expired or deleted: write a new one
                else:
                    with self._lock:
                        self._sent[key] = (event_name, count + 1)
                    return
            involved: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": name, "uid": uid}
            if container:
                involved["fieldPath"] = f"spec.containers{{{container}}}"
            event_name = f"{name}.{time.time_ns():x}"
            self.api.create("Event", {
                "metadata": {"name": event_name, "namespace": ns}, "involvedObject": involved,
                "reason": reason, "message": message, "type": "Warning" if warning else "Normal",
                "source": {"component": "kubelet", "host": self.node}, "reportingComponent": "kubelet",
                "reportingInstance": self.node, "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            }, namespace=ns)
            with self._lock:
                self._sent[key] = (event_name, 1)
        except ApiError as exc:
            log.warning("event=event-write-failed node=%s pod=%s/%s reason=%s error=%r", self.node, ns, name, reason,
                        str(exc))

    def forget(self, uid: str) -> None:
        with self._lock:
            for key in [k for k in self._sent if k[0] == uid]:
                del self._sent[key]
