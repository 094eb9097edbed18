"""Consumable capacity (DRAConsumableCapacity, alpha in 1.35): a device capacity's requestPolicy.

Accepted as written, like every alpha field here. Kubernetes 1.35 compares options by their integer
value (Quantity.Value(), rounded up), so `4.9` and `5` are the same option.
"""

from __future__ import annotations

import math
from typing import Any

from gpudra.quantity import Quantity
from gpudra.validation.errors import FieldError, child, duplicate, forbidden, index, invalid, required, too_many
from gpudra.validation.fields import get_list, get_map, parse_quantity

VALID_VALUES_MAX = 10
_INT64_MAX = (1 << 63) - 1


def _quantity(value: Any, path: str, errs: list[FieldError]) -> Quantity | None:
    return None if value is None else parse_quantity(value, path, errs)


def _value(q: Quantity) -> int:
    """Quantity.Value(): the integer value, rounded up."""
    return math.ceil(q.as_fraction())


def validate_request_policy(value: Any, capacity: Quantity, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    policy = get_map(value, path, errs)
    valid_values = get_list(policy.get("validValues"), child(path, "validValues"), errs)
    default = _quantity(policy.get("default"), child(path, "default"), errs)
    if valid_values and policy.get("validRange") is not None:
        errs.append(forbidden(path, 'exactly one policy can be specified, cannot specify "validValues" and "validRange" at the same time'))
    elif valid_values:
        if policy.get("default") is None:
            errs.append(required(child(path, "default"), "required when validValues is defined"))
        elif default is not None:
            errs.extend(_valid_values(valid_values, default, capacity, child(path, "validValues")))
    elif policy.get("validRange") is not None:
        if policy.get("default") is None:
            errs.append(required(child(path, "default"), "required when validRange is defined"))
        elif default is not None:
            errs.extend(_valid_range(policy.get("validRange"), default, capacity, child(path, "validRange")))
    return errs


def _valid_values(raw: list[Any], default: Quantity, capacity: Quantity, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    options = [_quantity(v, index(path, i), errs) for i, v in enumerate(raw)]
    if errs:
        return errs
    values = [q for q in options if q is not None]
    for i in range(len(values) - 1):
        if values[i] > values[i + 1]:
            errs.append(invalid(index(path, i + 1), str(values[i + 1]), "values must be sorted in ascending order"))
    if len(values) > VALID_VALUES_MAX:
        errs.append(too_many(path, len(values), VALID_VALUES_MAX))
        return errs
    found_default = False
    seen: set[int] = set()
    for i, option in enumerate(values):
        if option > capacity:
            errs.append(invalid(index(path, i), str(option), f"option is larger than capacity value: {capacity}"))
        if option == default:
            found_default = True
    for i, option in enumerate(values):
        key = _value(option)
        if key in seen:
            errs.append(duplicate(index(path, i), str(key)))
        seen.add(key)
    if not found_default:
        errs.append(invalid(path, str(default), "default value is not valid according to the requestPolicy"))
    return errs


def _valid_range(value: Any, default: Quantity, capacity: Quantity, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    bounds = get_map(value, path, errs)
    minimum = _quantity(bounds.get("min"), child(path, "min"), errs)
    maximum = _quantity(bounds.get("max"), child(path, "max"), errs)
    step = _quantity(bounds.get("step"), child(path, "step"), errs)
    if bounds.get("min") is None:
        errs.append(required(child(path, "min"), "required when validRange is defined"))
        return errs
    if minimum is None or errs:
        return errs
    if minimum > capacity:
        errs.append(invalid(child(path, "min"), str(minimum), f"min is larger than capacity value: {capacity}"))
    if default < minimum:
        errs.append(invalid(child(path, "default"), str(default), f"default is less than min: {minimum}"))
    if maximum is not None:
        if minimum > maximum:
            errs.append(invalid(child(path, "max"), str(minimum), f"min is larger than max: {maximum}"))
        if maximum > capacity:
            errs.append(invalid(child(path, "max"), str(maximum), f"max is larger than capacity value: {capacity}"))
        if default > maximum:
            errs.append(invalid(child(path, "default"), str(default), f"default is more than max: {maximum}"))
    if step is None:
        return errs
    if step.sign() <= 0:
        errs.append(invalid(child(path, "step"), str(step), "must be greater than zero"))
        return errs
    one_step = minimum + step
    if one_step > capacity:
        errs.append(invalid(child(path, "step"), str(step), f"one step {one_step} is larger than capacity value: {capacity}"))
    named = {"default": default, "min": minimum, "max": maximum, "step": step}
    unsafe = False
    for name, q in named.items():
        if q is None:
            continue
        if q.sign() < 0:
            errs.append(invalid(child(path, name), str(q), "must be greater than or equal to 0"))
            unsafe = True
        elif _value(q) > _INT64_MAX:
            errs.append(invalid(child(path, name), str(q), f"must not be larger than {_INT64_MAX}"))
            unsafe = True
    if unsafe:
        return errs
    for target in (default, maximum):
        if target is not None and (_value(target) - _value(minimum)) % _value(step) != 0:
            errs.append(
                invalid(child(path, "step"), str(target), f"value is not a multiple of a given step ({step}) from ({minimum})")
            )
    return errs
