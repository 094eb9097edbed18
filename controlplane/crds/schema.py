"""Structural OpenAPI v3 schemas as apiextensions-apiserver applies them to custom resources.

Pure functions over JSON values: `check_structural` (is a CRD's schema one the server can serve), `default`
(apply `default`s and drop non-nullable nulls, as structuraldefaulting does), `prune` (drop fields the schema
does not name, unless `x-kubernetes-preserve-unknown-fields`), `validate` (types, formats, bounds, enums,
required, list types, and `x-kubernetes-validations` through a caller-supplied CEL evaluator). Error texts are
kube-apiserver's (kube-openapi's validate package and field.Error).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from gpudra.jsoncopy import copy_json

Schema = dict[str, Any]
# (rule, self, oldSelf or None, has_old) -> None when the rule holds, else the reason it does not
# (an evaluation or compile error's text, or "" for a plain false).
RuleEvaluator = Callable[[str, Any, Any, bool], "str | None"]

_TYPES = ("object", "array", "string", "integer", "number", "boolean")
_META_FIELDS = frozenset({"apiVersion", "kind", "metadata"})
# What a root schema may say about metadata (structural schemas may only restrict name and generateName).
_ROOT_METADATA_KEYS = frozenset({"name", "generateName"})


def _go_value(value: Any) -> str:
    """A value as field.Invalid prints it: strings quoted, numbers bare, objects and lists by their type."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(value)
    if value is None:
        return "null"
    return json.dumps("object" if isinstance(value, dict) else "array")


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# ----- structural check (the CRD's schema itself) ----------------------------------------------------------------

def check_structural(schema: Any, path: str) -> list[str]:
    """Why `schema` (at field path `path` of the CRD) is not a structural schema the server can serve; [] when it is."""
    if not isinstance(schema, dict):
        return [f"{path}: Required value: a schema object is required"]
    errors: list[str] = []
    if schema.get("type") != "object":
        errors.append(f"{path}.type: Invalid value: {json.dumps(schema.get('type', ''))}: must be object at the root")
    errors.extend(_check_node(schema, path, root=True))
    meta = (schema.get("properties") or {}).get("metadata")
    if isinstance(meta, dict):
        for key in meta.get("properties") or {}:
            if key not in _ROOT_METADATA_KEYS:
                errors.append(f"{path}.properties[metadata].properties[{key}]: Forbidden: only name and "
                              "generateName may be specified at the root of metadata")
    return errors


def _check_node(node: Schema, path: str, root: bool = False) -> list[str]:
    errors: list[str] = []
    typ = node.get("type")
    if typ is not None and typ not in _TYPES:
        errors.append(f"{path}.type: Unsupported value: {json.dumps(typ)}: supported values: "
                      + ", ".join(f'"{t}"' for t in _TYPES))
    special = node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
    if not typ and not special and not root:
        errors.append(f"{path}.type: Required value: must not be empty for specified object fields")
    if "$ref" in node:
        errors.append(f"{path}.$ref: Forbidden: $ref is not supported in a structural schema")
    if node.get("x-kubernetes-int-or-string") and typ:
        errors.append(f"{path}.type: Invalid value: {json.dumps(typ)}: must be empty if x-kubernetes-int-or-string "
                      "is true")
    props = node.get("properties")
    if props is not None:
        if not isinstance(props, dict):
            errors.append(f"{path}.properties: Invalid value: must be an object of schemas")
        else:
            if typ and typ != "object":
                errors.append(f"{path}.properties: Forbidden: must only be used with type object")
            for key, sub in props.items():
                errors.extend(_check_node(sub, f"{path}.properties[{key}]") if isinstance(sub, dict)
                              else [f"{path}.properties[{key}]: Invalid value: must be a schema object"])
    addl = node.get("additionalProperties")
    if isinstance(addl, dict):
        if props:
            errors.append(f"{path}.additionalProperties: Forbidden: additionalProperties and properties are "
                          "mutually exclusive")
        errors.extend(_check_node(addl, f"{path}.additionalProperties"))
    items = node.get("items")
    if typ == "array" and not isinstance(items, dict):
        errors.append(f"{path}.items: Required value: must be specified for type array")
    if isinstance(items, dict):
        errors.extend(_check_node(items, f"{path}.items"))
    for key in ("allOf", "anyOf", "oneOf"):
        for i, sub in enumerate(node.get(key) or []):
            if isinstance(sub, dict) and ("type" in sub or "default" in sub or "description" in sub):
                errors.append(f"{path}.{key}[{i}].{next(k for k in ('type', 'default', 'description') if k in sub)}"
                              f": Forbidden: must be empty to be structural")
    list_type = node.get("x-kubernetes-list-type")
    if list_type is not None:
        if list_type not in ("atomic", "set", "map"):
            errors.append(f"{path}.x-kubernetes-list-type: Unsupported value: {json.dumps(list_type)}: supported "
                          'values: "atomic", "set", "map"')
        if typ != "array":
            errors.append(f"{path}.x-kubernetes-list-type: Invalid value: {json.dumps(list_type)}: must only be "
                          "used on type array")
        if list_type == "map" and not node.get("x-kubernetes-list-map-keys"):
            errors.append(f"{path}.x-kubernetes-list-map-keys: Required value: must not be empty if "
                          "x-kubernetes-list-type is map")
    if "default" in node and not errors:
        default_errors = validate(node, copy_json(node["default"]), f"{path}.default", None)
        errors.extend(default_errors)
        pruned, _ = prune(node, copy_json(node["default"]), "", root=False)
        if pruned != node["default"] and not default_errors:
            errors.append(f"{path}.default: Invalid value: {_go_value(node['default'])}: must not have unknown fields")
    return errors


# ----- defaulting -------------------------------------------------------------------------------------------------

def default(schema: Schema, value: Any) -> Any:
    """`value` with the schema's defaults applied (in place where it is a dict or list; returned)."""
    if isinstance(value, dict):
        props = schema.get("properties")
        if isinstance(props, dict):
            for key, sub in props.items():
                if not isinstance(sub, dict):
                    continue
                if key in value and value[key] is None and not sub.get("nullable"):
                    if "default" in sub:
                        value[key] = copy_json(sub["default"])
                    else:
                        del value[key]  # a non-nullable null without a default is pruned
                        continue
                elif key not in value and "default" in sub:
                    value[key] = copy_json(sub["default"])
                if key in value:
                    value[key] = default(sub, value[key])
        addl = schema.get("additionalProperties")
        if isinstance(addl, dict):
            for key in list(value):
                value[key] = default(addl, value[key])
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(value):
                if item is None and "default" in items and not items.get("nullable"):
                    value[i] = copy_json(items["default"])
                value[i] = default(items, value[i])
    return value


# ----- pruning ----------------------------------------------------------------------------------------------------

def prune(schema: Schema, value: Any, path: str, root: bool = True) -> tuple[Any, list[str]]:
    """`value` without the fields `schema` does not specify, and the dotted paths of what was dropped.

    At the root (and at `x-kubernetes-embedded-resource` nodes) apiVersion, kind and metadata are kept; what
    metadata may hold is checked by the caller against ObjectMeta."""
    dropped: list[str] = []
    out = _prune(schema, value, path, dropped, root)
    return out, dropped


def _prune(schema: Schema, value: Any, path: str, dropped: list[str], keep_meta: bool) -> Any:
    if isinstance(value, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields") and not schema.get("properties"):
            props: dict[str, Any] = {}
            preserve = True
        else:
            props_raw = schema.get("properties")
            props = props_raw if isinstance(props_raw, dict) else {}
            preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
        addl = schema.get("additionalProperties")
        embedded = keep_meta or bool(schema.get("x-kubernetes-embedded-resource"))
        out: dict[str, Any] = {}
        for key, item in value.items():
            sub = props.get(key)
            if embedded and key in _META_FIELDS:
                out[key] = item  # ObjectMeta and TypeMeta are pruned by their Go types, not the schema
            elif isinstance(sub, dict):
                out[key] = _prune(sub, item, _child(path, key), dropped, False)
            elif isinstance(addl, dict):
                out[key] = _prune(addl, item, _child(path, key), dropped, False)
            elif addl is True or preserve:
                out[key] = item
            else:
                dropped.append(_child(path, key))
        return out
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            return [_prune(items, item, f"{path}[{i}]", dropped, False) for i, item in enumerate(value)]
    return value


# ----- validation -------------------------------------------------------------------------------------------------

def validate(schema: Schema, value: Any, path: str, old: Any, rules: RuleEvaluator | None = None,
             has_old: bool = False) -> list[str]:
    """Every error of `value` against `schema`, as `field.path: message` lines in kube-apiserver's words.
    `old` (with `has_old`) is the stored value at the same path, for transition rules (oldSelf)."""
    errors: list[str] = []
    _validate(schema, value, path, old, has_old, rules, errors)
    return errors


def _type_ok(typ: str, value: Any, schema: Schema) -> bool:
    actual = json_type(value)
    if typ == "number":
        return actual in ("number", "integer")
    return actual == typ


def _validate(schema: Schema, value: Any, path: str, old: Any, has_old: bool, rules: RuleEvaluator | None,
              errors: list[str]) -> None:
    shown = path or "<root>"
    if value is None:
        if schema.get("nullable"):
            return
        if schema.get("type"):
            errors.append(f'{shown}: Invalid value: "null": {shown} in body must be of type {schema["type"]}: "null"')
        return
    if schema.get("x-kubernetes-int-or-string") and json_type(value) not in ("integer", "string"):
        errors.append(f"{shown}: Invalid value: {_go_value(value)}: {shown} in body must be of type "
                      f'integer,string: "{json_type(value)}"')
        return
    typ = schema.get("type")
    if typ and not _type_ok(typ, value, schema):
        errors.append(f'{shown}: Invalid value: "{json_type(value)}": {shown} in body must be of type {typ}: '
                      f'"{json_type(value)}"')
        return
    enum = schema.get("enum")
    if isinstance(enum, list) and value not in enum:
        errors.append(f"{shown}: Unsupported value: {_go_value(value)}: supported values: "
                      + ", ".join(_go_value(e) for e in enum))
    if isinstance(value, str):
        _validate_string(schema, value, shown, errors)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        _validate_number(schema, value, shown, errors)
    elif isinstance(value, list):
        _validate_list(schema, value, path, old if has_old and isinstance(old, list) else None, rules, errors)
    elif isinstance(value, dict):
        _validate_object(schema, value, path, old if has_old and isinstance(old, dict) else None, rules, errors)
    for key in ("allOf", "anyOf", "oneOf", "not"):
        _validate_junctors(schema, key, value, path, errors)
    _validate_rules(schema, value, shown, old, has_old, rules, errors)


def _validate_string(schema: Schema, value: str, shown: str, errors: list[str]) -> None:
    max_len = schema.get("maxLength")
    if isinstance(max_len, int) and len(value) > max_len:
        errors.append(f"{shown}: Too long: may not be more than {max_len} bytes")
    min_len = schema.get("minLength")
    if isinstance(min_len, int) and len(value) < min_len:
        errors.append(f"{shown}: Invalid value: {_go_value(value)}: {shown} in body should be at least {min_len} "
                      "chars long")
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        try:
            matched = re.search(pattern, value) is not None
        except re.error:
            matched = True  # an invalid pattern was refused when the CRD was written
        if not matched:
            errors.append(f"{shown}: Invalid value: {_go_value(value)}: {shown} in body should match '{pattern}'")
    fmt = schema.get("format")
    checker = _FORMATS.get(fmt) if isinstance(fmt, str) else None
    if checker is not None and not checker(value):
        errors.append(f"{shown}: Invalid value: {_go_value(value)}: {shown} in body must be of type {fmt}: "
                      f"{_go_value(value)}")


def _validate_number(schema: Schema, value: float, shown: str, errors: list[str]) -> None:
    minimum = schema.get("minimum")
    if isinstance(minimum, (int, float)):
        if schema.get("exclusiveMinimum") and value <= minimum:
            errors.append(f"{shown}: Invalid value: {_go_value(value)}: {shown} in body should be greater than "
                          f"{_go_value(minimum)}")
        elif value < minimum:
            errors.append(f"{shown}: Invalid value: {_go_value(value)}: {shown} in body should be greater than or "
                          f"equal to {_go_value(minimum)}")
    maximum = schema.get("maximum")
    if isinstance(maximum, (int, float)):
        if schema.get("exclusiveMaximum") and value >= maximum:
            errors.append(f"{shown}: Invalid value: {_go_value(value)}: {shown} in body should be less than "
                          f"{_go_value(maximum)}")
        elif value > maximum:
            errors.append(f"{shown}: Invalid value: {_go_value(value)}: {shown} in body should be less than or "
                          f"equal to {_go_value(maximum)}")
    multiple = schema.get("multipleOf")
    if isinstance(multiple, (int, float)) and multiple > 0 and (value / multiple) % 1 != 0:
        errors.append(f"{shown}: Invalid value: {_go_value(value)}: {shown} in body should be a multiple of "
                      f"{_go_value(multiple)}")


def _validate_list(schema: Schema, value: list[Any], path: str, old: list[Any] | None,
                   rules: RuleEvaluator | None, errors: list[str]) -> None:
    shown = path or "<root>"
    max_items = schema.get("maxItems")
    if isinstance(max_items, int) and len(value) > max_items:
        errors.append(f"{shown}: Too many: {len(value)}: must have at most {max_items} items")
    min_items = schema.get("minItems")
    if isinstance(min_items, int) and len(value) < min_items:
        errors.append(f"{shown}: Invalid value: {len(value)}: {shown} in body should have at least {min_items} items")
    list_type = schema.get("x-kubernetes-list-type")
    keys = schema.get("x-kubernetes-list-map-keys") or []
    if list_type == "set" or schema.get("uniqueItems"):
        seen: list[Any] = []
        for i, item in enumerate(value):
            if item in seen:
                errors.append(f"{path}[{i}]: Duplicate value: {_go_value(item)}")
            seen.append(item)
    elif list_type == "map":
        seen_keys: set[str] = set()
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                continue
            key = json.dumps([item.get(k) for k in keys])
            if key in seen_keys:
                shown_key = ", ".join(f"{json.dumps(k)}:{_go_value(item.get(k))}" for k in keys)
                errors.append(f"{path}[{i}]: Duplicate value: map[string]interface {{}}{{{shown_key}}}")
            seen_keys.add(key)
    items = schema.get("items")
    if not isinstance(items, dict):
        return
    old_by_key: dict[str, Any] = {}
    if old is not None and list_type == "map":
        old_by_key = {json.dumps([o.get(k) for k in keys]): o for o in old if isinstance(o, dict)}
    for i, item in enumerate(value):
        # Transition rules see the old element correlated by map key (list-type map) only, as upstream.
        if list_type == "map" and isinstance(item, dict):
            key = json.dumps([item.get(k) for k in keys])
            _validate(items, item, f"{path}[{i}]", old_by_key.get(key), key in old_by_key, rules, errors)
        else:
            _validate(items, item, f"{path}[{i}]", None, False, rules, errors)


def _validate_object(schema: Schema, value: dict[str, Any], path: str, old: dict[str, Any] | None,
                     rules: RuleEvaluator | None, errors: list[str]) -> None:
    shown = path or "<root>"
    for key in schema.get("required") or []:
        if key not in value:
            errors.append(f"{_child(path, key)}: Required value")
    max_props = schema.get("maxProperties")
    if isinstance(max_props, int) and len(value) > max_props:
        errors.append(f"{shown}: Too many: {len(value)}: must have at most {max_props} items")
    min_props = schema.get("minProperties")
    if isinstance(min_props, int) and len(value) < min_props:
        errors.append(f"{shown}: Invalid value: {len(value)}: {shown} in body should have at least {min_props} "
                      "properties")
    props_raw = schema.get("properties")
    props: dict[str, Any] = props_raw if isinstance(props_raw, dict) else {}
    addl = schema.get("additionalProperties")
    for key, item in value.items():
        sub = props.get(key)
        if not isinstance(sub, dict):
            sub = addl if isinstance(addl, dict) else None
        if sub is None or (path == "" and key == "metadata" and not sub.get("properties")):
            continue
        has_old = old is not None and key in old
        _validate(sub, item, _child(path, key), old.get(key) if old is not None else None, has_old, rules, errors)


def _validate_junctors(schema: Schema, key: str, value: Any, path: str, errors: list[str]) -> None:
    subs = schema.get(key)
    if subs is None:
        return
    shown = path or "<root>"
    if key == "not":
        if isinstance(subs, dict) and not validate(subs, value, path, None):
            errors.append(f"{shown}: Invalid value: {_go_value(value)}: {shown} in body must not validate the schema")
        return
    if not isinstance(subs, list):
        return
    passing = sum(1 for sub in subs if isinstance(sub, dict) and not validate(sub, value, path, None))
    if key == "allOf":
        for sub in subs:
            if isinstance(sub, dict):
                errors.extend(validate(sub, value, path, None))
    elif key == "anyOf" and passing == 0:
        errors.append(f"{shown}: Invalid value: {_go_value(value)}: {shown} in body must validate at least one "
                      "schema (anyOf)")
    elif key == "oneOf" and passing != 1:
        errors.append(f"{shown}: Invalid value: {_go_value(value)}: {shown} in body must validate one and only one "
                      "schema (oneOf)")


def _validate_rules(schema: Schema, value: Any, shown: str, old: Any, has_old: bool, rules: RuleEvaluator | None,
                    errors: list[str]) -> None:
    for i, rule in enumerate(schema.get("x-kubernetes-validations") or []):
        if not isinstance(rule, dict) or not isinstance(rule.get("rule"), str):
            continue
        expression = rule["rule"]
        transition = "oldSelf" in expression
        if transition and not has_old and not rule.get("optionalOldSelf"):
            continue  # a transition rule applies to updates of a value that existed before
        if rules is None:
            errors.append(f"{shown}: Internal error: no CEL evaluator to check x-kubernetes-validations[{i}] "
                          f"({expression})")
            continue
        failure = rules(expression, value, old, has_old)
        if failure is None:
            continue
        message = rule.get("message") or f"failed rule: {expression}"
        if failure and failure != "false":
            message = failure  # an evaluation error is reported as such, not as the rule's message
        field = shown
        if isinstance(rule.get("fieldPath"), str) and rule["fieldPath"]:
            field = shown + rule["fieldPath"] if shown != "<root>" else rule["fieldPath"].lstrip(".")
        reason = rule.get("reason") or "FieldValueInvalid"
        if reason == "FieldValueRequired":
            errors.append(f"{field}: Required value: {message}")
        elif reason == "FieldValueForbidden":
            errors.append(f"{field}: Forbidden: {message}")
        elif reason == "FieldValueDuplicate":
            errors.append(f"{field}: Duplicate value: {message}")
        else:
            errors.append(f"{field}: Invalid value: {_go_value(value)}: {message}")


_DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
_FORMATS: dict[str, Callable[[str], bool]] = {
    "date-time": lambda s: _DATE_TIME.match(s) is not None,
    "date": lambda s: re.match(r"^\d{4}-\d{2}-\d{2}$", s) is not None,
    "uuid": lambda s: re.match(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$",
                               s) is not None,
    "ipv4": lambda s: re.match(r"^((25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(25[0-5]|2[0-4]\d|1?\d?\d)$", s) is not None,
    "byte": lambda s: re.match(r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$", s) is not None,
}
