"""Reading and validating the offline inputs shared by `gpu-dra allocate` and `gpu-dra explain`."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.workload import KINDS

DEFAULT_DRIVER = "gpu.nvidia.com"


@dataclass
class Inputs:
    objects: list[dict[str, Any]]
    errors: list[str]  # "Kind/ns/name: path: message" or read errors; non-empty means exit 2
    warnings: list[str] = field(default_factory=list)  # API-validation findings that do not stop the command


def _name(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    parts = [str(obj.get("kind", "?"))]
    if meta.get("namespace"):
        parts.append(str(meta["namespace"]))
    parts.append(str(meta.get("name", "")))
    return "/".join(parts)


def read_inputs(paths: Sequence[str], strict: bool = True) -> Inputs:
    """Load the documents. With strict=False, API-validation findings inside `spec` become warnings: the
    allocator, like kube-scheduler, judges the specs it is given and reports what it cannot use per claim,
    with Kubernetes' texts. Unreadable documents and invalid kinds or metadata still fail the input."""
    from gpudra.manifests import load_objects

    try:
        objects = [dict(o) for o in load_objects(list(paths))]
    except Exception as exc:  # noqa: BLE001 - any read/parse failure is reported and becomes exit 2
        return Inputs([], [f"cannot read input: {exc}"])
    errors: list[str] = []
    for obj in objects:
        if not isinstance(obj.get("kind"), str):
            errors.append(f"{_name(obj)}: kind: required; accepted: {', '.join(KINDS)}")
    found = validate(objects)
    if strict:
        return Inputs(objects, errors + found)
    in_spec = [e for e in found if e.split(": ", 1)[-1].startswith("spec.")]
    return Inputs(objects, errors + [e for e in found if e not in in_spec], in_spec)


def validate(objects: Sequence[dict[str, Any]]) -> list[str]:
    """Kubernetes' validation rules for the resource.k8s.io objects (Pods and Nodes are taken as they are)."""
    from gpudra.validation import validate_object

    cel_check = None
    try:
        from controller.cel import check as cel_check
    except ImportError:  # pragma: no cover - the CEL layer is part of the package; kept for partial installs
        cel_check = None
    opaque: dict[str, Any] = {}
    try:
        from driver.config import validate_parameters

        opaque[DEFAULT_DRIVER] = validate_parameters
    except ImportError:  # pragma: no cover - as above
        pass
    errors: list[str] = []
    for obj in objects:
        if obj.get("kind") not in ("DeviceClass", "ResourceSlice", "ResourceClaim", "ResourceClaimTemplate"):
            continue
        for err in validate_object(obj, cel=cel_check, opaque=opaque):
            errors.append(f"{_name(obj)}: {err}")
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


def make_cel_env() -> Any:
    from controller.cel import CelEnvironment

    return CelEnvironment()
