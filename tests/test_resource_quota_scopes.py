"""ResourceQuota scopes as kube-apiserver's quota evaluator applies them: `spec.scopes` and `spec.scopeSelector`
(In/NotIn/Exists/DoesNotExist) decide which pods a quota counts, at admission and in status.used; a scoped quota
counts no ResourceClaims; and the scopes are validated against the resources they may limit, in upstream's words."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane import quota
from gpudra.kubeapi import ApiError
from tests.conftest import RunningApiServer


def _pod(name: str, *, cpu: str | None = None, deadline: int | None = None, priority: str | None = None,
         cross: bool = False) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "busybox"}
    if cpu:
        container["resources"] = {"requests": {"cpu": cpu}}
    spec: dict[str, Any] = {"containers": [container]}
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    if priority:
        spec["priorityClassName"] = priority
    if cross:
        spec["affinity"] = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname",
             "namespaceSelector": {}}]}}
    return {"metadata": {"name": name, "namespace": "default"}, "spec": spec}


def _quota(hard: dict[str, str], scopes: list[str] | None = None,
           selector: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"hard": hard}
    if scopes is not None:
        spec["scopes"] = scopes
    if selector is not None:
        spec["scopeSelector"] = {"matchExpressions": selector}
    return {"metadata": {"name": "q", "namespace": "default"}, "spec": spec}


def test_each_scope_matches_the_pods_the_evaluator_matches() -> None:
    best, burst = _pod("b"), _pod("c", cpu="1")
    timed, high, cross = _pod("t", deadline=60), _pod("h", priority="high"), _pod("x", cross=True)
    cases: list[tuple[dict[str, Any], dict[str, bool]]] = [
        (_quota({"pods": "9"}, ["BestEffort"]), {"b": True, "c": False, "h": True}),
        (_quota({"pods": "9"}, ["NotBestEffort"]), {"b": False, "c": True}),
        (_quota({"pods": "9"}, ["Terminating"]), {"t": True, "b": False}),
        (_quota({"pods": "9"}, ["NotTerminating"]), {"t": False, "b": True}),
        (_quota({"pods": "9"}, ["CrossNamespacePodAffinity"]), {"x": True, "b": False}),
        (_quota({"pods": "9"}, selector=[{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]),
         {"h": True, "b": False}),
        (_quota({"pods": "9"}, selector=[{"scopeName": "PriorityClass", "operator": "NotIn", "values": ["high"]}]),
         {"h": False, "b": True}),
        (_quota({"pods": "9"}, selector=[{"scopeName": "PriorityClass", "operator": "Exists"}]), {"h": True, "b": False}),
        # A label selector over {"PriorityClass": name}: the key is always there.
        (_quota({"pods": "9"}, selector=[{"scopeName": "PriorityClass", "operator": "DoesNotExist"}]),
         {"h": False, "b": False}),
        # scopes and the selector together: every one must match.
        (_quota({"pods": "9"}, ["Terminating"], [{"scopeName": "PriorityClass", "operator": "Exists"}]),
         {"t": False, "h": False}),
    ]
    pods = {p["metadata"]["name"]: p for p in (best, burst, timed, high, cross)}
    for q, expected in cases:
        got = {name: quota.matches(q, "Pod", pods[name]) for name in expected}
        assert got == expected, q["spec"]
    claim = {"metadata": {"name": "c"}, "spec": {"devices": {"requests": []}}}
    assert quota.matches(_quota({"count/resourceclaims.resource.k8s.io": "1"}), "ResourceClaim", claim)
    assert not quota.matches(_quota({"pods": "1"}, ["NotTerminating"]), "ResourceClaim", claim)
    used = quota.used(_quota({"pods": "9", "requests.cpu": "9"}, ["NotBestEffort"]),
                      {"Pod": [best, burst, _pod("d", cpu="500m")], "ResourceClaim": [claim]})
    assert used == {"pods": "2", "requests.cpu": "1500m"}


def test_scoped_quotas_bite_only_the_pods_they_match(apiserver: RunningApiServer) -> None:
    api = apiserver.api
    api.create("PriorityClass", {"metadata": {"name": "high"}, "value": 1000})
    api.create("ResourceQuota", {**_quota({"pods": "1"}, ["BestEffort"]), "metadata": {"name": "besteffort"}},
               namespace="default")
    api.create("ResourceQuota", {**_quota({"pods": "1"}, selector=[
        {"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]), "metadata": {"name": "high"}},
        namespace="default")
    api.create("Pod", _pod("first"), namespace="default")
    with pytest.raises(ApiError) as refused:
        api.create("Pod", _pod("second"), namespace="default")
    assert refused.value.status == 403 and refused.value.message == (
        'pods "second" is forbidden: exceeded quota: besteffort, requested: pods=1, used: pods=1, limited: pods=1')
    api.create("Pod", _pod("burstable", cpu="100m"), namespace="default")  # not BestEffort: not this quota's
    api.create("Pod", _pod("urgent", cpu="100m", priority="high"), namespace="default")
    with pytest.raises(ApiError, match='exceeded quota: high, requested: pods=1, used: pods=1, limited: pods=1'):
        api.create("Pod", _pod("urgent2", cpu="100m", priority="high"), namespace="default")


@pytest.mark.parametrize("spec,message", [
    ({"hard": {"requests.cpu": "1", "pods": "2"}, "scopes": ["BestEffort"]},
     'spec.scopes: Invalid value: ["BestEffort"]: unsupported scope applied to resource'),
    ({"hard": {"pods": "2"}, "scopes": ["Terminating", "NotTerminating"]},
     'spec.scopes: Invalid value: ["Terminating","NotTerminating"]: conflicting scopes'),
    ({"hard": {"pods": "2"}, "scopes": ["Sometimes"]}, 'spec.scopes: Invalid value: ["Sometimes"]: unsupported scope'),
    ({"hard": {"services": "2"}, "scopes": ["NotTerminating"]},
     'spec.scopes: Invalid value: ["NotTerminating"]: unsupported scope applied to resource'),
    ({"hard": {"pods": "2"}, "scopeSelector": {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In"}]}},
     "spec.scopeSelector.matchExpressions.values: Required value: must be at least one value when `operator` is 'In' "
     "or 'NotIn' for scope selector"),
    ({"hard": {"pods": "2"}, "scopeSelector": {"matchExpressions": [
        {"scopeName": "BestEffort", "operator": "In", "values": ["x"]}]}},
     'spec.scopeSelector.matchExpressions.operator: Invalid value: "In": must be \'Exist\' when scope is any of '
     "ResourceQuotaScopeTerminating, ResourceQuotaScopeNotTerminating, ResourceQuotaScopeBestEffort, "
     "ResourceQuotaScopeNotBestEffort or ResourceQuotaScopeCrossNamespacePodAffinity"),
    ({"hard": {"pods": "2"}, "scopeSelector": {"matchExpressions": [
        {"scopeName": "PriorityClass", "operator": "Exists", "values": ["x"]}]}},
     'spec.scopeSelector.matchExpressions.values: Invalid value: ["x"]: must be no value when `operator` is '
     "'Exist' or 'DoesNotExist' for scope selector"),
    ({"hard": {"pods": "2"}, "scopeSelector": {"matchExpressions": [
        {"scopeName": "PriorityClass", "operator": "Near", "values": ["x"]}]}},
     'spec.scopeSelector.matchExpressions.operator: Invalid value: "Near": not a valid selector operator'),
])
def test_scopes_are_validated_as_kube_apiserver_does(apiserver: RunningApiServer, spec: dict[str, Any],
                                                      message: str) -> None:
    with pytest.raises(ApiError) as refused:
        apiserver.api.create("ResourceQuota", {"metadata": {"name": "bad"}, "spec": spec}, namespace="default")
    assert refused.value.status == 422
    assert refused.value.message == f'ResourceQuota "bad" is invalid: {message}'


def test_an_update_is_validated_too(apiserver: RunningApiServer) -> None:
    api = apiserver.api
    api.create("ResourceQuota", {"metadata": {"name": "ok"}, "spec": {"hard": {"pods": "2"}, "scopes": ["BestEffort"]}},
               namespace="default")
    with pytest.raises(ApiError, match="unsupported scope applied to resource"):
        api.patch("ResourceQuota", "ok", {"spec": {"hard": {"requests.memory": "1Gi"}}}, namespace="default")
