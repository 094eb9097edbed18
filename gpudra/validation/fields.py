"""Type-safe reads of untyped manifest dicts, and Kubernetes' generic list/map/name checks.

Manifests come from users, so every read tolerates a wrong type: it records an error
naming the field and carries on with an empty value, so that all errors are reported.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from typing import Any

from gpudra.quantity import Quantity, QuantityError
from gpudra.validation import names
from gpudra.validation.errors import (
    FieldError,
    duplicate,
    index,
    invalid,
    key,
    required,
    too_long,
    too_many,
)

Errors = list[FieldError]


def get_map(value: Any, path: str, errs: Errors) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        errs.append(invalid(path, value, "must be an object"))
        return {}
    return value


def get_list(value: Any, path: str, errs: Errors) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        errs.append(invalid(path, value, "must be a list"))
        return []
    return value


def get_str(value: Any, path: str, errs: Errors) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        errs.append(invalid(path, value, "must be a string"))
        return ""
    return value


def get_int(value: Any, path: str, errs: Errors) -> int | None:
    """An int64 field; None when absent or of the wrong type (the error is recorded)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        errs.append(invalid(path, value, "must be an integer"))
        return None
    if not -(1 << 63) <= value < (1 << 63):
        errs.append(invalid(path, value, "must fit in a 64-bit signed integer"))
        return None
    return value


def get_bool(value: Any, path: str, errs: Errors) -> bool | None:
    if value is None:
        return None
    if not isinstance(value, bool):
        errs.append(invalid(path, value, "must be a boolean"))
        return None
    return value


def parse_quantity(value: Any, path: str, errs: Errors) -> Quantity | None:
    """A quantity field; numbers are accepted as Kubernetes' JSON decoder accepts them."""
    if value is None:
        errs.append(required(path, ""))
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        errs.append(invalid(path, value, "must be a quantity string"))
        return None
    text = value.strip() if isinstance(value, str) else json.dumps(value)
    try:
        return Quantity.parse(text)
    except QuantityError as err:
        errs.append(invalid(path, value, str(err)))
        return None


def check_size(items: list[Any], maximum: int, path: str, errs: Errors) -> bool:
    """Kubernetes' list size check; it stops item validation to bound the work (DoS protection)."""
    if maximum >= 0 and len(items) > maximum:
        errs.append(too_many(path, len(items), maximum))
        return False
    return True


def validate_list(
    items: list[Any],
    maximum: int,
    validate_item: Callable[[Any, str], Errors],
    path: str,
    errs: Errors,
    item_key: Callable[[Any], Hashable | None] | None = None,
) -> None:
    """validateSlice / validateSet: size, each item, then duplicates by key (first one wins).

    Since 1.35 a duplicate is reported at the item (`list[i]`), not at its key field, matching the
    declarative `listType=map` validation that covers these lists."""
    if not check_size(items, maximum, path, errs):
        return
    for i, item in enumerate(items):
        errs.extend(validate_item(item, index(path, i)))
    if item_key is None:
        return
    seen: set[Hashable] = set()
    for i, item in enumerate(items):
        k = item_key(item)
        if k is None:
            continue
        if k in seen:
            errs.append(duplicate(index(path, i), k))
        else:
            seen.add(k)


def map_entries(value: Any, maximum: int, path: str, errs: Errors) -> list[tuple[str, Any]]:
    """validateMap's size check; returns the entries to validate (none when over the limit)."""
    entries = get_map(value, path, errs)
    if maximum >= 0 and len(entries) > maximum:
        errs.append(too_many(path, len(entries), maximum))
        return []
    return [(str(k), v) for k, v in entries.items()]


def truncate_key(text: str, max_len: int) -> str:
    """Long map keys are shortened in the middle in field paths, as Kubernetes does."""
    max_len = max(max_len, 16)
    if len(text) <= max_len:
        return text
    remaining = max_len - 3
    return text[: (remaining + 1) // 2] + "..." + text[len(text) - remaining // 2 :]


def key_path(path: str, k: str, max_len: int) -> str:
    return key(path, truncate_key(k, max_len))


def dns_label(value: str, path: str) -> Errors:
    return [invalid(path, value, m) for m in names.dns1123_label(value)]


def dns_subdomain(value: str, path: str) -> Errors:
    return [invalid(path, value, m) for m in names.dns1123_subdomain(value)]


def label_key(value: str, path: str) -> Errors:
    return [invalid(path, value, m) for m in names.qualified_name(value)]


def label_value(value: str, path: str) -> Errors:
    return [invalid(path, value, m) for m in names.label_value(value)]


def driver_name(value: str, path: str) -> Errors:
    """ValidateCSIDriverName: required, <= 63 bytes, a DNS subdomain once lower-cased."""
    errs: Errors = []
    if not value:
        errs.append(required(path, ""))
    if len(value) > 63:
        errs.append(too_long(path, 63))
    errs.extend(invalid(path, value, m) for m in names.dns1123_subdomain(value.lower()))
    return errs


def pool_name(value: str, path: str) -> Errors:
    if not value:
        return [required(path, "")]
    errs: Errors = []
    if len(value) > 253:
        errs.append(too_long(path, 253))
    for part in value.split("/"):
        errs.extend(dns_subdomain(part, path))
    return errs


def c_identifier(value: str, path: str) -> Errors:
    errs: Errors = []
    if len(value) > 32:
        errs.append(too_long(path, 32))
    errs.extend(invalid(path, value, m) for m in names.c_identifier(value))
    return errs


def qualified_name(value: str, path: str) -> Errors:
    """Attribute/capacity names: a C identifier <= 32, optionally `<domain>/` with a driver-name domain.

    Kubernetes reports an empty name as a malformed C identifier, and empty parts as Invalid."""
    parts = value.split("/")
    if len(parts) == 1:
        return c_identifier(parts[0], path)
    if len(parts) > 2:
        return [invalid(path, value, "must not contain more than one slash")]
    errs: Errors = []
    domain, name = parts
    if not domain:
        errs.append(invalid(path, "", "the domain must not be empty"))
    else:
        errs.extend(driver_name(domain, path))
    if not name:
        errs.append(invalid(path, "", "the name must not be empty"))
    else:
        errs.extend(c_identifier(name, path))
    return errs


def fully_qualified_name(value: str, path: str) -> Errors:
    errs = qualified_name(value, path)
    if "/" not in value:
        errs.append(invalid(path, value, "a fully qualified name must be a domain and a name separated by a slash"))
    return errs


def raw_json_object(value: Any, path: str, max_length: int) -> Errors:
    """validateRawExtension: present, <= max_length bytes of JSON, and a JSON object."""
    if value is None:
        return [required(path, "")]
    try:
        size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
    except (TypeError, ValueError) as err:
        return [invalid(path, "<value omitted>", f"error parsing data as JSON: {err}")]
    if size > max_length:
        return [too_long(path, max_length)]
    if not isinstance(value, dict):
        return [invalid(path, "<value omitted>", "must be a valid JSON object")]
    return []
