"""The DaemonSet controller of `gpu-dra cluster`, as kube-controller-manager's: one pod per node the template
fits (nodeSelector, required node affinity, taints with the tolerations the controller adds), pinned to its node
by node affinity on `metadata.name` so that the scheduler binds it (and allocates its claims); status counts;
rolling update (at most `maxUnavailable` old pods replaced at a time) or OnDelete.

`plan` is pure: DaemonSets, nodes and pods in, what to create and delete and each DaemonSet's status out.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.expand import name_suffix, pod_template_hash
from controller.allocator import AllocationError
from controller.nodefit import as_allocator_node, required_affinity, static_rejects
from gpudra.kubeapi import AlreadyExists, ApiError, KubeApi

log = logging.getLogger("gpu-dra.cluster.daemonsets")

# The tolerations the DaemonSet controller adds to every daemon pod (pkg/controller/daemon/util).
DEFAULT_TOLERATIONS: tuple[dict[str, Any], ...] = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
REVISION_LABEL = "controller-revision-hash"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _controller_uid(obj: Mapping[str, Any]) -> str | None:
    ref = next((r for r in _meta(obj).get("ownerReferences") or [] if r.get("controller")), None)
    return str(ref.get("uid")) if ref and ref.get("kind") == "DaemonSet" else None


def _node_of(pod: Mapping[str, Any]) -> str | None:
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    for term in terms:
        for req in term.get("matchFields") or []:
            if req.get("key") == "metadata.name" and req.get("operator") == "In" and req.get("values"):
                return str(req["values"][0])
    return None


def _with_tolerations(spec: dict[str, Any]) -> None:
    tolerations = list(spec.get("tolerations") or [])
    for t in DEFAULT_TOLERATIONS:
        if not any(x.get("key") == t["key"] and x.get("effect") == t["effect"] for x in tolerations):
            tolerations.append(dict(t))
    spec["tolerations"] = tolerations


def _pinned(spec: dict[str, Any], node: str) -> None:
    """Node affinity to exactly `node`, as the controller writes it: every term gets the node's matchFields."""
    affinity = spec.setdefault("affinity", {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    terms = required.get("nodeSelectorTerms") or [{}]
    required["nodeSelectorTerms"] = [{**{k: v for k, v in t.items() if k != "matchFields"}, "matchFields": [pin]}
                                     for t in terms]


def should_run(ds: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether the DaemonSet wants a pod on `node`: its template fits, cordoning aside."""
    spec = copy.deepcopy(dict(((ds.get("spec") or {}).get("template") or {}).get("spec") or {}))
    _with_tolerations(spec)
    uncordoned = {**node, "spec": {k: v for k, v in (node.get("spec") or {}).items() if k != "unschedulable"}}
    probe = {"metadata": {"name": "probe"}, "spec": spec}
    try:
        affinity = required_affinity(probe)
    except AllocationError:
        return False  # a malformed affinity fits no node (the scheduler says why on the pods of a valid one)
    return static_rejects(probe, uncordoned, as_allocator_node(uncordoned), affinity) is None


def daemon_pod(ds: Mapping[str, Any], node: str) -> dict[str, Any]:
    meta = _meta(ds)
    template = (ds.get("spec") or {}).get("template") or {}
    tmeta = template.get("metadata") or {}
    revision = pod_template_hash(template)
    name = f"{meta.get('name')}-{name_suffix(str(meta.get('name')), hash_position(node))}"
    spec = copy.deepcopy(dict(template.get("spec") or {}))
    _with_tolerations(spec)
    _pinned(spec, node)
    pod_meta: dict[str, Any] = {
        "name": name, "namespace": meta.get("namespace") or "default",
        "labels": {**(tmeta.get("labels") or {}), REVISION_LABEL: revision,
                   "pod-template-generation": str(meta.get("generation", 1))},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": meta.get("name"),
                             "uid": meta.get("uid", ""), "controller": True, "blockOwnerDeletion": True}]}
    if tmeta.get("annotations"):
        pod_meta["annotations"] = dict(tmeta["annotations"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec}


def hash_position(node: str) -> int:
    """A stable number per node name, so a daemon pod's name is the same in every pass."""
    h = 2166136261
    for b in node.encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


def _ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    conditions = status.get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    return ready is None or ready.get("status") == "True"


def _max_unavailable(ds: Mapping[str, Any], desired: int) -> int:
    value = (((ds.get("spec") or {}).get("updateStrategy") or {}).get("rollingUpdate") or {}).get("maxUnavailable", 1)
    if isinstance(value, str) and value.endswith("%"):
        return max(1, desired * int(value[:-1] or 0) // 100)
    return max(1, int(value)) if isinstance(value, int) else 1


@dataclass
class Plan:
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[tuple[str, str]] = field(default_factory=list)  # (namespace, name)
    status: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)


def plan(daemonsets: list[dict[str, Any]], nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> Plan:
    out = Plan()
    for ds in daemonsets:
        meta = _meta(ds)
        if meta.get("deletionTimestamp"):
            continue
        key = (str(meta.get("namespace") or "default"), str(meta.get("name")))
        revision = pod_template_hash((ds.get("spec") or {}).get("template") or {})
        owned = [p for p in pods if _controller_uid(p) == meta.get("uid") and not _meta(p).get("deletionTimestamp")]
        by_node: dict[str, list[dict[str, Any]]] = {}
        for p in owned:
            by_node.setdefault(_node_of(p) or "", []).append(p)
        wanted = {str(_meta(n).get("name")) for n in nodes if should_run(ds, n)}
        for node in sorted(wanted):
            mine = by_node.get(node, [])
            if not mine:
                out.create.append(daemon_pod(ds, node))
            for extra in mine[1:]:
                out.delete.append((key[0], str(_meta(extra).get("name"))))
        misscheduled = [p for n, ps in by_node.items() if n not in wanted for p in ps]
        out.delete += [(key[0], str(_meta(p).get("name"))) for p in misscheduled]
        current = [p for n, ps in by_node.items() if n in wanted for p in ps[:1]]
        updated = [p for p in current if (_meta(p).get("labels") or {}).get(REVISION_LABEL) == revision]
        ready = [p for p in current if _ready(p)]
        strategy = ((ds.get("spec") or {}).get("updateStrategy") or {}).get("type") or "RollingUpdate"
        if strategy == "RollingUpdate":
            # Replace old pods, at most maxUnavailable of the DaemonSet's pods down at once.
            budget = _max_unavailable(ds, len(wanted)) - (len(wanted) - len(ready))
            for p in sorted((p for p in current if p not in updated), key=lambda p: str(_meta(p).get("name"))):
                if budget <= 0:
                    break
                out.delete.append((key[0], str(_meta(p).get("name"))))
                budget -= 1
        out.status[key] = {
            "desiredNumberScheduled": len(wanted), "currentNumberScheduled": len(current),
            "numberMisscheduled": len(misscheduled), "numberReady": len(ready), "numberAvailable": len(ready),
            "numberUnavailable": len(wanted) - len(ready), "updatedNumberScheduled": len(updated),
            "observedGeneration": meta.get("generation", 1)}
    return out


class DaemonSetController:
    def __init__(self, api: KubeApi, *, interval: float = 1.0) -> None:
        self.api = api
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def reconcile(self) -> None:
        daemonsets = self.api.list("DaemonSet")[0]
        if not daemonsets:
            return
        todo = plan(list(daemonsets), list(self.api.list("Node")[0]), list(self.api.list("Pod")[0]))
        for pod in todo.create:
            ns = pod["metadata"]["namespace"]
            try:
                self.api.create("Pod", {k: v for k, v in pod.items() if k not in ("apiVersion", "kind")}, namespace=ns)
                log.info("event=created kind=Pod object=%s/%s", ns, pod["metadata"]["name"])
            except AlreadyExists:
                pass
            except ApiError as exc:
                log.warning("event=daemon-pod-refused object=%s/%s error=%r", ns, pod["metadata"]["name"], str(exc))
        for ns, name in todo.delete:
            if self.api.delete("Pod", name, namespace=ns):
                log.info("event=deleted kind=Pod object=%s/%s", ns, name)
        for ds in daemonsets:
            meta = ds.get("metadata") or {}
            status = todo.status.get((str(meta.get("namespace") or "default"), str(meta.get("name"))))
            if status is not None and any((ds.get("status") or {}).get(k) != v for k, v in status.items()):
                self.api.patch("DaemonSet", meta["name"], {"status": status}, namespace=meta.get("namespace"),
                               subresource="status")

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.reconcile()
            except (ApiError, OSError) as exc:
                log.warning("event=daemonsets-pass-failed error=%r", str(exc))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="daemonsets", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
