"""Consumable capacity (DRAConsumableCapacity; beta and on from 1.36): a device capacity's requestPolicy.

Up to 1.36 Kubernetes compares by integer value (Quantity.Value(), rounded up), so `4.9` and `5` are the same
option. 1.37's DRAFractionalCapacityRange (beta, on) uses milli-unit arithmetic for a range with a fractional
min, max or step (values must then be representable in milli units: at most 3 decimals, at most
MaxInt64/1000) and tells validValues apart by their exact value. `fractional=False` gives the older rules.
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


_MAX_MILLI_VALUE = _INT64_MAX // 1000


def _milli(q: Quantity) -> int | None:
    """The value in milli units when exactly representable and within int64 (else None)."""
    scaled = q.as_fraction() * 1000
    if scaled.denominator != 1 or abs(scaled.numerator) > _INT64_MAX or abs(q.as_fraction()) > _MAX_MILLI_VALUE:
        return None
    return scaled.numerator


def _is_fractional(q: Quantity | None) -> bool:
    return q is not None and q.as_fraction().denominator != 1


def validate_request_policy(value: Any, capacity: Quantity, path: str, *, fractional: bool = True) -> list[FieldError]:
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
            errs.extend(_valid_values(valid_values, default, capacity, child(path, "validValues"), fractional))
    elif policy.get("validRange") is not None:
        if policy.get("default") is None:
            errs.append(required(child(path, "default"), "required when validRange is defined"))
        elif default is not None:
            errs.extend(_valid_range(policy.get("validRange"), default, capacity, child(path, "validRange"), fractional))
    return errs


def _valid_values(raw: list[Any], default: Quantity, capacity: Quantity, path: str, fractional: bool) -> list[FieldError]:
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
    for i, option in enumerate(values):
        if option > capacity:
            errs.append(invalid(index(path, i), str(option), f"option is larger than capacity value: {capacity}"))
        if option == default:
            found_default = True
    seen_keys: set[Any] = set()
    for i, option in enumerate(values):
        # 1.37 (fractional) tells options apart by their exact value; before, by the rounded-up integer.
        key: Any = option.as_fraction() if fractional else _value(option)
        if key in seen_keys:
            errs.append(duplicate(index(path, i), str(option) if fractional else str(key)))
        seen_keys.add(key)
    if not found_default:
        errs.append(invalid(path, str(default), "default value is not valid according to the requestPolicy"))
    return errs


def _valid_range(value: Any, default: Quantity, capacity: Quantity, path: str, fractional: bool) -> list[FieldError]:
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
        errs.append(invalid(child(path, "min"), str(default), f"default is less than min: {minimum}"))
    if maximum is not None:
        if minimum > maximum:
            errs.append(invalid(child(path, "max"), str(minimum), f"min is larger than max: {maximum}"))
        if maximum > capacity:
            errs.append(invalid(child(path, "max"), str(maximum), f"max is larger than capacity value: {capacity}"))
        if default > maximum:
            errs.append(invalid(child(path, "max"), str(default), f"default is more than max: {maximum}"))
    milli = fractional and any(_is_fractional(q) for q in (minimum, maximum, step))
    if milli:
        for name, q in (("default", default), ("min", minimum), ("max", maximum), ("step", step)):
            if q is not None and _milli(q) is None:
                errs.append(invalid(child(path, name), str(q), "value cannot be represented as a milli value"))
        if any("cannot be represented as a milli value" in e.message for e in errs):
            return errs
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
    unit = _milli if milli else _value
    for target in (default, maximum):
        if target is not None and (unit(target) - unit(minimum)) % unit(step) != 0:  # type: ignore[operator]
            errs.append(
                invalid(child(path, "step"), str(target), f"value is not a multiple of a given step ({step}) from ({minimum})")
            )
    return errs
