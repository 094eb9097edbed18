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
