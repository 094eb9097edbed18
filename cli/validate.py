"""`gpu-dra validate -f FILE... [-o json]`: Kubernetes' resource.k8s.io validation rules (v1, v1beta2 and v1beta1,
converted to v1 as kube-apiserver does), offline.

Unknown fields (checked against the official client's schema of the object's kind, for every kind it knows)
are warnings, or errors with `--strict`, as kube-apiserver's `fieldValidation=Warn|Strict` treats them.

Exit codes: 0 when every object is valid, 1 when any is invalid, 2 when an input cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gpudra import DEFAULT_DRIVER_NAME, cliopts
from gpudra.validation.schema import check_object
from gpudra.manifests import InputError, load_objects, object_label
from gpudra.features import DEFAULT_VERSION, SUPPORTED_VERSIONS, FeatureGateError, check_version
from gpudra import computedomain
from gpudra.validation import FieldError, validate_object
from gpudra.validation.meta import validate_object_meta
from gpudra.validation.workloads import API_VERSION as WORKLOAD_API_VERSION
from gpudra.validation.workloads import KINDS as WORKLOAD_KINDS
from gpudra.validation.workloads import validate_workload_api_object
from gpudra.validation.common import CelChecker, OpaqueValidators
from controller.validationhooks import cel_checker, opaque_validators, unsupported_class_errors


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--filename", dest="files", action="extend", nargs="+", required=True, metavar="FILE",
                        help="YAML or JSON manifest (multi-document and `kind: List` allowed; `-` for stdin); repeatable")
    cliopts.add_output(parser)
    parser.add_argument("--strict", action="store_true",
                        help="unknown fields are errors (default: warnings), as fieldValidation=Strict")
    parser.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME,
                        help=f"driver whose opaque parameters are checked with our config schema (default {DEFAULT_DRIVER_NAME})")
    parser.add_argument("--kubernetes-version", default=DEFAULT_VERSION, metavar="VERSION",
                        help=f"the release whose validation rules apply ({SUPPORTED_VERSIONS[0]}..{SUPPORTED_VERSIONS[-1]}, "
                             "default %(default)s)")


def is_dra_object(obj: Any) -> bool:
    """Objects of the resource.k8s.io group (any version) are ours to check; a wrong version is an error."""
    api_version = obj.get("apiVersion") if isinstance(obj, dict) else None
    return not isinstance(api_version, str) or api_version.partition("/")[0] == "resource.k8s.io"


def unknown_fields(obj: dict[str, Any]) -> list[str]:
    report = check_object(obj)
    return [f'{path}: unknown field "{path}"' for path in report.unknown] if report is not None else []


def is_workload_api_object(obj: Any) -> bool:
    """Workload and PodGroup of scheduling.k8s.io/v1beta1 (Kubernetes 1.37's Workload API) are checked too."""
    return isinstance(obj, dict) and obj.get("apiVersion") == WORKLOAD_API_VERSION and obj.get("kind") in WORKLOAD_KINDS


def compute_domain_schema_errors(obj: dict[str, Any]) -> list[str]:
    """A ComputeDomain checked against NVIDIA's CRD (manifests/compute-domains), defaulted as the server would."""
    from controlplane.crds.definition import CustomSchema, served_type


    crd = next(c for c in load_objects([str(_COMPUTE_DOMAIN_CRD)]) if c.get("kind") == "CustomResourceDefinition")
    custom = served_type(crd).custom
    assert isinstance(custom, CustomSchema)
    decoded, unknown, type_errors = custom.decode(obj)
    return type_errors + [f'{p}: unknown field "{p}"' for p in unknown] + custom.validate(decoded, None)


_COMPUTE_DOMAIN_CRD = Path(__file__).resolve().parents[1] / "manifests" / "compute-domains" / \
    "resource.nvidia.com_computedomains.yaml"


def validate_all(objects: list[dict[str, Any]], cel: CelChecker | None, opaque: OpaqueValidators,
                 kubernetes_version: str = "1.37", strict: bool = False) -> list[dict[str, Any]]:
    results = []
    for obj in objects:
        unknown = unknown_fields(obj)
        warnings = [] if strict else unknown
        if is_workload_api_object(obj):
            found = [*validate_object_meta(obj.get("metadata"), namespaced=True), *validate_workload_api_object(obj)]
            results.append(_result(obj, True, (unknown if strict else []) + [str(e) for e in found], warnings))
            continue
        if obj.get("apiVersion") == computedomain.API_VERSION and obj.get("kind") == "ComputeDomain":
            found = [*validate_object_meta(obj.get("metadata"), namespaced=True)]
            errors = [str(e) for e in found] + compute_domain_schema_errors(obj) + computedomain.validate_compute_domain(obj)
            results.append(_result(obj, True, errors, []))
            continue
        if not is_dra_object(obj):
            # Manifests mix Pods, RBAC and the like with DRA objects; those are reported as not checked.
            errors = unknown if strict else []
            results.append(_result(obj, False, errors, warnings))
            continue
        found: list[FieldError] = validate_object(obj, cel=cel, opaque=opaque, kubernetes_version=kubernetes_version)
        errors = (unknown if strict else []) + [str(e) for e in found] + unsupported_class_errors(obj)
        results.append(_result(obj, True, errors, warnings))
    return results


def _result(obj: dict[str, Any], checked: bool, errors: list[str], warnings: list[str]) -> dict[str, Any]:
    result: dict[str, Any] = {"object": object_label(obj), "valid": not errors, "checked": checked, "errors": errors}
    if warnings:
        result["warnings"] = warnings
    return result


def run(args: argparse.Namespace) -> int:
    try:
        version = check_version(args.kubernetes_version)
        objects = load_objects(args.files)
    except (InputError, FeatureGateError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    results = validate_all(objects, cel_checker(), opaque_validators(args.driver_name), version, strict=args.strict)
    if args.output != "table":
        print(cliopts.render({"results": results}, args.output))
    else:
        for result in results:
            state = "valid" if result["valid"] else "invalid"
            if result["checked"] or result["errors"]:
                print(f"{result['object']}: {state}")
            else:
                print(f"{result['object']}: not checked (not a resource.k8s.io object)")
            for error in result["errors"]:
                print(f"  {error}")
            for warning in result.get("warnings", []):
                print(f"  warning: {warning}")
        invalid_count = sum(not r["valid"] for r in results)
        checked = sum(r["checked"] for r in results)
        print(f"{checked} object(s) checked, {invalid_count} invalid, {len(results) - checked} not checked")
    return 1 if any(not r["valid"] for r in results) else 0
