"""Strict semver parsing (blang/semver v4) and Kubernetes' normalization."""

from __future__ import annotations

import pytest

from gpudra.semver import Semver, SemverError, is_semver, normalize_version


@pytest.mark.parametrize(
    ("text", "major", "minor", "patch", "pre", "build"),
    [
        ("1.2.3", 1, 2, 3, "", ""),
        ("0.0.0", 0, 0, 0, "", ""),
        ("1.2.3-alpha", 1, 2, 3, "alpha", ""),
        ("1.2.3-alpha.1", 1, 2, 3, "alpha.1", ""),
        ("1.2.3-0.3.7", 1, 2, 3, "0.3.7", ""),
        ("1.2.3-x.7.z.92", 1, 2, 3, "x.7.z.92", ""),
        ("1.2.3+build.5", 1, 2, 3, "", "build.5"),
        ("1.0.0-rc.1+build.1-2", 1, 0, 0, "rc.1", "build.1-2"),
        ("1.2.3-0a", 1, 2, 3, "0a", ""),
        ("1.2.3-a-b--c", 1, 2, 3, "a-b--c", ""),
        ("1.2.3+001", 1, 2, 3, "", "001"),
        ("550.54.15", 550, 54, 15, "", ""),
        ("18446744073709551615.0.0", 2**64 - 1, 0, 0, "", ""),
    ],
)
def test_parse_valid(text: str, major: int, minor: int, patch: int, pre: str, build: str) -> None:
    v = Semver.parse(text)
    assert (v.major, v.minor, v.patch) == (major, minor, patch)
    assert ".".join(str(p) for p in v.prerelease) == pre
    assert ".".join(v.build) == build
    assert str(v) == text
    assert is_semver(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "Version string empty"),
        ("1", "No Major.Minor.Patch elements found"),
        ("1.2", "No Major.Minor.Patch elements found"),
        ("v1.2.3", 'Invalid character(s) found in major number "v1"'),
        ("01.2.3", 'Major number must not contain leading zeroes "01"'),
        ("1.02.3", 'Minor number must not contain leading zeroes "02"'),
        ("1.2.03", 'Patch number must not contain leading zeroes "03"'),
        ("1.x.3", 'Invalid character(s) found in minor number "x"'),
        ("1.2.3.4", 'Invalid character(s) found in patch number "3.4"'),
        ("1.2.3-", "Prerelease is empty"),
        ("1.2.3-a..b", "Prerelease is empty"),
        ("1.2.3-01", 'Numeric PreRelease version must not contain leading zeroes "01"'),
        ("1.2.3-a_b", 'Invalid character(s) found in prerelease "a_b"'),
        ("1.2.3+", "Build meta data is empty"),
        ("1.2.3+a+b", 'Invalid character(s) found in build meta data "a+b"'),
        (" 1.2.3", 'Invalid character(s) found in major number " 1"'),
        ("18446744073709551616.0.0", 'strconv.ParseUint: parsing "18446744073709551616": value out of range'),
        ("1..3", 'strconv.ParseUint: parsing "": invalid syntax'),
    ],
)
def test_parse_errors(text: str, message: str) -> None:
    with pytest.raises(SemverError) as err:
        Semver.parse(text)
    assert str(err.value) == message
    assert not is_semver(text)


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("v1.2.3", "1.2.3"),
        ("1", "1.0.0"),
        ("v1.2", "1.2.0"),
        ("01.002.0003", "1.2.3"),
        ("1.0.0-beta", "1.0.0-beta"),
        ("1.2.00-rc.1", "1.2.0-rc.1"),
        ("v0.0.0", "0.0.0"),
    ],
)
def test_normalize(text: str, normalized: str) -> None:
    assert normalize_version(text) == normalized
    assert str(Semver.parse(text, normalize=True)) == normalized
    assert is_semver(text, normalize=True)


def test_normalize_rejects_short_versions_with_metadata() -> None:
    with pytest.raises(SemverError, match="short version cannot contain PreRelease/Build meta data"):
        Semver.parse("1.2-beta", normalize=True)


def test_precedence_follows_semver_2() -> None:
    ordered = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
        "1.0.1",
        "1.1.0",
        "2.0.0",
        "10.0.0",
    ]
    versions = [Semver.parse(t) for t in ordered]
    backwards = versions[::-1]
    assert sorted(backwards) == versions
    for a, b in zip(versions, versions[1:]):
        assert a < b and b > a
        assert a.compare(b) == -1 and b.compare(a) == 1


def test_build_metadata_does_not_count() -> None:
    a, b = Semver.parse("1.2.3+a"), Semver.parse("1.2.3+b")
    assert a == b and a.compare(b) == 0
    assert hash(a) == hash(b)
    assert Semver.parse("1.2.3") != Semver.parse("1.2.4")


def test_non_string_is_rejected() -> None:
    with pytest.raises(SemverError, match="must be a string"):
        Semver.parse(1)  # type: ignore[arg-type]
