"""Kubernetes' validation rules for resource.k8s.io objects, in every served version.

Objects in v1beta1 or v1beta2 are converted to v1 first (gpudra.conversion) and validated there, as
kube-apiserver validates the internal version: field paths in errors are v1's (`exactly.deviceClassName`).

`validate_object(obj)` returns every violation of an object as `FieldError`s with
Kubernetes' field paths and messages; an empty list means the API server would accept it.

Semantics are Kubernetes 1.35's, after v1 defaulting (allocationMode ExactCount, count 1, toleration
operator Equal): duplicates are reported at the list item (`requests[1]`), map-key errors at the map
(`attributes`), and a list over its limit reports only its size. Fields behind alpha gates
(consumable capacity, distinctAttribute, extendedResourceName, ...) are validated as written and
accepted: an API server with the gate off silently drops them on create, which an offline check of
the file cannot model usefully, so we check what the user wrote.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpudra.conversion import ConversionError, served_versions, split_api_version, storage_view
from gpudra.validation.claims import gather_request_names, validate_claim_spec, validate_claim_status, validate_device_class_spec
from gpudra.validation.common import Hooks
from gpudra.validation.errors import FieldError, child, invalid, not_supported, required
from gpudra.validation.fields import get_map
from gpudra.validation.meta import validate_object_meta, validate_template_meta
from gpudra.validation.slices import validate_slice_spec
from gpudra.validation.taintrules import validate_taint_rule_spec, validate_taint_rule_status

API_VERSION = "resource.k8s.io/v1"
KINDS = ["DeviceClass", "DeviceTaintRule", "ResourceClaim", "ResourceClaimTemplate", "ResourceSlice"]
NAMESPACED_KINDS = frozenset({"ResourceClaim", "ResourceClaimTemplate"})

__all__ = ["API_VERSION", "FieldError", "KINDS", "NAMESPACED_KINDS", "validate_object", "validate_update"]


def validate_object(
    obj: Any,
    *,
    cel: Callable[[str, bool], str | None] | None = None,
    opaque: Mapping[str, Callable[[dict[str, Any]], list[str]]] | None = None,
    kubernetes_version: str = "1.37",
) -> list[FieldError]:
    """All validation errors of one resource.k8s.io object (DeviceClass, ResourceClaim, ...) of any served
    version, with the rules of `kubernetes_version` where they differ (1.37: fractional capacity ranges,
    DRAFractionalCapacityRange)."""
    if not isinstance(obj, dict):
        return [invalid("", obj, "must be a Kubernetes object (a mapping with apiVersion, kind, metadata)")]
    hooks = Hooks(cel=cel, opaque=dict(opaque or {}))
    api_version = obj.get("apiVersion")
    kind = obj.get("kind")
    if not api_version:
        return [required("apiVersion", f"must be {API_VERSION!r}")]
    group, version = split_api_version(api_version)
    if not kind:
        return [required("kind", "must be one of " + ", ".join(KINDS))]
    if kind not in KINDS:
        return [not_supported("kind", kind, KINDS)]
    accepted = [f"{group or 'resource.k8s.io'}/{v}" for v in served_versions(kind)]
    if group != "resource.k8s.io" or version not in served_versions(kind):
        return [not_supported("apiVersion", api_version, accepted)]
    try:
        obj = storage_view(obj)  # validation only reads: no copy of a v1 object
    except ConversionError as exc:
        return [FieldError(exc.path, f"Invalid value: {exc}")]

    errs = validate_object_meta(obj.get("metadata"), namespaced=kind in NAMESPACED_KINDS)
    if kind == "DeviceClass":
        errs.extend(validate_device_class_spec(obj.get("spec"), "spec", hooks))
    elif kind == "ResourceSlice":
        fractional = int(kubernetes_version.split(".")[1]) >= 37
        errs.extend(validate_slice_spec(obj.get("spec"), "spec", fractional=fractional))
    elif kind == "DeviceTaintRule":
        errs.extend(validate_taint_rule_spec(obj.get("spec"), "spec"))
        if obj.get("status") is not None:
            errs.extend(validate_taint_rule_status(obj.get("status"), "status"))
    elif kind == "ResourceClaim":
        errs.extend(validate_claim_spec(obj.get("spec"), "spec", hooks))
        if obj.get("status") is not None:
            spec = get_map(obj.get("spec"), "spec", [])
            names = gather_request_names(get_map(spec.get("devices"), "spec.devices", []))
            errs.extend(validate_claim_status(obj.get("status"), "status", names, hooks))
    else:  # ResourceClaimTemplate
        spec_errs: list[FieldError] = []
        spec = get_map(obj.get("spec"), "spec", spec_errs)
        errs.extend(spec_errs)
        errs.extend(validate_template_meta(spec.get("metadata"), child("spec", "metadata")))
        errs.extend(validate_claim_spec(spec.get("spec"), child("spec", "spec"), hooks))
    return errs


def validate_update(
    obj: Any,
    old: Any,
    *,
    cel: Callable[[str, bool], str | None] | None = None,
    opaque: Mapping[str, Callable[[dict[str, Any]], list[str]]] | None = None,
    kubernetes_version: str = "1.37",
) -> list[FieldError]:
    """The validation errors of an update of the stored `old` to `obj`, as Kubernetes' update strategies
    validate it. Immutable fields are the server's own check (a changed claim spec or allocation is refused
    there), not repeated here.

    A ResourceClaim's update validates its metadata (ValidateResourceClaimUpdate: the spec is immutable, so it
    is not validated again); its status update validates the status against the stored one
    (ValidateResourceClaimStatusUpdate). A server's update keeps the stored status and its status update the
    stored spec and metadata, so a changed status is what marks a status update. Every other kind is
    validated in full, as their strategies do."""
    if not isinstance(obj, dict) or not isinstance(old, dict) or obj.get("kind") != "ResourceClaim" \
            or old.get("kind") != "ResourceClaim":
        return validate_object(obj, cel=cel, opaque=opaque, kubernetes_version=kubernetes_version)
    try:
        new_v1, old_v1 = storage_view(obj), storage_view(old)
    except ConversionError:
        return validate_object(obj, cel=cel, opaque=opaque, kubernetes_version=kubernetes_version)
    if new_v1.get("status") == old_v1.get("status"):
        return validate_object_meta(new_v1.get("metadata"), namespaced=True)
    hooks = Hooks(cel=cel, opaque=dict(opaque or {}))
    spec = get_map(new_v1.get("spec"), "spec", [])
    names = gather_request_names(get_map(spec.get("devices"), "spec.devices", []))
    meta = new_v1.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
    return validate_claim_status(new_v1.get("status"), "status", names, hooks, old_value=old_v1.get("status") or {},
                                 deleted=bool(meta.get("deletionTimestamp")))
