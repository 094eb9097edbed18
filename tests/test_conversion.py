"""resource.k8s.io conversion between v1 (storage), v1beta2 and v1beta1, as kube-apiserver converts.

The first cases transcribe the table of Kubernetes' pkg/apis/resource/v1beta1/conversion_test.go (internal,
which has v1's shapes, stands for v1 here); the rest check every kind round-trips through every served version
and that the field sets we move match the official client's models of both versions.
"""

from __future__ import annotations

import copy
from typing import Any

import kubernetes.client as k
import pytest

from gpudra.conversion import SERVED_VERSIONS, ConversionError, convert, from_storage, normalize_objects, to_storage

SELECTOR = [{"cel": {"expression": 'device.attributes["driver-a"].exists'}}]


def _claim(version: str, requests: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": f"resource.k8s.io/{version}", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns"}, "spec": {"devices": {"requests": requests}}}


def _subrequests() -> list[dict[str, Any]]:
    return [{"name": "sub-1", "deviceClassName": "class-a", "selectors": SELECTOR, "allocationMode": "ExactCount",
             "count": 2},
            {"name": "sub-2", "deviceClassName": "class-a", "selectors": SELECTOR, "allocationMode": "ExactCount",
             "count": 1}]


# ----- upstream's table (pkg/apis/resource/v1beta1/conversion_test.go, TestConversion) -----------------------------


def test_upstream_v1beta1_to_internal_without_alternatives() -> None:
    flat = _claim("v1beta1", [{"name": "foo", "deviceClassName": "class-a", "selectors": SELECTOR,
                               "allocationMode": "ExactCount", "count": 2}])
    assert to_storage(flat) == _claim("v1", [{"name": "foo", "exactly": {
        "deviceClassName": "class-a", "selectors": SELECTOR, "allocationMode": "ExactCount", "count": 2}}])


def test_upstream_internal_to_v1beta1_without_alternatives() -> None:
    nested = _claim("v1", [{"name": "foo", "exactly": {
        "deviceClassName": "class-a", "selectors": SELECTOR, "allocationMode": "ExactCount", "count": 2}}])
    assert from_storage(nested, "v1beta1") == _claim("v1beta1", [{
        "name": "foo", "deviceClassName": "class-a", "selectors": SELECTOR, "allocationMode": "ExactCount",
        "count": 2}])


def test_upstream_v1beta1_to_internal_with_alternatives() -> None:
    assert to_storage(_claim("v1beta1", [{"name": "foo", "firstAvailable": _subrequests()}])) == \
        _claim("v1", [{"name": "foo", "firstAvailable": _subrequests()}])


def test_upstream_internal_to_v1beta1_with_alternatives() -> None:
    assert from_storage(_claim("v1", [{"name": "foo", "firstAvailable": _subrequests()}]), "v1beta1") == \
        _claim("v1beta1", [{"name": "foo", "firstAvailable": _subrequests()}])


# ----- the rest of v1beta1's differences ------------------------------------------------------------------------


def test_v1beta1_defaulting_makes_a_class_only_request_exact() -> None:
    # SetDefaults_DeviceRequest runs before conversion: allocationMode ExactCount, count 1.
    converted = to_storage(_claim("v1beta1", [{"name": "gpu", "deviceClassName": "gpu.nvidia.com"}]))
    assert converted["spec"]["devices"]["requests"] == [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}}]
    # A request naming nothing still gets `exactly` (from the defaults), so v1 validation names the class.
    assert to_storage(_claim("v1beta1", [{"name": "x"}]))["spec"]["devices"]["requests"][0]["exactly"] == \
        {"allocationMode": "ExactCount", "count": 1}


def test_v1beta1_tolerations_capacity_and_admin_access_move_under_exactly() -> None:
    request = {"name": "r", "deviceClassName": "c", "allocationMode": "All", "adminAccess": True,
               "tolerations": [{"key": "k", "operator": "Exists"}], "capacity": {"requests": {"memory": "1Gi"}}}
    exactly = to_storage(_claim("v1beta1", [request]))["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly == {k: v for k, v in request.items() if k != "name"}
    assert from_storage(to_storage(_claim("v1beta1", [request])), "v1beta1")["spec"]["devices"]["requests"] == \
        [request]


def test_v1beta1_slice_devices_are_basic_and_zero_values_mean_unset() -> None:
    v1beta1 = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceSlice", "metadata": {"name": "s"},
               "spec": {"driver": "d.example.com", "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
                        "nodeName": "", "allNodes": False, "perDeviceNodeSelection": True,
                        "devices": [{"name": "gpu-0", "basic": {
                            "attributes": {"model": {"string": "A100"}},
                            "capacity": {"memory": {"value": "80Gi"}},
                            "nodeName": "n1", "taints": [{"key": "k", "effect": "NoSchedule"}]}}]}}
    v1 = to_storage(v1beta1)
    assert "nodeName" not in v1["spec"] and "allNodes" not in v1["spec"]
    assert v1["spec"]["devices"] == [{"name": "gpu-0", "attributes": {"model": {"string": "A100"}},
                                      "capacity": {"memory": {"value": "80Gi"}}, "nodeName": "n1",
                                      "taints": [{"key": "k", "effect": "NoSchedule"}]}]
    back = from_storage(v1, "v1beta1")
    assert back["spec"]["devices"] == v1beta1["spec"]["devices"]
    # v1 to v1beta1 always wraps, even a device with nothing but a name.
    assert from_storage({**v1, "spec": {**v1["spec"], "devices": [{"name": "bare"}]}}, "v1beta1")["spec"]["devices"] \
        == [{"name": "bare", "basic": {}}]


def test_input_is_never_modified() -> None:
    obj = _claim("v1beta1", [{"name": "gpu", "deviceClassName": "gpu.nvidia.com"}])
    before = copy.deepcopy(obj)
    to_storage(obj)
    from_storage(to_storage(obj), "v1beta1")
    assert obj == before


def test_unserved_versions_and_kinds_are_named_with_what_is_served() -> None:
    with pytest.raises(ConversionError, match="served versions: resource.k8s.io/v1, resource.k8s.io/v1beta2, "
                                              "resource.k8s.io/v1beta1"):
        to_storage({"apiVersion": "resource.k8s.io/v1alpha3", "kind": "ResourceClaim"})
    with pytest.raises(ConversionError, match="served versions: resource.k8s.io/v1, resource.k8s.io/v1beta2$"):
        to_storage({"apiVersion": "resource.k8s.io/v1beta1", "kind": "DeviceTaintRule"})
    objects, errors = normalize_objects([{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}},
                                         {"apiVersion": "resource.k8s.io/v1alpha3", "kind": "DeviceClass",
                                          "metadata": {"name": "old"}}])
    assert objects[0]["kind"] == "Pod" and len(errors) == 1 and errors[0].startswith("DeviceClass/old: apiVersion:")


# ----- every kind, every version --------------------------------------------------------------------------------

V1_OBJECTS: dict[str, dict[str, Any]] = {
    "DeviceClass": {"metadata": {"name": "gpu"}, "spec": {
        "selectors": [{"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}],
        "config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"a": 1}}}],
        "extendedResourceName": "example.com/gpu"}},
    "ResourceClaim": {"metadata": {"name": "c", "namespace": "ns"}, "spec": {"devices": {
        "requests": [{"name": "one", "exactly": {"deviceClassName": "gpu", "allocationMode": "ExactCount",
                                                 "count": 2, "selectors": SELECTOR,
                                                 "tolerations": [{"key": "k", "operator": "Exists"}]}},
                     {"name": "alt", "firstAvailable": _subrequests()}],
        "constraints": [{"requests": ["one"], "matchAttribute": "gpu.nvidia.com/nvlinkDomain"}],
        "config": [{"requests": ["one"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {}}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "one", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}},
    "ResourceClaimTemplate": {"metadata": {"name": "t", "namespace": "ns"}, "spec": {
        "metadata": {"labels": {"a": "b"}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu",
                                                                      "allocationMode": "All"}}]}}}},
    "ResourceSlice": {"metadata": {"name": "s"}, "spec": {
        "driver": "gpu.nvidia.com", "pool": {"name": "n1", "generation": 3, "resourceSliceCount": 1},
        "nodeName": "n1",
        "sharedCounters": [{"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}],
        "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "index": {"int": 0}},
                     "capacity": {"memory": {"value": "80Gi"}},
                     "consumesCounters": [{"counterSet": "gpu-0-counters",
                                           "counters": {"memory": {"value": "80Gi"}}}],
                     "taints": [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}],
                     "allowMultipleAllocations": True}]}},
    "DeviceTaintRule": {"metadata": {"name": "r"}, "spec": {
        "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"},
        "taint": {"key": "maintenance", "value": "true", "effect": "NoExecute"}},
        "status": {"conditions": [{"type": "EvictionInProgress", "status": "False", "reason": "Idle",
                                   "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}},
}


@pytest.mark.parametrize("kind", sorted(V1_OBJECTS))
def test_every_kind_round_trips_through_every_served_version(kind: str) -> None:
    stored = {"apiVersion": "resource.k8s.io/v1", "kind": kind, **V1_OBJECTS[kind]}
    for version in SERVED_VERSIONS[kind]:
        shown = from_storage(stored, version)
        assert shown["apiVersion"] == f"resource.k8s.io/{version}"
        assert to_storage(shown) == stored, version
        for other in SERVED_VERSIONS[kind]:
            assert to_storage(convert(shown, other)) == stored, (version, other)


def _client_fields(model: str) -> set[str]:
    return set(getattr(k, model).attribute_map.values())


def test_the_fields_moved_are_exactly_the_ones_the_versions_differ_in() -> None:
    from gpudra import conversion

    flat = _client_fields("V1beta1DeviceRequest") - {"name", "firstAvailable"}
    assert flat == set(conversion._EXACT_FIELDS) == _client_fields("V1ExactDeviceRequest")
    assert _client_fields("V1beta1BasicDevice") == _client_fields("V1Device") - {"name"}
    assert _client_fields("V1beta1Device") == {"name", "basic"}
    # v1beta2 has v1's shapes everywhere.
    for name in ("DeviceRequest", "Device", "ExactDeviceRequest", "ResourceSliceSpec", "DeviceClassSpec",
                 "AllocationResult", "DeviceTaintRuleSpec", "DeviceTaint"):
        assert _client_fields(f"V1beta2{name}") == _client_fields(f"V1{name}"), name


def test_an_object_read_through_v1beta1_parses_as_the_client_model() -> None:
    stored = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", **V1_OBJECTS["ResourceSlice"]}
    shown = from_storage(stored, "v1beta1")
    model = k.ApiClient()._ApiClient__deserialize(shown, "V1beta1ResourceSlice")  # the client's own decoding
    assert model.spec.devices[0].basic.capacity["memory"].value == "80Gi"


def test_no_other_type_differs_between_versions() -> None:
    """Every model reachable from the served kinds has v1's fields in v1beta2 and v1beta1, except the two that
    conversion handles, so nothing else can be lost or misplaced by a round trip."""
    from controlplane.openapi import definitions
    from controlplane.resources import DEFAULT_REGISTRY

    differing = set()
    for model in definitions(DEFAULT_REGISTRY).names:
        for prefix in ("V1beta1", "V1beta2"):
            twin = "V1" + model[len(prefix):]
            if model.startswith(prefix) and hasattr(k, twin) and _client_fields(model) != _client_fields(twin):
                differing.add(model)
    assert differing == {"V1beta1Device", "V1beta1DeviceRequest"}


def test_a_basic_of_the_wrong_type_is_refused_not_dropped() -> None:
    bad = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceSlice", "metadata": {"name": "s"},
           "spec": {"devices": [{"name": "ok", "basic": {}}, {"name": "gpu-0", "basic": "A100"}]}}
    with pytest.raises(ConversionError) as err:
        to_storage(bad)
    assert err.value.path == "spec.devices[1].basic" and "must be an object" in str(err.value)
    from gpudra.validation import validate_object

    assert [str(e) for e in validate_object(bad)] == [
        "spec.devices[1].basic: Invalid value: must be an object (BasicDevice), got str"]


def test_the_cel_debugger_reads_v1beta1_slices(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from cli.main import main

    path = tmp_path / "old.yaml"
    path.write_text(json.dumps({
        "apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceSlice", "metadata": {"name": "s"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "n1",
                 "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0", "basic": {"attributes": {"productName": {"string": "A100"}},
                                                         "capacity": {"memory": {"value": "80Gi"}}}}]}}))
    rc = main(["cel", 'device.attributes["gpu.nvidia.com"].productName == "A100" && '
                      'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) > 0',
               "-f", str(path), "-o", "json"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["results"] == [{"device": "gpu.nvidia.com/n1/gpu-0", "match": True}]
