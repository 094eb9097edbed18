"""Events recorded by the simulated cluster's components (the kubelet, the workload controllers), aggregated as
client-go's event correlator does: the same reason and message about the same object bumps `count` and
`lastTimestamp` of one Event instead of writing a new one. A failure to write is logged, never raised: an Event is
never worth stopping a controller for."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from gpudra.kubeapi import ApiError, KubeApi, NotFound
from gpudra.timestamps import rfc3339

log = logging.getLogger("sim.events")


def reference(obj: Mapping[str, Any], kind: str, api_version: str) -> dict[str, str]:
    """The involvedObject of an Event about `obj`."""
    meta = obj.get("metadata") or {}
    return {"apiVersion": api_version, "kind": kind, "namespace": str(meta.get("namespace") or "default"),
            "name": str(meta.get("name") or ""), "uid": str(meta.get("uid") or "")}


class EventRecorder:
    def __init__(self, api: KubeApi, component: str, host: str | None = None) -> None:
        self.api = api
        self.component = component
        self.host = host
        self._sent: dict[tuple[str, str, str, str], tuple[str, int]] = {}  # key -> (event name, count)
        self._lock = threading.Lock()

    def record(self, involved: Mapping[str, str], reason: str, message: str, *, warning: bool = False) -> None:
        """`involved`: apiVersion, kind, namespace, name, uid (and fieldPath for a container)."""
        # Events about cluster-scoped objects (Nodes) live in the default namespace, as the kubelet posts them.
        ns, name, uid = involved["namespace"] or "default", involved["name"], involved["uid"]
        key = (uid, involved.get("fieldPath", ""), reason, message)
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
            event_name = f"{name}.{time.time_ns():x}"
            source = {"component": self.component, **({"host": self.host} if self.host else {})}
            self.api.create("Event", {
                "metadata": {"name": event_name, "namespace": ns}, "involvedObject": {k: v for k, v in involved.items() if v},
                "reason": reason, "message": message, "type": "Warning" if warning else "Normal",
                "source": source, "reportingComponent": self.component, "reportingInstance": self.host or self.component,
                "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            }, namespace=ns)
            with self._lock:
                self._sent[key] = (event_name, 1)
        except ApiError as exc:
            log.warning("event=event-write-failed component=%s object=%s/%s/%s reason=%s error=%r", self.component,
                        involved.get("kind"), ns, name, reason, str(exc))

    def forget(self, uid: str) -> None:
        with self._lock:
            for key in [k for k in self._sent if k[0] == uid]:
                del self._sent[key]
