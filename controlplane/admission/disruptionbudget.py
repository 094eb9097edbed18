"""kube-apiserver's PodDisruptionBudget validation (pkg/apis/policy/validation): `minAvailable` or
`maxUnavailable`, not both, each a non-negative integer or a percentage of at most 100%; a label selector; an
`unhealthyPodEvictionPolicy` it knows."""

from __future__ import annotations

import json
import re
from typing import Any

from controlplane import status as st
from controlplane.admission.request import AdmissionRequest

_PERCENT = re.compile(r"^[0-9]+%$")
_POLICIES = ("IfHealthyBudget", "AlwaysAllow")
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def _int_or_percent_errors(value: Any, path: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, bool) or not isinstance(value, int | str):
        return [f"{path}: Invalid value: {json.dumps(value)}: must be an integer or percentage (e.g '5%')"]
    if isinstance(value, int):
        return [] if value >= 0 else [f"{path}: Invalid value: {value}: must be greater than or equal to 0"]
    if not _PERCENT.match(value):
        return [f"{path}: Invalid value: {json.dumps(value)}: a valid percent string must be a numeric string "
                "followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')"]
    if int(value[:-1]) > 100:
        return [f"{path}: Invalid value: {json.dumps(value)}: must not be greater than 100%"]
    return []


def _selector_errors(selector: Any, path: str) -> list[str]:
    if selector is None:
        return []
    if not isinstance(selector, dict):
        return [f"{path}: Invalid value: {json.dumps(selector)}: must be a label selector"]
    errors = []
    for i, expr in enumerate(selector.get("matchExpressions") or []):
        op = expr.get("operator") if isinstance(expr, dict) else None
        if op not in _OPERATORS:
            errors.append(f"{path}.matchExpressions[{i}].operator: Unsupported value: {json.dumps(op)}: supported "
                          f"values: {', '.join(json.dumps(o) for o in _OPERATORS)}")
        elif op in ("In", "NotIn") and not expr.get("values"):
            errors.append(f"{path}.matchExpressions[{i}].values: Required value: must be specified when `operator` "
                          "is 'In' or 'NotIn'")
    return errors


def budget_errors(spec: Any) -> list[str]:
    if not isinstance(spec, dict):
        return []
    errors = []
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        errors.append("spec: Invalid value: minAvailable and maxUnavailable cannot be both set")
    errors += _int_or_percent_errors(spec.get("minAvailable"), "spec.minAvailable")
    errors += _int_or_percent_errors(spec.get("maxUnavailable"), "spec.maxUnavailable")
    errors += _selector_errors(spec.get("selector"), "spec.selector")
    policy = spec.get("unhealthyPodEvictionPolicy")
    if policy is not None and policy not in _POLICIES:
        errors.append(f"spec.unhealthyPodEvictionPolicy: Unsupported value: {json.dumps(policy)}: supported values: "
                      f"{', '.join(json.dumps(p) for p in _POLICIES)}")
    return errors


class DisruptionBudgetPlugin:
    kinds = frozenset({("policy", "PodDisruptionBudget")})

    def admit(self, req: AdmissionRequest, obj: dict[str, Any] | None, old: dict[str, Any] | None,
              warnings: list[str]) -> None:
        if req.rt.kind != "PodDisruptionBudget" or obj is None or req.subresource or req.operation not in ("CREATE", "UPDATE"):
            return
        errors = budget_errors(obj.get("spec"))
        if errors:
            raise st.invalid(req.rt, req.name, errors)
