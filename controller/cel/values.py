"""Conversions between gpudra's exact Quantity/Semver and the CEL message values that carry them."""

from __future__ import annotations

from typing import Any

from gpudra.quantity import Quantity, QuantityError
from gpudra.semver import Semver

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


def compare_quantity_messages(a: Any, b: Any) -> int:
    """-1, 0 or 1: the exact order of two Quantity messages, in integer arithmetic (no parsing, no Fraction)."""
    ac, bc = int(a.coefficient or "0"), int(b.coefficient or "0")
    ae, be = a.exponent, b.exponent
    if ae != be:
        a_sign, b_sign = (ac > 0) - (ac < 0), (bc > 0) - (bc < 0)
        if a_sign != b_sign or a_sign == 0:
            return (a_sign > b_sign) - (a_sign < b_sign)
        # Bring both to the smaller exponent; the values are exact integers from there on.
        low = min(ae, be)
        ac, bc = ac * 10 ** (ae - low), bc * 10 ** (be - low)
    return (ac > bc) - (ac < bc)


def semver_to_message(v: Semver, cls: Any) -> Any:
    """The Semver message: build metadata is dropped, as semver equality ignores it."""
    return cls(major=v.major, minor=v.minor, patch=v.patch, prerelease=".".join(str(p) for p in v.prerelease))


class MessageMemo:
    """Bounded memo of immutable-by-convention CEL messages keyed by the value (or text) they were built from.

    Messages handed to cel-expr-python are copied into its own values and never changed by the library's
    functions, so one message can serve every device and call that needs the same value.
    """

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._messages: dict[Any, Any] = {}

    def get(self, key: Any) -> Any:
        return self._messages.get(key)

    def put(self, key: Any, message: Any) -> Any:
        if len(self._messages) >= self._limit:
            # Expressions and device values repeat heavily; a full reset keeps the bound without bookkeeping.
            self._messages.clear()
        self._messages[key] = message
        return message
