"""JSON decoding for untrusted input: no NaN/Infinity, bounded nesting, duplicate keys reported with their path.

Kubernetes decodes request bodies with a strict JSON decoder (Go's, through sigs.k8s.io/json): NaN and
Infinity are not JSON, nesting is bounded, and duplicate keys are reported for `fieldValidation`. Python's
`json` accepts NaN, recurses on the C stack (a 100,000-deep body raises RecursionError) and silently keeps the
last of duplicate keys; this module closes those gaps for both the API server and the manifest loader.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

# Python's json, our schema walk and deep copies recurse; ~900 is where CPython's default limit bites, so the
# bound sits well below it (Kubernetes objects nest a few dozen levels at most).
MAX_DEPTH = 256

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = bytes(c for c in range(256) if c not in b"[]{}")


class StrictJsonError(ValueError):
    """The text is not acceptable JSON; the message says why."""


class _DupDict(dict):  # type: ignore[type-arg]
    """A decoded object that had duplicate keys (the last value wins, as in Go); remembers which."""

    dup_keys: list[str]


def nesting_depth_exceeds(raw: bytes, limit: int) -> bool:
    """Whether brackets outside strings nest deeper than `limit`; linear, no recursion."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKET)
    depth = 0
    for c in brackets:
        if c in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def _no_constant(name: str) -> Any:
    raise StrictJsonError(f"{name} is not a JSON value (JSON has no NaN or Infinity)")


def _marked(out: dict[str, Any], pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    dups: list[str] = []
    for k, _ in pairs:
        if k in seen and k not in dups:
            dups.append(k)
        seen.add(k)
    marked = _DupDict(out)
    marked.dup_keys = dups
    return marked


def loads(raw: bytes | str, max_depth: int = MAX_DEPTH) -> Any:
    """Decode `raw`; raises StrictJsonError for invalid JSON, NaN/Infinity or nesting deeper than `max_depth`."""
    return decode(raw, max_depth)[0]


def _pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(items)
    if len(out) == len(items):
        return out
    _DECODING.duplicate = True
    return _marked(out, items)


class _Decoding(threading.local):
    """Each thread's decoder (json.loads with hooks builds one per call, which costs more than decoding a small
    body) and whether the decode under way met a duplicate key."""

    def __init__(self) -> None:
        self.decoder = json.JSONDecoder(parse_constant=_no_constant, object_pairs_hook=_pairs)
        self.duplicate = False


_DECODING = _Decoding()


def decode(raw: bytes | str, max_depth: int = MAX_DEPTH) -> tuple[Any, list[str]]:
    """`loads`, and the paths of duplicate keys (found with a walk only when the decoder met one)."""
    data = raw.encode() if isinstance(raw, str) else raw
    if nesting_depth_exceeds(data, max_depth):
        raise StrictJsonError(f"exceeded max depth of {max_depth}")
    state = _DECODING
    state.duplicate = False
    try:
        text = data.decode("utf-8")
        if text.startswith("\ufeff"):  # what json.loads refuses before decoding
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        value = state.decoder.decode(text)
    except StrictJsonError:
        raise
    except RecursionError:
        raise StrictJsonError(f"exceeded max depth of {max_depth}") from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise StrictJsonError(str(exc)) from None
    return value, duplicate_fields(value) if state.duplicate else []


def duplicate_fields(value: Any, path: str = "") -> list[str]:
    """Dotted paths (`spec.devices`, `items[0].name`) of every key that appeared twice in its object."""
    out: list[str] = []
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        cur, where = stack.pop()
        if isinstance(cur, dict):
            for k in getattr(cur, "dup_keys", ()):
                out.append(f"{where}.{k}" if where else k)
            for k, v in cur.items():
                if isinstance(v, (dict, list)):
                    stack.append((v, f"{where}.{k}" if where else k))
        elif isinstance(cur, list):
            for i, v in enumerate(cur):
                if isinstance(v, (dict, list)):
                    stack.append((v, f"{where}[{i}]"))
    return sorted(out)
