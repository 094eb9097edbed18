"""PodDisruptionBudgets and the eviction subresource as on a 1.37 cluster: the disruption controller's status
(pure), kube-apiserver's validation and eviction decisions, discovery's pods/eviction, and `kubectl drain`
evicting through them (refused while the budget allows nothing, retried until it does)."""

from __future__ import annotations

import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from gpudra.kubeapi import ApiError
from gpudra.timestamps import rfc3339
from sim.cluster.disruption import budget_status
from tests.conftest import RunningApiServer
from tests.cluster_helpers import node_and_workload_controllers

KUBECTL = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "kubectl")
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
READY = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}


def _pod(name: str, owner: str = "rs-1", ready: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "labels": {"app": "web"},
                         "ownerReferences": [{"kind": "ReplicaSet", "uid": owner, "controller": True}]},
            "status": READY if ready else {"phase": "Running"}}


def _pdb(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "web", "namespace": "default", "generation": 1},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, **spec}}


WORKLOADS = {"Deployment": [{"metadata": {"uid": "d-1"}, "spec": {"replicas": 4}}],
             "ReplicaSet": [{"metadata": {"uid": "rs-1", "ownerReferences": [{"kind": "Deployment", "uid": "d-1",
                                                                              "controller": True}]},
                             "spec": {"replicas": 4}}]}


def test_budget_status_counts_healthy_pods_against_min_available_or_max_unavailable() -> None:
    pods = [_pod("a"), _pod("b"), _pod("c"), _pod("d", ready=False), {**_pod("x"), "metadata": {
        **_pod("x")["metadata"], "labels": {"app": "other"}}}]
    status = budget_status(_pdb(minAvailable=2), pods, WORKLOADS, NOW)
    assert (status["expectedPods"], status["currentHealthy"], status["desiredHealthy"], status["disruptionsAllowed"]) == \
        (4, 3, 2, 1)
    assert status["conditions"][0]["reason"] == "SufficientPods" and status["observedGeneration"] == 1
    # A percentage or maxUnavailable counts against the Deployment's 4 replicas (rounded up).
    assert budget_status(_pdb(minAvailable="60%"), pods, WORKLOADS, NOW)["desiredHealthy"] == 3
    assert budget_status(_pdb(maxUnavailable="25%"), pods, WORKLOADS, NOW)["desiredHealthy"] == 3
    none_left = budget_status(_pdb(maxUnavailable=1), pods, WORKLOADS, NOW)
    assert none_left["disruptionsAllowed"] == 0 and none_left["conditions"][0]["reason"] == "InsufficientPods"
    # A pod the eviction subresource just took is not healthy while it is still there (for 2 minutes).
    recent = {**_pdb(minAvailable=2), "status": {"disruptedPods": {"a": rfc3339(NOW - timedelta(seconds=30)),
                                                                   "gone": rfc3339(NOW)}}}
    status = budget_status(recent, pods, WORKLOADS, NOW)
    assert status["currentHealthy"] == 2 and status["disruptedPods"] == {"a": rfc3339(NOW - timedelta(seconds=30))}
    stale = {**recent, "status": {"disruptedPods": {"a": rfc3339(NOW - timedelta(minutes=3))}}}
    assert "disruptedPods" not in budget_status(stale, pods, WORKLOADS, NOW)


def _evict(api: Any, name: str) -> Any:
    return api._call("POST", f"/api/v1/namespaces/default/pods/{name}/eviction",
                     body={"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}})


def _running_pod(api: Any, name: str, labels: dict[str, str]) -> None:
    api.create("Pod", {"metadata": {"name": name, "namespace": "default", "labels": labels},
                       "spec": {"containers": [{"name": "c", "image": "busybox"}]}}, namespace="default")
    api.patch("Pod", name, {"status": READY}, namespace="default", subresource="status")


def test_eviction_follows_the_budget(apiserver: RunningApiServer) -> None:
    api = apiserver.api
    _running_pod(api, "a", {"app": "web"})
    _running_pod(api, "b", {"app": "web"})
    api.create("PodDisruptionBudget", _pdb(minAvailable=1), namespace="default")
    # The disruption controller has not written a status yet.
    with pytest.raises(ApiError) as refused:
        _evict(api, "a")
    assert refused.value.status == 429 and "Cannot evict pod as it would violate the pod's disruption budget." in str(refused.value)
    api.patch("PodDisruptionBudget", "web", {"status": {"observedGeneration": 1, "disruptionsAllowed": 1,
                                                        "currentHealthy": 2, "desiredHealthy": 1}},
              namespace="default", subresource="status")
    assert _evict(api, "a")["status"] == "Success"
    assert api.try_get("Pod", "a", namespace="default") is None
    status = api.get("PodDisruptionBudget", "web", namespace="default")["status"]
    assert status["disruptionsAllowed"] == 0 and set(status["disruptedPods"]) == {"a"}
    with pytest.raises(ApiError) as budget:
        _evict(api, "b")
    assert budget.value.status == 429
    # A pod that is not running is evicted whatever the budget says.
    api.create("Pod", {"metadata": {"name": "waiting", "namespace": "default", "labels": {"app": "web"}},
                       "spec": {"containers": [{"name": "c", "image": "busybox"}]}}, namespace="default")
    assert _evict(api, "waiting")["status"] == "Success"
    # Two budgets for one pod: kube-apiserver refuses to choose.
    api.create("PodDisruptionBudget", {**_pdb(maxUnavailable=1), "metadata": {"name": "second", "namespace": "default"}},
               namespace="default")
    with pytest.raises(ApiError) as two:
        _evict(api, "b")
    assert two.value.status == 500 and "more than one PodDisruptionBudget" in str(two.value)


def test_budget_validation_and_discovery(apiserver: RunningApiServer) -> None:
    api = apiserver.api
    with pytest.raises(ApiError) as both:
        api.create("PodDisruptionBudget", _pdb(minAvailable=1, maxUnavailable=1), namespace="default")
    assert both.value.status == 422 and "minAvailable and maxUnavailable cannot be both set" in str(both.value)
    with pytest.raises(ApiError) as percent:
        api.create("PodDisruptionBudget", _pdb(maxUnavailable="150%"), namespace="default")
    assert "spec.maxUnavailable" in str(percent.value) and "must not be greater than 100%" in str(percent.value)
    resources = api._call("GET", "/api/v1")["resources"]
    (entry,) = [r for r in resources if r["name"] == "pods/eviction"]
    assert (entry["group"], entry["version"], entry["kind"], entry["verbs"]) == ("policy", "v1", "Eviction", ["create"])


@pytest.mark.process
def test_kubectl_drain_evicts_through_the_budget(apiserver: RunningApiServer) -> None:
    if not Path(KUBECTL).exists():
        pytest.skip("kubectl is installed by `make install-test`")
    api = apiserver.api
    api.create("Node", {"metadata": {"name": "n1"}})
    template = {"metadata": {"labels": {"app": "web"}},
                "spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 0,
                         "containers": [{"name": "c", "image": "busybox"}]}}
    with node_and_workload_controllers(api, "n1"):
        api.create("Deployment", {"metadata": {"name": "web", "namespace": "default"},
                                  "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                                           "template": template}}, namespace="default")
        api.create("PodDisruptionBudget", _pdb(minAvailable=1), namespace="default")
        kubectl = [KUBECTL, "--kubeconfig", str(apiserver.kubeconfig)]
        ready = subprocess.run([*kubectl, "-n", "default", "rollout", "status", "deploy/web", "--timeout=60s"],
                               capture_output=True, text=True, timeout=90)
        assert ready.returncode == 0, ready.stderr
        printed = subprocess.run([*kubectl, "-n", "default", "get", "pdb", "web", "--no-headers"],
                                 capture_output=True, text=True, timeout=30).stdout.split()
        assert printed[:4] == ["web", "1", "N/A", "1"], printed
        drain = subprocess.run([*kubectl, "drain", "n1", "--timeout=60s"], capture_output=True, text=True, timeout=90)
        assert drain.returncode == 0, drain.stderr
        out = drain.stdout + drain.stderr
        # Both pods go by eviction; the second waits for the first's replacement to be Ready again.
        assert out.count("evicting pod default/web-") >= 2 and out.count(" evicted") == 2, out
        assert "Cannot evict pod as it would violate the pod's disruption budget." in out, out
        assert "node/n1 drained" in out
