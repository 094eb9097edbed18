"""Consumable capacity (DRAConsumableCapacity; beta, on from 1.36): how much of a shared device a request consumes.

Range arithmetic is on integer values (Quantity.Value(), rounded up), except that with DRAFractionalCapacityRange
(beta, on in 1.37) a range whose min, max or step is fractional works in milli units (`fractional=True`)."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

from gpudra.quantity import BINARY_SI, Quantity, QuantityError

Consumed = dict[str, Quantity]


def _q(raw: Any) -> Quantity:
    if isinstance(raw, Quantity):
        return raw
    return _parse(str(raw))


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> Quantity:
    # Quantities are immutable and every device of a kind repeats the same few texts ("80Gi"): the search checks
    # capacity for each candidate device, so parse each text once (errors are raised, not cached).
    return Quantity.parse(text)


def _value(q: Quantity) -> int:
    """Kubernetes' Quantity.Value(): the value rounded up to an integer."""
    return math.ceil(q.as_fraction())


def _milli_range(valid_range: Mapping[str, Any], fractional: bool) -> bool:
    return fractional and any(valid_range.get(k) is not None and _q(valid_range[k]).as_fraction().denominator != 1
                              for k in ("min", "max", "step"))


def _milli(q: Quantity) -> int:
    """Quantity.MilliValue(): the value in milli units, rounded up."""
    return math.ceil(q.as_fraction() * 1000)


def consumed_amount(requested: Quantity | None, capacity: Mapping[str, Any], fractional: bool = True) -> Quantity:
    """calculateConsumedCapacity: the request rounded up by the capacity's requestPolicy."""
    policy = capacity.get("requestPolicy")
    if requested is None:
        if policy and policy.get("default") is not None:
            return _q(policy["default"])
        return _q(capacity.get("value", "0"))
    if not policy:
        return requested
    valid_range = policy.get("validRange")
    if valid_range and valid_range.get("min") is not None:
        low = _q(valid_range["min"])
        if requested < low:
            return low
        if valid_range.get("step") is None:
            return requested
        milli = _milli_range(valid_range, fractional)
        unit = _milli if milli else _value
        step, lo, req = unit(_q(valid_range["step"])), unit(low), unit(requested)
        n, mod = divmod(req - lo, step)
        if mod:
            n += 1
        if milli:
            return Quantity.parse(f"{lo + step * n}m")
        return Quantity.from_int(lo + step * n, BINARY_SI)
    if policy.get("validValues") is not None:
        for v in policy["validValues"]:
            vq = _q(v)
            if requested <= vq:
                return vq
    return requested


def violates_policy(value: Quantity, policy: Mapping[str, Any] | None, fractional: bool = True) -> bool:
    if not policy:
        return False
    if policy.get("default") is not None and value == _q(policy["default"]):
        return False
    valid_range = policy.get("validRange")
    if valid_range:
        if valid_range.get("max") is not None and value > _q(valid_range["max"]):
            return True
        if valid_range.get("step") is not None:
            unit = _milli if _milli_range(valid_range, fractional) else _value
            lo = unit(_q(valid_range.get("min", "0")))
            if (unit(value) - lo) % unit(_q(valid_range["step"])):
                return True
        return False
    values = policy.get("validValues") or []
    if values:
        return all(value != _q(v) for v in values)
    return False


def fits(
    device_capacity: Mapping[str, Mapping[str, Any]],
    requests: Mapping[str, Any] | None,
    consumed: Consumed,
    allocating: Consumed,
    fractional: bool = True,
) -> bool:
    """CmpRequestOverCapacity: does the request fit in what is left of each capacity?

    A request for a capacity the device does not define never fits; so does a malformed quantity."""
    try:
        if requests and any(name not in device_capacity for name in requests):
            return False
        for name, cap in device_capacity.items():
            requested = _q(requests[name]) if requests and name in requests else None
            amount = consumed_amount(requested, cap, fractional)
            if violates_policy(amount, cap.get("requestPolicy"), fractional):
                return False
            total = amount
            if name in consumed:
                total = total + consumed[name]
            if name in allocating:
                total = total + allocating[name]
            limit = _q(cap.get("value", "0"))
            # An idle device asked for nothing consumes its own value, the very object _q cached: not over it.
            if total is not limit and total > limit:
                return False
    except (QuantityError, TypeError, AttributeError, ZeroDivisionError):
        return False
    return True


def consumption(device_capacity: Mapping[str, Mapping[str, Any]], requests: Mapping[str, Any] | None,
                fractional: bool = True) -> Consumed:
    """GetConsumedCapacityFromRequest: what a request consumes of every capacity of a shared device."""
    return {
        name: consumed_amount(_q(requests[name]) if requests and name in requests else None, cap, fractional)
        for name, cap in device_capacity.items()
    }


def add_into(target: Consumed, extra: Mapping[str, Any]) -> None:
    for name, q in extra.items():
        qq = _q(q)
        target[name] = target[name] + qq if name in target else qq


def sub_from(target: Consumed, extra: Mapping[str, Quantity]) -> None:
    for name, q in extra.items():
        if name in target:
            target[name] = target[name] - q
