"""ResourceSlice spec rules."""

from __future__ import annotations

from typing import Any

from gpudra.semver import is_semver
from gpudra.validation.capacity import validate_request_policy
from gpudra.validation.common import (
    TAINTS_MAX,
    validate_binding_conditions,
    validate_node_name,
    validate_node_selector,
    validate_taint,
)
from gpudra.validation.errors import FieldError, child, forbidden, index, invalid, required, too_long
from gpudra.validation.fields import (
    check_size,
    dns_label,
    driver_name,
    get_bool,
    get_int,
    get_list,
    get_map,
    get_str,
    key_path,
    map_entries,
    parse_quantity,
    pool_name,
    qualified_name,
    validate_list,
)

MAX_DEVICES = 128
MAX_DEVICES_WITH_TAINTS_OR_COUNTERS = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_COUNTER_SETS = 8
MAX_COUNTERS_PER_SET = 32
MAX_CONSUMES_COUNTERS = 2
MAX_COUNTERS_PER_CONSUMPTION = 32
ATTRIBUTE_VALUE_MAX_LENGTH = 64
_QUALIFIED_KEY_MAX = 63 + 1 + 32
# ResourceSliceMaxAttributeValuesPerDevice (1.36+, KEP-5491): scalars count one, lists their length.
MAX_ATTRIBUTE_VALUES = 48
_NODE_FIELDS = "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
_DEVICE_NODE_FIELDS = (
    "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when `perDeviceNodeSelection` "
    "is set to true in the ResourceSlice spec"
)


def validate_slice_spec(value: Any, path: str, *, fractional: bool = True) -> list[FieldError]:
    errs: list[FieldError] = []
    spec = get_map(value, path, errs)
    driver_path = child(path, "driver")
    errs.extend(driver_name(get_str(spec.get("driver"), driver_path, errs), driver_path))
    errs.extend(_validate_pool(spec.get("pool"), child(path, "pool")))

    set_fields: list[str] = []
    if spec.get("nodeName") is not None:
        node_name = get_str(spec.get("nodeName"), child(path, "nodeName"), errs)
        if node_name:
            set_fields.append("`nodeName`")
            errs.extend(validate_node_name(node_name, child(path, "nodeName")))
        else:
            errs.append(invalid(child(path, "nodeName"), node_name, "must be either unset or set to a non-empty string"))
    if spec.get("nodeSelector") is not None:
        set_fields.append("`nodeSelector`")
        selector_path = child(path, "nodeSelector")
        errs.extend(validate_node_selector(spec.get("nodeSelector"), selector_path))
        terms = spec["nodeSelector"].get("nodeSelectorTerms") if isinstance(spec["nodeSelector"], dict) else None
        if terms is None or (isinstance(terms, list) and len(terms) != 1):
            errs.append(invalid(child(selector_path, "nodeSelectorTerms"), terms, "must have exactly one node selector term"))
    for flag in ("allNodes", "perDeviceNodeSelection"):
        if spec.get(flag) is not None:
            flag_value = get_bool(spec.get(flag), child(path, flag), errs)
            if flag_value:
                set_fields.append(f"`{flag}`")
            elif flag_value is False:
                errs.append(invalid(child(path, flag), False, "must be either unset or set to true"))
    if not set_fields:
        errs.append(required(path, _NODE_FIELDS))
    elif len(set_fields) > 1:
        errs.append(invalid(path, "{" + ", ".join(set_fields) + "}", _NODE_FIELDS + ", but multiple fields are set"))

    if spec.get("sharedCounters") is not None and spec.get("devices") is not None:
        errs.append(invalid(path, "", "only one of `sharedCounters` or `devices` is allowed"))

    devices_path = child(path, "devices")
    devices = get_list(spec.get("devices"), devices_path, errs)
    advanced = any(isinstance(d, dict) and (d.get("taints") or d.get("consumesCounters")) for d in devices)
    per_device = spec.get("perDeviceNodeSelection") is True
    validate_list(
        devices,
        MAX_DEVICES_WITH_TAINTS_OR_COUNTERS if advanced else MAX_DEVICES,
        lambda item, p: _validate_device(item, p, per_device, fractional),
        devices_path,
        errs,
        item_key=lambda d: d.get("name") if isinstance(d, dict) and isinstance(d.get("name"), str) else None,
    )

    sets_path = child(path, "sharedCounters")
    validate_list(
        get_list(spec.get("sharedCounters"), sets_path, errs),
        MAX_COUNTER_SETS,
        lambda item, item_path: _validate_counters_of(item, item_path, "name", MAX_COUNTERS_PER_SET),
        sets_path,
        errs,
        item_key=lambda s: s.get("name") if isinstance(s, dict) and isinstance(s.get("name"), str) else None,
    )
    return errs


def _validate_pool(value: Any, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    pool = get_map(value, path, errs)
    name_path = child(path, "name")
    errs.extend(pool_name(get_str(pool.get("name"), name_path, errs), name_path))
    count = get_int(pool.get("resourceSliceCount"), child(path, "resourceSliceCount"), errs)
    if pool.get("resourceSliceCount") is None or (count is not None and count <= 0):
        errs.append(invalid(child(path, "resourceSliceCount"), count or 0, "must be greater than zero"))
    generation = get_int(pool.get("generation"), child(path, "generation"), errs)
    if generation is not None and generation < 0:
        errs.append(invalid(child(path, "generation"), generation, "must be greater than or equal to zero"))
    return errs


def _validate_device(value: Any, path: str, per_device_node_selection: bool, fractional: bool = True) -> list[FieldError]:
    errs: list[FieldError] = []
    device = get_map(value, path, errs)
    errs.extend(dns_label(get_str(device.get("name"), child(path, "name"), errs), child(path, "name")))
    attributes = get_map(device.get("attributes"), child(path, "attributes"), errs)
    capacity = get_map(device.get("capacity"), child(path, "capacity"), errs)
    total = len(attributes) + len(capacity)
    if total > MAX_ATTRIBUTES_AND_CAPACITIES:
        errs.append(
            invalid(path, total, f"the total number of attributes and capacities must not exceed {MAX_ATTRIBUTES_AND_CAPACITIES}")
        )
    values = attribute_value_count(attributes)
    if values > MAX_ATTRIBUTE_VALUES:
        errs.append(invalid(child(path, "attributes"), values,
                            f"the total number of attribute values (list elements counted one by one) must not exceed "
                            f"{MAX_ATTRIBUTE_VALUES}"))
    attributes_path = child(path, "attributes")
    for name, attribute in map_entries(attributes, -1, attributes_path, errs):
        item_path = key_path(attributes_path, name, _QUALIFIED_KEY_MAX)
        # Since 1.35 key errors name the map itself (declarative `eachKey`), value errors the entry.
        errs.extend(qualified_name(name, attributes_path))
        errs.extend(_validate_attribute(attribute, item_path))
    multi = get_bool(device.get("allowMultipleAllocations"), child(path, "allowMultipleAllocations"), errs) is True
    capacity_path = child(path, "capacity")
    for name, entry in map_entries(capacity, -1, capacity_path, errs):
        item_path = key_path(capacity_path, name, _QUALIFIED_KEY_MAX)
        errs.extend(qualified_name(name, capacity_path))
        cap = get_map(entry, item_path, errs)
        value = parse_quantity(cap.get("value"), child(item_path, "value"), errs)
        policy_path = child(item_path, "requestPolicy")
        if cap.get("requestPolicy") is not None and not multi:
            errs.append(forbidden(policy_path, "allowMultipleAllocations must be true"))
        elif cap.get("requestPolicy") is not None and value is not None:
            errs.extend(validate_request_policy(cap.get("requestPolicy"), value, policy_path, fractional=fractional))

    taints_path = child(path, "taints")
    taints = get_list(device.get("taints"), taints_path, errs)
    if check_size(taints, TAINTS_MAX, taints_path, errs):
        for i, taint in enumerate(taints):
            errs.extend(validate_taint(taint, index(taints_path, i)))

    consumes_path = child(path, "consumesCounters")
    validate_list(
        get_list(device.get("consumesCounters"), consumes_path, errs),
        MAX_CONSUMES_COUNTERS,
        lambda item, item_path: _validate_counters_of(item, item_path, "counterSet", MAX_COUNTERS_PER_CONSUMPTION),
        consumes_path,
        errs,
        item_key=lambda c: c.get("counterSet") if isinstance(c, dict) and isinstance(c.get("counterSet"), str) else None,
    )
    errs.extend(_validate_device_node_fields(device, path, per_device_node_selection))
    errs.extend(validate_binding_conditions(device, path))
    return errs


def _validate_device_node_fields(device: dict[str, Any], path: str, per_device: bool) -> list[FieldError]:
    errs: list[FieldError] = []
    has_any = any(device.get(f) is not None for f in ("nodeName", "nodeSelector", "allNodes"))
    if not per_device:
        if has_any:
            errs.append(
                invalid(
                    path,
                    None,
                    "`nodeName`, `nodeSelector` and `allNodes` can only be set if `perDeviceNodeSelection` "
                    "is set to true in the ResourceSlice spec",
                )
            )
        return errs
    set_fields: list[str] = []
    if device.get("nodeName") is not None:
        node_name = get_str(device.get("nodeName"), child(path, "nodeName"), errs)
        if node_name:
            set_fields.append("`nodeName`")
            errs.extend(validate_node_name(node_name, child(path, "nodeName")))
        else:
            errs.append(invalid(child(path, "nodeName"), node_name, "must not be empty"))
    if device.get("nodeSelector") is not None:
        set_fields.append("`nodeSelector`")
        errs.extend(validate_node_selector(device.get("nodeSelector"), child(path, "nodeSelector")))
    if device.get("allNodes") is not None:
        all_nodes = get_bool(device.get("allNodes"), child(path, "allNodes"), errs)
        if all_nodes:
            set_fields.append("`allNodes`")
        elif all_nodes is False:
            errs.append(invalid(child(path, "allNodes"), False, "must be either unset or set to true"))
    if not set_fields:
        errs.append(required(path, _DEVICE_NODE_FIELDS))
    elif len(set_fields) > 1:
        errs.append(invalid(path, "{" + ", ".join(set_fields) + "}", _DEVICE_NODE_FIELDS))
    return errs


def _validate_attribute(value: Any, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    attribute = get_map(value, path, errs)
    present = [k for k in ("bool", "int", "string", "version") if attribute.get(k) is not None]
    if "bool" in present:
        get_bool(attribute["bool"], child(path, "bool"), errs)
    if "int" in present:
        get_int(attribute["int"], child(path, "int"), errs)
    if "string" in present:
        text = get_str(attribute["string"], child(path, "string"), errs)
        if len(text.encode()) > ATTRIBUTE_VALUE_MAX_LENGTH:
            errs.append(too_long(child(path, "string"), ATTRIBUTE_VALUE_MAX_LENGTH))
    if "version" in present:
        version_path = child(path, "version")
        version = get_str(attribute["version"], version_path, errs)
        if isinstance(attribute["version"], str) and not is_semver(version):
            errs.append(invalid(version_path, version, "must be a string compatible with semver.org spec 2.0.0"))
        if len(version.encode()) > ATTRIBUTE_VALUE_MAX_LENGTH:
            errs.append(too_long(version_path, ATTRIBUTE_VALUE_MAX_LENGTH))
    # List-type attributes (KEP-5491, DRAListTypeAttributes, alpha): checked element by element like scalars,
    # as written (see the package docstring on alpha fields); an empty list counts as unset.
    for kind, element in (("bools", "bool"), ("ints", "int"), ("strings", "string"), ("versions", "version")):
        if attribute.get(kind) is None:
            continue
        items = get_list(attribute[kind], child(path, kind), errs)
        if items:
            present.append(kind)
        for i, item in enumerate(items):
            item_path = index(child(path, kind), i)
            if item is None:
                errs.append(required(item_path))
                continue
            # An element is checked as the scalar of its kind would be, reported at the element itself.
            for e in _validate_attribute({element: item}, item_path):
                errs.append(FieldError(e.path.replace(f"{item_path}.{element}", item_path), e.message))
    if not present:
        errs.append(invalid(path, "", "exactly one value must be specified"))
    elif len(present) > 1:
        errs.append(invalid(path, attribute, "exactly one value must be specified"))
    return errs


def attribute_value_count(attributes: Any) -> int:
    """Values of a device's attributes, a list counting each element (ResourceSliceMaxAttributeValuesPerDevice)."""
    count = 0
    for value in (attributes or {}).values() if isinstance(attributes, dict) else ():
        if isinstance(value, dict):
            lists = [v for k, v in value.items() if k in ("bools", "ints", "strings", "versions") and isinstance(v, list)]
            count += sum(len(v) for v in lists) if lists else 1
    return count


def _validate_counter_map(value: Any, maximum: int, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    if not value:
        errs.append(required(path, ""))
        return errs
    for name, counter in map_entries(value, maximum, path, errs):
        item_path = key_path(path, name, 63)
        errs.extend(dns_label(name, path))
        entry = get_map(counter, item_path, errs)
        parse_quantity(entry.get("value"), child(item_path, "value"), errs)
    return errs


def _validate_counters_of(value: Any, path: str, name_field: str, max_counters: int) -> list[FieldError]:
    """A shared counter set (`name`) or a device's consumption of one (`counterSet`): the same shape, a
    DNS-label reference and a counter map, with different field names and limits."""
    errs: list[FieldError] = []
    entry = get_map(value, path, errs)
    name = get_str(entry.get(name_field), child(path, name_field), errs)
    if not name:
        errs.append(required(child(path, name_field), ""))
    else:
        errs.extend(dns_label(name, child(path, name_field)))
    errs.extend(_validate_counter_map(entry.get("counters"), max_counters, child(path, "counters")))
    return errs
