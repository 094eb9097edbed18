"""Kubernetes quantity semantics, checked against cases from apimachinery's own tests."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from gpudra.quantity import ERR_FORMAT_WRONG, ERR_NUMERIC, ERR_SUFFIX, Quantity, QuantityError, is_quantity


def q(text: str) -> Quantity:
    return Quantity.parse(text)


# (input, exact value, format) from apimachinery's TestQuantityParse.
PARSE_CASES: list[tuple[str, Fraction, str]] = [
    ("0", Fraction(0), "DecimalSI"),
    ("0n", Fraction(0), "DecimalSI"),
    ("0Ki", Fraction(0), "BinarySI"),
    ("0T", Fraction(0), "DecimalSI"),
    ("1", Fraction(1), "DecimalSI"),
    ("1Ki", Fraction(1024), "BinarySI"),
    ("8Ki", Fraction(8 * 1024), "BinarySI"),
    ("7Mi", Fraction(7 * 1024**2), "BinarySI"),
    ("6Gi", Fraction(6 * 1024**3), "BinarySI"),
    ("5Ti", Fraction(5 * 1024**4), "BinarySI"),
    ("4Pi", Fraction(4 * 1024**5), "BinarySI"),
    ("3Ei", Fraction(3 * 1024**6), "BinarySI"),
    ("100Ti", Fraction(100 * 1024**4), "BinarySI"),
    ("5n", Fraction(5, 10**9), "DecimalSI"),
    ("4u", Fraction(4, 10**6), "DecimalSI"),
    ("3m", Fraction(3, 1000), "DecimalSI"),
    ("50k", Fraction(50_000), "DecimalSI"),
    ("300T", Fraction(300 * 10**12), "DecimalSI"),
    ("1E", Fraction(10**18), "DecimalSI"),
    ("1E-3", Fraction(1, 1000), "DecimalExponent"),
    ("1e3", Fraction(1000), "DecimalExponent"),
    ("1E18", Fraction(10**18), "DecimalExponent"),
    ("1e13", Fraction(10**13), "DecimalExponent"),
    ("100.035k", Fraction(100035), "DecimalSI"),
    ("0.0005k", Fraction(1, 2), "DecimalSI"),
    ("0.00500", Fraction(5, 1000), "DecimalSI"),
    ("0.5e-2", Fraction(5, 1000), "DecimalExponent"),
    ("10.035M", Fraction(10035000), "DecimalSI"),
    ("1.3E+6", Fraction(1_300_000), "DecimalExponent"),
    ("1.53E12", Fraction(153 * 10**10), "DecimalExponent"),
    ("1.7E18", Fraction(17 * 10**17), "DecimalExponent"),
    ("6.987654321G", Fraction(6987654321), "DecimalSI"),
    ("1.01E", Fraction(101 * 10**16), "DecimalSI"),
    # sub-nano precision rounds away from zero
    ("3.001n", Fraction(4, 10**9), "DecimalSI"),
    ("1.1E-9", Fraction(2, 10**9), "DecimalExponent"),
    ("0.0000000001", Fraction(1, 10**9), "DecimalSI"),
    ("0.00000000050", Fraction(1, 10**9), "DecimalSI"),
    ("0.9n", Fraction(1, 10**9), "DecimalSI"),
    ("0.00000012345", Fraction(124, 10**9), "DecimalSI"),
    # BinarySI is capped at 2^63-1
    ("9Ei", Fraction(2**63 - 1), "BinarySI"),
    ("9223372036854775807Ki", Fraction(2**63 - 1), "BinarySI"),
    ("12E", Fraction(12 * 10**18), "DecimalSI"),
    ("100.035Ki", Fraction(10243584, 100), "BinarySI"),
    ("0.5Mi", Fraction(512 * 1024), "BinarySI"),
    ("0.05Gi", Fraction(536870912, 10), "BinarySI"),
    ("0.025Ti", Fraction(274877906944, 10), "BinarySI"),
    ("0.000000000001Ki", Fraction(2, 10**9), "DecimalSI"),
    (".001", Fraction(1, 1000), "DecimalSI"),
    (".0001k", Fraction(1, 10)),
    ("1.", Fraction(1), "DecimalSI"),
    ("1.G", Fraction(10**9), "DecimalSI"),
    # the scanner does not apply the documented regular expression
    (".", Fraction(0), "DecimalSI"),
    ("e3", Fraction(0), "DecimalExponent"),
]
PARSE_CASES = [(c[0], c[1], c[2] if len(c) > 2 else "DecimalSI") for c in PARSE_CASES]  # type: ignore[misc]


@pytest.mark.parametrize(("text", "value", "fmt"), PARSE_CASES)
def test_parse_value_and_format(text: str, value: Fraction, fmt: str) -> None:
    parsed = q(text)
    assert parsed.as_fraction() == value
    assert parsed.format == fmt
    if value:
        negative = q("-" + text)
        assert negative.as_fraction() == -value
        assert negative.format == fmt
    assert q("+" + text).as_fraction() == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", ERR_FORMAT_WRONG),
        ("1.1.M", ERR_FORMAT_WRONG),
        ("1+1.0M", ERR_FORMAT_WRONG),
        ("0.1mi", ERR_SUFFIX),
        ("0.1am", ERR_FORMAT_WRONG),
        ("aoeu", ERR_FORMAT_WRONG),
        (".5i", ERR_SUFFIX),
        ("1i", ERR_SUFFIX),
        ("-3.01i", ERR_SUFFIX),
        ("-3.01e-", ERR_SUFFIX),
        (" 1", ERR_FORMAT_WRONG),
        ("1 ", ERR_FORMAT_WRONG),
        ("1K", ERR_SUFFIX),
        ("1KiB", ERR_FORMAT_WRONG),
        ("1e", ERR_SUFFIX),
        ("1ee3", ERR_SUFFIX),
        ("1e1.5", ERR_FORMAT_WRONG),
        ("1e3k", ERR_FORMAT_WRONG),
        ("--1", ERR_SUFFIX),
        ("1e+-3", ERR_FORMAT_WRONG),
        ("1,5", ERR_FORMAT_WRONG),
        ("0x10", ERR_FORMAT_WRONG),
        ("Inf", ERR_FORMAT_WRONG),
        ("1e99999999999999999999", ERR_SUFFIX),
        (".e-10", ERR_NUMERIC),
        ("-e-10", ERR_NUMERIC),
    ],
)
def test_parse_errors_carry_kubernetes_messages(text: str, message: str) -> None:
    with pytest.raises(QuantityError) as err:
        q(text)
    assert str(err.value) == message
    assert not is_quantity(text)


def test_regex_message_is_verbatim() -> None:
    assert ERR_FORMAT_WRONG == (
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )
    assert ERR_SUFFIX == "unable to parse quantity's suffix"


# (canonical, a non-canonical spelling of the same value) from apimachinery's TestQuantityString.
CANONICAL_CASES = [
    ("1Gi", "1024Mi"),
    ("300Mi", "307200Ki"),
    ("1001Gi", "1025024Mi"),
    ("1Ti", "1024Gi"),
    ("1G", "1000M"),
    ("1G", "0.001T"),
    ("1m", "1000u"),
    ("1080m", "1.08"),
    ("1080m", "1080000000n"),
    ("1e9", ".001e12"),
    ("1e-3", "0.001e0"),
    ("1e-9", "1000e-12"),
    ("0", "00"),
    ("1", "1000m"),
    ("512Mi", "0.5Gi"),
    ("1536Mi", "1.5Gi"),
    ("1500m", "1.5"),
    ("1k", "1000"),
    ("1M", "1000k"),
    ("1m", "0.001"),
    ("5", "5.0"),
    ("1024m", ".001Ki"),
    ("1024u", ".000001Ki"),
    ("1024n", ".000000001Ki"),
    ("2n", ".000000000001Ki"),
    ("1n", "0.1n"),
    ("1126400m", "1.1Ki"),
    ("512", "0.5Ki"),
    ("1500", "1.5e3"),
    ("9223372036854775807", "8Ei"),
    ("1e21", "1000E"),  # beyond the E suffix Kubernetes switches to an exponent
    ("100m", "0.1"),
]


@pytest.mark.parametrize(("canonical", "alternate"), CANONICAL_CASES)
def test_canonical_form(canonical: str, alternate: str) -> None:
    assert q(alternate).canonical() == canonical
    assert str(q(canonical)) == canonical
    assert q(alternate) == q(canonical)
    if canonical != "0":
        assert str(-q(alternate)) == "-" + canonical


@pytest.mark.parametrize(
    "text",
    ["1Ki", "6Ki", "300Mi", "5", "500m", "80m", "1234567M", "1025", "80e-3", "300e6", "3e3", "1080n", "80u"],
)
def test_canonical_spellings_round_trip(text: str) -> None:
    assert str(q(text)) == text


def test_kubernetes_reuses_canonical_looking_text() -> None:
    # Kubernetes prints back the parsed text whenever its digits are already in canonical shape.
    assert str(q("+1")) == "+1"
    assert str(q("01")) == "01"
    assert str(q("1E3")) == "1E3"
    assert str(q("1.050")) == "1.050"
    assert str(q("100.m")) == "100.m"
    # arithmetic drops the remembered text
    assert str(q("+1") + q("0")) == "1"


def test_format_is_kept_through_canonicalisation() -> None:
    assert str(Quantity.from_int(1000)) == "1k"
    assert str(Quantity.from_int(1024, "BinarySI")) == "1Ki"
    assert str(Quantity.from_int(1_000_000, "DecimalExponent")) == "1e6"
    assert str(Quantity.from_int(1025, "BinarySI")) == "1025"
    assert str(Quantity.from_int(1023, "BinarySI")) == "1023"
    assert str(Quantity.from_int(0, "BinarySI")) == "0"


def test_comparisons_are_exact() -> None:
    assert q("100m") > q("50m")
    assert q("50m") < q("100m")
    assert q("10000T") > q("100Gi")
    assert q("1Gi") == q("1073741824")
    assert q("1G") != q("1Gi")
    assert q("1e300") > q("9Ei")
    assert q("-1e300") < q("-9Ei")
    assert q("1n") > q("0")
    assert q("-1n") < q("0")
    assert q("0.1") == q("100m")
    assert q("1e-9") == q("1n")
    assert q("999999999999999999999") < q("1e21")
    assert q("1000000000000000000001") > q("1e21")
    assert q("1").cmp(q("1000m")) == 0
    assert sorted([q("2"), q("1Ki"), q("500m"), q("-1")]) == [q("-1"), q("500m"), q("2"), q("1Ki")]


def test_hash_follows_value() -> None:
    assert hash(q("1")) == hash(q("1000m"))
    assert hash(q("1Ki")) == hash(q("1024"))
    assert len({q("1"), q("1000m"), q("1.0"), q("2")}) == 2


def test_add_and_sub_keep_receiver_format() -> None:
    assert str(q("1Gi") + q("512Mi")) == "1536Mi"
    assert str(q("100m") + q("0")) == "100m"
    assert str(q("0") + q("100m")) == "100m"
    assert str(q("0") + q("1Gi")) == "1Gi"
    assert str(q("1Gi") - q("0")) == "1Gi"
    assert str(q("0") - q("1Gi")) == "-1Gi"
    assert str(q("1") - q("1")) == "0"
    assert str(q("1k") + q("1Ki")) == "2024"
    assert str(q("1Ki") + q("1k")) == "2024"
    assert str(q("1.5") - q("2")) == "-500m"
    assert str(q("9Ei") + q("9Ei")) == "18446744073709551614"
    assert str(q("9223372036854775807") + q("1")) == "9223372036854775808"
    assert (q("1e300") + q("1n")).as_fraction() == Fraction(10**300) + Fraction(1, 10**9)
    assert str(-q("9.01")) == "-9010m"


def test_sign_and_zero() -> None:
    assert q("5").sign() == 1
    assert q("-5m").sign() == -1
    assert q("0Ki").sign() == 0
    assert q("-0").sign() == 0
    assert q("0").is_zero()
    assert q("-").is_zero() and q("-.").is_zero()


def test_is_integer_follows_kubernetes_as_int64() -> None:
    # Kubernetes' AsInt64 succeeds only for its scaled-int64 form with a non-negative scale.
    assert q("50k").is_integer() and q("50k").as_int() == 50_000
    assert q("1Gi").as_int() == 1 << 30
    assert q("-7").as_int() == -7
    assert q("1e18").as_int() == 10**18
    assert q("999999999999999999").as_int() == 10**18 - 1
    # 19 digits leave Kubernetes' int64 fast path, so even 2^63-1 is not an "integer" there
    assert not q("9223372036854775807").is_integer()
    assert not q("9223372036854775808").is_integer()
    assert not q("1e19").is_integer()
    assert not q("1.5").is_integer()
    assert not q("1000m").is_integer()  # scale -3 even though the value is whole
    assert not q("1Ei").is_integer()  # parsed through the arbitrary-precision path
    assert not q("50.5Mi").is_integer()
    with pytest.raises(QuantityError, match="cannot be converted to an int64"):
        q("1.5").as_int()
    assert (q("1") + q("2")).as_int() == 3
    assert Quantity.from_int(42).as_int() == 42


def test_approximate_float() -> None:
    assert q("1.5").as_approximate_float() == 1.5
    assert q("1Gi").as_approximate_float() == float(1 << 30)
    assert q("-1.5Gi").as_approximate_float() == -1610612736.0
    assert q("100m").as_approximate_float() == pytest.approx(0.1)
    assert q("1e300").as_approximate_float() == 1e300
    assert q("1e400").as_approximate_float() == math.inf
    assert q("0").as_approximate_float() == 0.0


def test_huge_values_fail_cleanly() -> None:
    with pytest.raises(QuantityError, match="digits"):
        q("1" * 5000 + "e-20")
    with pytest.raises(QuantityError, match="digits"):
        q("1e1000000") + q("1")
    # comparisons across enormous exponents stay cheap
    assert q("1e1000000") > q("1e999999")


def test_parse_rejects_non_strings() -> None:
    with pytest.raises(QuantityError, match="must be a string"):
        Quantity.parse(5)  # type: ignore[arg-type]
    with pytest.raises(QuantityError):
        Quantity.from_int(1.5)  # type: ignore[arg-type]
