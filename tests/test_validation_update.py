"""Kubernetes' update strategies for ResourceClaims (gpudra.validation.validate_update), the copy-free reads of
validation and conversion, and the deep copy the API server stores with."""

from __future__ import annotations

import copy
import glob
from pathlib import Path
from typing import Any

import pytest

from gpudra.conversion import storage_view, to_storage
from gpudra.manifests import load_objects
from gpudra.validation import validate_object, validate_update

ROOT = Path(__file__).resolve().parents[1]
UID = "0b6c7f5e-4c1e-4a57-9b0a-3f2d6c1b8e11"


def _claim(status: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default", "uid": UID, "resourceVersion": "5", **meta},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
    }
    if status is not None:
        obj["status"] = status
    return obj


def _allocation(device: str = "gpu-0", request: str = "gpu") -> dict[str, Any]:
    return {"devices": {"results": [{"request": request, "driver": "gpu.nvidia.com", "pool": "node-1",
                                     "device": device}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}]}}


def _consumer(name: str) -> dict[str, Any]:
    return {"resource": "pods", "name": name, "uid": f"{UID[:-2]}{len(name):02d}"}


def _errors(new: dict[str, Any], old: dict[str, Any]) -> list[str]:
    return [str(e) for e in validate_update(new, old)]


# ----- status updates -------------------------------------------------------------------------------------------


def test_a_new_allocation_is_validated_on_a_status_update() -> None:
    old = _claim()
    assert _errors(_claim({"allocation": _allocation()}), old) == []
    bad = _errors(_claim({"allocation": _allocation(device="GPU_0", request="nope")}), old)
    assert any(e.startswith("status.allocation.devices.results[0].request: Invalid value") for e in bad)
    assert any(e.startswith("status.allocation.devices.results[0].device: Invalid value") for e in bad)


def test_a_stored_allocation_is_not_validated_again() -> None:
    # Stored before the rules tightened (here: a device name that is no DNS label): unchanged, it is not
    # re-validated, as Kubernetes' status strategy says; reservations can still be added.
    stored = _allocation(device="GPU_0")
    old = _claim({"allocation": stored})
    new = _claim({"allocation": copy.deepcopy(stored), "reservedFor": [_consumer("p")]})
    assert _errors(new, old) == []
    assert any("device" in str(e) for e in validate_object(new))  # the full validation would refuse it


def test_device_status_must_name_an_allocated_device_even_with_a_stored_allocation() -> None:
    old = _claim({"allocation": _allocation()})
    entry = {"driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-7"}
    new = _claim({"allocation": _allocation(), "devices": [entry]})
    assert _errors(new, old) == ['status.devices[0]: Invalid value: "gpu.nvidia.com/node-1/gpu-7": must be an '
                                 'allocated device in the claim']
    new["status"]["devices"][0]["device"] = "gpu-0"
    assert _errors(new, old) == []


def test_reserved_for_needs_an_allocation() -> None:
    errs = _errors(_claim({"reservedFor": [_consumer("p")]}), _claim())
    assert errs == ["status.reservedFor: Forbidden: may not be specified when `allocated` is not set"]


def test_no_new_reservations_while_the_claim_is_deleted() -> None:
    deleting = {"deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["resource.kubernetes.io/delete-protection"]}
    old = _claim({"allocation": _allocation(), "reservedFor": [_consumer("a"), _consumer("bb")]}, **deleting)
    fewer = _claim({"allocation": _allocation(), "reservedFor": [_consumer("a")]}, **deleting)
    assert _errors(fewer, old) == []
    more = _claim({"allocation": _allocation(), "reservedFor": [_consumer("a"), _consumer("ccc")]}, **deleting)
    assert _errors(more, old) == ["status.reservedFor: Forbidden: new entries may not be added while "
                                  "`deallocationRequested` or `deletionTimestamp` are set"]
    # Not being deleted: adding is fine.
    alive_old = _claim({"allocation": _allocation(), "reservedFor": [_consumer("a")]})
    alive_new = _claim({"allocation": _allocation(), "reservedFor": [_consumer("a"), _consumer("ccc")]})
    assert _errors(alive_new, alive_old) == []


# ----- main-resource updates --------------------------------------------------------------------------------------


def test_an_update_validates_metadata_not_the_immutable_spec() -> None:
    old = _claim()
    old["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "Not_A_Class"  # stored long ago
    new = copy.deepcopy(old)
    new["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    assert _errors(new, old) == []
    assert validate_object(new)  # the spec itself is not valid any more
    new["metadata"]["labels"] = {"bad key!": "v"}
    assert [e for e in _errors(new, old) if e.startswith("metadata.labels")]


def test_other_kinds_are_validated_in_full_on_update() -> None:
    cls = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "x.example.com"},
           "spec": {"selectors": [{"cel": {"expression": "device.driver == "}}]}}
    assert [str(e) for e in validate_update(cls, cls)] == [str(e) for e in validate_object(cls)]


# ----- reading without copying -------------------------------------------------------------------------------------


def _corpus() -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for path in sorted(glob.glob(str(ROOT / "manifests" / "**" / "*.yaml"), recursive=True)):
        objects += [o for o in load_objects([Path(path)]) if str(o.get("apiVersion", "")).startswith("resource.k8s.io/")]
    objects.append(_claim({"allocation": _allocation(), "reservedFor": [_consumer("p")]}))
    v1beta1 = _claim()
    v1beta1["apiVersion"] = "resource.k8s.io/v1beta1"
    v1beta1["spec"]["devices"]["requests"] = [{"name": "gpu", "deviceClassName": "gpu.nvidia.com", "count": 2}]
    objects.append(v1beta1)
    return objects


def test_validation_and_storage_views_never_modify_their_input() -> None:
    corpus = _corpus()
    assert len(corpus) > 5
    for obj in corpus:
        before = copy.deepcopy(obj)
        validate_object(obj)
        validate_update(obj, before)
        view = storage_view(obj)
        assert obj == before, obj["kind"]
        assert view["apiVersion"] == "resource.k8s.io/v1"
        if obj["apiVersion"] == "resource.k8s.io/v1":
            assert view is obj  # nothing to convert: no copy


def test_to_storage_shares_nothing_with_its_input() -> None:
    for obj in _corpus():
        out = to_storage(obj)
        assert out == storage_view(obj)
        stack: list[tuple[Any, Any]] = [(out, obj)]
        originals = set()
        todo = [obj]
        while todo:
            cur = todo.pop()
            if isinstance(cur, (dict, list)):
                originals.add(id(cur))
                todo.extend(cur.values() if isinstance(cur, dict) else cur)
        while stack:
            cur, _ = stack.pop()
            if isinstance(cur, (dict, list)):
                assert id(cur) not in originals
                stack.extend((v, None) for v in (cur.values() if isinstance(cur, dict) else cur))


def test_v1beta1_conversion_result_is_unchanged() -> None:
    obj = _corpus()[-1]
    assert storage_view(obj)["spec"]["devices"]["requests"] == [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2}}]


# ----- through the API server's admission ------------------------------------------------------------------------


def test_status_updates_through_the_server_follow_the_status_strategy(apiserver: Any) -> None:
    from gpudra.kubeapi import Invalid

    api = apiserver.api
    created = api.create("ResourceClaim", {"metadata": {"name": "c"}, "spec": _claim()["spec"]}, "default")
    bad = {**created, "status": {"allocation": _allocation(request="nope")}}
    with pytest.raises(Invalid) as err:
        api.replace_status("ResourceClaim", bad)
    assert err.value.causes[0]["field"] == "status.allocation.devices.results[0].request"
    allocated = api.replace_status("ResourceClaim", {**created, "status": {"allocation": _allocation()}})
    reserved = api.replace_status("ResourceClaim", {**allocated, "status": {
        "allocation": _allocation(), "reservedFor": [_consumer("a")]}})
    # A finalizer keeps the deleted claim; while it is deleted no consumer may be added.
    kept = api.replace("ResourceClaim", {**reserved, "metadata": {**reserved["metadata"], "finalizers": ["example.com/keep"]}})
    api.delete("ResourceClaim", "c", "default")
    deleting = api.get("ResourceClaim", "c", "default")
    assert deleting["metadata"].get("deletionTimestamp") and kept["metadata"]["finalizers"]
    with pytest.raises(Invalid) as err2:
        api.replace_status("ResourceClaim", {**deleting, "status": {
            "allocation": _allocation(), "reservedFor": [_consumer("a"), _consumer("bb")]}})
    assert "new entries may not be added" in err2.value.message
    released = api.replace_status("ResourceClaim", {**deleting, "status": {"allocation": _allocation()}})
    assert "reservedFor" not in released["status"]
