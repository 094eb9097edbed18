"""Strategic merge patch, as apimachinery's `strategicpatch.StrategicMergePatch` applies one to an object.

Lists whose field has the `merge` strategy are merged by their merge key (primitive lists are unioned),
other lists are replaced; maps are merged, `null` deletes a key. Directives: `$patch: replace|delete|merge`
(in a map, or as a list element), `$retainKeys`, `$setElementOrder/<list>`, `$deleteFromPrimitiveList/<list>`.
The strategies come from `controlplane.patchmeta` (the 1.37 API's struct tags).
"""

from __future__ import annotations

import copy
from typing import Any

from controlplane.patch import PatchError
from controlplane.patchmeta import FieldMeta, PatchMeta

_PATCH = "$patch"
_RETAIN_KEYS = "$retainKeys"
_SET_ORDER = "$setElementOrder/"
_DELETE_PRIMITIVE = "$deleteFromPrimitiveList/"


def strategic_merge(original: Any, patch: Any, meta: PatchMeta, type_name: str) -> Any:
    """`original` patched with `patch` (neither is modified); `type_name` is the object's OpenAPI type."""
    if not isinstance(patch, dict):
        raise PatchError("strategic merge patch: the patch must be a JSON object")
    return _merge_map(copy.deepcopy(original) if isinstance(original, dict) else {}, patch, meta, type_name)


def _merge_map(original: dict[str, Any], patch: dict[str, Any], meta: PatchMeta, type_name: str) -> dict[str, Any]:
    """Merge `patch` into `original` (which this owns and modifies) and return the result."""
    directive = patch.get(_PATCH)
    if directive is not None:
        if directive == "replace":
            return _without_directives(patch)
        if directive == "delete":
            return {}
        if directive != "merge":
            raise PatchError(f"strategic merge patch: unknown patch type {directive!r} in map; accepted: replace, "
                             "delete, merge")
    retain = patch.get(_RETAIN_KEYS)
    if retain is not None:
        if not isinstance(retain, list) or not all(isinstance(k, str) for k in retain):
            raise PatchError("strategic merge patch: $retainKeys must be a list of strings")
        for key in [k for k in original if k not in retain]:
            del original[key]
    for key, value in patch.items():
        if key.startswith(_DELETE_PRIMITIVE):
            field = key[len(_DELETE_PRIMITIVE):]
            if not isinstance(value, list):
                raise PatchError(f"strategic merge patch: {key} must be a list")
            current = original.get(field)
            if isinstance(current, list):
                original[field] = [item for item in current if item not in value]
    orders = {key[len(_SET_ORDER):]: value for key, value in patch.items() if key.startswith(_SET_ORDER)}
    for key, value in patch.items():
        if key in (_PATCH, _RETAIN_KEYS) or key.startswith((_DELETE_PRIMITIVE, _SET_ORDER)):
            continue
        fmeta = meta.field(type_name, key)
        if value is None:
            original.pop(key, None)
            continue
        if isinstance(value, dict):
            if value.get(_PATCH) == "delete":
                original.pop(key, None)
                continue
            if "replace" in fmeta.strategies:
                original[key] = _without_directives(value)
                continue
            current = original.get(key)
            original[key] = _merge_map(current if isinstance(current, dict) else {}, value, meta, fmeta.ref)
            continue
        if isinstance(value, list):
            current = original.get(key)
            if fmeta.merges:
                base = current if isinstance(current, list) else []
                original[key] = _merge_list(base, value, meta, fmeta, key, orders.get(key))
            else:
                original[key] = _without_directives(value)
            continue
        original[key] = value
    # An order for a list the patch does not otherwise touch reorders what the object has.
    for key, order in orders.items():
        if key not in patch and isinstance(original.get(key), list):
            fmeta = meta.field(type_name, key)
            if fmeta.merges:
                original[key] = _normalize(original[key], order, original[key], fmeta.merge_key)
    return original


def _without_directives(value: Any) -> Any:
    """A replaced value, as stored: the directives it may carry are dropped."""
    if isinstance(value, dict):
        return {k: _without_directives(v) for k, v in value.items()
                if not (k in (_PATCH, _RETAIN_KEYS) or k.startswith((_SET_ORDER, _DELETE_PRIMITIVE)))}
    if isinstance(value, list):
        return [_without_directives(v) for v in value if not (isinstance(v, dict) and _PATCH in v)]
    return copy.deepcopy(value)


def _key_of(item: Any, merge_key: str, field: str) -> Any:
    if not isinstance(item, dict):
        raise PatchError(f"strategic merge patch: {field}: the items of a list merged by {merge_key!r} must be "
                         f"objects, got {item!r}")
    if merge_key not in item:
        raise PatchError(f"strategic merge patch: {field}: map: {item} does not contain declared merge key: "
                         f"{merge_key}")
    return item[merge_key]


def _merge_list(original: list[Any], patch: list[Any], meta: PatchMeta, fmeta: FieldMeta, field: str,
                order: Any) -> list[Any]:
    merge_key = fmeta.merge_key
    if order is not None and not isinstance(order, list):
        raise PatchError(f"strategic merge patch: $setElementOrder/{field} must be a list")
    if not merge_key:
        if any(isinstance(v, (dict, list)) for v in patch):
            raise PatchError(f"strategic merge patch: {field}: a list merged without a merge key holds only "
                             "primitive values")
        merged = list(original)
        for value in patch:
            if value not in merged:
                merged.append(value)
        return _normalize(merged, order if order is not None else patch, original, "")
    # Special elements: a `$patch: replace` element replaces the whole list; `$patch: delete` removes an item.
    plain: list[dict[str, Any]] = []
    deleted: list[Any] = []
    for item in patch:
        if isinstance(item, dict) and _PATCH in item:
            kind = item[_PATCH]
            if kind == "replace":
                return [_without_directives(v) for v in patch if not (isinstance(v, dict) and _PATCH in v)]
            if kind == "delete":
                deleted.append(_key_of(item, merge_key, field))
                continue
            if kind != "merge":
                raise PatchError(f"strategic merge patch: {field}: unknown patch type {kind!r} in list; accepted: "
                                 "replace, delete, merge")
        plain.append(item)
    merged = [copy.deepcopy(v) for v in original if not (isinstance(v, dict) and v.get(merge_key) in deleted)]
    for item in plain:
        key = _key_of(item, merge_key, field)
        for i, existing in enumerate(merged):
            if isinstance(existing, dict) and existing.get(merge_key) == key:
                merged[i] = _merge_map(existing, item, meta, fmeta.ref)
                break
        else:
            merged.append(_merge_map({}, item, meta, fmeta.ref))
    if order is not None:
        order_keys = [_key_of(item, merge_key, f"$setElementOrder/{field}") for item in order]
    else:
        order_keys = [item.get(merge_key) for item in plain]
    return _normalize(merged, order_keys, original, merge_key)


def _normalize(merged: list[Any], order: list[Any], original: list[Any], merge_key: str) -> list[Any]:
    """apimachinery's normalizeElementOrder: the items named in `order` in that order, the others (server-only)
    in their original order, the two interleaved so that server-only items keep their place relative to the
    ordered items the original also had."""
    def key(item: Any) -> Any:
        return item.get(merge_key) if merge_key and isinstance(item, dict) else item

    if merge_key:
        order = [o.get(merge_key) if isinstance(o, dict) else o for o in order]
    in_order = [item for item in merged if key(item) in order]
    server_only = [item for item in merged if key(item) not in order]
    in_order.sort(key=lambda item: order.index(key(item)))
    original_keys = [key(item) for item in original]
    server_only.sort(key=lambda item: original_keys.index(key(item)) if key(item) in original_keys
                     else len(original_keys))
    out: list[Any] = []
    i = j = 0
    while i < len(server_only) or j < len(in_order):
        if i >= len(server_only):
            out.append(in_order[j])
            j += 1
        elif j >= len(in_order):
            out.append(server_only[i])
            i += 1
        else:
            left, right = key(server_only[i]), key(in_order[j])
            if left in original_keys and right in original_keys and original_keys.index(left) < original_keys.index(right):
                out.append(server_only[i])
                i += 1
            else:
                out.append(in_order[j])
                j += 1
    return out

