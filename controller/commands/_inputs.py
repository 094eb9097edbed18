"""Reading and validating the offline inputs shared by `gpu-dra allocate` and `gpu-dra explain`."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.workload import KINDS
from gpudra.conversion import normalize_objects
from gpudra.manifests import InputError, load_objects, object_label
from gpudra.validation import validate_object
from controller.validationhooks import cel_checker, opaque_validators, unsupported_class_errors


@dataclass
class Inputs:
    objects: list[dict[str, Any]]
    errors: list[str]  # "Kind/ns/name: path: message" or read errors; non-empty means exit 2
    warnings: list[str] = field(default_factory=list)  # API-validation findings that do not stop the command


def read_inputs(paths: Sequence[str], strict: bool = True) -> Inputs:
    """Load the documents. With strict=False, API-validation findings inside `spec` become warnings: the
    allocator, like kube-scheduler, judges the specs it is given and reports what it cannot use per claim,
    with Kubernetes' texts. Unreadable documents, invalid kinds or metadata and invalid opaque device
    configurations still fail the input."""
    try:
        objects = load_objects(list(paths))
    except InputError as exc:
        return Inputs([], [f"cannot read input: {exc}"])
    errors: list[str] = []
    for obj in objects:
        if not isinstance(obj.get("kind"), str):
            errors.append(f"{object_label(obj)}: kind: required; accepted: {', '.join(KINDS)}")
    # Validation reads every served version itself (and names an unserved one); what the allocator gets is v1.
    found = validate(objects)
    objects, _ = normalize_objects(objects)
    if strict:
        return Inputs(objects, errors + found)
    # An invalid opaque configuration is refused as `explain` and `validate` refuse it: the driver's admission
    # would never let such an object in, and its node agent could not prepare it.
    in_spec = [e for e in found if e.split(": ", 1)[-1].startswith("spec.") and ".opaque." not in e.split(": ", 2)[1]]
    return Inputs(objects, errors + [e for e in found if e not in in_spec], in_spec)


def validate(objects: Sequence[dict[str, Any]]) -> list[str]:
    """Kubernetes' validation rules for the resource.k8s.io objects (Pods and Nodes are taken as they are)."""
    cel = cel_checker()
    opaque = opaque_validators()
    errors: list[str] = []
    for obj in objects:
        if obj.get("kind") not in ("DeviceClass", "ResourceSlice", "ResourceClaim", "ResourceClaimTemplate",
                                   "DeviceTaintRule"):
            continue
        for err in [*validate_object(obj, cel=cel, opaque=opaque), *unsupported_class_errors(obj)]:
            errors.append(f"{object_label(obj)}: {err}")
    return errors


def report_warnings(warnings: Sequence[str]) -> None:
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)


def report_input_errors(errors: Sequence[str], output: str) -> int:
    if output == "json":
        print(json.dumps({"errors": list(errors)}, indent=2))
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    return 2
