"""Label and field selectors with Kubernetes' syntax, parsed once and matched many times."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# A label key: optional DNS-subdomain prefix and a name segment; values are up to 63 characters.
_KEY = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET_RE = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ_RE = re.compile(rf"^\s*({_KEY})\s*(==|!=|=)\s*({_VALUE})\s*$")
_EXISTS_RE = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")


class SelectorError(ValueError):
    """A selector that does not parse; the message says which part and what is accepted."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: frozenset[str]

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and labels[self.key] in self.values
        # "!=" and "notin" match objects that lack the key, as in Kubernetes.
        return not present or labels[self.key] not in self.values


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside a `( ... )` value set."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in (p.strip() for p in parts) if p]


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...]

    @classmethod
    def parse(cls, text: str | None) -> LabelSelector:
        if not text:
            return cls(())
        reqs: list[Requirement] = []
        for part in _split_top_level(text):
            m = _SET_RE.match(part)
            if m:
                values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
                reqs.append(Requirement(m.group(1), m.group(2), values))
                continue
            m = _EQ_RE.match(part)
            if m:
                op = "=" if m.group(2) in ("=", "==") else "!="
                reqs.append(Requirement(m.group(1), op, frozenset([m.group(3)])))
                continue
            m = _EXISTS_RE.match(part)
            if m:
                reqs.append(Requirement(m.group(2), "!exists" if m.group(1) else "exists", frozenset()))
                continue
            raise SelectorError(
                f"labelSelector: unable to parse requirement {part!r}: accepted forms are key=value, "
                "key==value, key!=value, key in (a,b), key notin (a,b), key and !key"
            )
        return cls(tuple(reqs))

    def matches(self, labels: dict[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    equal: bool
    value: str


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...]

    @classmethod
    def parse(cls, text: str | None) -> FieldSelector:
        if not text:
            return cls(())
        reqs: list[FieldRequirement] = []
        for part in _split_top_level(text):
            for op, equal in (("!=", False), ("==", True), ("=", True)):
                if op in part:
                    name, _, value = part.partition(op)
                    reqs.append(FieldRequirement(name.strip(), equal, value.strip()))
                    break
            else:
                raise SelectorError(
                    f"fieldSelector: invalid selector {part!r}: accepted forms are field=value, "
                    "field==value and field!=value"
                )
        return cls(tuple(reqs))

    def check_fields(self, supported: Callable[[str], bool], describe: Callable[[], list[str]],
                     resource: str) -> None:
        for req in self.requirements:
            if not supported(req.field):
                raise SelectorError(
                    f'field label not supported: {req.field!r} for {resource}; supported: '
                    + ", ".join(describe())
                )

    def matches(self, value_of: Callable[[str], str | None]) -> bool:
        for req in self.requirements:
            actual = value_of(req.field) or ""
            if (actual == req.value) != req.equal:
                return False
        return True

    @property
    def empty(self) -> bool:
        return not self.requirements


def labels_of(obj: dict[str, Any]) -> dict[str, str]:
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    return labels if isinstance(labels, dict) else {}
