"""JSON merge patch (RFC 7386) and JSON patch (RFC 6902) on plain JSON values (strategic merge patch is
`controlplane.strategicmerge`)."""

from __future__ import annotations

import copy
import json
from typing import Any


# kube-apiserver's limits on a JSON patch: its operations (the patch handler's maxJSONPatchOperations, 413) and
# what its `copy` operations may add in all (the server's JSONPatchMaxCopyBytes, 3 MiB: json-patch's
# AccumulatedCopySizeLimit, each copy counted as its value's JSON size), so one request cannot grow an object
# exponentially by copying it into itself.
MAX_OPERATIONS = 10000
MAX_COPY_BYTES = 3 * 1024 * 1024


class PatchError(ValueError):
    """A patch that cannot be applied; the message names the operation and path."""


class TooManyOperations(PatchError):
    """More operations than kube-apiserver applies in one JSON patch (its 413)."""


class CopyLimitExceeded(PatchError):
    """The patch's copies add more than kube-apiserver allows (json-patch's error, answered 422)."""


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"json patch: path {path!r} must be empty or start with '/'")
    return [_unescape(t) for t in path[1:].split("/")]


def _container(doc: Any, tokens: list[str], path: str) -> Any:
    cur = doc
    for token in tokens:
        if isinstance(cur, dict):
            if token not in cur:
                raise PatchError(f"json patch: path {path!r}: key {token!r} not found")
            cur = cur[token]
        elif isinstance(cur, list):
            cur = cur[_index(token, len(cur), path, allow_end=False)]
        else:
            raise PatchError(f"json patch: path {path!r}: {token!r} is inside a non-container value")
    return cur


def _index(token: str, length: int, path: str, *, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return length
    if not token.isdigit():
        raise PatchError(f"json patch: path {path!r}: {token!r} is not an array index")
    idx = int(token)
    if idx > length or (idx == length and not allow_end):
        raise PatchError(f"json patch: path {path!r}: index {idx} out of range (length {length})")
    return idx


def _get(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return doc
    parent = _container(doc, tokens[:-1], path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"json patch: path {path!r} not found")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(last, len(parent), path, allow_end=False)]
    raise PatchError(f"json patch: path {path!r} not found")


def _add(doc: Any, path: str, value: Any) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return value
    parent = _container(doc, tokens[:-1], path)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(last, len(parent), path, allow_end=True), value)
    else:
        raise PatchError(f"json patch: path {path!r}: parent is not an object or array")
    return doc


def _remove(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        raise PatchError("json patch: cannot remove the whole document")
    parent = _container(doc, tokens[:-1], path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"json patch: remove: path {path!r} not found")
        del parent[last]
    elif isinstance(parent, list):
        del parent[_index(last, len(parent), path, allow_end=False)]
    else:
        raise PatchError(f"json patch: remove: path {path!r} not found")
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    if not isinstance(operations, list):
        raise PatchError("json patch: the body must be a JSON array of operations")
    if len(operations) > MAX_OPERATIONS:
        raise TooManyOperations(f"The allowed maximum operations in a JSON patch is {MAX_OPERATIONS}, "
                                f"got {len(operations)}")
    doc = copy.deepcopy(target)
    copied = 0
    for i, op in enumerate(operations):
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"json patch: operation {i} must be an object with 'op' and 'path'")
        kind, path = op["op"], op["path"]
        if not isinstance(path, str):
            raise PatchError(f"json patch: operation {i}: path must be a string")
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)
            doc = _remove(doc, path) if _pointer(path) else doc
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "move":
            value = _get(doc, op.get("from", ""))
            doc = _remove(doc, op.get("from", ""))
            doc = _add(doc, path, value)
        elif kind == "copy":
            value = _get(doc, op.get("from", ""))
            # Bounded: what copies made the document grow by is bounded by the limit itself.
            copied += len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
            if copied > MAX_COPY_BYTES:
                raise CopyLimitExceeded(f"Unable to complete the copy, the accumulated size increase of copy is "
                                        f"{copied}, exceeding the limit {MAX_COPY_BYTES}")
            doc = _add(doc, path, copy.deepcopy(value))
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise PatchError(f"json patch: test operation {i} failed at path {path!r}")
        else:
            raise PatchError(
                f"json patch: operation {i}: unsupported op {kind!r}; accepted: add, remove, replace, move, copy, test"
            )
    return doc

