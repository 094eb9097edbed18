"""Pure helpers on Kubernetes object dicts: names, metadata, copying, the server-side rules per kind."""

from __future__ import annotations

import json
import re
from typing import Any

from controlplane import namespaces, quota
from controlplane.resources import ResourceType

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Kubernetes' generateName suffix alphabet: no vowels (no words) and no easily confused characters.
GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"

# apimachinery's TotalAnnotationSizeLimitB: keys and values of an object's annotations together.
ANNOTATIONS_MAX_BYTES = 256 * 1024
# Resources whose status is reset on create, as Kubernetes' create strategies do.
_STATUS_CLEARED_ON_CREATE = frozenset({"ResourceClaim", "ResourceQuota"})




def meta(obj: dict[str, Any]) -> dict[str, Any]:
    m = obj.get("metadata")
    if not isinstance(m, dict):
        m = {}
        obj["metadata"] = m
    return m


def name_errors(rt: ResourceType, name: str) -> list[str]:
    """Kubernetes' object-name rules: namespaces are DNS labels, everything we serve else DNS subdomains."""
    if rt.kind == "Namespace":
        if len(name) > 63 or not _DNS_LABEL.match(name):
            return [f"metadata.name: Invalid value: {json.dumps(name)}: a lowercase RFC 1123 label must consist "
                    "of lower case alphanumeric characters or '-', and must start and end with an alphanumeric "
                    "character (at most 63 characters)"]
        return []
    if rt.group == "rbac.authorization.k8s.io":
        # RBAC objects only need path-segment names (ValidateRBACName), so `system:discovery` is valid.
        if name in (".", ".."):
            return [f"metadata.name: Invalid value: {json.dumps(name)}: may not be '{name}'"]
        bad = next((c for c in ("/", "%") if c in name), None)
        if bad:
            return [f"metadata.name: Invalid value: {json.dumps(name)}: may not contain '{bad}'"]
        return []
    if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        return [f"metadata.name: Invalid value: {json.dumps(name)}: a lowercase RFC 1123 subdomain must consist "
                "of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric "
                "character (at most 253 characters)"]
    return []


def metadata_errors(obj: dict[str, Any]) -> list[str]:
    m = obj.get("metadata") or {}
    errors: list[str] = []
    for key in ("labels", "annotations"):
        value = m.get(key)
        if value is None:
            continue
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            errors.append(f"metadata.{key}: Invalid value: must be a map of string keys to string values")
        elif key == "annotations" and sum(len(k.encode()) + len(v.encode()) for k, v in value.items()) > \
                ANNOTATIONS_MAX_BYTES:
            errors.append(f"metadata.annotations: Too long: may not be more than {ANNOTATIONS_MAX_BYTES} bytes")
    finalizers = m.get("finalizers")
    if finalizers is not None and (not isinstance(finalizers, list) or not all(isinstance(f, str) for f in finalizers)):
        errors.append("metadata.finalizers: Invalid value: must be a list of strings")
    owners = m.get("ownerReferences")
    if owners is not None:
        if not isinstance(owners, list):
            errors.append("metadata.ownerReferences: Invalid value: must be a list")
        else:
            for i, ref in enumerate(owners):
                if not isinstance(ref, dict):
                    errors.append(f"metadata.ownerReferences[{i}]: Invalid value: must be an object")
                    continue
                for key in ("apiVersion", "kind", "name", "uid"):
                    if not ref.get(key):
                        errors.append(f"metadata.ownerReferences[{i}].{key}: Required value")
    return errors


def replace_content(obj: dict[str, Any], new: dict[str, Any]) -> None:
    """Make `obj` hold `new`'s content, keeping its own metadata dict (which a write in progress holds on to)."""
    metadata, new_metadata = obj.get("metadata"), new.get("metadata")
    obj.clear()
    obj.update(new)
    if isinstance(metadata, dict) and isinstance(new_metadata, dict) and metadata is not new_metadata:
        metadata.clear()
        metadata.update(new_metadata)
        obj["metadata"] = metadata


def without(obj: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in keys}


def spec_part(rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
    """The part of an object whose change bumps metadata.generation."""
    skip = ("metadata", "status", "apiVersion", "kind") if rt.has_status else ("metadata", "apiVersion", "kind")
    return without(obj, *skip)


def prepare_create(rt: ResourceType, obj: dict[str, Any]) -> None:
    """Reset what a client may not set on create, as Kubernetes' per-kind create strategies do."""
    if rt.kind in _STATUS_CLEARED_ON_CREATE or (rt.custom is not None and rt.has_status):
        obj.pop("status", None)
    elif rt.kind == "Pod":
        status = obj.get("status")
        if not isinstance(status, dict):
            status = {}
        obj["status"] = {**status, "phase": status.get("phase") or "Pending"}
        spec = obj.get("spec")
        if isinstance(spec, dict):
            spec.setdefault("schedulerName", "default-scheduler")
    elif rt.kind == "CustomResourceDefinition" and rt.group == "apiextensions.k8s.io":
        # The server's CRD controllers set the status; its instances are removed before it goes (the finalizer).
        obj.pop("status", None)
        finalizers = meta(obj).setdefault("finalizers", [])
        if isinstance(finalizers, list) and "customresourcecleanup.apiextensions.k8s.io" not in finalizers:
            finalizers.append("customresourcecleanup.apiextensions.k8s.io")
    elif rt.kind == "Namespace" and not rt.group:
        namespaces.prepare_create(obj)
    elif rt.kind == "DaemonSet" and rt.group == "apps":
        meta(obj).setdefault("annotations", {})[TEMPLATE_GENERATION] = "1"


# kube-apiserver's DaemonSet strategy keeps spec.templateGeneration (internal), shown in v1 as this annotation: 1 on
# create, one more for every change of spec.template; the controller labels its pods with it.
TEMPLATE_GENERATION = "deprecated.daemonset.template.generation"


def prepare_update(rt: ResourceType, new: dict[str, Any], old: dict[str, Any]) -> None:
    """What the per-kind update strategies keep or derive from the stored object."""
    if rt.kind == "Namespace" and not rt.group:
        namespaces.with_spec_of(new, old)
    elif rt.kind == "DaemonSet" and rt.group == "apps":
        before = str(((old.get("metadata") or {}).get("annotations") or {}).get(TEMPLATE_GENERATION) or "1")
        generation = int(before) if before.isdigit() else 1
        if (new.get("spec") or {}).get("template") != (old.get("spec") or {}).get("template"):
            generation += 1
        annotations = meta(new).get("annotations")
        meta(new)["annotations"] = {**(annotations if isinstance(annotations, dict) else {}),
                                    TEMPLATE_GENERATION: str(generation)}


def spec_errors(rt: ResourceType, obj: dict[str, Any]) -> list[str]:
    """Per-kind validation kube-apiserver does that no admission stage here covers (namespaces' finalizers,
    quotas' scopes)."""
    if rt.group:
        return []
    if rt.kind == "Namespace":
        return namespaces.spec_errors(obj)
    if rt.kind == "ResourceQuota":
        return quota.spec_errors(obj)
    return []


def immutability_errors(rt: ResourceType, new: dict[str, Any], old: dict[str, Any]) -> list[str]:
    """The fields Kubernetes refuses to change after creation, for the kinds we serve."""
    errors: list[str] = []
    if rt.kind == "ResourceClaim":
        if new.get("spec") != old.get("spec"):
            errors.append("spec: Invalid value: \"object\": field is immutable")
        old_alloc = (old.get("status") or {}).get("allocation")
        new_alloc = (new.get("status") or {}).get("allocation")
        # An allocation may be set once and removed (deallocation), but never changed in place.
        if old_alloc is not None and new_alloc is not None and old_alloc != new_alloc:
            errors.append("status.allocation: Invalid value: \"object\": field is immutable")
    elif rt.kind == "ResourceSlice":
        old_driver = (old.get("spec") or {}).get("driver")
        new_driver = (new.get("spec") or {}).get("driver")
        if old_driver != new_driver:
            errors.append(f"spec.driver: Invalid value: {json.dumps(new_driver)}: field is immutable")
    elif rt.kind == "ResourceClaimTemplate":
        if new.get("spec") != old.get("spec"):
            errors.append("spec: Invalid value: \"object\": field is immutable")
    elif rt.kind == "Pod":
        old_node = (old.get("spec") or {}).get("nodeName")
        new_node = (new.get("spec") or {}).get("nodeName")
        if old_node and new_node != old_node:
            errors.append(f"spec.nodeName: Invalid value: {json.dumps(new_node)}: field is immutable once set")
    return errors


def owner_uids(obj: dict[str, Any]) -> list[str]:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return [r["uid"] for r in refs if isinstance(r, dict) and isinstance(r.get("uid"), str)]
