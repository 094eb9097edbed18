"""Errors of the CEL layer and the texts the allocator reports for them (Kubernetes' wording)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping


class CelCompileError(ValueError):
    """The expression does not compile, or its result is not a bool (message is Kubernetes' text)."""


class CelRuntimeError(RuntimeError):
    """Evaluating a compiled selector failed for one device (message is Kubernetes' text)."""


def selector_error(prefix: str, index: int, err: Exception) -> str:
    """The allocator's text for a failed selector, e.g. ``class gpu: selector #0: CEL runtime error: ...``.

    ``prefix`` names the owner: ``class NAME`` or ``claim NAMESPACE/NAME``.
    """
    kind = "CEL compile error" if isinstance(err, CelCompileError) else "CEL runtime error"
    return f"{prefix}: selector #{index}: {kind}: {err}"


# cel-cpp statuses read "CODE: message" (and compile issues end in " [CODE]"); Kubernetes shows the message.
_STATUS_PREFIX = re.compile(r"^[A-Z_]+: ")
_STATUS_SUFFIX = re.compile(r" \[[A-Z_]+\]$")
_MISSING_KEY = re.compile(r'^Key not found in map ?: ?"?(.*?)"?$')
_NO_FIELD = re.compile(r"^no_such_field ?: ?(.*)$")
# A comprehension (exists, all, map, ...) over a scalar: cel-cpp names only the internal range overload.
_NOT_ITERABLE = re.compile(r"^No matching overloads found ?: ?<iter_range>$")


def runtime_message(status: str) -> str:
    """Translate a cel-cpp evaluation error into cel-go's wording where they differ."""
    text = _STATUS_PREFIX.sub("", status.strip(), count=1)
    missing = _MISSING_KEY.match(text)
    if missing:
        return f"no such key: {missing.group(1)}"
    no_field = _NO_FIELD.match(text)
    if no_field:
        return f"no such key: {no_field.group(1)}"
    if _NOT_ITERABLE.match(text):
        return "got a scalar value (not a list or map), expected iterable type"
    return text


def compile_message(status: str) -> str:
    """cel-cpp's issue list as Kubernetes prints a failed compilation."""
    text = _STATUS_PREFIX.sub("", status.strip(), count=1)
    text = _STATUS_SUFFIX.sub("", text)
    return f"compilation failed: {text}"


_NO_SUCH_KEY = re.compile(r"^no such key: (\S+)$")


def closest(name: str, choices: Iterable[str]) -> str | None:
    """The choice nearest to a mistyped `name` (case-insensitive similarity), if any is close enough."""
    import difflib

    pool = sorted(set(choices))
    by_lower = {c.lower(): c for c in pool}
    found = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[found[0]] if found else None


def missing_key_hint(message: str, attributes: Mapping[str, Mapping[str, object]],
                     capacity: Mapping[str, Mapping[str, object]], device: str) -> str:
    """For a `no such key: NAME` runtime error: what the device does have, and the closest name. Empty otherwise.

    Appended after Kubernetes' text, e.g. "no such key: prodcutName; did you mean productName? (device gpu-0 has
    attributes gpu.nvidia.com: architecture, brand, ...; capacity gpu.nvidia.com: memory)".
    """
    missing = _NO_SUCH_KEY.match(message)
    if not missing:
        return ""
    name = missing.group(1)
    names = [n for domain in (*attributes.values(), *capacity.values()) for n in domain]
    names += [d for d in (*attributes, *capacity) if d]
    best = closest(name, (n for n in names if n != name))
    parts = [f"attributes {domain}: {', '.join(sorted(ids))}" for domain, ids in sorted(attributes.items()) if ids]
    parts += [f"capacity {domain}: {', '.join(sorted(ids))}" for domain, ids in sorted(capacity.items()) if ids]
    has = f"device {device} has " + ("; ".join(parts) if parts else "no attributes or capacity")
    return (f"; did you mean {best}?" if best else "") + f" ({has})"
