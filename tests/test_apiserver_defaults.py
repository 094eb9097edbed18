"""kube-apiserver's defaulting: what a write omits is stored as Kubernetes defaults it, in every served version."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from conftest import RESOURCE_BETAS
from gpudra.defaults import apply_defaults


def test_pod_defaults(apiserver: Any) -> None:
    pod = apiserver.api.create("Pod", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {
        "containers": [{"name": "a", "image": "busybox", "ports": [{"containerPort": 80}],
                        "resources": {"limits": {"cpu": "1"}},
                        "readinessProbe": {"httpGet": {"port": 80}}},
                       {"name": "b", "image": "registry.local:5000/x:v2"},
                       {"name": "c", "image": "x@sha256:" + "0" * 64}],
        "volumes": [{"name": "scratch"}, {"name": "cfg", "configMap": {"name": "c"}}]}}, "default")
    spec = pod["spec"]
    assert (spec["restartPolicy"], spec["dnsPolicy"], spec["terminationGracePeriodSeconds"], spec["schedulerName"],
            spec["securityContext"], spec["enableServiceLinks"]) == (
        "Always", "ClusterFirst", 30, "default-scheduler", {}, True)
    a, b, c = spec["containers"]
    assert [x["imagePullPolicy"] for x in (a, b, c)] == ["Always", "IfNotPresent", "IfNotPresent"]
    assert a["terminationMessagePath"] == "/dev/termination-log" and a["terminationMessagePolicy"] == "File"
    assert a["ports"] == [{"containerPort": 80, "protocol": "TCP"}]
    assert a["resources"]["requests"] == {"cpu": "1"}
    assert a["readinessProbe"] == {"httpGet": {"port": 80, "scheme": "HTTP"}, "timeoutSeconds": 1,
                                   "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3}
    assert spec["volumes"] == [{"name": "scratch", "emptyDir": {}},
                               {"name": "cfg", "configMap": {"name": "c", "defaultMode": 420}}]


def test_defaults_never_override_what_was_written() -> None:
    pod = {"spec": {"restartPolicy": "Never", "containers": [{"name": "a", "image": "x", "imagePullPolicy": "Never"}]}}
    apply_defaults("", "Pod", pod)
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["containers"][0]["imagePullPolicy"] == "Never"


def test_secret_type_defaults_to_opaque() -> None:
    secret: dict[str, Any] = {"metadata": {"name": "s"}, "data": {}}
    apply_defaults("", "Secret", secret)
    assert secret["type"] == "Opaque"


def test_workload_defaults() -> None:
    deployment: dict[str, Any] = {"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "x:1"}]}}}}
    apply_defaults("apps", "Deployment", deployment)
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}}
    assert (deployment["spec"]["replicas"], deployment["spec"]["revisionHistoryLimit"],
            deployment["spec"]["progressDeadlineSeconds"]) == (1, 10, 600)
    assert deployment["spec"]["template"]["spec"]["restartPolicy"] == "Always"
    recreate: dict[str, Any] = {"spec": {"strategy": {"type": "Recreate"}}}
    apply_defaults("apps", "Deployment", recreate)
    assert recreate["spec"]["strategy"] == {"type": "Recreate"}
    job: dict[str, Any] = {"spec": {"template": {"spec": {"restartPolicy": "Never", "containers": []}}}}
    apply_defaults("batch", "Job", job)
    assert {k: v for k, v in job["spec"].items() if k != "template"} == {
        "completions": 1, "parallelism": 1, "backoffLimit": 6, "completionMode": "NonIndexed", "suspend": False,
        "podReplacementPolicy": "TerminatingOrFailed"}
    parallel: dict[str, Any] = {"spec": {"parallelism": 4}}
    apply_defaults("batch", "Job", parallel)
    assert "completions" not in parallel["spec"]


@pytest.mark.apiserver_options(runtime_config=RESOURCE_BETAS)
def test_claim_defaults_round_trip_through_every_version(apiserver: Any) -> None:
    api = apiserver.api
    api.create("ResourceClaim", {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                 "metadata": {"name": "c"}, "spec": {"devices": {"requests": [
                                     {"name": "one", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                 "tolerations": [{"key": "k", "effect": "NoSchedule"}]}},
                                     {"name": "alt", "firstAvailable": [{"name": "a", "deviceClassName": "gpu.nvidia.com"}]},
                                     {"name": "all", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                 "allocationMode": "All"}}]}}}, "default")
    requests = api.get("ResourceClaim", "c", "default")["spec"]["devices"]["requests"]
    assert requests[0]["exactly"]["allocationMode"] == "ExactCount" and requests[0]["exactly"]["count"] == 1
    assert requests[0]["exactly"]["tolerations"][0]["operator"] == "Equal"
    assert requests[1]["firstAvailable"][0]["allocationMode"] == "ExactCount"
    assert requests[1]["firstAvailable"][0]["count"] == 1
    assert "count" not in requests[2]["exactly"]
    # A label written through v1beta1 (the whole object converted and back) changes nothing else.
    url = apiserver.url + "/apis/resource.k8s.io/v1beta1/namespaces/default/resourceclaims/c"
    with urllib.request.urlopen(url) as resp:
        beta = json.load(resp)
    beta["metadata"]["labels"] = {"x": "y"}
    req = urllib.request.Request(url, data=json.dumps(beta).encode(), method="PUT",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as resp:
        assert resp.status == 200
    stored = api.get("ResourceClaim", "c", "default")
    assert stored["spec"]["devices"]["requests"] == requests
    assert stored["metadata"]["labels"] == {"x": "y"}


def test_no_default_is_in_a_status() -> None:
    # The store skips defaulting on status writes (they keep everything but the status from the stored
    # object), which is only right while no defaulter writes into a status.
    from gpudra.defaults import _DEFAULTERS

    for group, kind in _DEFAULTERS:
        status = {"conditions": [{"type": "Ready", "status": "True"}], "containerStatuses": [{"name": "c"}]}
        obj = {"spec": {"containers": [{"name": "c", "image": "x"}]}, "status": json.loads(json.dumps(status))}
        apply_defaults(group, kind, obj)
        assert obj["status"] == status, (group, kind)
