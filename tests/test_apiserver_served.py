"""Served versions as a 1.37 kube-apiserver serves them (GA only, betas through --runtime-config), and fields of
disabled feature gates dropped on write, as kube-apiserver's strategies drop them."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

import pytest

from controlplane import EmbeddedApiServer
from controlplane.resources import known_group_versions, registry_for
from controlplane.runtimeconfig import RuntimeConfig, RuntimeConfigError
from gpudra.features import Features


def _get(url: str) -> Any:
    with urllib.request.urlopen(url) as resp:
        return json.load(resp)


def _versions(url: str, group: str) -> list[str]:
    return [v["version"] for v in _get(f"{url}/apis/{group}")["versions"]]


def test_by_default_only_ga_versions_are_served(server: EmbeddedApiServer) -> None:
    assert _versions(server.url, "resource.k8s.io") == ["v1"]
    assert _versions(server.url, "scheduling.k8s.io") == ["v1"]
    with pytest.raises(urllib.error.HTTPError) as err:
        _get(f"{server.url}/apis/resource.k8s.io/v1beta1/resourceclaims")
    assert err.value.code == 404


@pytest.mark.apiserver_options(runtime_config="api/beta=true,resource.k8s.io/v1beta2=false")
def test_runtime_config_enables_betas_and_a_specific_entry_wins(server: EmbeddedApiServer) -> None:
    assert _versions(server.url, "resource.k8s.io") == ["v1", "v1beta1"]


def test_runtime_config_semantics() -> None:
    known = known_group_versions()
    assert not RuntimeConfig().serves("resource.k8s.io", "v1beta1", "resourceclaims")
    assert RuntimeConfig().serves("resource.k8s.io", "v1", "resourceclaims")
    one = RuntimeConfig.parse("resource.k8s.io/v1beta1/resourceclaims=true", known)
    assert one.serves("resource.k8s.io", "v1beta1", "resourceclaims")
    assert not one.serves("resource.k8s.io", "v1beta1", "deviceclasses")
    assert RuntimeConfig.parse(["api/all=false", "v1=true"], known).serves("", "v1", "pods")
    assert not RuntimeConfig.parse("api/all=false", known).serves("apps", "v1", "deployments")
    registry = registry_for("1.37", RuntimeConfig.parse("resource.k8s.io/v1beta1", known))
    claim = registry.by_kind("ResourceClaim")
    assert claim is not None and claim.versions == ("v1", "v1beta1")
    for bad, message in (("resource.k8s.io/v1beta1=yes", "invalid value 'yes'"),
                         ("example.com/v1=true", "unknown API group version example.com/v1")):
        with pytest.raises(RuntimeConfigError, match=message):
            RuntimeConfig.parse(bad, known)


def test_the_workload_api_needs_its_gate_and_its_version() -> None:
    config = RuntimeConfig.parse("scheduling.k8s.io/v1beta1=true", known_group_versions())
    assert registry_for("1.37", config).by_kind("PodGroup") is None  # GenericWorkload is off in 1.37
    assert registry_for("1.37", config, Features.parse(["GenericWorkload"])).by_kind("PodGroup") is not None
    assert registry_for("1.37", None, Features.parse(["GenericWorkload"])).by_kind("PodGroup") is None


@pytest.mark.process
def test_apiserver_command_refuses_a_bad_runtime_config() -> None:
    done = subprocess.run([sys.executable, "-m", "cli.main", "apiserver", "--runtime-config", "resource.k8s.io/v9=true"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert "unknown API group version resource.k8s.io/v9" in done.stderr and "Traceback" not in done.stderr


def _pod_group(claims: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulingPolicy": {"basic": {}}}
    if claims:
        spec["resourceClaims"] = [{"name": "shared", "resourceClaimTemplateName": "t"}]
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": "g", "namespace": "default"}, "spec": spec}


@pytest.mark.apiserver_options(runtime_config="scheduling.k8s.io/v1beta1=true", features=Features.parse(["GenericWorkload"]))
def test_pod_group_claims_are_dropped_without_their_gate(apiserver: Any) -> None:
    stored = apiserver.api.create("PodGroup", _pod_group(True), "default")
    assert "resourceClaims" not in stored["spec"]
    stored["spec"]["resourceClaims"] = [{"name": "shared", "resourceClaimTemplateName": "t"}]
    apiserver.api.replace("PodGroup", stored)
    assert "resourceClaims" not in apiserver.api.get("PodGroup", "g", "default")["spec"]


@pytest.mark.apiserver_options(runtime_config="scheduling.k8s.io/v1beta1=true",
                               features=Features.parse(["GenericWorkload", "DRAWorkloadResourceClaims"]))
def test_pod_group_claims_are_kept_with_their_gate(apiserver: Any) -> None:
    stored = apiserver.api.create("PodGroup", _pod_group(True), "default")
    assert stored["spec"]["resourceClaims"] == [{"name": "shared", "resourceClaimTemplateName": "t"}]


def _slice(**device: Any) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": "n", "pool": {"name": "n", "generation": 1,
                                                                            "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0", **device}]}}


def test_list_type_attributes_are_dropped_with_their_alpha_gate_off(apiserver: Any) -> None:
    stored = apiserver.api.create("ResourceSlice", _slice(attributes={
        "model": {"string": "A100"}, "links": {"strings": ["a", "b"]}}))
    assert stored["spec"]["devices"][0]["attributes"] == {"model": {"string": "A100"}}


def test_fields_of_gates_off_in_an_older_release_are_dropped_and_kept_when_in_use() -> None:
    from controlplane.gatedfields import GatedFields

    gated = GatedFields(Features.for_version("1.35"))  # DRAConsumableCapacity and DRADeviceTaints: alpha, off
    new = _slice(allowMultipleAllocations=True, taints=[{"key": "k", "effect": "NoSchedule"}],
                 capacity={"memory": {"value": "80Gi", "requestPolicy": {"default": "1Gi"}}})
    gated.drop_disabled("resource.k8s.io", "ResourceSlice", new, None)
    assert new["spec"]["devices"][0] == {"name": "gpu-0", "capacity": {"memory": {"value": "80Gi"}}}
    old = _slice(allowMultipleAllocations=True)
    update = _slice(allowMultipleAllocations=False, taints=[{"key": "k", "effect": "NoSchedule"}])
    gated.drop_disabled("resource.k8s.io", "ResourceSlice", update, old)
    assert update["spec"]["devices"][0] == {"name": "gpu-0", "allowMultipleAllocations": False}
    claim = {"spec": {"devices": {"requests": [{"name": "r", "exactly": {
        "deviceClassName": "c", "capacity": {"requests": {"memory": "1Gi"}}}}]}}}
    gated.drop_disabled("resource.k8s.io", "ResourceClaim", claim, None)
    assert claim["spec"]["devices"]["requests"][0]["exactly"] == {"deviceClassName": "c"}
