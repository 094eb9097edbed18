"""Nodes and v1 NodeSelector matching (the semantics of k8s.io/component-helpers nodeaffinity)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.allocator.errors import AllocationError

HOSTNAME_LABEL = "kubernetes.io/hostname"


@dataclass(frozen=True)
class Node:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> "Node":
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise AllocationError("Node: metadata.name: required, a non-empty string")
        labels = meta.get("labels") or {}
        if not isinstance(labels, Mapping):
            raise AllocationError(f"Node {name}: metadata.labels: must be a map of strings")
        return cls(name=name, labels={str(k): str(v) for k, v in labels.items()})

    @classmethod
    def inferred(cls, name: str) -> "Node":
        """A node known only from a slice's nodeName: it carries the hostname label the kubelet would set."""
        return cls(name=name, labels={HOSTNAME_LABEL: name})


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class Term:
    expressions: tuple[Requirement, ...]
    fields: tuple[Requirement, ...]


@dataclass(frozen=True)
class NodeSelector:
    """A parsed v1 NodeSelector; `raw` is kept for allocation results."""

    terms: tuple[Term, ...]
    raw: Mapping[str, Any]

    @classmethod
    def parse(cls, raw: Mapping[str, Any], where: str) -> "NodeSelector":
        terms: list[Term] = []
        raw_terms = raw.get("nodeSelectorTerms") or []
        if not isinstance(raw_terms, list):
            raise AllocationError(f"{where}: nodeSelectorTerms: must be a list of terms")
        for ti, term in enumerate(raw_terms):
            if not isinstance(term, Mapping):
                raise AllocationError(f"{where}: nodeSelectorTerms[{ti}]: must be an object")
            exprs = tuple(_requirement(r, f"{where}: nodeSelectorTerms[{ti}].matchExpressions", False)
                          for r in term.get("matchExpressions") or [])
            flds = tuple(_requirement(r, f"{where}: nodeSelectorTerms[{ti}].matchFields", True)
                         for r in term.get("matchFields") or [])
            terms.append(Term(exprs, flds))
        return cls(tuple(terms), raw)

    def matches(self, node: Node) -> bool:
        # Terms are ORed; a term without requirements matches nothing (as in nodeaffinity).
        return any(_term_matches(t, node) for t in self.terms)


_LABEL_OPS = {"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"}
_FIELD_OPS = {"In", "NotIn"}


def _requirement(raw: Any, where: str, is_field: bool) -> Requirement:
    if not isinstance(raw, Mapping):
        raise AllocationError(f"{where}: each requirement must be an object with key, operator and values")
    key, op, values = raw.get("key"), raw.get("operator"), raw.get("values") or []
    allowed = _FIELD_OPS if is_field else _LABEL_OPS
    if not isinstance(key, str) or not key:
        raise AllocationError(f"{where}: key: required")
    if op not in allowed:
        raise AllocationError(f"{where}: operator {op!r}: not a valid selector operator; accepted: {', '.join(sorted(allowed))}")
    if is_field and key != "metadata.name":
        raise AllocationError(f"{where}: key {key!r}: not a supported field selector; accepted: metadata.name")
    vals = tuple(str(v) for v in values)
    if op in ("In", "NotIn") and not vals:
        raise AllocationError(f"{where}: values: must be non-empty for operator {op}")
    if op in ("Exists", "DoesNotExist") and vals:
        raise AllocationError(f"{where}: values: must be empty for operator {op}")
    if op in ("Gt", "Lt") and (len(vals) != 1 or not _is_int(vals[0])):
        raise AllocationError(f"{where}: values: operator {op} needs exactly one integer value")
    return Requirement(key, op, vals)


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _term_matches(term: Term, node: Node) -> bool:
    if not term.expressions and not term.fields:
        return False
    for r in term.expressions:
        if not _label_matches(r, node.labels):
            return False
    for r in term.fields:
        present = r.values and node.name in r.values
        if (r.operator == "In") != bool(present):
            return False
    return True


def _label_matches(r: Requirement, labels: Mapping[str, str]) -> bool:
    has = r.key in labels
    op = r.operator
    if op == "In":
        return has and labels[r.key] in r.values
    if op == "NotIn":
        return not has or labels[r.key] not in r.values
    if op == "Exists":
        return has
    if op == "DoesNotExist":
        return not has
    if not has or not _is_int(labels[r.key]):
        return False
    value, bound = int(labels[r.key]), int(r.values[0])
    return value > bound if op == "Gt" else value < bound


def node_matches(node: Node, node_name: str | None, all_nodes: bool, selector: NodeSelector | None) -> bool:
    """Does a slice (or a device with per-device node selection) target this node?"""
    if node_name:
        return node.name == node_name
    if all_nodes:
        return True
    if selector is not None:
        return selector.matches(node)
    return False
