"""Kubernetes' validation of DeviceTaintRule (resource.k8s.io/v1): the selector, the one taint, the status."""

from __future__ import annotations

import re
from typing import Any

from gpudra.validation.common import validate_taint
from gpudra.validation.errors import (FieldError, child, duplicate, index, invalid, not_supported, required,
                                     too_long, too_many)
from gpudra.validation.fields import dns_label, driver_name, get_list, get_map, get_str, label_key, pool_name

STATUS_CONDITIONS_MAX = 8
CONDITION_STATUSES = ("False", "True", "Unknown")  # sorted, as Kubernetes lists them
REASON_MAX = 1024
MESSAGE_MAX = 32768
_REASON = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?")
_REASON_MESSAGE = ("a condition reason must start with alphabetic character, optionally followed by a string of "
                   "alphanumeric characters or '_,:', and must end with an alphanumeric character or '_' (e.g. "
                   "'my_name',  or 'MY_NAME',  or 'MyName',  or 'ReasonA,ReasonB',  or 'ReasonA:ReasonB', regex "
                   "used for validation is '[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?')")


def validate_taint_rule_spec(value: Any, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    spec = get_map(value, path, errs)
    selector_path = child(path, "deviceSelector")
    if spec.get("deviceSelector") is not None:
        selector = get_map(spec.get("deviceSelector"), selector_path, errs)
        for field, check in (("driver", driver_name), ("pool", pool_name), ("device", dns_label)):
            if selector.get(field) is not None:
                field_path = child(selector_path, field)
                errs.extend(check(get_str(selector.get(field), field_path, errs), field_path))
    taint_path = child(path, "taint")
    if spec.get("taint") is None:
        errs.append(required(taint_path))
    else:
        errs.extend(validate_taint(spec.get("taint"), taint_path))
    return errs


def validate_taint_rule_status(value: Any, path: str) -> list[FieldError]:
    """At most 8 conditions, each valid as apimachinery's ValidateConditions checks metav1.Condition."""
    errs: list[FieldError] = []
    status = get_map(value, path, errs)
    cond_path = child(path, "conditions")
    conditions = get_list(status.get("conditions"), cond_path, errs)
    seen: set[str] = set()
    for i, raw in enumerate(conditions):
        item_path = index(cond_path, i)
        cond = get_map(raw, item_path, errs)
        ctype = get_str(cond.get("type"), child(item_path, "type"), errs)
        errs.extend(label_key(ctype, child(item_path, "type")))
        if ctype in seen:
            errs.append(duplicate(child(item_path, "type"), ctype))
        seen.add(ctype)
        cstatus = get_str(cond.get("status"), child(item_path, "status"), errs)
        if cstatus not in CONDITION_STATUSES:
            errs.append(not_supported(child(item_path, "status"), cstatus, list(CONDITION_STATUSES)))
        generation = cond.get("observedGeneration")
        if isinstance(generation, int) and not isinstance(generation, bool) and generation < 0:
            errs.append(invalid(child(item_path, "observedGeneration"), generation,
                                "must be greater than or equal to zero"))
        if not cond.get("lastTransitionTime"):
            errs.append(required(child(item_path, "lastTransitionTime"), "must be set"))
        reason = get_str(cond.get("reason"), child(item_path, "reason"), errs)
        if not reason:
            errs.append(required(child(item_path, "reason"), "must be set"))
        else:
            if not _REASON.fullmatch(reason):
                errs.append(invalid(child(item_path, "reason"), reason, _REASON_MESSAGE))
            if len(reason) > REASON_MAX:
                errs.append(too_long(child(item_path, "reason"), REASON_MAX))
        if len(get_str(cond.get("message"), child(item_path, "message"), errs)) > MESSAGE_MAX:
            errs.append(too_long(child(item_path, "message"), MESSAGE_MAX))
    if len(conditions) > STATUS_CONDITIONS_MAX:
        errs.append(too_many(cond_path, len(conditions), STATUS_CONDITIONS_MAX))
    return errs
