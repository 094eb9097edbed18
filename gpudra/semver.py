"""Semantic versions as Kubernetes' CEL semver library sees them (blang/semver v4, strict).

`Semver.parse(text)` accepts exactly what blang's `semver.Parse` accepts and reports its
error messages; `normalize=True` first applies Kubernetes' `semver(s, true)` rewrite
(strip a leading `v`, drop leading zeros of the dot-separated parts, fill a missing
minor/patch with 0).
Ordering is semver 2.0.0 precedence: build metadata never counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import total_ordering

_NUMBERS = frozenset("0123456789")
_ALPHANUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-0123456789")
_UINT64_MAX = (1 << 64) - 1


class SemverError(ValueError):
    """Text is not a strict semantic version."""


def _contains_only(text: str, allowed: frozenset[str]) -> bool:
    return all(ch in allowed for ch in text)


def _has_leading_zeroes(text: str) -> bool:
    return len(text) > 1 and text[0] == "0"


def _parse_uint(text: str) -> int:
    # Mirrors strconv.ParseUint(text, 10, 64) after the digit check already passed.
    if not text:
        raise SemverError('strconv.ParseUint: parsing "": invalid syntax')
    value = int(text)
    if value > _UINT64_MAX:
        raise SemverError(f'strconv.ParseUint: parsing "{text}": value out of range')
    return value


@dataclass(frozen=True)
class PrereleaseIdentifier:
    """One dot-separated prerelease part: numeric parts compare as numbers and sort first."""

    text: str
    number: int | None = None

    def compare(self, other: "PrereleaseIdentifier") -> int:
        if self.number is not None and other.number is not None:
            return (self.number > other.number) - (self.number < other.number)
        if self.number is not None:
            return -1
        if other.number is not None:
            return 1
        return (self.text > other.text) - (self.text < other.text)

    def __str__(self) -> str:
        return str(self.number) if self.number is not None else self.text


def _parse_prerelease(text: str) -> PrereleaseIdentifier:
    if not text:
        raise SemverError("Prerelease is empty")
    if _contains_only(text, _NUMBERS):
        if _has_leading_zeroes(text):
            raise SemverError(f'Numeric PreRelease version must not contain leading zeroes "{text}"')
        return PrereleaseIdentifier(text, _parse_uint(text))
    if _contains_only(text, _ALPHANUM):
        return PrereleaseIdentifier(text)
    raise SemverError(f'Invalid character(s) found in prerelease "{text}"')


def _parse_core_number(text: str, what: str) -> int:
    if not _contains_only(text, _NUMBERS):
        raise SemverError(f'Invalid character(s) found in {what.lower()} number "{text}"')
    if _has_leading_zeroes(text):
        raise SemverError(f'{what} number must not contain leading zeroes "{text}"')
    return _parse_uint(text)


def normalize_version(text: str) -> str:
    """Kubernetes' normalizeAndParse rewrite for `semver(s, true)` (ParseTolerant without trimming).

    Raises SemverError for a shortened version that carries prerelease or build data.
    """
    if text.startswith("v"):
        text = text[1:]
    parts = text.split(".", 2)
    for i, part in enumerate(parts):
        if len(part) > 1:
            stripped = part.lstrip("0")
            if not stripped or stripped[0] not in _NUMBERS:
                stripped = "0" + stripped
            parts[i] = stripped
    if len(parts) < 3:
        if any(ch in parts[-1] for ch in "+-"):
            raise SemverError("short version cannot contain PreRelease/Build meta data")
        parts.extend(["0"] * (3 - len(parts)))
    return ".".join(parts)


@total_ordering
@dataclass(frozen=True, eq=False)
class Semver:
    major: int
    minor: int
    patch: int
    prerelease: tuple[PrereleaseIdentifier, ...] = ()
    build: tuple[str, ...] = field(default=())

    @classmethod
    def parse(cls, text: str, normalize: bool = False) -> "Semver":
        if not isinstance(text, str):
            raise SemverError(f"version must be a string, not {type(text).__name__}")
        if normalize:
            text = normalize_version(text)
        if not text:
            raise SemverError("Version string empty")
        parts = text.split(".", 2)
        if len(parts) != 3:
            raise SemverError("No Major.Minor.Patch elements found")
        major = _parse_core_number(parts[0], "Major")
        minor = _parse_core_number(parts[1], "Minor")
        rest = parts[2]
        build: list[str] = []
        prerelease: list[str] = []
        if "+" in rest:
            rest, _, build_text = rest.partition("+")
            build = build_text.split(".")
        if "-" in rest:
            rest, _, pre_text = rest.partition("-")
            prerelease = pre_text.split(".")
        patch = _parse_core_number(rest, "Patch")
        pre = tuple(_parse_prerelease(p) for p in prerelease)
        for item in build:
            if not item:
                raise SemverError("Build meta data is empty")
            if not _contains_only(item, _ALPHANUM):
                raise SemverError(f'Invalid character(s) found in build meta data "{item}"')
        return cls(major, minor, patch, pre, tuple(build))

    def compare(self, other: "Semver") -> int:
        """-1, 0 or 1 by semver 2.0.0 precedence."""
        for a, b in ((self.major, other.major), (self.minor, other.minor), (self.patch, other.patch)):
            if a != b:
                return 1 if a > b else -1
        if not self.prerelease or not other.prerelease:
            return (not self.prerelease) - (not other.prerelease)
        for a_id, b_id in zip(self.prerelease, other.prerelease):
            result = a_id.compare(b_id)
            if result:
                return result
        return (len(self.prerelease) > len(other.prerelease)) - (len(self.prerelease) < len(other.prerelease))

    def _key(self) -> tuple[int, int, int, tuple[tuple[int, str], ...]]:
        return (self.major, self.minor, self.patch, tuple((p.number or 0, p.text) for p in self.prerelease))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Semver):
            return NotImplemented
        return self.compare(other) == 0

    def __lt__(self, other: "Semver") -> bool:
        return self.compare(other) < 0

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += "-" + ".".join(str(p) for p in self.prerelease)
        if self.build:
            text += "+" + ".".join(self.build)
        return text

    def __repr__(self) -> str:
        return f"Semver({str(self)!r})"


def is_semver(text: str, normalize: bool = False) -> bool:
    """Whether `text` parses as a semver (CEL's isSemver; `normalize` as in Semver.parse)."""
    try:
        Semver.parse(text, normalize)
    except SemverError:
        return False
    return True
