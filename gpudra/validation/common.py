"""Rules shared by DeviceClass, ResourceClaim and ResourceSlice: selectors, opaque config, taints, node selectors."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpudra.validation import names
from gpudra.validation.errors import (
    FieldError,
    child,
    duplicate,
    forbidden,
    index,
    invalid,
    not_supported,
    required,
    too_long,
)
from gpudra.validation.fields import (
    check_size,
    dns_subdomain,
    driver_name,
    get_list,
    get_map,
    get_str,
    label_key,
    label_value,
    raw_json_object,
)

CEL_EXPRESSION_MAX_LENGTH = 10 * 1024
OPAQUE_PARAMETERS_MAX_LENGTH = 10 * 1024
SELECTORS_MAX = 32
CONFIG_MAX = 32
TOLERATIONS_MAX = 16
TAINTS_MAX = 16
TAINT_EFFECTS = ["NoExecute", "NoSchedule", "None"]  # sorted, as Kubernetes lists them
TOLERATION_OPERATORS = ["Equal", "Exists"]
BINDING_CONDITIONS_MAX = 4

CelChecker = Callable[[str, bool], "str | None"]
OpaqueValidators = Mapping[str, Callable[[dict[str, Any]], list[str]]]


@dataclass(frozen=True)
class Hooks:
    """Optional checks supplied by other packages (CEL compile/cost, driver opaque parameters)."""

    cel: CelChecker | None = None
    opaque: OpaqueValidators = field(default_factory=dict)


def validate_cel_expression(expression: str, path: str, hooks: Hooks) -> list[FieldError]:
    if len(expression) > CEL_EXPRESSION_MAX_LENGTH:
        # Kubernetes does not compile expressions that are too long.
        return [too_long(path, CEL_EXPRESSION_MAX_LENGTH)]
    if expression.strip() == "":
        return [required(path, "expression must not be empty")]
    if hooks.cel is None:
        return []
    try:
        problem = hooks.cel(expression, True)
    except Exception as err:  # a checker bug must not hide the object's other errors
        return [FieldError(path, f"Internal error: CEL check failed: {err}")]
    if not problem:
        return []
    # Cost rejections are Forbidden in Kubernetes; compile errors are Invalid with the expression.
    if problem.startswith("too complex"):
        return [forbidden(path, problem)]
    return [invalid(path, expression, problem)]


def validate_selectors(value: Any, path: str, hooks: Hooks) -> list[FieldError]:
    errs: list[FieldError] = []
    selectors = get_list(value, path, errs)
    if not check_size(selectors, SELECTORS_MAX, path, errs):
        return errs
    for i, raw in enumerate(selectors):
        item_path = index(path, i)
        selector = get_map(raw, item_path, errs)
        if selector.get("cel") is None:
            errs.append(required(child(item_path, "cel"), ""))
            continue
        cel = get_map(selector.get("cel"), child(item_path, "cel"), errs)
        expr_path = child(item_path, "cel", "expression")
        errs.extend(validate_cel_expression(get_str(cel.get("expression"), expr_path, errs), expr_path, hooks))
    return errs


def validate_opaque(value: Any, path: str, hooks: Hooks) -> list[FieldError]:
    """A DeviceConfiguration: `opaque` with a driver name and a JSON object of parameters."""
    errs: list[FieldError] = []
    config = get_map(value, path, errs)
    opaque_path = child(path, "opaque")
    if config.get("opaque") is None:
        errs.append(required(opaque_path, ""))
        return errs
    opaque = get_map(config.get("opaque"), opaque_path, errs)
    driver = get_str(opaque.get("driver"), child(opaque_path, "driver"), errs)
    errs.extend(driver_name(driver, child(opaque_path, "driver")))
    params_path = child(opaque_path, "parameters")
    params = opaque.get("parameters")
    param_errs = raw_json_object(params, params_path, OPAQUE_PARAMETERS_MAX_LENGTH)
    errs.extend(param_errs)
    validator = hooks.opaque.get(driver)
    if not param_errs and validator is not None and isinstance(params, dict):
        try:
            messages = validator(params)
        except Exception as err:  # a driver validator bug must not hide the object's other errors
            messages = [f"Internal error: parameter validation failed: {err}"]
        errs.extend(_opaque_error(params_path, msg) for msg in messages)
    return errs


def _opaque_error(params_path: str, message: str) -> FieldError:
    """Driver validators report "sub.path: message" relative to `parameters`; anchor it in the object."""
    sub, sep, rest = message.partition(": ")
    if not sep or not sub or " " in sub:
        return FieldError(params_path, message)
    if sub == "parameters":
        return FieldError(params_path, rest)
    joiner = "" if sub.startswith("[") else "."
    return FieldError(f"{params_path}{joiner}{sub}", rest)


def validate_config_list(value: Any, path: str, hooks: Hooks) -> list[FieldError]:
    """DeviceClass.spec.config: <= 32 opaque configurations."""
    errs: list[FieldError] = []
    configs = get_list(value, path, errs)
    if check_size(configs, CONFIG_MAX, path, errs):
        for i, item in enumerate(configs):
            errs.extend(validate_opaque(item, index(path, i), hooks))
    return errs


def validate_taint(value: Any, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    taint = get_map(value, path, errs)
    taint_key = get_str(taint.get("key"), child(path, "key"), errs)
    errs.extend(label_key(taint_key, child(path, "key")))
    taint_value = get_str(taint.get("value"), child(path, "value"), errs)
    if taint_value:
        errs.extend(label_value(taint_value, child(path, "value")))
    effect = get_str(taint.get("effect"), child(path, "effect"), errs)
    if not effect:
        errs.append(required(child(path, "effect"), ""))
    elif effect not in TAINT_EFFECTS:
        errs.append(not_supported(child(path, "effect"), effect, TAINT_EFFECTS))
    return errs


def validate_tolerations(value: Any, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    tolerations = get_list(value, path, errs)
    if not check_size(tolerations, TOLERATIONS_MAX, path, errs):
        return errs
    for i, raw in enumerate(tolerations):
        errs.extend(validate_toleration(raw, index(path, i)))
    return errs


def validate_toleration(value: Any, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    toleration = get_map(value, path, errs)
    tol_key = get_str(toleration.get("key"), child(path, "key"), errs)
    if tol_key:
        errs.extend(label_key(tol_key, child(path, "key")))
    # The v1 API defaults an empty operator to Equal.
    operator = get_str(toleration.get("operator"), child(path, "operator"), errs) or "Equal"
    tol_value = get_str(toleration.get("value"), child(path, "value"), errs)
    if operator == "Exists":
        if tol_value:
            errs.append(invalid(child(path, "value"), tol_value, "must be empty for operator `Exists`"))
    elif operator == "Equal":
        # Unlike Pod tolerations, a DRA toleration with an empty key and Equal is accepted.
        errs.extend(label_value(tol_value, child(path, "value")))
    else:
        errs.append(not_supported(child(path, "operator"), operator, TOLERATION_OPERATORS))
    effect = get_str(toleration.get("effect"), child(path, "effect"), errs)
    if effect and effect not in TAINT_EFFECTS:
        errs.append(not_supported(child(path, "effect"), effect, TAINT_EFFECTS))
    seconds = toleration.get("tolerationSeconds")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int)):
        errs.append(invalid(child(path, "tolerationSeconds"), seconds, "must be an integer"))
    return errs


def validate_node_name(value: str, path: str) -> list[FieldError]:
    return dns_subdomain(value, path)


def validate_node_selector(value: Any, path: str) -> list[FieldError]:
    """core ValidateNodeSelector: >= 1 term; label requirements and metadata.name field requirements."""
    errs: list[FieldError] = []
    selector = get_map(value, path, errs)
    terms_path = child(path, "nodeSelectorTerms")
    terms = get_list(selector.get("nodeSelectorTerms"), terms_path, errs)
    if not terms:
        errs.append(required(terms_path, "must have at least one node selector term"))
        return errs
    for i, raw_term in enumerate(terms):
        term_path = index(terms_path, i)
        term = get_map(raw_term, term_path, errs)
        exprs_path = child(term_path, "matchExpressions")
        for j, raw in enumerate(get_list(term.get("matchExpressions"), exprs_path, errs)):
            errs.extend(_label_requirement(raw, index(exprs_path, j)))
        fields_path = child(term_path, "matchFields")
        for j, raw in enumerate(get_list(term.get("matchFields"), fields_path, errs)):
            errs.extend(_field_requirement(raw, index(fields_path, j)))
    return errs


def _label_requirement(value: Any, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    req = get_map(value, path, errs)
    operator = get_str(req.get("operator"), child(path, "operator"), errs)
    values_path = child(path, "values")
    values = [get_str(v, index(values_path, i), errs) for i, v in enumerate(get_list(req.get("values"), values_path, errs))]
    if operator in ("In", "NotIn"):
        if not values:
            errs.append(required(values_path, "must be specified when `operator` is 'In' or 'NotIn'"))
    elif operator in ("Exists", "DoesNotExist"):
        if values:
            errs.append(forbidden(values_path, "may not be specified when `operator` is 'Exists' or 'DoesNotExist'"))
    elif operator in ("Gt", "Lt"):
        if len(values) != 1:
            errs.append(required(values_path, "must be specified single value when `operator` is 'Lt' or 'Gt'"))
    else:
        errs.append(invalid(child(path, "operator"), operator, "not a valid selector operator"))
    errs.extend(label_key(get_str(req.get("key"), child(path, "key"), errs), child(path, "key")))
    for i, v in enumerate(values):
        errs.extend(label_value(v, index(values_path, i)))
    return errs


def _field_requirement(value: Any, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    req = get_map(value, path, errs)
    operator = get_str(req.get("operator"), child(path, "operator"), errs)
    values_path = child(path, "values")
    values = [get_str(v, index(values_path, i), errs) for i, v in enumerate(get_list(req.get("values"), values_path, errs))]
    if operator in ("In", "NotIn"):
        if len(values) != 1:
            errs.append(
                required(values_path, "must be only one value when `operator` is 'In' or 'NotIn' for node field selector")
            )
    else:
        errs.append(invalid(child(path, "operator"), operator, "not a valid selector operator"))
    field_key = get_str(req.get("key"), child(path, "key"), errs)
    if field_key != "metadata.name":
        errs.append(invalid(child(path, "key"), field_key, "not a valid field selector key"))
    else:
        for i, v in enumerate(values):
            errs.extend(validate_node_name(v, index(values_path, i)))
    return errs


def is_extended_resource_name(name: str) -> bool:
    """v1helper.IsExtendedResourceName."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    return not names.qualified_name("requests." + name)


def validate_binding_conditions(value: dict[str, Any], path: str) -> list[FieldError]:
    """bindingConditions / bindingFailureConditions (DRADeviceBindingConditions, beta in 1.35), on a
    device and on an allocation result: <= 4 label names each, unique, disjoint, and both or neither."""
    errs: list[FieldError] = []
    lists: dict[str, list[str]] = {}
    for name in ("bindingConditions", "bindingFailureConditions"):
        list_path = child(path, name)
        items = get_list(value.get(name), list_path, errs)
        lists[name] = [get_str(v, index(list_path, i), errs) for i, v in enumerate(items)]
        if check_size(items, BINDING_CONDITIONS_MAX, list_path, errs):
            for i, item in enumerate(lists[name]):
                errs.extend(label_key(item, index(list_path, i)))
    conditions, failures = lists["bindingConditions"], lists["bindingFailureConditions"]
    for name, items in lists.items():
        seen: set[str] = set()
        for i, item in enumerate(items):
            if item in seen:
                errs.append(duplicate(index(child(path, name), i), item))
            seen.add(item)
    for i, item in enumerate(failures):
        if item in conditions:
            errs.append(
                invalid(index(child(path, "bindingFailureConditions"), i), item, "bindingFailureConditions must not overlap with bindingConditions")
            )
    if not conditions and failures:
        errs.append(invalid(child(path, "bindingConditions"), None, "bindingConditions are required to use bindingFailureConditions"))
    if not failures and conditions:
        errs.append(invalid(child(path, "bindingFailureConditions"), None, "bindingFailureConditions are required to use bindingConditions"))
    return errs
