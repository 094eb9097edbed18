"""Deep copies of JSON-shaped values (what the API sends: dicts, lists, strings, numbers, booleans, None)."""

from __future__ import annotations

import copy
from typing import Any


def copy_json(value: Any) -> Any:
    """A deep copy, ~5x cheaper than `copy.deepcopy` on API objects: no memo, no per-type dispatch for the
    immutable leaves. Anything not JSON-shaped inside is copied by `copy.deepcopy`."""
    kind = type(value)
    if kind is dict:
        return {k: copy_json(v) for k, v in value.items()}
    if kind is list:
        return [copy_json(v) for v in value]
    if kind in (str, int, float, bool) or value is None:
        return value
    return copy.deepcopy(value)
