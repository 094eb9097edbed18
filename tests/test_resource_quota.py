"""ResourceQuota as kube-apiserver's quota admission and kube-controller-manager's quota controller keep it: pods
and ResourceClaims that would exceed `spec.hard` are refused at creation (403 exceeded quota), status.hard/used
follow what the namespace uses, and `kubectl describe quota` shows them."""

from __future__ import annotations

import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from controlplane.quota import claim_usage, pod_usage
from gpudra.kubeapi import ApiError
from sim.cluster.workloads import WorkloadController
from tests.conftest import RunningApiServer

KUBECTL = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "kubectl")


def _pod(name: str, cpu: str = "500m", gpus: int = 0) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": cpu}, "limits": {"memory": "1Gi"}}
    if gpus:
        resources["limits"]["nvidia.com/gpu"] = str(gpus)
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "busybox", "resources": resources}]}}


def _claim(name: str, count: int) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": count}}]}}}


def test_usage_counts_what_the_evaluators_count() -> None:
    usage = {k: v.canonical() for k, v in pod_usage(_pod("p", gpus=2)).items()}
    assert usage == {"pods": "1", "count/pods": "1", "requests.cpu": "500m", "cpu": "500m", "requests.memory": "1Gi",
                     "memory": "1Gi", "limits.memory": "1Gi", "requests.nvidia.com/gpu": "2"}
    assert pod_usage({**_pod("done"), "status": {"phase": "Succeeded"}}) == {}
    # Terminating: still charged within a grace period past its deletionTimestamp; stuck beyond that, not.
    stuck = {**_pod("stuck", gpus=2), "metadata": {"name": "stuck", "namespace": "default",
                                                    "deletionTimestamp": "2026-12-02T06:00:30Z",
                                                    "deletionGracePeriodSeconds": 30}}
    assert pod_usage(stuck, datetime(2026, 12, 2, 6, 0, 59, tzinfo=timezone.utc))["pods"].canonical() == "1"
    assert pod_usage(stuck, datetime(2026, 12, 2, 6, 1, 1, tzinfo=timezone.utc)) == {}
    claim = {k: v.canonical() for k, v in claim_usage(_claim("c", 3)).items()}
    assert claim == {"count/resourceclaims.resource.k8s.io": "1", "gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "3"}


@pytest.mark.process
def test_quota_refuses_creates_past_hard_and_its_status_is_kept(apiserver: RunningApiServer) -> None:
    api = apiserver.api
    api.create("ResourceQuota", {"metadata": {"name": "team"}, "spec": {"hard": {
        "pods": "2", "requests.cpu": "1", "gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "4"}}},
        namespace="default")
    api.create("Pod", _pod("a"), namespace="default")
    api.create("Pod", _pod("b"), namespace="default")
    with pytest.raises(ApiError) as refused:
        api.create("Pod", _pod("c", cpu="100m"), namespace="default")
    assert refused.value.status == 403
    assert refused.value.message == ('pods "c" is forbidden: exceeded quota: team, requested: pods=1,requests.cpu=100m, '
                                     'used: pods=2,requests.cpu=1, limited: pods=2,requests.cpu=1')
    api.create("ResourceClaim", _claim("three", 3), namespace="default")
    with pytest.raises(ApiError, match=r'resourceclaims.resource.k8s.io "two" is forbidden: exceeded quota: team, '
                                       r"requested: gpu.nvidia.com.deviceclass.resource.k8s.io/devices=2, used: "
                                       r"gpu.nvidia.com.deviceclass.resource.k8s.io/devices=3, limited: "
                                       r"gpu.nvidia.com.deviceclass.resource.k8s.io/devices=4"):
        api.create("ResourceClaim", _claim("two", 2), namespace="default")
    controllers = WorkloadController(api, interval=0.2)
    controllers.start()
    try:
        deadline = time.monotonic() + 30
        while (api.get("ResourceQuota", "team", namespace="default").get("status") or {}).get("used") != {
                "pods": "2", "requests.cpu": "1", "gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "3"}:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        status = api.get("ResourceQuota", "team", namespace="default")["status"]
        assert status["hard"] == {"pods": "2", "requests.cpu": "1", "gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "4"}
        api.delete("Pod", "a", namespace="default")
        while api.get("ResourceQuota", "team", namespace="default")["status"]["used"]["pods"] != "1":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        api.create("Pod", _pod("c", cpu="100m"), namespace="default")  # room again
        while api.get("ResourceQuota", "team", namespace="default")["status"]["used"]["requests.cpu"] != "600m":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        if Path(KUBECTL).exists():
            got = subprocess.run([KUBECTL, "--kubeconfig", str(apiserver.kubeconfig), "get", "quota", "team",
                                  "--no-headers"], capture_output=True, text=True, timeout=60)
            assert got.stdout.split(None, 1)[1].startswith(
                "gpu.nvidia.com.deviceclass.resource.k8s.io/devices: 3/4, pods: 2/2, requests.cpu: 600m/1"), got
    finally:
        controllers.stop()


def test_a_quota_tracking_cpu_refuses_pods_that_do_not_state_it_and_usage_is_charged_at_admission(
        apiserver: RunningApiServer) -> None:
    api = apiserver.api
    api.create("ResourceQuota", {"metadata": {"name": "q"}, "spec": {"hard": {"pods": "3", "requests.cpu": "1",
                                                                             "limits.memory": "4Gi"}}},
               namespace="default")
    bare = {"metadata": {"name": "bare"}, "spec": {
        "initContainers": [{"name": "setup", "image": "busybox"}],
        "containers": [{"name": "b", "image": "busybox", "resources": {"limits": {"memory": "1Gi"}}},
                       {"name": "a", "image": "busybox"}]}}
    with pytest.raises(ApiError) as refused:
        api.create("Pod", bare, namespace="default")
    assert refused.value.status == 403
    assert refused.value.message == ('pods "bare" is forbidden: failed quota: q: must specify limits.memory for: a,setup; '
                                     'requests.cpu for: a,b,setup')
    # What a create is charged shows in status.used as soon as the create returns, before any controller pass.
    api.create("Pod", _pod("p", cpu="250m"), namespace="default")
    assert api.get("ResourceQuota", "q", namespace="default")["status"] == {
        "hard": {"pods": "3", "requests.cpu": "1", "limits.memory": "4Gi"},
        "used": {"pods": "1", "requests.cpu": "250m", "limits.memory": "1Gi"}}
    api.create("Pod", _pod("r", cpu="500m"), namespace="default")
    assert api.get("ResourceQuota", "q", namespace="default")["status"]["used"] == {
        "pods": "2", "requests.cpu": "750m", "limits.memory": "2Gi"}


def test_a_refused_pod_create_holds_up_only_its_own_replicaset(apiserver: RunningApiServer) -> None:
    api = apiserver.api
    api.create("Namespace", {"metadata": {"name": "tight"}})
    api.create("ResourceQuota", {"metadata": {"name": "q"}, "spec": {"hard": {"pods": "1"}}}, namespace="tight")
    template = {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    for ns in ("tight", "default"):
        api.create("Deployment", {"metadata": {"name": "d"}, "spec": {
            "replicas": 2, "selector": {"matchLabels": {"app": "x"}}, "template": template}}, namespace=ns)
    workloads = WorkloadController(api)
    for _ in range(3):
        workloads.reconcile()
        time.sleep(1.1)  # past the first refusal's back-off
    assert len(api.list("Pod", namespace="default")[0]) == 2  # the other namespace's Deployment is not held up
    assert len(api.list("Pod", namespace="tight")[0]) == 1
    (rs,) = api.list("ReplicaSet", namespace="tight")[0]
    (failure,) = [c for c in rs["status"]["conditions"] if c["type"] == "ReplicaFailure"]
    assert (failure["status"], failure["reason"]) == ("True", "FailedCreate")
    assert failure["message"].startswith('pods "d-') and failure["message"].endswith(
        'is forbidden: exceeded quota: q, requested: pods=1, used: pods=1, limited: pods=1')
    events = [e for e in api.list("Event", namespace="tight")[0] if e["reason"] == "FailedCreate"]
    assert events and all(e["type"] == "Warning" and e["involvedObject"]["kind"] == "ReplicaSet"
                          and e["message"].startswith("Error creating: pods \"d-") for e in events)
    deploy = api.get("Deployment", "d", namespace="tight")
    assert [(c["status"], c["reason"]) for c in deploy["status"]["conditions"] if c["type"] == "ReplicaFailure"] == [
        ("True", "FailedCreate")]
    # Room again: the next create succeeds and the condition goes.
    api.patch("ResourceQuota", "q", {"spec": {"hard": {"pods": "5"}}}, namespace="tight")
    deadline = time.monotonic() + 30
    while len(api.list("Pod", namespace="tight")[0]) < 2:
        assert time.monotonic() < deadline
        workloads.reconcile()
        time.sleep(0.2)
    workloads.reconcile()
    (rs,) = api.list("ReplicaSet", namespace="tight")[0]
    assert not [c for c in rs["status"].get("conditions") or [] if c["type"] == "ReplicaFailure"]
