"""kube-controller-manager's pod garbage collector (PodGC) for `gpu-dra cluster`.

Every 20 s it force-deletes (grace period 0) the pods no kubelet will ever finish:
- orphans: pods bound to a node that no longer exists, once it has been missing for the 40 s quarantine (a node
  that comes back in time keeps its pods). They are first marked Failed with the `DisruptionTarget` condition
  (`DeletionByPodGC`, "PodGC: node no longer exists"), so that a Job counts them failed and `kubectl get` shows why;
- unscheduled pods being deleted (graceful deletion waits for a kubelet that such a pod never had);
- pods being deleted on a node that is not Ready and carries the `node.kubernetes.io/out-of-service` taint.
A pod not yet Succeeded or Failed is marked Failed before its deletion, as markFailedAndDeletePod does.

`plan` is pure (objects and a clock in, decisions out); `PodGC` lists, applies and keeps the quarantine.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpudra.kubeapi import Conflict, KubeApi, NotFound
from gpudra.timestamps import rfc3339
from sim.cluster import podstate
from sim.cluster.periodic import Periodic

log = logging.getLogger("gpu-dra.cluster.podgc")

PERIOD_S = 20.0  # gcCheckPeriod
QUARANTINE_S = 40.0  # quarantineTime: how long a node must stay missing before its pods are orphans
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
ORPHANED = {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC",
            "message": "PodGC: node no longer exists"}


@dataclass(frozen=True)
class Collect:
    """One pod to force-delete; `condition` is added to its status when it is marked Failed first."""

    namespace: str
    name: str
    uid: str
    why: str  # orphaned, unscheduled-terminating, out-of-service
    condition: Mapping[str, str] | None = None


@dataclass
class Plan:
    collect: list[Collect] = field(default_factory=list)
    missing: dict[str, float] = field(default_factory=dict)  # node name -> when it was first seen missing


def _out_of_service(node: Mapping[str, Any]) -> bool:
    return any(isinstance(t, Mapping) and t.get("key") == OUT_OF_SERVICE for t in (node.get("spec") or {}).get("taints") or [])


def plan(pods: Sequence[Mapping[str, Any]], nodes: Sequence[Mapping[str, Any]], missing_since: Mapping[str, float],
         now: float) -> Plan:
    """The pods to collect now; `missing_since` is the quarantine so far (node name -> first seen missing)."""
    by_name = {str(podstate.meta(n).get("name")): n for n in nodes}
    out = Plan()
    for pod in pods:
        meta = podstate.meta(pod)
        ref = (str(meta.get("namespace") or "default"), str(meta.get("name")), str(meta.get("uid") or ""))
        node_name = str((pod.get("spec") or {}).get("nodeName") or "")
        if not node_name:
            if podstate.terminating(pod):
                out.collect.append(Collect(*ref, "unscheduled-terminating"))
            continue
        node = by_name.get(node_name)
        if node is None:
            first = out.missing.setdefault(node_name, missing_since.get(node_name, now))
            if now - first >= QUARANTINE_S:
                out.collect.append(Collect(*ref, "orphaned", ORPHANED))
        elif podstate.terminating(pod) and not podstate.ready(node) and _out_of_service(node):
            out.collect.append(Collect(*ref, "out-of-service"))
    return out


def failed_status(pod: Mapping[str, Any], condition: Mapping[str, str] | None, stamp: str) -> dict[str, Any] | None:
    """The status patch that marks the pod Failed (with `condition`), or None when it already finished."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return None
    patch: dict[str, Any] = {"phase": "Failed"}
    if condition is not None:
        kept = [c for c in status.get("conditions") or [] if isinstance(c, Mapping) and c.get("type") != condition["type"]]
        patch["conditions"] = [*kept, {**condition, "lastTransitionTime": stamp}]
    return {"status": patch}


class PodGC:
    def __init__(self, api: KubeApi, *, interval: float = PERIOD_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self._clock = clock
        self._missing: dict[str, float] = {}
        self._loop = Periodic("podgc", self.reconcile, interval, log)

    def reconcile(self) -> None:
        pods = {(str(podstate.meta(p).get("namespace") or "default"), str(podstate.meta(p).get("name"))): p
                for p in self.api.list("Pod")[0]}
        todo = plan(list(pods.values()), self.api.list("Node")[0], self._missing, self._clock())
        self._missing = todo.missing
        for item in todo.collect:
            patch = failed_status(pods[(item.namespace, item.name)], item.condition, rfc3339())
            try:
                if patch is not None:
                    self.api.patch("Pod", item.name, {**patch, "metadata": {"uid": item.uid}}, namespace=item.namespace,
                                   subresource="status")
                self.api.delete("Pod", item.name, namespace=item.namespace, uid=item.uid, grace_period_seconds=0)
            except (NotFound, Conflict):
                continue  # gone meanwhile, or replaced by a pod of the same name
            log.info("event=pod-collected reason=%s pod=%s/%s", item.why, item.namespace, item.name)

    @property
    def failure(self) -> str | None:
        """Why its last pass failed, None once one succeeds."""
        return self._loop.failure

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()
