"""kube-apiserver's create strategy for batch/v1 Jobs, the part that needs the Job's name and uid: the generated
selector and pod-template labels (pkg/registry/batch/job/strategy.go, generateSelector) and the validation of
them (pkg/apis/batch/validation, validateGeneratedSelector and ValidateJobSpec's selector checks).

Facts followed (kube-apiserver 1.3x):
- `spec.manualSelector` defaults to false (SetDefaults_Job); unless it is true, the template gains `job-name` and
  `batch.kubernetes.io/job-name` (the Job's name) and `controller-uid` and `batch.kubernetes.io/controller-uid`
  (its uid), each only where the template does not already have that key, and `spec.selector.matchLabels` gains
  `batch.kubernetes.io/controller-uid` where absent; a selector the client gave is kept, and merged into.
- Validation then requires those four template labels to hold the name and uid (`must be '<value>'`), and the
  selector to match them (otherwise `` `selector` not auto-generated ``), so a client's own selector is refused
  unless manualSelector is true. With any selector, it must be present and select the template's labels.
- A Job with no labels of its own gets its template's (SetDefaults_Job shares the map, and kube-apiserver
  defaults again what it reads back from storage), generated labels included.

The validation of label keys and values inside the selector follows ValidateLabelSelector; an invalid selector is
not matched against anything (LabelSelectorAsSelector fails), as upstream.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpudra.labelselector import selects
from gpudra.validation import names
from gpudra.validation.errors import go_value

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
CONTROLLER_UID_LABEL = "batch.kubernetes.io/controller-uid"
LEGACY_JOB_NAME_LABEL = "job-name"
LEGACY_CONTROLLER_UID_LABEL = "controller-uid"


def _selector_json(selector: Mapping[str, Any]) -> str:
    """A *metav1.LabelSelector as encoding/json writes it: struct fields in declaration order, empty ones omitted."""
    out: dict[str, Any] = {}
    match_labels = selector.get("matchLabels")
    if isinstance(match_labels, Mapping) and match_labels:
        out["matchLabels"] = dict(sorted(match_labels.items()))
    exprs = selector.get("matchExpressions")
    if isinstance(exprs, list) and exprs:
        out["matchExpressions"] = [
            {"key": e.get("key") or "", "operator": e.get("operator") or "",
             **({"values": e["values"]} if e.get("values") else {})} if isinstance(e, Mapping) else e
            for e in exprs]
    return json.dumps(out, separators=(",", ":"), ensure_ascii=False)


def _labels(template: Any) -> dict[str, Any] | None:
    meta = template.get("metadata") if isinstance(template, dict) else None
    labels = meta.get("labels") if isinstance(meta, dict) else None
    return labels if isinstance(labels, dict) else None


def generate_selector(spec: dict[str, Any], name: str, uid: str) -> None:
    """generateSelector, in place: the template's job-name and controller-uid labels and the selector on the uid,
    each only where the key is not there yet."""
    template = spec.get("template")
    if not isinstance(template, dict):
        template = spec["template"] = {}
    tmeta = template.get("metadata")
    if not isinstance(tmeta, dict):
        tmeta = template["metadata"] = {}
    labels = dict(tmeta.get("labels") or {})
    for key, value in ((LEGACY_JOB_NAME_LABEL, name), (JOB_NAME_LABEL, name),
                       (LEGACY_CONTROLLER_UID_LABEL, uid), (CONTROLLER_UID_LABEL, uid)):
        labels.setdefault(key, value)
    tmeta["labels"] = dict(sorted(labels.items()))  # a Go map: encoded with its keys sorted
    selector = spec.get("selector")
    if not isinstance(selector, dict):
        selector = spec["selector"] = {}
    match_labels = dict(selector.get("matchLabels") or {})
    match_labels.setdefault(CONTROLLER_UID_LABEL, uid)
    selector["matchLabels"] = dict(sorted(match_labels.items()))


def _selector_problems(selector: Mapping[str, Any], path: str) -> list[str]:
    """ValidateLabelSelector: matchLabels' keys and values, each requirement's operator, values and key."""
    errors: list[str] = []
    match_labels = selector.get("matchLabels")
    labels_path = f"{path}.matchLabels"
    for key, value in (match_labels.items() if isinstance(match_labels, Mapping) else ()):
        errors.extend(f"{labels_path}: Invalid value: {go_value(key)}: {m}" for m in names.qualified_name(str(key)))
        errors.extend(f"{labels_path}: Invalid value: {go_value(value)}: {m}" for m in names.label_value(str(value)))
    exprs = selector.get("matchExpressions")
    for i, expr in enumerate(exprs if isinstance(exprs, list) else ()):
        expr_path = f"{path}.matchExpressions[{i}]"
        expr = expr if isinstance(expr, Mapping) else {}
        operator, values = expr.get("operator") or "", list(expr.get("values") or [])
        if operator in ("In", "NotIn"):
            if not values:
                errors.append(f"{expr_path}.values: Required value: must be specified when `operator` is 'In' or "
                              "'NotIn'")
        elif operator in ("Exists", "DoesNotExist"):
            if values:
                errors.append(f"{expr_path}.values: Forbidden: may not be specified when `operator` is 'Exists' or "
                              "'DoesNotExist'")
        else:
            errors.append(f"{expr_path}.operator: Invalid value: {go_value(operator)}: not a valid selector operator")
        key = str(expr.get("key") or "")
        errors.extend(f"{expr_path}.key: Invalid value: {go_value(key)}: {m}" for m in names.qualified_name(key))
        for j, value in enumerate(values):
            errors.extend(f"{expr_path}.values[{j}]: Invalid value: {go_value(value)}: {m}"
                          for m in names.label_value(str(value)))
    return errors


def _matches(selector: Any, labels: Mapping[str, str]) -> bool:
    # LabelSelectorAsSelector: nil selects nothing, an empty selector everything.
    return selector is not None and selects(selector, labels)


def selector_errors(job: Mapping[str, Any]) -> list[str]:
    """The selector part of ValidateJob on create (prefixed labels required): validateGeneratedSelector, then
    ValidateJobSpec's selector presence, its validity and its match of the template's labels."""
    meta = job.get("metadata") or {}
    spec = job.get("spec")
    if not isinstance(spec, Mapping):
        return []
    name, uid = str(meta.get("name") or ""), str(meta.get("uid") or "")
    selector = spec.get("selector")
    labels = _labels(spec.get("template"))
    errors: list[str] = []
    problems = _selector_problems(selector, "spec.selector") if isinstance(selector, Mapping) else []
    if spec.get("manualSelector") is not True and isinstance(selector, Mapping):
        if not uid:
            errors.append("metadata.uid: Required value")
        have = labels or {}
        expected = {LEGACY_CONTROLLER_UID_LABEL: uid, LEGACY_JOB_NAME_LABEL: name,
                    CONTROLLER_UID_LABEL: uid, JOB_NAME_LABEL: name}
        for key, want in expected.items():
            path = f"spec.template.metadata.labels[{key}]"
            if key not in have:
                errors.append(f"{path}: Required value: must be '{want}'")
            elif have[key] != want:
                errors.append(f"{path}: Invalid value: {go_value(have)}: must be '{want}'")
        if not problems and not _matches(selector, expected):
            errors.append(f"spec.selector: Invalid value: {_selector_json(selector)}: `selector` not auto-generated")
    if selector is None:
        errors.append("spec.selector: Required value")
    errors.extend(problems)
    if not problems and not _matches(selector, labels or {}):
        errors.append(f"spec.template.metadata.labels: Invalid value: {go_value(labels)}: `selector` does not match "
                      "template `labels`")
    return errors


def prepare_create(job: dict[str, Any]) -> list[str]:
    """The Job create strategy once the name and uid are set, in place: manualSelector's default, the generated
    selector and labels unless manualSelector is true, and the Job's own labels from its template where it has
    none. Returns the validation errors (field paths first, as kube-apiserver words them); none, nothing wrong."""
    spec = job.get("spec")
    if not isinstance(spec, dict):
        return []
    meta = job.setdefault("metadata", {})
    if spec.get("manualSelector") is None:
        spec["manualSelector"] = False
    if spec["manualSelector"] is not True:
        generate_selector(spec, str(meta.get("name") or ""), str(meta.get("uid") or ""))
    errors = selector_errors(job)
    template_labels = _labels(spec.get("template"))
    if not meta.get("labels") and template_labels:
        meta["labels"] = dict(template_labels)
    return errors
