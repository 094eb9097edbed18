"""ObjectMeta rules (Kubernetes' ValidateObjectMeta subset that applies to DRA objects)."""

from __future__ import annotations

import json
from typing import Any

from gpudra.validation import names
from gpudra.validation.errors import FieldError, child, forbidden, invalid, required, too_long
from gpudra.validation.fields import get_map, get_str, label_key, label_value

_ANNOTATIONS_MAX_BYTES = 256 * 1024


def validate_object_meta(meta_value: Any, namespaced: bool, path: str = "metadata") -> list[FieldError]:
    """Names are DNS subdomains; namespace required exactly for namespaced kinds; labels and annotations."""
    errs: list[FieldError] = []
    meta = get_map(meta_value, path, errs)
    name = get_str(meta.get("name"), child(path, "name"), errs)
    generate_name = get_str(meta.get("generateName"), child(path, "generateName"), errs)
    if generate_name:
        for msg in names.dns1123_subdomain(names.mask_trailing_dash(generate_name)):
            errs.append(invalid(child(path, "generateName"), generate_name, msg))
    if not name and not generate_name:
        errs.append(required(child(path, "name"), "name or generateName is required"))
    elif name:
        for msg in names.dns1123_subdomain(name):
            errs.append(invalid(child(path, "name"), name, msg))
    namespace = get_str(meta.get("namespace"), child(path, "namespace"), errs)
    if namespaced:
        if not namespace:
            errs.append(required(child(path, "namespace"), ""))
        else:
            for msg in names.dns1123_label(namespace):
                errs.append(invalid(child(path, "namespace"), namespace, msg))
    elif namespace:
        errs.append(forbidden(child(path, "namespace"), "not allowed on this type"))
    errs.extend(validate_labels_and_annotations(meta, path))
    return errs


def validate_labels_and_annotations(meta: dict[str, Any], path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    labels_path = child(path, "labels")
    for k, v in get_map(meta.get("labels"), labels_path, errs).items():
        errs.extend(label_key(str(k), labels_path))
        errs.extend(label_value(get_str(v, labels_path, errs), labels_path))
    annotations_path = child(path, "annotations")
    annotations = get_map(meta.get("annotations"), annotations_path, errs)
    total = 0
    for k, v in annotations.items():
        for msg in names.qualified_name(str(k).lower()):
            errs.append(invalid(annotations_path, str(k), msg))
        text = v if isinstance(v, str) else json.dumps(v)
        total += len(str(k)) + len(text.encode())
    if total > _ANNOTATIONS_MAX_BYTES:
        errs.append(too_long(annotations_path, _ANNOTATIONS_MAX_BYTES))
    return errs


def validate_template_meta(meta_value: Any, path: str) -> list[FieldError]:
    """ResourceClaimTemplate.spec.metadata: only labels and annotations are checked."""
    errs: list[FieldError] = []
    meta = get_map(meta_value, path, errs)
    errs.extend(validate_labels_and_annotations(meta, path))
    return errs
