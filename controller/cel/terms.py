"""Which top-level term of a selector is false on a device, said with the device's values.

A selector `A && B && C` rejects a device when one of its terms is false there. The expression is parsed (the
parser's AST, with source positions), split at its top-level `&&` operators, and each term is compiled and run
on the devices the selector rejected; the first false term of each device is named, rendered with the values
the device has where the term reads it:

    device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) >= 0
    -> memory 81559Mi >= 80Gi is false on all 8 devices

Only explanations use this, after a selector has already been found false: it never decides a match.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from controller.cel.device import DeviceView
from controller.cel.errors import CelCompileError, CelRuntimeError
from controller.cel.footprint import Path, _const_string, _device_map, _is_device, _member, footprint_of

_COMPARISONS = {"_==_": "==", "_!=_": "!=", "_<_": "<", "_<=_": "<=", "_>_": ">", "_>=_": ">="}
_METHOD_WORDS = {"contains": "contains", "startsWith": "starts with", "endsWith": "ends with", "matches": "matches",
                 "includes": "includes"}
_ORDER_METHODS = {"isGreaterThan": ">", "isLessThan": "<"}
_MAX_VALUES = 3  # distinct device values shown for one attribute


@dataclass(frozen=True)
class Term:
    """One top-level conjunct of a selector: its source text (what compiles on its own) and its AST."""

    text: str
    expr: Any


def top_level_terms(expression: str, parsed: Any) -> list[Term]:
    """The conjuncts of `expression` in source order; `parsed` is its cel.expr.ParsedExpr (with source_info).
    One term when the expression is not a conjunction; empty when the positions do not fit the text."""
    leaves: list[Any] = []
    operators: list[int] = []
    positions = dict(parsed.source_info.positions)

    def flatten(expr: Any) -> None:
        call = expr.call_expr if expr.WhichOneof("expr_kind") == "call_expr" else None
        if call is not None and call.function == "_&&_" and not call.HasField("target") and len(call.args) == 2:
            flatten(call.args[0])
            operators.append(positions.get(expr.id, -1))
            flatten(call.args[1])
        else:
            leaves.append(expr)

    flatten(parsed.expr)
    if not operators:
        return [Term(_trim(expression), parsed.expr)]
    if any(p < 0 or expression[p:p + 2] != "&&" for p in operators) or operators != sorted(operators):
        return []
    bounds = [0, *operators, len(expression)]
    texts = [expression[bounds[i] + (2 if i else 0):bounds[i + 1]] for i in range(len(bounds) - 1)]
    return [Term(_trim(text), leaf) for text, leaf in zip(texts, leaves)]


def _trim(text: str) -> str:
    """A term's text without the parentheses that grouped it with its neighbours: those left unmatched once the
    conjunction is cut at its `&&` (always at the term's start or end), and any pair around all of it."""
    opened: list[int] = []
    unmatched: set[int] = set()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in "\"'":
            i = _string_end(text, i)
            continue
        if ch == "(":
            opened.append(i)
        elif ch == ")":
            if opened:
                opened.pop()
            else:
                unmatched.add(i)
        i += 1
    unmatched.update(opened)
    out = "".join(ch for j, ch in enumerate(text) if j not in unmatched).strip()
    while out.startswith("(") and _closing(out, 0) == len(out) - 1:
        out = out[1:-1].strip()
    return out


def _closing(text: str, start: int) -> int:
    """Index of the parenthesis that closes the one at `start`, or -1."""
    depth = 0
    i = start
    while i < len(text):
        ch = text[i]
        if ch in "\"'":
            i = _string_end(text, i)
            continue
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return i
        i += 1
    return -1


def _string_end(text: str, start: int) -> int:
    """Index just past the CEL string literal that opens at `start` (single or triple quotes, raw or not)."""
    quote = text[start]
    delim = quote * 3 if text.startswith(quote * 3, start) else quote
    raw = start > 0 and text[start - 1] in "rR"
    i = start + len(delim)
    while i < len(text):
        if not raw and text[i] == "\\":
            i += 2
            continue
        if text.startswith(delim, i):
            return i + len(delim)
        i += 1
    return len(text)


def first_false(terms: Sequence[Term], compile_term: Any, view: DeviceView) -> int | None:
    """Index of the first term that is false on the device (a term that fails to run is passed over, as `&&`
    passes over an error when another term is false); None when none is."""
    for i, term in enumerate(terms):
        try:
            if compile_term(term.text).matches(view) is False:
                return i
        except (CelCompileError, CelRuntimeError):
            continue
    return None


def false_terms(terms: Sequence[Term], compile_term: Any, views: Sequence[DeviceView], limit: int = 2) -> str:
    """'memory 81559Mi >= 80Gi is false on all 8 devices', naming the first false term of each device (the most
    common first, at most `limit`); empty when no term is found false. `compile_term(text) -> Selector`."""
    groups: dict[int, list[DeviceView]] = {}
    for view in views:
        index = first_false(terms, compile_term, view)
        if index is not None:
            groups.setdefault(index, []).append(view)
    ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:limit]
    parts = []
    for index, group in ranked:
        n = len(group)
        where = f"all {n} devices" if n == len(views) and n > 1 else f"{n} device{'s' if n != 1 else ''}"
        parts.append(f"{describe(terms[index], group)} is false on {where}")
    return "; ".join(parts)


def describe(term: Term, views: Sequence[DeviceView]) -> str:
    """The term as a person reads it, with the devices' values where it reads them: `memory 81559Mi >= 80Gi`,
    `productName "NVIDIA A100-SXM4-80GB" == "H100"`; a form not recognised is its source text followed by the
    values it reads."""
    rendered = _Renderer(views).render(term.expr)
    if rendered is not None:
        return rendered
    footprint = footprint_of(term.expr)
    values = [f"{_name(p)} {_values(p, views)}" for p in footprint.paths] if footprint is not None else []
    return term.text + (f" ({', '.join(values)})" if values else "")


def device_path(expr: Any) -> Path | None:
    """The device value `expr` reads: ("driver",), ("allowMultipleAllocations",) or (map, domain, id)."""
    kind = expr.WhichOneof("expr_kind")
    if kind == "select_expr" and not expr.select_expr.test_only and _is_device(expr.select_expr.operand):
        field = expr.select_expr.field
        return (field,) if field in ("driver", "allowMultipleAllocations") else None
    member = _member(expr)
    if member is None:
        return None
    domain = _member(member[0])
    which = _device_map(domain[0]) if domain is not None else None
    return (which, domain[1], member[1]) if which is not None and domain is not None else None


def _name(path: Path) -> str:
    return path[-1]


def _value_text(value: Any) -> str:
    if value is None:
        return "(not set)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value_text(v) for v in value) + "]"
    return str(value)  # int, Semver, Quantity


def _read(path: Path, view: DeviceView) -> Any:
    if path[0] == "driver":
        return view.driver
    if path[0] == "allowMultipleAllocations":
        return view.allow_multiple_allocations
    ids = (view.attributes if path[0] == "attributes" else view.capacity).get(path[1]) or {}
    return ids.get(path[2])


def _values(path: Path, views: Sequence[DeviceView]) -> str:
    seen: list[str] = []
    for view in views:
        text = _value_text(_read(path, view))
        if text not in seen:
            seen.append(text)
    if len(seen) == 1:
        return seen[0]
    return "{" + ", ".join(seen[:_MAX_VALUES]) + (", ..." if len(seen) > _MAX_VALUES else "") + "}"


class _Renderer:
    """Renders the common forms of a term; None for anything else (the caller then shows the source text)."""

    def __init__(self, views: Sequence[DeviceView]) -> None:
        self.views = views
        self.reads_device = False

    def render(self, expr: Any) -> str | None:
        text = self._render(expr)
        # A form that reads nothing of the device explains nothing about it.
        return text if text is not None and self.reads_device else None

    def _render(self, expr: Any) -> str | None:
        path = device_path(expr)
        if path is not None:
            self.reads_device = True
            return f"{_name(path)} {_values(path, self.views)}"
        kind = expr.WhichOneof("expr_kind")
        if kind == "const_expr":
            which = expr.const_expr.WhichOneof("constant_kind")
            return _value_text(getattr(expr.const_expr, which)) if which and which != "bytes_value" else None
        if kind == "list_expr":
            items = [self._render(e) for e in expr.list_expr.elements]
            return None if any(i is None for i in items) else "[" + ", ".join(str(i) for i in items) + "]"
        if kind != "call_expr":
            return None
        call = expr.call_expr
        fn, args = call.function, list(call.args)
        target = call.target if call.HasField("target") else None
        if fn in ("quantity", "semver") and target is None and len(args) == 1:
            literal = _const_string(args[0])
            return literal if literal is not None else None
        if fn in _COMPARISONS and target is None and len(args) == 2:
            left, right = args
            inner = left.call_expr if left.WhichOneof("expr_kind") == "call_expr" else None
            zero = right.WhichOneof("expr_kind") == "const_expr" and right.const_expr.WhichOneof("constant_kind") \
                == "int64_value" and right.const_expr.int64_value == 0
            if inner is not None and inner.function == "compareTo" and inner.HasField("target") and len(inner.args) == 1 \
                    and zero:
                # a.compareTo(b) OP 0 is a OP b
                return self._binary(inner.target, _COMPARISONS[fn], inner.args[0])
            return self._binary(left, _COMPARISONS[fn], right)
        if fn in _ORDER_METHODS and target is not None and len(args) == 1:
            return self._binary(target, _ORDER_METHODS[fn], args[0])
        if fn in _METHOD_WORDS and target is not None and len(args) == 1:
            return self._binary(target, _METHOD_WORDS[fn], args[0])
        if fn == "@in" and target is None and len(args) == 2:
            return self._binary(args[0], "in", args[1])
        if fn == "!_" and target is None and len(args) == 1:
            inner_text = self._render(args[0])
            return f"not ({inner_text})" if inner_text is not None else None
        return None

    def _binary(self, left: Any, op: str, right: Any) -> str | None:
        a, b = self._render(left), self._render(right)
        return f"{a} {op} {b}" if a is not None and b is not None else None
