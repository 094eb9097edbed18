"""Kubernetes' validation of DeviceTaintRule (resource.k8s.io/v1): the selector, the one taint, the status."""

from __future__ import annotations

from typing import Any

from gpudra.validation.common import validate_taint
from gpudra.validation.errors import FieldError, child, duplicate, index, not_supported, required, too_many
from gpudra.validation.fields import dns_label, driver_name, get_list, get_map, get_str, pool_name

STATUS_CONDITIONS_MAX = 8
CONDITION_STATUSES = ("True", "False", "Unknown")


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
    errs: list[FieldError] = []
    status = get_map(value, path, errs)
    cond_path = child(path, "conditions")
    conditions = get_list(status.get("conditions"), cond_path, errs)
    if len(conditions) > STATUS_CONDITIONS_MAX:
        return errs + [too_many(cond_path, len(conditions), STATUS_CONDITIONS_MAX)]
    seen: set[str] = set()
    for i, raw in enumerate(conditions):
        item_path = index(cond_path, i)
        cond = get_map(raw, item_path, errs)
        ctype = get_str(cond.get("type"), child(item_path, "type"), errs)
        if not ctype:
            errs.append(required(child(item_path, "type")))
        elif ctype in seen:
            errs.append(duplicate(item_path, ctype))
        seen.add(ctype)
        cstatus = get_str(cond.get("status"), child(item_path, "status"), errs)
        if cstatus not in CONDITION_STATUSES:
            errs.append(not_supported(child(item_path, "status"), cstatus, list(CONDITION_STATUSES)))
        for field in ("lastTransitionTime", "reason"):
            if not cond.get(field):
                errs.append(required(child(item_path, field)))
    return errs
