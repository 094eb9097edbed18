"""Deep copies of JSON values (dicts, lists and scalars), several times cheaper than `copy.deepcopy`.

`copy.deepcopy` handles any object graph (a memo of every node, cycles, `__deepcopy__` hooks); a JSON value is
a tree of dicts and lists over immutable scalars, so a plain recursion that copies the containers and shares the
scalars is a complete copy of it.
"""

from __future__ import annotations

from typing import Any


def deep_copy(value: Any) -> Any:
    """A copy of `value` sharing no dict or list with it (tuples become lists, as a JSON round trip makes them)."""
    t = type(value)
    if t is dict:
        return {k: deep_copy(v) if type(v) in _CONTAINERS else v for k, v in value.items()}
    if t is list or t is tuple:
        return [deep_copy(v) if type(v) in _CONTAINERS else v for v in value]
    if isinstance(value, dict):  # subclasses (OrderedDict, ...) are stored as plain dicts
        return {k: deep_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [deep_copy(v) for v in value]
    return value


_CONTAINERS = frozenset({dict, list, tuple})
