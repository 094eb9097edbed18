"""The Events kube-controller-manager's workload controllers record, in their words: a controller's pods created
and deleted (`SuccessfulCreate`/`SuccessfulDelete` on the owner), a Deployment scaling its ReplicaSets
(`ScalingReplicaSet`), a CronJob's Jobs, and a Job finishing (`Completed`, or its failure reason). `kubectl describe`
of a Deployment, ReplicaSet, DaemonSet, StatefulSet or Job shows them as on a cluster."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpudra.kubeapi import KubeApi
from sim.events import EventRecorder
from sim.cluster.podstate import meta as _meta, controller_ref as _controller

API_VERSIONS = {"Deployment": "apps/v1", "ReplicaSet": "apps/v1", "StatefulSet": "apps/v1", "DaemonSet": "apps/v1",
                "Job": "batch/v1", "CronJob": "batch/v1"}
COMPONENTS = {"Deployment": "deployment-controller", "ReplicaSet": "replicaset-controller",
              "StatefulSet": "statefulset-controller", "DaemonSet": "daemonset-controller", "Job": "job-controller",
              "CronJob": "cronjob-controller"}


def _owner(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    ref = _controller(obj)
    return ref if ref is not None and ref.get("kind") in COMPONENTS else None


class WorkloadEvents:
    def __init__(self, api: KubeApi) -> None:
        self._recorders = {kind: EventRecorder(api, component) for kind, component in COMPONENTS.items()}

    def _record(self, kind: str, namespace: str, name: str, uid: str, reason: str, message: str, *,
                warning: bool = False) -> None:
        involved = {"apiVersion": API_VERSIONS[kind], "kind": kind, "namespace": namespace, "name": name, "uid": uid}
        self._recorders[kind].record(involved, reason, message, warning=warning)

    def _about_owner(self, child: Mapping[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        owner = _owner(child)
        if owner is not None:
            self._record(str(owner["kind"]), str(_meta(child).get("namespace") or "default"), str(owner.get("name")),
                         str(owner.get("uid") or ""), reason, message, warning=warning)

    def created(self, child_kind: str, child: Mapping[str, Any]) -> None:
        """`child` as the API server stored it (named)."""
        name = str(_meta(child).get("name"))
        owner = _owner(child)
        if owner is None:
            return
        if owner["kind"] == "StatefulSet":
            self._about_owner(child, "SuccessfulCreate", f"create {child_kind} {name} in StatefulSet {owner.get('name')} successful")
        elif owner["kind"] == "CronJob":
            self._about_owner(child, "SuccessfulCreate", f"Created job {name}")
        elif owner["kind"] == "Deployment":
            replicas = (child.get("spec") or {}).get("replicas") or 0
            if replicas:
                self._about_owner(child, "ScalingReplicaSet", f"Scaled up replica set {name} from 0 to {replicas}")
        else:
            self._about_owner(child, "SuccessfulCreate", f"Created pod: {name}")

    def create_failed(self, child_kind: str, child: Mapping[str, Any], message: str) -> None:
        """The API server refused to create `child` (a quota, an admission plugin): a Warning on its owner."""
        owner = _owner(child)
        if owner is None:
            return
        if owner["kind"] == "StatefulSet":
            text = f"create {child_kind} {_meta(child).get('name')} in StatefulSet {owner.get('name')} failed error: {message}"
        elif owner["kind"] == "CronJob":
            text = f"Error creating job: {message}"
        elif owner["kind"] in ("ReplicaSet", "Job"):
            text = f"Error creating: {message}"
        else:
            return  # the Deployment controller returns the error and records nothing
        self._about_owner(child, "FailedCreate", text, warning=True)

    def deleted(self, child_kind: str, child: Mapping[str, Any]) -> None:
        name = str(_meta(child).get("name"))
        owner = _owner(child)
        if owner is None or child_kind != "Pod":
            return  # the Deployment controller's history cleanup and the garbage collector record nothing
        if owner["kind"] == "StatefulSet":
            self._about_owner(child, "SuccessfulDelete", f"delete Pod {name} in StatefulSet {owner.get('name')} successful")
        else:
            self._about_owner(child, "SuccessfulDelete", f"Deleted pod: {name}")

    def scaled(self, rs: Mapping[str, Any], replicas: int) -> None:
        """A Deployment set its ReplicaSet's spec.replicas to `replicas`."""
        before = int((rs.get("spec") or {}).get("replicas") or 0)
        if before != replicas:
            self._about_owner(rs, "ScalingReplicaSet",
                              f"Scaled {'up' if replicas > before else 'down'} replica set {_meta(rs).get('name')} "
                              f"from {before} to {replicas}")

    def job_finished(self, job: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        """The Job's new status: an Event when it turns Complete or Failed."""
        def true(conditions: Any) -> dict[str, Mapping[str, Any]]:
            return {str(c.get("type")): c for c in conditions or [] if isinstance(c, Mapping) and c.get("status") == "True"}

        before, after = true((job.get("status") or {}).get("conditions")), true(status.get("conditions"))
        meta = _meta(job)
        where = (str(meta.get("namespace") or "default"), str(meta.get("name")), str(meta.get("uid") or ""))
        if "Complete" in after and "Complete" not in before:
            self._record("Job", *where, "Completed", "Job completed")
        elif "Failed" in after and "Failed" not in before:
            failed = after["Failed"]
            self._record("Job", *where, str(failed.get("reason") or "Failed"), str(failed.get("message") or ""),
                         warning=True)
