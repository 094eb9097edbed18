"""Kubernetes resource quantities (k8s.io/apimachinery/pkg/api/resource), exactly.

A `Quantity` keeps the same facts Kubernetes keeps, because several observable results
depend on them and not only on the numeric value:

- the format (DecimalSI, BinarySI, DecimalExponent) chosen by the parsed suffix, which
  decides the canonical string;
- the original text when Kubernetes reuses it as the printed form (its parser keeps a
  string it considers canonical, so `"+1"` prints as `"+1"` and `"1E3"` as `"1E3"`);
- whether Kubernetes holds the number as a scaled int64 or as an arbitrary-precision
  decimal, because `AsInt64` (CEL's `isInteger()` / `asInteger()`) only succeeds for the
  former, and `AsApproximateFloat64` multiplies the stored unscaled value.

Equality, ordering and hashing are by numeric value only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

Format = Literal["DecimalSI", "BinarySI", "DecimalExponent"]

DECIMAL_SI: Format = "DecimalSI"
BINARY_SI: Format = "BinarySI"
DECIMAL_EXPONENT: Format = "DecimalExponent"

SPLIT_RE = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
ERR_FORMAT_WRONG = f"quantities must match the regular expression '{SPLIT_RE}'"
ERR_NUMERIC = "unable to parse numeric part of quantity"
ERR_SUFFIX = "unable to parse quantity's suffix"

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_NANO = -9
# Kubernetes keeps 18 decimal digits in its int64 fast path.
_MAX_INT64_FACTORS = 18
# Python refuses int<->str conversions beyond 4300 digits by default; Kubernetes itself
# would spend unbounded memory on such numbers. We refuse them with a clear error instead.
_MAX_DIGITS = 4000

_DECIMAL_SUFFIXES: dict[str, int] = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_BY_EXPONENT: dict[int, str] = {e: s for s, e in _DECIMAL_SUFFIXES.items()}
_BINARY_SUFFIXES: dict[str, int] = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_BINARY_BY_POWER: tuple[str, ...] = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_SUFFIX_CHARS = frozenset("eEinumkKMGTP")
_DIGITS = frozenset("0123456789")


class QuantityError(ValueError):
    """A string is not a Kubernetes quantity, or an operation cannot be represented."""


@dataclass(frozen=True)
class _Scanned:
    positive: bool
    value: str  # sign, integer and fraction text as written
    num: str  # integer digits without leading zeros ("0" when none)
    denom: str  # fraction digits
    suffix: str


def _scan(text: str) -> _Scanned:
    """Split text like Kubernetes' parseQuantityString (it does not apply its regex)."""
    positive = True
    pos = 0
    end = len(text)
    if pos < end and text[0] in "+-":
        positive = text[0] == "+"
        pos += 1
    while pos < end and text[pos] == "0":
        pos += 1
    if pos >= end:
        return _Scanned(positive, "0", "0", "", "")
    start = pos
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    num = text[start:pos] or "0"
    if pos >= end:
        return _Scanned(positive, text, num, "", "")
    denom = ""
    if text[pos] == ".":
        pos += 1
        start = pos
        while pos < end and text[pos] in _DIGITS:
            pos += 1
        denom = text[start:pos]
        if pos >= end:
            return _Scanned(positive, text, num, denom, "")
    value = text[:pos]
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < end and text[pos] in "+-":
        pos += 1
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    if pos < end:
        raise QuantityError(ERR_FORMAT_WRONG)
    return _Scanned(positive, value, num, denom, text[suffix_start:])


def _interpret_suffix(suffix: str) -> tuple[int, int, Format]:
    """(base, exponent, format) of a suffix, as Kubernetes' suffixer interprets it."""
    if suffix in _DECIMAL_SUFFIXES:
        return 10, _DECIMAL_SUFFIXES[suffix], DECIMAL_SI
    if suffix in _BINARY_SUFFIXES:
        return 2, _BINARY_SUFFIXES[suffix], BINARY_SI
    if len(suffix) > 1 and suffix[0] in "eE":
        digits = suffix[1:]
        body = digits[1:] if digits[0] in "+-" else digits
        if not body or not body.isdigit() or not body.isascii():
            raise QuantityError(ERR_SUFFIX)
        parsed = int(digits)
        if not _INT64_MIN <= parsed <= _INT64_MAX:
            raise QuantityError(ERR_SUFFIX)
        # Kubernetes narrows the parsed int64 exponent to int32 (wrapping).
        wrapped = ((parsed + (1 << 31)) % (1 << 32)) - (1 << 31)
        return 10, wrapped, DECIMAL_EXPONENT
    raise QuantityError(ERR_SUFFIX)


def _fits_int64(value: int) -> bool:
    return _INT64_MIN <= value <= _INT64_MAX


def _digit_count(value: int) -> int:
    return len(str(abs(value))) if value else 1


def _strip_tens(unscaled: int, exponent: int) -> tuple[int, int]:
    """Move factors of ten from the coefficient into the exponent (zero -> (0, 0))."""
    if unscaled == 0:
        return 0, 0
    text = str(abs(unscaled))
    stripped = text.rstrip("0")
    coefficient = int(stripped)
    return (coefficient if unscaled > 0 else -coefficient), exponent + len(text) - len(stripped)


# Go's math.Pow10 tables, so that as_approximate_float multiplies by the same float64 factors.
_POW10_TAB = tuple(float(f"1e{i}") for i in range(32))
_POW10_POS32 = tuple(float(f"1e{32 * i}") for i in range(10))
_POW10_NEG32 = tuple(float(f"1e-{32 * i}") for i in range(11))


def _go_pow10(n: int) -> float:
    if 0 <= n <= 308:
        return _POW10_POS32[n // 32] * _POW10_TAB[n % 32]
    if -323 <= n < 0:
        return _POW10_NEG32[(-n) // 32] / _POW10_TAB[(-n) % 32]
    return math.inf if n > 0 else 0.0


def _go_float(value: int) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


@dataclass(frozen=True, eq=False)
class Quantity:
    """An exact Kubernetes quantity; see the module docstring for what it remembers."""

    # Numeric value = _unscaled * 10 ** _exponent.
    _unscaled: int
    _exponent: int
    format: Format = DECIMAL_SI
    # True when Kubernetes would hold this value as an inf.Dec rather than a scaled int64.
    _big: bool = False
    # The parsed text when Kubernetes would print it back unchanged.
    _text: str | None = None

    # ---- construction -------------------------------------------------------------------------

    @classmethod
    def parse(cls, text: str) -> "Quantity":
        """Parse like Kubernetes' ParseQuantity; raises QuantityError with its message."""
        if not isinstance(text, str):
            raise QuantityError(f"quantity must be a string, not {type(text).__name__}")
        if text == "":
            raise QuantityError(ERR_FORMAT_WRONG)
        if text == "0":
            return cls(0, 0, DECIMAL_SI, False, text)
        scanned = _scan(text)
        base, exponent, fmt = _interpret_suffix(scanned.suffix)
        fast = cls._parse_int64(text, scanned, base, exponent, fmt)
        if fast is not None:
            return fast
        return cls._parse_big(scanned, base, exponent, fmt)

    @classmethod
    def _parse_int64(cls, text: str, s: _Scanned, base: int, exponent: int, fmt: Format) -> "Quantity | None":
        """Kubernetes' int64 fast path; None where it falls back to arbitrary precision."""
        mantissa = 1
        if fmt == BINARY_SI:
            scale = 0
            if exponent >= 0 and not s.denom:
                mantissa = 1 << exponent
                precision = 15 - len(s.num) - (exponent * 3) // 10 - 1
            else:
                precision = -1
        else:
            scale = exponent
            precision = _MAX_INT64_FACTORS - (len(s.num) + len(s.denom))
        if precision < 0:
            return None
        scale -= len(s.denom)
        if scale < _NANO:
            return None
        shifted = s.num + s.denom
        value = int(shifted)
        if not _fits_int64(value):
            raise QuantityError(ERR_NUMERIC)
        result = value * mantissa
        if not _fits_int64(result):
            return None
        if not s.positive:
            result = -result
        if fmt == BINARY_SI:
            keeps_text = exponent % 10 == 0 and (value & 0x07) != 0
        else:
            keeps_text = scale % 3 == 0 and not shifted.endswith("000") and shifted[0] != "0"
        return cls(result, scale, fmt, False, text if keeps_text else None)

    @classmethod
    def _parse_big(cls, s: _Scanned, base: int, exponent: int, fmt: Format) -> "Quantity":
        """Kubernetes' inf.Dec path: exact, rounded away from zero to nano, BinarySI capped at int64."""
        body = s.value.lstrip("+-")
        integer, _, fraction = body.partition(".")
        digits = integer + fraction
        if not digits:
            raise QuantityError(ERR_NUMERIC)
        if len(digits) > _MAX_DIGITS:
            raise QuantityError(f"quantity has more than {_MAX_DIGITS} digits")
        unscaled = int(digits)
        value_exponent = -len(fraction)
        if base == 10:
            value_exponent += exponent
        else:
            unscaled <<= exponent
        if unscaled != 0:
            if value_exponent >= _NANO:
                if _digit_count(unscaled) + value_exponent - _NANO > _MAX_DIGITS:
                    raise QuantityError(f"quantity has more than {_MAX_DIGITS} digits")
                unscaled *= 10 ** (value_exponent - _NANO)
            else:
                drop = _NANO - value_exponent
                if drop > _digit_count(unscaled):
                    unscaled = 1
                else:
                    unscaled = -(-unscaled // 10**drop)
            value_exponent = _NANO
        if fmt == BINARY_SI and Fraction(unscaled) * Fraction(10) ** value_exponent > _INT64_MAX:
            unscaled, value_exponent = _INT64_MAX, 0
        if fmt == BINARY_SI and unscaled != 0 and Fraction(unscaled) * Fraction(10) ** value_exponent < 1:
            fmt = DECIMAL_SI
        if not s.positive:
            unscaled = -unscaled
        return cls(unscaled, value_exponent, fmt, True, None)

    @classmethod
    def from_int(cls, value: int, fmt: Format = DECIMAL_SI) -> "Quantity":
        """Like Kubernetes' NewQuantity(value, format)."""
        if isinstance(value, bool) or not isinstance(value, int):
            raise QuantityError(f"from_int needs an int, not {type(value).__name__}")
        return cls(value, 0, fmt, not _fits_int64(value), None)

    # ---- value --------------------------------------------------------------------------------

    def _normalized(self) -> tuple[int, int]:
        return _strip_tens(self._unscaled, self._exponent)

    def as_fraction(self) -> Fraction:
        """The exact value (for callers that need arithmetic beyond add/sub)."""
        coefficient, exponent = self._normalized()
        if abs(exponent) > _MAX_DIGITS:
            raise QuantityError(f"quantity {self} is too large to convert to an exact fraction")
        return Fraction(coefficient) * Fraction(10) ** exponent

    def sign(self) -> int:
        return (self._unscaled > 0) - (self._unscaled < 0)

    def is_zero(self) -> bool:
        return self._unscaled == 0

    def is_integer(self) -> bool:
        """Kubernetes' AsInt64 succeeds: a scaled int64 (not an inf.Dec) with a non-negative scale that fits int64.

        This is what CEL's `isInteger()` reports, so e.g. `1000m` and `1Ei` are not integers.
        """
        return self._int64() is not None

    def as_int(self) -> int:
        """Kubernetes' AsInt64 (CEL `asInteger()`); raises QuantityError where it fails."""
        value = self._int64()
        if value is None:
            raise QuantityError(f"quantity {self} cannot be converted to an int64 integer")
        return value

    def _int64(self) -> int | None:
        if self._big or self._exponent < 0:
            return None
        if self._exponent == 0:
            return self._unscaled
        if self._unscaled == 0:
            return 0
        if self._exponent > 18:
            return None
        scaled = self._unscaled * 10**self._exponent
        return scaled if _fits_int64(scaled) else None

    def as_approximate_float(self) -> float:
        """Kubernetes' AsApproximateFloat64: float(unscaled) * 10**exponent in float64."""
        base = _go_float(self._unscaled)
        if self._exponent == 0:
            return base
        return base * _go_pow10(self._exponent)

    def cmp(self, other: "Quantity") -> int:
        """-1, 0 or 1, exactly."""
        a, b = self.sign(), other.sign()
        if a != b or a == 0:
            return (a > b) - (a < b)
        (ac, ae), (bc, be) = self._normalized(), other._normalized()
        # Compare magnitudes by order of magnitude first so huge exponents stay cheap.
        a_order, b_order = _digit_count(ac) + ae, _digit_count(bc) + be
        if a_order != b_order:
            greater = a_order > b_order
        else:
            low = min(ae, be)
            left, right = abs(ac) * 10 ** (ae - low), abs(bc) * 10 ** (be - low)
            if left == right:
                return 0
            greater = left > right
        return (1 if greater else -1) * a

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self._normalized() == other._normalized()

    def __hash__(self) -> int:
        return hash(self._normalized())

    def __lt__(self, other: "Quantity") -> bool:
        return self.cmp(other) < 0

    def __le__(self, other: "Quantity") -> bool:
        return self.cmp(other) <= 0

    def __gt__(self, other: "Quantity") -> bool:
        return self.cmp(other) > 0

    def __ge__(self, other: "Quantity") -> bool:
        return self.cmp(other) >= 0

    # ---- arithmetic ---------------------------------------------------------------------------

    def add(self, other: "Quantity") -> "Quantity":
        """Kubernetes' Add: keeps this quantity's format unless it is zero (then other's)."""
        fmt = other.format if self._unscaled == 0 else self.format
        if not self._big and not other._big:
            summed = _int64_add(self._unscaled, self._exponent, other._unscaled, other._exponent)
            if summed is not None:
                return Quantity(summed[0], summed[1], fmt, False, None)
        unscaled, exponent = _exact_add(self._unscaled, self._exponent, other._unscaled, other._exponent)
        return Quantity(unscaled, exponent, fmt, True, None)

    def sub(self, other: "Quantity") -> "Quantity":
        """Kubernetes' Sub: keeps this quantity's format unless it is zero (then other's)."""
        return self.add(other.neg()).with_format(other.format if self._unscaled == 0 else self.format)

    def neg(self) -> "Quantity":
        big = self._big or not _fits_int64(-self._unscaled)
        return Quantity(-self._unscaled, self._exponent, self.format, big, None)

    def with_format(self, fmt: Format) -> "Quantity":
        if fmt == self.format:
            return self
        return Quantity(self._unscaled, self._exponent, fmt, self._big, None)

    def __add__(self, other: "Quantity") -> "Quantity":
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.add(other)

    def __sub__(self, other: "Quantity") -> "Quantity":
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.sub(other)

    def __neg__(self) -> "Quantity":
        return self.neg()

    # ---- printing -----------------------------------------------------------------------------

    def canonical(self) -> str:
        """What Kubernetes prints for this quantity (its String() / JSON form)."""
        if self._text is not None:
            return self._text
        if self._unscaled == 0:
            return "0"
        coefficient, exponent = self._normalized()
        fmt = self.format
        if fmt == BINARY_SI and (-1024 < self._bounded() < 1024 or exponent < 0):
            fmt = DECIMAL_SI
        if fmt == BINARY_SI:
            if exponent > _MAX_DIGITS:
                raise QuantityError("quantity is too large to print in BinarySI")
            whole = coefficient * 10**exponent
            power = 0
            while power < len(_BINARY_BY_POWER) - 1 and whole % 1024 == 0:
                whole //= 1024
                power += 1
            return f"{whole}{_BINARY_BY_POWER[power]}"
        thousands = exponent - exponent % 3
        number = coefficient * 10 ** (exponent - thousands)
        if fmt == DECIMAL_SI and thousands in _DECIMAL_BY_EXPONENT:
            return f"{number}{_DECIMAL_BY_EXPONENT[thousands]}"
        return f"{number}" if thousands == 0 else f"{number}e{thousands}"

    def _bounded(self) -> Fraction:
        """The value, clamped to +-2**70 (enough for comparisons against small bounds)."""
        coefficient, exponent = self._normalized()
        if _digit_count(coefficient) + exponent > 22:
            return Fraction(1 << 70) * self.sign()
        if exponent < -_MAX_DIGITS:
            return Fraction(0)
        return Fraction(coefficient) * Fraction(10) ** exponent

    def __str__(self) -> str:
        return self.canonical()

    def __repr__(self) -> str:
        return f"Quantity({self.canonical()!r})"


def _int64_add(au: int, ae: int, bu: int, be: int) -> tuple[int, int] | None:
    """Kubernetes' int64Amount.Add; None where it overflows (it then switches to inf.Dec)."""
    if bu == 0:
        return au, ae
    if au == 0:
        return bu, be
    if ae == be:
        total = au + bu
        return (total, ae) if _fits_int64(total) else None
    if ae > be:
        au, ae, bu, be = bu, be, au, ae
    # now ae < be: scale b down to a's exponent
    gap = be - ae
    if gap > 18:
        return None
    scaled = bu * 10**gap
    if not _fits_int64(scaled):
        return None
    total = au + scaled
    return (total, ae) if _fits_int64(total) else None


def _exact_add(au: int, ae: int, bu: int, be: int) -> tuple[int, int]:
    low = min(ae, be)
    if max(_digit_count(au) + ae, _digit_count(bu) + be) - low > _MAX_DIGITS:
        raise QuantityError(f"quantity sum would have more than {_MAX_DIGITS} digits")
    return au * 10 ** (ae - low) + bu * 10 ** (be - low), low


def is_quantity(text: str) -> bool:
    """Whether `text` parses as a Kubernetes quantity (CEL's isQuantity)."""
    try:
        Quantity.parse(text)
    except QuantityError:
        return False
    return True
