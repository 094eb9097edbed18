"""Field errors rendered the way Kubernetes' apimachinery `field.Error` prints them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

OMITTED = object()  # Kubernetes' "<value omitted>" marker for values too large to print


@dataclass(frozen=True)
class FieldError:
    """One violation: `path` like `spec.devices.requests[0].name`, `message` like `Required value`."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def go_value(value: Any) -> str:
    """Render a bad value as Kubernetes does: %q for strings, %v for numbers/bools, null for nil."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    except (TypeError, ValueError):
        return repr(value)


def _with_detail(body: str, detail: str) -> str:
    return f"{body}: {detail}" if detail else body


def required(path: str, detail: str = "") -> FieldError:
    return FieldError(path, _with_detail("Required value", detail))


def forbidden(path: str, detail: str) -> FieldError:
    return FieldError(path, _with_detail("Forbidden", detail))


def invalid(path: str, value: Any, detail: str) -> FieldError:
    shown = "<value omitted>" if value is OMITTED else go_value(value)
    return FieldError(path, _with_detail(f"Invalid value: {shown}", detail))


def duplicate(path: str, value: Any) -> FieldError:
    return FieldError(path, f"Duplicate value: {go_value(value)}")


def not_supported(path: str, value: Any, supported: list[str]) -> FieldError:
    quoted = ", ".join(json.dumps(v) for v in supported)
    return FieldError(path, _with_detail(f"Unsupported value: {go_value(value)}", f"supported values: {quoted}"))


def too_long(path: str, max_length: int) -> FieldError:
    unit = "byte" if max_length == 1 else "bytes"
    return FieldError(path, f"Too long: may not be more than {max_length} {unit}")


def too_many(path: str, actual: int, maximum: int) -> FieldError:
    unit = "item" if maximum == 1 else "items"
    return FieldError(path, f"Too many: {actual}: must have at most {maximum} {unit}")


def not_found(path: str, value: Any) -> FieldError:
    return FieldError(path, f"Not found: {go_value(value)}")


def child(path: str, *names: str) -> str:
    """Kubernetes field path join: `a.b`, without a leading dot for the root."""
    for name in names:
        path = f"{path}.{name}" if path else name
    return path


def index(path: str, i: int) -> str:
    return f"{path}[{i}]"


def key(path: str, k: str) -> str:
    return f"{path}[{k}]"
