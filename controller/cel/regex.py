"""Regular expressions for Kubernetes' `find`/`findAll`, with Go's `regexp` syntax and linear-time matching.

Kubernetes compiles these patterns with Go's `regexp`, whose syntax is RE2's (no backreferences, no lookaround)
and whose matching time is linear in the input. Python's `re` backtracks: `"aaaa…a!".find("^(a+)+$")` takes
exponential time there, so one tenant's selector could hold the scheduler for hours. RE2 (the `google-re2`
binding) is the engine Go's package was modelled on: same syntax, same leftmost-first semantics, linear time.
cel-cpp's own `matches` already uses RE2.

Errors read as Go's (`error parsing regexp: missing closing ): `(``); RE2 reports the same conditions with its
own words, translated here.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Any

import re2

# Functions whose second argument (the first after the receiver) is a pattern.
REGEX_FUNCTIONS = frozenset({"matches", "find", "findAll"})

# Compiled patterns kept per library: selectors use a handful of constant patterns.
_CACHE_SIZE = 256

# RE2's error codes (re2::RE2::ErrorCode texts) -> Go's regexp/syntax ErrorCode texts.
_GO_WORDING = {
    "unexpected error": "regexp/syntax: internal error",
    "invalid escape sequence": "invalid escape sequence",
    "invalid character class": "invalid character class",
    "invalid character class range": "invalid character class range",
    "missing ]": "missing closing ]",
    "missing )": "missing closing )",
    "unexpected )": "unexpected )",
    "trailing \\": "trailing backslash at end of expression",
    "no argument for repetition operator": "missing argument to repetition operator",
    "invalid repetition size": "invalid repeat count",
    "bad repetition operator": "invalid nested repetition operator",
    "invalid perl operator": "invalid or unsupported Perl syntax",
    "invalid UTF-8": "invalid UTF-8",
    "invalid named capture group": "invalid named capture",
    "pattern too large - compile failed": "expression too large",
}


class RegexError(ValueError):
    """A pattern Go's regexp does not accept; the message is Go's `error parsing regexp: ...` text."""


def go_error_text(re2_message: str) -> str:
    """Go's wording of an RE2 compile error (`missing ): (` -> ``error parsing regexp: missing closing ): `(```)."""
    code, sep, arg = re2_message.partition(": ")
    if code not in _GO_WORDING and re2_message in _GO_WORDING:
        code, sep, arg = re2_message, "", ""
    text = _GO_WORDING.get(code, code)
    return f"error parsing regexp: {text}: `{arg}`" if sep else f"error parsing regexp: {text}"


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # errors are reported to the user, not printed on the process's stderr
    return options


class Regex:
    """One compiled pattern; matching works on UTF-8 bytes, as Go's does."""

    def __init__(self, pattern: str) -> None:
        try:
            self._re = re2.compile(pattern.encode("utf-8", "surrogatepass"), _options())
        except re2.error as err:
            message = err.args[0] if err.args else str(err)
            if isinstance(message, bytes):
                message = message.decode("utf-8", "replace")
            raise RegexError(go_error_text(str(message))) from None

    def find(self, text: str) -> str:
        """The leftmost match (Go's FindString): "" when there is none."""
        match = self._re.search(text.encode("utf-8", "surrogatepass"))
        return "" if match is None else bytes(match.group(0)).decode("utf-8", "surrogatepass")

    def find_all(self, text: str, limit: int = -1) -> list[str]:
        """Successive non-overlapping matches (Go's FindAllString): an empty match right after a match is skipped."""
        if limit == 0:
            return []
        data = text.encode("utf-8", "surrogatepass")
        return [data[s:e].decode("utf-8", "surrogatepass") for s, e in self._spans(data, limit)]

    def _spans(self, data: bytes, limit: int) -> Iterator[tuple[int, int]]:
        pos, found, prev_end = 0, 0, -1
        while pos <= len(data) and (limit < 0 or found < limit):
            match = self._re.search(data, pos)
            if match is None:
                return
            start, end = match.span()
            accept = True
            if end == pos:
                accept = start != prev_end  # an empty match abutting the previous match
                pos += _rune_width(data, pos)
            else:
                pos = end
            prev_end = end
            if accept:
                found += 1
                yield start, end


def _rune_width(data: bytes, pos: int) -> int:
    """Bytes of the UTF-8 character at `pos` (1 past the end, as Go steps)."""
    if pos >= len(data):
        return 1
    lead = data[pos]
    return 1 if lead < 0xC0 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4


class RegexCache:
    """Compiled patterns by text, the most recent `size` kept; a bad pattern's error is kept as well."""

    def __init__(self, size: int = _CACHE_SIZE) -> None:
        self._size = size
        self._entries: OrderedDict[str, Regex | RegexError] = OrderedDict()

    def get(self, pattern: str) -> Regex:
        entry = self._entries.get(pattern)
        if entry is None:
            try:
                entry = Regex(pattern)
            except RegexError as err:
                entry = err
            self._entries[pattern] = entry
            if len(self._entries) > self._size:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(pattern)
        if isinstance(entry, RegexError):
            raise entry
        return entry


def constant_pattern_error(expr: Any, functions: Iterable[str] = REGEX_FUNCTIONS) -> str | None:
    """The first constant pattern of a call to one of `functions` in a CEL AST (cel.expr.Expr) that Go's regexp
    refuses, in Go's words; None when all compile."""
    for pattern in _constant_patterns(expr, frozenset(functions)):
        try:
            Regex(pattern)
        except RegexError as err:
            return str(err)
    return None


def _constant_patterns(expr: Any, functions: frozenset[str]) -> Iterator[str]:
    stack = [expr]
    while stack:
        node = stack.pop()
        kind = node.WhichOneof("expr_kind")
        if kind == "call_expr":
            call = node.call_expr
            args = list(call.args)
            if call.HasField("target"):
                stack.append(call.target)
                pattern = args[0] if call.function in functions and args else None
            else:
                pattern = args[1] if call.function in functions and len(args) > 1 else None
            if pattern is not None and pattern.WhichOneof("expr_kind") == "const_expr" \
                    and pattern.const_expr.WhichOneof("constant_kind") == "string_value":
                yield pattern.const_expr.string_value
            stack.extend(args)
        elif kind == "select_expr":
            stack.append(node.select_expr.operand)
        elif kind == "list_expr":
            stack.extend(node.list_expr.elements)
        elif kind == "struct_expr":
            for entry in node.struct_expr.entries:
                if entry.WhichOneof("key_kind") == "map_key":
                    stack.append(entry.map_key)
                stack.append(entry.value)
        elif kind == "comprehension_expr":
            comp = node.comprehension_expr
            stack.extend([comp.iter_range, comp.accu_init, comp.loop_condition, comp.loop_step, comp.result])
