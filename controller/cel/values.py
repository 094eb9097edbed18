"""Conversions between gpudra's exact Quantity/Semver and the CEL message values that carry them."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from gpudra.quantity import Quantity, QuantityError

# A Kubernetes quantity is at most nano-precise after parsing, and add/sub keep that; 10**-30 leaves room.
_MAX_FRACTION_DIGITS = 30


def _strip_tens(coefficient: int, exponent: int) -> tuple[int, int]:
    if coefficient == 0:
        return 0, 0
    while coefficient % 10 == 0:
        coefficient //= 10
        exponent += 1
    return coefficient, exponent


def quantity_parts(q: Quantity) -> tuple[int, int]:
    """(coefficient, exponent) with no trailing zeros: equal values give equal parts."""
    value = q.as_fraction()
    denominator = value.denominator
    digits = 0
    while denominator != 1:
        # A decimal's denominator divides a power of ten; anything else is not a Kubernetes quantity.
        if digits > _MAX_FRACTION_DIGITS:
            raise QuantityError(f"quantity {q} has more than {_MAX_FRACTION_DIGITS} fractional digits")
        digits += 1
        if (10**digits) % denominator == 0:
            break
    coefficient = value.numerator * (10**digits // denominator)
    return _strip_tens(coefficient, -digits)


def quantity_to_message(q: Quantity, cls: Any) -> Any:
    coefficient, exponent = quantity_parts(q)
    return cls(coefficient=str(coefficient), exponent=exponent)


def quantity_from_message(msg: Any) -> Quantity:
    coefficient = msg.coefficient or "0"
    if msg.exponent == 0:
        return Quantity.parse(coefficient)
    return Quantity.parse(f"{coefficient}e{msg.exponent}")


def message_fraction(msg: Any) -> Fraction:
    """The exact value of a Quantity message (cheap: no parsing)."""
    return Fraction(int(msg.coefficient or "0")) * Fraction(10) ** msg.exponent
