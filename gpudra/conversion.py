"""Conversion between the served versions of resource.k8s.io objects, as kube-apiserver converts them.

v1 is the storage version and the version every consumer (validation, allocator, controller) reads.
v1beta2 has v1's shapes, so converting it changes only `apiVersion`. v1beta1 differs in two places
(Kubernetes' pkg/apis/resource/v1beta1/conversion.go):

- a DeviceRequest carries the "exactly one kind of device" fields flat (deviceClassName, selectors,
  allocationMode, count, adminAccess, tolerations, capacity, derivedAttributes) where v1 nests them under
  `exactly`;
  when any of them is set, v1 gets an `exactly` holding them. Before that, v1beta1's defaulting applies
  (a request without firstAvailable gets allocationMode ExactCount, and count 1 for ExactCount), so a
  request naming only a class still converts to an `exactly` request, as on a real server.
- a ResourceSlice device wraps its properties in `basic` where v1 has them on the device itself; v1 to
  v1beta1 always produces `basic`, and `nodeName: ""` / `allNodes: false` mean "unset" in v1beta1.

Everything else (DeviceClass, claim status, DeviceTaintRule) has the same shape in every version.
Functions here are pure: they return new dicts and never modify their input.
"""

from __future__ import annotations

from typing import Any

from gpudra.jsoncopy import copy_json

GROUP = "resource.k8s.io"
STORAGE_VERSION = "v1"
# Served versions per kind, preferred first (discovery lists them in this order).
SERVED_VERSIONS: dict[str, tuple[str, ...]] = {
    "DeviceClass": ("v1", "v1beta2", "v1beta1"),
    "ResourceClaim": ("v1", "v1beta2", "v1beta1"),
    "ResourceClaimTemplate": ("v1", "v1beta2", "v1beta1"),
    "ResourceSlice": ("v1", "v1beta2", "v1beta1"),
    "DeviceTaintRule": ("v1", "v1beta2"),
}
# The DeviceRequest fields v1beta1 keeps flat and v1 keeps under `exactly`, in v1's field order.
_EXACT_FIELDS = ("deviceClassName", "selectors", "allocationMode", "count", "adminAccess", "tolerations",
                 "capacity", "derivedAttributes")


class ConversionError(ValueError):
    """An object cannot be converted: unknown version or kind, or a moved structure of the wrong type.
    `path` is the field at fault; the message names what is accepted."""

    def __init__(self, message: str, path: str = "apiVersion") -> None:
        super().__init__(message)
        self.path = path


def split_api_version(api_version: Any) -> tuple[str, str]:
    text = api_version if isinstance(api_version, str) else ""
    group, sep, version = text.rpartition("/")
    return (group, version) if sep else ("", text)


def is_resource_api(obj: Any) -> bool:
    return isinstance(obj, dict) and split_api_version(obj.get("apiVersion"))[0] == GROUP


def served_versions(kind: str) -> tuple[str, ...]:
    return SERVED_VERSIONS.get(kind, ())


def _check(kind: str, version: str) -> None:
    versions = SERVED_VERSIONS.get(kind)
    if versions is None:
        raise ConversionError(f"kind {kind!r} is not served in {GROUP}; served kinds: "
                              + ", ".join(SERVED_VERSIONS))
    if version not in versions:
        raise ConversionError(f"{GROUP}/{version} does not serve {kind}; served versions: "
                              + ", ".join(f"{GROUP}/{v}" for v in versions))


# ----- v1beta1 -> v1 ---------------------------------------------------------------------------------------------


def _default_v1beta1_request(request: dict[str, Any]) -> None:
    """v1beta1's SetDefaults_DeviceRequest: only requests without firstAvailable are defaulted."""
    if request.get("firstAvailable"):
        return
    if not request.get("allocationMode"):
        request["allocationMode"] = "ExactCount"
    if request["allocationMode"] == "ExactCount" and not request.get("count"):
        request["count"] = 1


def _request_v1beta1_to_v1(request: Any) -> Any:
    if not isinstance(request, dict):
        return request
    request = dict(request)
    _default_v1beta1_request(request)
    exactly = {k: request.pop(k) for k in _EXACT_FIELDS if k in request}
    # hasAnyMainRequestFieldsSet: empty strings and a zero count count as unset, as Go's zero values do.
    if any(v not in (None, "", 0) for v in exactly.values()):
        request["exactly"] = {k: v for k, v in exactly.items() if v is not None}
    return request


def _request_v1_to_v1beta1(request: Any) -> Any:
    if not isinstance(request, dict):
        return request
    out = {k: v for k, v in request.items() if k != "exactly"}
    exactly = request.get("exactly")
    if isinstance(exactly, dict):
        for key in _EXACT_FIELDS:
            if key in exactly:
                out[key] = exactly[key]
        # Unknown fields under `exactly` (from a newer API) have no v1beta1 home; they are dropped, as the
        # generated conversion drops fields a version lacks.
    return out


def _map_requests(spec: Any, fn: Any) -> Any:
    """Apply `fn` to each of a ResourceClaimSpec's requests."""
    if not isinstance(spec, dict) or not isinstance(spec.get("devices"), dict):
        return spec
    devices = dict(spec["devices"])
    if isinstance(devices.get("requests"), list):
        devices["requests"] = [fn(r) for r in devices["requests"]]
    return {**spec, "devices": devices}


def _device_v1beta1_to_v1(device: Any, path: str) -> Any:
    if not isinstance(device, dict):
        return device
    out = {k: v for k, v in device.items() if k != "basic"}
    basic = device.get("basic")
    if isinstance(basic, dict):
        out.update(basic)
    elif basic is not None:
        # kube-apiserver's decoder refuses it too; dropping it would accept a device without its properties.
        raise ConversionError(f"must be an object (BasicDevice), got {type(basic).__name__}", f"{path}.basic")
    return out


def _device_v1_to_v1beta1(device: Any, path: str) -> Any:
    if not isinstance(device, dict):
        return device
    return {"name": device["name"], "basic": {k: v for k, v in device.items() if k != "name"}} \
        if "name" in device else {"basic": dict(device)}


def _slice_spec(spec: Any, device_fn: Any, to_v1: bool) -> Any:
    if not isinstance(spec, dict):
        return spec
    out = dict(spec)
    if isinstance(out.get("devices"), list):
        out["devices"] = [device_fn(d, f"spec.devices[{i}]") for i, d in enumerate(out["devices"])]
    if to_v1:
        # v1beta1's nodeName and allNodes are plain values whose zero means unset; v1's are pointers.
        if out.get("nodeName") == "":
            out.pop("nodeName")
        if out.get("allNodes") is False:
            out.pop("allNodes")
    return out


def _convert_spec(kind: str, obj: dict[str, Any], to_v1: bool) -> dict[str, Any]:
    request_fn = _request_v1beta1_to_v1 if to_v1 else _request_v1_to_v1beta1
    if kind == "ResourceClaim" and "spec" in obj:
        obj["spec"] = _map_requests(obj["spec"], request_fn)
    elif kind == "ResourceClaimTemplate" and isinstance(obj.get("spec"), dict) and "spec" in obj["spec"]:
        obj["spec"] = {**obj["spec"], "spec": _map_requests(obj["spec"]["spec"], request_fn)}
    elif kind == "ResourceSlice" and "spec" in obj:
        obj["spec"] = _slice_spec(obj["spec"], _device_v1beta1_to_v1 if to_v1 else _device_v1_to_v1beta1, to_v1)
    return obj


# ----- entry points ----------------------------------------------------------------------------------------------


def storage_view(obj: dict[str, Any]) -> dict[str, Any]:
    """The v1 form of a resource.k8s.io object given in any served version, for reading only: `obj` itself
    when it is v1, else a new dict that shares every part conversion leaves alone with `obj`.
    Raises ConversionError when its version does not serve its kind."""
    group, version = split_api_version(obj.get("apiVersion"))
    kind = str(obj.get("kind") or "")
    if group != GROUP:
        raise ConversionError(f"apiVersion {obj.get('apiVersion')!r} is not in {GROUP}")
    _check(kind, version)
    if version == STORAGE_VERSION:
        return obj
    out = {**obj, "apiVersion": f"{GROUP}/{STORAGE_VERSION}"}
    if version == "v1beta1":
        _convert_spec(kind, out, to_v1=True)
    return out


def to_storage(obj: dict[str, Any]) -> dict[str, Any]:
    """The v1 form of a resource.k8s.io object given in any served version (a new dict sharing nothing
    with `obj`). Raises ConversionError when its version does not serve its kind."""
    return copy_json(storage_view(obj))


def from_storage(obj: dict[str, Any], version: str) -> dict[str, Any]:
    """A stored v1 object as `version` serves it (the object itself when `version` is v1)."""
    kind = str(obj.get("kind") or "")
    _check(kind, version)
    if version == STORAGE_VERSION:
        return obj
    out = {**obj, "apiVersion": f"{GROUP}/{version}"}
    if version == "v1beta1":
        _convert_spec(kind, out, to_v1=False)
    return out


def convert(obj: dict[str, Any], version: str) -> dict[str, Any]:
    """Any served version to any other."""
    return from_storage(to_storage(obj), version)


def normalize_objects(objects: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Input objects with every resource.k8s.io object in v1; objects of other groups pass through.
    Returns the objects and one message per object that could not be converted (naming it)."""
    out: list[dict[str, Any]] = []
    errors: list[str] = []
    for obj in objects:
        if not is_resource_api(obj):
            out.append(obj)
            continue
        try:
            out.append(to_storage(obj))
        except ConversionError as exc:
            meta = obj.get("metadata")
            if not isinstance(meta, dict):
                meta = {}
            errors.append(f"{obj.get('kind') or '?'}/{meta.get('name') or ''}: {exc.path}: {exc}")
            out.append(obj)
    return out, errors
