"""The simulated cluster's workload controllers record kube-controller-manager's Events: a Deployment scaling its
ReplicaSet, a ReplicaSet or DaemonSet creating and deleting pods (a replaced pod under a new name), a Job finishing."""

from __future__ import annotations

from typing import Any

from sim.cluster.daemonsets import DaemonSetController
from sim.cluster.workloads import WorkloadController
from sim.cluster.workloadevents import WorkloadEvents

TEMPLATE = {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


def _events(api: Any, kind: str, name: str) -> list[tuple[str, str, str]]:
    items, _ = api.list("Event", namespace="default", field_selector=f"involvedObject.name={name}")
    return sorted((e["reason"], e["message"], e["source"]["component"]) for e in items
                  if e["involvedObject"]["kind"] == kind)


def _pods(api: Any, prefix: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in api.list("Pod", namespace="default")[0]
                  if p["metadata"]["name"].startswith(prefix) and not p["metadata"].get("deletionTimestamp"))


def test_deployment_scaling_and_replicaset_pods_are_recorded(apiserver: Any) -> None:
    api = apiserver.api
    api.create("Deployment", {"metadata": {"name": "web", "namespace": "default"},
                              "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "template": TEMPLATE}},
               namespace="default")
    workloads = WorkloadController(api)
    workloads.reconcile()  # the ReplicaSet
    workloads.reconcile()  # its pods
    (rs,) = api.list("ReplicaSet", namespace="default")[0]
    rs_name = rs["metadata"]["name"]
    assert _events(api, "Deployment", "web") == [
        ("ScalingReplicaSet", f"Scaled up replica set {rs_name} from 0 to 2", "deployment-controller")]
    first = _pods(api, f"{rs_name}-")
    assert _events(api, "ReplicaSet", rs_name) == sorted(
        ("SuccessfulCreate", f"Created pod: {n}", "replicaset-controller") for n in first)
    # A deleted pod is replaced under a new name.
    api.delete("Pod", first[0], namespace="default")
    workloads.reconcile()
    second = _pods(api, f"{rs_name}-")
    assert len(second) == 2 and first[0] not in second
    (replacement,) = set(second) - set(first)
    assert ("SuccessfulCreate", f"Created pod: {replacement}", "replicaset-controller") in _events(api, "ReplicaSet", rs_name)
    # Scaling down: the Deployment scales its ReplicaSet, which deletes a pod (the newest; these two were created
    # within the same second, which is all creationTimestamp tells apart).
    api.patch("Deployment", "web", {"spec": {"replicas": 1}}, namespace="default")
    workloads.reconcile()
    workloads.reconcile()
    assert ("ScalingReplicaSet", f"Scaled down replica set {rs_name} from 2 to 1", "deployment-controller") in \
        _events(api, "Deployment", "web")
    (kept,) = _pods(api, f"{rs_name}-")
    (gone,) = set(second) - {kept}
    assert ("SuccessfulDelete", f"Deleted pod: {gone}", "replicaset-controller") in _events(api, "ReplicaSet", rs_name)


def test_daemonset_pods_are_recorded(apiserver: Any) -> None:
    api = apiserver.api
    api.create("Node", {"metadata": {"name": "n1"}})
    api.create("DaemonSet", {"metadata": {"name": "agent", "namespace": "default"},
                             "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": TEMPLATE}},
               namespace="default")
    DaemonSetController(api).reconcile()
    (pod,) = _pods(api, "agent-")
    assert _events(api, "DaemonSet", "agent") == [("SuccessfulCreate", f"Created pod: {pod}", "daemonset-controller")]


def test_a_job_finishing_is_recorded(apiserver: Any) -> None:
    events = WorkloadEvents(apiserver.api)
    job = {"metadata": {"name": "train", "namespace": "default", "uid": "j1"}, "status": {}}
    events.job_finished(job, {"conditions": [{"type": "Complete", "status": "True"}]})
    failing = {**job, "metadata": {**job["metadata"], "name": "flaky", "uid": "j2"}}
    events.job_finished(failing, {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                                  "message": "Job has reached the specified backoff limit"}]})
    done = {**job, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    events.job_finished(done, {"conditions": [{"type": "Complete", "status": "True"}]})  # no new transition
    assert _events(apiserver.api, "Job", "train") == [("Completed", "Job completed", "job-controller")]
    items, _ = apiserver.api.list("Event", namespace="default", field_selector="involvedObject.name=flaky")
    assert [(e["type"], e["reason"], e["message"]) for e in items] == [
        ("Warning", "BackoffLimitExceeded", "Job has reached the specified backoff limit")]
