"""DeviceClass, ResourceClaim(+Template) spec and ResourceClaim status rules."""

from __future__ import annotations

import ipaddress
import uuid
from typing import Any

from gpudra.validation.common import (
    CONFIG_MAX,
    Hooks,
    is_extended_resource_name,
    validate_binding_conditions,
    validate_config_list,
    validate_node_selector,
    validate_opaque,
    validate_selectors,
    validate_tolerations,
)
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
    too_many,
)
from gpudra.validation.fields import (
    check_size,
    dns_label,
    dns_subdomain,
    driver_name,
    fully_qualified_name,
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
    raw_json_object,
    validate_list,
)

REQUESTS_MAX = 32
SUBREQUESTS_MAX = 8
CONSTRAINTS_MAX = 32
RESULTS_MAX = 32
ALLOCATION_CONFIG_MAX = 2 * CONFIG_MAX
RESERVED_FOR_MAX = 256
DEVICE_STATUS_CONDITIONS_MAX = 8
DEVICE_STATUS_DATA_MAX = 10 * 1024
ALLOCATION_MODES = ["All", "ExactCount"]
CONFIG_SOURCES = ["FromClaim", "FromClass"]
_QUALIFIED_KEY_MAX = 63 + 1 + 32
_REF_MESSAGE = "must be the name of a request in the claim or the name of a request and a subrequest separated by '/'"

RequestNames = dict[str, set[str] | None]


def validate_device_class_spec(value: Any, path: str, hooks: Hooks) -> list[FieldError]:
    errs: list[FieldError] = []
    spec = get_map(value, path, errs)
    errs.extend(validate_selectors(spec.get("selectors"), child(path, "selectors"), hooks))
    errs.extend(validate_config_list(spec.get("config"), child(path, "config"), hooks))
    ext = spec.get("extendedResourceName")
    if ext is not None:
        name = get_str(ext, child(path, "extendedResourceName"), errs)
        if not is_extended_resource_name(name):
            errs.append(invalid(child(path, "extendedResourceName"), name, "must be a valid extended resource name"))
    return errs


def gather_request_names(devices: dict[str, Any]) -> RequestNames:
    names: RequestNames = {}
    requests = devices.get("requests")
    for request in requests if isinstance(requests, list) else []:
        if not isinstance(request, dict) or not isinstance(request.get("name"), str):
            continue
        subs = request.get("firstAvailable")
        if isinstance(subs, list) and subs:
            names[request["name"]] = {s["name"] for s in subs if isinstance(s, dict) and isinstance(s.get("name"), str)}
        else:
            names[request["name"]] = None
    return names


def _has_request(names: RequestNames, ref: str) -> bool:
    segments = ref.split("/")
    if len(segments) > 2 or segments[0] not in names:
        return False
    if len(segments) == 1:
        return True
    subs = names[segments[0]]
    return subs is not None and segments[1] in subs


def validate_request_ref(ref: str, path: str, names: RequestNames) -> list[FieldError]:
    segments = ref.split("/")
    if len(segments) > 2:
        return [invalid(path, ref, _REF_MESSAGE)]
    errs: list[FieldError] = []
    for segment in segments:
        errs.extend(dns_label(segment, path))
    if not _has_request(names, ref):
        errs.append(invalid(path, ref, _REF_MESSAGE))
    return errs


def _validate_ref_list(value: Any, path: str, names: RequestNames, errs: list[FieldError]) -> None:
    refs = get_list(value, path, errs)
    validate_list(
        refs,
        REQUESTS_MAX,
        lambda item, p: validate_request_ref(get_str(item, p, errs), p, names),
        path,
        errs,
        item_key=lambda item: item if isinstance(item, str) else None,
    )


def validate_claim_spec(value: Any, path: str, hooks: Hooks) -> list[FieldError]:
    errs: list[FieldError] = []
    spec = get_map(value, path, errs)
    devices_path = child(path, "devices")
    devices = get_map(spec.get("devices"), devices_path, errs)
    names = gather_request_names(devices)

    requests_path = child(devices_path, "requests")
    validate_list(
        get_list(devices.get("requests"), requests_path, errs),
        REQUESTS_MAX,
        lambda item, p: _validate_request(item, p, hooks),
        requests_path,
        errs,
        item_key=_name_key,
    )

    constraints_path = child(devices_path, "constraints")
    constraints = get_list(devices.get("constraints"), constraints_path, errs)
    if check_size(constraints, CONSTRAINTS_MAX, constraints_path, errs):
        for i, raw in enumerate(constraints):
            errs.extend(_validate_constraint(raw, index(constraints_path, i), names))

    config_path = child(devices_path, "config")
    configs = get_list(devices.get("config"), config_path, errs)
    if check_size(configs, CONFIG_MAX, config_path, errs):
        for i, raw in enumerate(configs):
            item_path = index(config_path, i)
            config = get_map(raw, item_path, errs)
            _validate_ref_list(config.get("requests"), child(item_path, "requests"), names, errs)
            errs.extend(validate_opaque(config, item_path, hooks))
    return errs


def _name_key(item: Any) -> str | None:
    return item.get("name") if isinstance(item, dict) and isinstance(item.get("name"), str) else None


def _validate_request(value: Any, path: str, hooks: Hooks) -> list[FieldError]:
    errs: list[FieldError] = []
    request = get_map(value, path, errs)
    errs.extend(dns_label(get_str(request.get("name"), child(path, "name"), errs), child(path, "name")))
    subrequests = get_list(request.get("firstAvailable"), child(path, "firstAvailable"), errs)
    has_exactly = request.get("exactly") is not None
    if not subrequests and not has_exactly:
        errs.append(required(path, "exactly one of `exactly` or `firstAvailable` is required"))
    elif subrequests and has_exactly:
        errs.append(invalid(path, None, "exactly one of `exactly` or `firstAvailable` is required, but multiple fields are set"))
    elif subrequests:
        validate_list(
            subrequests,
            SUBREQUESTS_MAX,
            lambda item, p: _validate_exact(item, p, hooks, subrequest=True),
            child(path, "firstAvailable"),
            errs,
            item_key=_name_key,
        )
    else:
        errs.extend(_validate_exact(request.get("exactly"), child(path, "exactly"), hooks, subrequest=False))
    return errs


def _validate_exact(value: Any, path: str, hooks: Hooks, subrequest: bool) -> list[FieldError]:
    """An ExactDeviceRequest, or a DeviceSubRequest (which also has a name and no adminAccess)."""
    errs: list[FieldError] = []
    request = get_map(value, path, errs)
    if subrequest:
        errs.extend(dns_label(get_str(request.get("name"), child(path, "name"), errs), child(path, "name")))
    class_path = child(path, "deviceClassName")
    class_name = get_str(request.get("deviceClassName"), class_path, errs)
    if not class_name:
        errs.append(required(class_path, ""))
    else:
        errs.extend(dns_subdomain(class_name, class_path))
    errs.extend(validate_selectors(request.get("selectors"), child(path, "selectors"), hooks))
    errs.extend(_validate_allocation_mode(request, path, errs))
    if subrequest and "adminAccess" in request:
        errs.append(forbidden(child(path, "adminAccess"), "may only be set in `exactly`, not in a `firstAvailable` subrequest"))
    elif not subrequest:
        get_bool(request.get("adminAccess"), child(path, "adminAccess"), errs)
    errs.extend(validate_tolerations(request.get("tolerations"), child(path, "tolerations")))
    if request.get("capacity") is not None:
        capacity_path = child(path, "capacity")
        capacity = get_map(request.get("capacity"), capacity_path, errs)
        requests_path = child(capacity_path, "requests")
        for name, amount in map_entries(capacity.get("requests"), -1, requests_path, errs):
            item_path = key_path(requests_path, name, _QUALIFIED_KEY_MAX)
            errs.extend(qualified_name(name, requests_path))
            parse_quantity(amount, item_path, errs)
    return errs


def _validate_allocation_mode(request: dict[str, Any], path: str, errs: list[FieldError]) -> list[FieldError]:
    out: list[FieldError] = []
    mode_path, count_path = child(path, "allocationMode"), child(path, "count")
    # v1 defaulting: an empty mode is ExactCount and an ExactCount count of 0 becomes 1.
    mode = get_str(request.get("allocationMode"), mode_path, errs) or "ExactCount"
    count = get_int(request.get("count"), count_path, errs) or 0
    if mode == "All":
        if count != 0:
            out.append(invalid(count_path, count, "must not be specified when allocationMode is 'All'"))
    elif mode == "ExactCount":
        if count < 0:
            out.append(invalid(count_path, count, "must be greater than zero"))
    else:
        out.append(not_supported(mode_path, mode, ALLOCATION_MODES))
    return out


def _validate_constraint(value: Any, path: str, names: RequestNames) -> list[FieldError]:
    errs: list[FieldError] = []
    constraint = get_map(value, path, errs)
    _validate_ref_list(constraint.get("requests"), child(path, "requests"), names, errs)
    match = constraint.get("matchAttribute")
    distinct = constraint.get("distinctAttribute")
    if match is not None and distinct is not None:
        errs.append(
            invalid(path, None, "exactly one of `matchAttribute` or `distinctAttribute` is required, but multiple fields are set")
        )
    elif match is not None:
        attr_path = child(path, "matchAttribute")
        errs.extend(fully_qualified_name(get_str(match, attr_path, errs), attr_path))
    elif distinct is not None:
        attr_path = child(path, "distinctAttribute")
        errs.extend(fully_qualified_name(get_str(distinct, attr_path, errs), attr_path))
    else:
        errs.append(required(child(path, "matchAttribute"), ""))
    return errs


def validate_claim_status(
    value: Any, path: str, names: RequestNames, hooks: Hooks, *, old_value: Any = None, deleted: bool = False
) -> list[FieldError]:
    """A claim's status. With `old_value` (the stored status: a status update), as Kubernetes' status update
    strategy: an allocation that was already set is not validated again (it may not change, which the server
    checks on its own: "status.allocation: field is immutable"), and while the claim is being deleted
    (`deleted`) reservedFor may lose entries but gain none."""
    errs: list[FieldError] = []
    status = get_map(value, path, errs)
    old = old_value if isinstance(old_value, dict) else {}
    reserved_path = child(path, "reservedFor")
    reserved = get_list(status.get("reservedFor"), reserved_path, errs)
    validate_list(
        reserved,
        RESERVED_FOR_MAX,
        _validate_consumer,
        reserved_path,
        errs,
        item_key=lambda item: item.get("uid") if isinstance(item, dict) and isinstance(item.get("uid"), str) else None,
    )
    allocation = status.get("allocation")
    if reserved and allocation is None:
        errs.append(forbidden(reserved_path, "may not be specified when `allocated` is not set"))
    elif reserved and deleted:
        before = {_consumer_key(r) for r in old.get("reservedFor") or [] if isinstance(r, dict)}
        if any(_consumer_key(r) not in before for r in reserved if isinstance(r, dict)):
            errs.append(forbidden(reserved_path, "new entries may not be added while `deallocationRequested` or "
                                                 "`deletionTimestamp` are set"))
    allocated: set[str] = set()
    if allocation is not None and old.get("allocation") is not None:
        # Stored earlier, validated then; validation of new results is stricter than it was (admin access).
        allocated = _allocated_devices(allocation)
    elif allocation is not None:
        errs.extend(_validate_allocation(allocation, child(path, "allocation"), names, hooks, allocated))
    devices_path = child(path, "devices")
    devices = get_list(status.get("devices"), devices_path, errs)
    seen: set[str] = set()
    for i, raw in enumerate(devices):
        item_path = index(devices_path, i)
        errs.extend(_validate_device_status(raw, item_path, allocated))
        device_id = _device_id(raw) if isinstance(raw, dict) else None
        if device_id is not None:
            if device_id in seen:
                errs.append(duplicate(item_path, device_id))
            seen.add(device_id)
    return errs


def _consumer_key(ref: dict[str, Any]) -> tuple[str, ...]:
    return tuple(str(ref.get(k) or "") for k in ("apiGroup", "resource", "name", "uid"))


def _allocated_devices(allocation: Any) -> set[str]:
    """The device IDs of an allocation's results, without validating them."""
    devices = allocation.get("devices") if isinstance(allocation, dict) else None
    results = devices.get("results") if isinstance(devices, dict) else None
    return {_device_id(r) for r in results or [] if isinstance(r, dict)} if isinstance(results, list) else set()


def _device_id(entry: dict[str, Any]) -> str:
    parts = [str(entry.get("driver", "")), str(entry.get("pool", "")), str(entry.get("device", ""))]
    if entry.get("shareID"):
        parts.append(str(entry["shareID"]))
    return "/".join(parts)


def _validate_consumer(value: Any, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    ref = get_map(value, path, errs)
    for name in ("resource", "name", "uid"):
        if not get_str(ref.get(name), child(path, name), errs):
            errs.append(required(child(path, name), ""))
    return errs


def _validate_allocation(
    value: Any, path: str, names: RequestNames, hooks: Hooks, allocated: set[str]
) -> list[FieldError]:
    errs: list[FieldError] = []
    allocation = get_map(value, path, errs)
    devices_path = child(path, "devices")
    devices = get_map(allocation.get("devices"), devices_path, errs)
    results_path = child(devices_path, "results")
    results = get_list(devices.get("results"), results_path, errs)
    if check_size(results, RESULTS_MAX, results_path, errs):
        for i, raw in enumerate(results):
            errs.extend(_validate_result(raw, index(results_path, i), names))
            if isinstance(raw, dict):
                allocated.add(_device_id(raw))
    config_path = child(devices_path, "config")
    configs = get_list(devices.get("config"), config_path, errs)
    if check_size(configs, ALLOCATION_CONFIG_MAX, config_path, errs):
        for i, raw in enumerate(configs):
            item_path = index(config_path, i)
            config = get_map(raw, item_path, errs)
            source = get_str(config.get("source"), child(item_path, "source"), errs)
            if not source:
                errs.append(required(child(item_path, "source"), ""))
            elif source not in CONFIG_SOURCES:
                errs.append(not_supported(child(item_path, "source"), source, CONFIG_SOURCES))
            _validate_ref_list(config.get("requests"), child(item_path, "requests"), names, errs)
            errs.extend(validate_opaque(config, item_path, hooks))
    if allocation.get("nodeSelector") is not None:
        errs.extend(validate_node_selector(allocation.get("nodeSelector"), child(path, "nodeSelector")))
    return errs


def _validate_result(value: Any, path: str, names: RequestNames) -> list[FieldError]:
    errs: list[FieldError] = []
    result = get_map(value, path, errs)
    errs.extend(validate_request_ref(get_str(result.get("request"), child(path, "request"), errs), child(path, "request"), names))
    errs.extend(driver_name(get_str(result.get("driver"), child(path, "driver"), errs), child(path, "driver")))
    errs.extend(pool_name(get_str(result.get("pool"), child(path, "pool"), errs), child(path, "pool")))
    errs.extend(dns_label(get_str(result.get("device"), child(path, "device"), errs), child(path, "device")))
    get_bool(result.get("adminAccess"), child(path, "adminAccess"), errs)
    errs.extend(validate_binding_conditions(result, path))
    errs.extend(validate_tolerations(result.get("tolerations"), child(path, "tolerations")))
    if result.get("shareID") is not None:
        errs.extend(_validate_uid(get_str(result.get("shareID"), child(path, "shareID"), errs), child(path, "shareID")))
    return errs


def _validate_uid(uid: str, path: str) -> list[FieldError]:
    try:
        uuid.UUID(uid)
    except ValueError as err:
        return [invalid(path, uid, f"error validating uid: {err}")]
    if len(uid) != 36 or uid != uid.lower():
        return [
            invalid(
                path,
                uid,
                "uid must be in RFC 4122 normalized form, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` with lowercase hexadecimal characters",
            )
        ]
    return []


def _validate_device_status(value: Any, path: str, allocated: set[str]) -> list[FieldError]:
    errs: list[FieldError] = []
    status = get_map(value, path, errs)
    errs.extend(driver_name(get_str(status.get("driver"), child(path, "driver"), errs), child(path, "driver")))
    errs.extend(pool_name(get_str(status.get("pool"), child(path, "pool"), errs), child(path, "pool")))
    errs.extend(dns_label(get_str(status.get("device"), child(path, "device"), errs), child(path, "device")))
    if status.get("shareID") is not None:
        errs.extend(_validate_uid(get_str(status.get("shareID"), child(path, "shareID"), errs), child(path, "shareID")))
    device_id = _device_id(status)
    if device_id not in allocated:
        errs.append(invalid(path, device_id, "must be an allocated device in the claim"))
    conditions = get_list(status.get("conditions"), child(path, "conditions"), errs)
    if len(conditions) > DEVICE_STATUS_CONDITIONS_MAX:
        errs.append(too_many(child(path, "conditions"), len(conditions), DEVICE_STATUS_CONDITIONS_MAX))
    if status.get("data") is not None:
        errs.extend(raw_json_object(status.get("data"), child(path, "data"), DEVICE_STATUS_DATA_MAX))
    network = status.get("networkData")
    if network is not None:
        network_path = child(path, "networkData")
        data = get_map(network, network_path, errs)
        if len(get_str(data.get("interfaceName"), child(network_path, "interfaceName"), errs)) > 256:
            errs.append(too_long(child(network_path, "interfaceName"), 256))
        if len(get_str(data.get("hardwareAddress"), child(network_path, "hardwareAddress"), errs)) > 128:
            errs.append(too_long(child(network_path, "hardwareAddress"), 128))
        ips_path = child(network_path, "ips")
        ips = get_list(data.get("ips"), ips_path, errs)
        validate_list(ips, 16, lambda item, p: _validate_ip(item, p), ips_path, errs, item_key=lambda i: i if isinstance(i, str) else None)
    return errs


def _validate_ip(value: Any, path: str) -> list[FieldError]:
    if not isinstance(value, str):
        return [invalid(path, value, "must be a string")]
    try:
        parsed = ipaddress.ip_interface(value)
    except ValueError:
        parsed = None
    if parsed is None or "/" not in value:
        return [invalid(path, value, "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)")]
    if str(parsed) != value:
        return [invalid(path, value, f"must be in canonical form ({parsed})")]
    return []
