"""Compact internal structures parsed once from resource.k8s.io/v1 dicts.

The allocator's hot path touches these instead of the API dicts: attribute values become
`(kind, value)` tuples (equal iff same type and value, as matchAttribute needs), quantities are
parsed only when a gated feature needs them, and every device gets a small integer `uid` so that
per-(device, selector) results can be cached across allocation calls.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.allocator.errors import AllocationError
from controller.allocator.nodes import NodeSelector

MAX_RESULTS = 32  # resourceapi.AllocationResultsMaxSize
ATTRIBUTE_KINDS = ("int", "bool", "string", "version")
# List-type attributes (KEP-5491, DRAListTypeAttributes): list field -> element kind.
LIST_KINDS = {"ints": "int", "bools": "bool", "strings": "string", "versions": "version"}

AttrValue = tuple[str, Any]
# An attribute that sets none of the known value fields (a newer API's type): it exists, but no
# constraint can compare it.
UNKNOWN_ATTRIBUTE: AttrValue = ("", None)
DeviceID = tuple[str, str, str]  # (driver, pool, device)

_device_uids = itertools.count()


def device_id_str(did: DeviceID) -> str:
    return f"{did[0]}/{did[1]}/{did[2]}"


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str
    raw: Mapping[str, Any]


@dataclass(eq=False)
class Device:
    name: str
    slice: "Slice"
    attributes: dict[str, AttrValue]
    raw: Mapping[str, Any]
    taints: tuple[Taint, ...] = ()
    allow_multiple: bool = False
    consumes_counters: tuple[tuple[str, Mapping[str, Any]], ...] = ()  # (counterSet, {counter: {value}})
    node_name: str | None = None
    all_nodes: bool = False
    node_selector: NodeSelector | None = None
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()
    binds_to_node: bool = False
    uid: int = field(default_factory=lambda: next(_device_uids))
    _view: Any = None
    # (driver, pool, device): the search, the constraints and scoring look it up for every candidate.
    id: DeviceID = field(init=False, repr=False)
    # Every name attribute() resolves, to its value: `<driver>/<name>` for each name as written (the domain of a
    # lookup is what precedes its first "/"), then the names as written, which win.
    _lookup: dict[str, AttrValue] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.id = (self.slice.driver, self.slice.pool, self.name)
        driver = self.slice.driver
        lookup = {} if "/" in driver else {f"{driver}/{k}": v for k, v in self.attributes.items()}
        lookup.update(self.attributes)
        self._lookup = lookup

    def attribute_names(self) -> list[str]:
        """The fully qualified names of the device's attributes (`<driver>/<name>` for those written bare)."""
        return [name for name in self._lookup if "/" in name]

    def attribute(self, qualified: str) -> AttrValue | None:
        """Kubernetes' lookupAttribute: the fully qualified name, or the bare id when the domain is the driver's."""
        return self._lookup.get(qualified)

    def cel_view(self, keep: bool = True) -> Any:
        """The device as CEL sees it; kept on the device unless `keep` is false (then built anew on each call)."""
        if self._view is not None:
            return self._view
        from controller.cel import DeviceView  # the CEL runtime is only needed once a selector runs

        view = DeviceView.from_slice_device(self.slice.driver, dict(self.raw))
        if keep:
            self._view = view
        return view


@dataclass(eq=False)
class Slice:
    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int
    node_name: str | None
    all_nodes: bool
    node_selector: NodeSelector | None
    per_device: bool
    shared_counters: tuple[tuple[str, Mapping[str, Any]], ...]  # (set name, {counter: {value}})
    devices: list[Device]
    order: int  # position in the input (a pool's slices are searched sorted by name, as 1.37 does)

    @property
    def has_binding_conditions(self) -> bool:
        return any(d.binding_conditions for d in self.devices)


def _where(kind: str, name: str) -> str:
    return f"{kind} {name}"


def _as_map(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise AllocationError(f"{where}: must be an object")
    return value


def _as_list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise AllocationError(f"{where}: must be a list")
    return value


def _typed(value: Any, kind: str) -> bool:
    expected = {"int": int, "bool": bool, "string": str, "version": str}[kind]
    return isinstance(value, expected) and not (kind == "int" and isinstance(value, bool))


def parse_attribute(raw: Any, where: str) -> AttrValue:
    """A scalar (`int`, ...) as (kind, value); a list (KEP-5491 `ints`, `bools`, `strings`, `versions`) as
    (list kind, tuple). An attribute with nothing set (or only empty lists) is UNKNOWN_ATTRIBUTE."""
    if not isinstance(raw, Mapping):
        raise AllocationError(f"{where}: must be an object with exactly one of int, bool, string, version")
    set_kinds = [k for k in ATTRIBUTE_KINDS if raw.get(k) is not None]
    set_kinds += [k for k in LIST_KINDS if raw.get(k)]  # an empty list counts as unset, as in Kubernetes
    if not set_kinds:
        if any(raw.get(k) is not None and not isinstance(raw.get(k), list) for k in LIST_KINDS):
            raise AllocationError(f"{where}: {', '.join(LIST_KINDS)} must be lists")
        return UNKNOWN_ATTRIBUTE
    if len(set_kinds) != 1:
        raise AllocationError(f"{where}: exactly one of int, bool, string, version (or one of their lists) must be set")
    kind = set_kinds[0]
    value = raw[kind]
    if kind in LIST_KINDS:
        element = LIST_KINDS[kind]
        if not isinstance(value, list) or not all(_typed(v, element) for v in value):
            raise AllocationError(f"{where}.{kind}: must be a list of {element} values")
        return (kind, tuple(value))
    if not _typed(value, kind):
        expected = {"int": int, "bool": bool, "string": str, "version": str}[kind]
        raise AllocationError(f"{where}.{kind}: must be a {expected.__name__}")
    return (kind, value)


def parse_slice(obj: Mapping[str, Any], order: int) -> Slice:
    meta = _as_map(obj.get("metadata"), "ResourceSlice: metadata")
    name = str(meta.get("name") or f"#{order}")
    where = _where("ResourceSlice", name)
    spec = _as_map(obj.get("spec"), f"{where}: spec")
    driver = spec.get("driver")
    if not isinstance(driver, str) or not driver:
        raise AllocationError(f"{where}: spec.driver: required, a DNS subdomain such as gpu.nvidia.com")
    pool = _as_map(spec.get("pool"), f"{where}: spec.pool")
    pool_name = pool.get("name")
    if not isinstance(pool_name, str) or not pool_name:
        raise AllocationError(f"{where}: spec.pool.name: required")
    generation, count = pool.get("generation", 0), pool.get("resourceSliceCount")
    if not isinstance(generation, int) or generation < 0:
        raise AllocationError(f"{where}: spec.pool.generation: must be an integer >= 0")
    if not isinstance(count, int) or count <= 0:
        raise AllocationError(f"{where}: spec.pool.resourceSliceCount: required, an integer > 0")
    selector = None
    if spec.get("nodeSelector") is not None:
        selector = NodeSelector.parse(_as_map(spec["nodeSelector"], f"{where}: spec.nodeSelector"), f"{where}: spec.nodeSelector")
    counters = []
    for i, cs in enumerate(_as_list(spec.get("sharedCounters"), f"{where}: spec.sharedCounters")):
        cs = _as_map(cs, f"{where}: spec.sharedCounters[{i}]")
        counters.append((str(cs.get("name", "")), _as_map(cs.get("counters"), f"{where}: spec.sharedCounters[{i}].counters")))
    sl = Slice(
        name=name, driver=driver, pool=pool_name, generation=generation, slice_count=count,
        node_name=spec.get("nodeName") or None, all_nodes=bool(spec.get("allNodes")), node_selector=selector,
        per_device=bool(spec.get("perDeviceNodeSelection")), shared_counters=tuple(counters), devices=[], order=order,
    )
    for i, raw in enumerate(_as_list(spec.get("devices"), f"{where}: spec.devices")):
        sl.devices.append(_parse_device(_as_map(raw, f"{where}: spec.devices[{i}]"), sl, f"{where}: spec.devices[{i}]"))
    return sl


def _parse_device(raw: Mapping[str, Any], sl: Slice, where: str) -> Device:
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise AllocationError(f"{where}.name: required, a DNS label")
    attrs = {str(k): parse_attribute(v, f"{where}.attributes[{k}]")
             for k, v in _as_map(raw.get("attributes"), f"{where}.attributes").items()}
    taints = []
    for i, t in enumerate(_as_list(raw.get("taints"), f"{where}.taints")):
        t = _as_map(t, f"{where}.taints[{i}]")
        taints.append(Taint(str(t.get("key", "")), str(t.get("value", "") or ""), str(t.get("effect", "")), t))
    consumes = []
    for i, c in enumerate(_as_list(raw.get("consumesCounters"), f"{where}.consumesCounters")):
        c = _as_map(c, f"{where}.consumesCounters[{i}]")
        consumes.append((str(c.get("counterSet", "")), _as_map(c.get("counters"), f"{where}.consumesCounters[{i}].counters")))
    selector = None
    if raw.get("nodeSelector") is not None:
        selector = NodeSelector.parse(_as_map(raw["nodeSelector"], f"{where}.nodeSelector"), f"{where}.nodeSelector")
    return Device(
        name=name, slice=sl, attributes=attrs, raw=raw, taints=tuple(taints),
        allow_multiple=bool(raw.get("allowMultipleAllocations")), consumes_counters=tuple(consumes),
        node_name=raw.get("nodeName") or None, all_nodes=bool(raw.get("allNodes")), node_selector=selector,
        binding_conditions=tuple(raw.get("bindingConditions") or ()),
        binding_failure_conditions=tuple(raw.get("bindingFailureConditions") or ()),
        binds_to_node=bool(raw.get("bindsToNode")),
    )


@dataclass(frozen=True)
class DeviceClass:
    name: str
    selectors: tuple[str | None, ...]  # CEL expressions; None for a selector of an unknown type
    config: tuple[Mapping[str, Any], ...]


def parse_class(obj: Mapping[str, Any]) -> DeviceClass:
    meta = _as_map(obj.get("metadata"), "DeviceClass: metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise AllocationError("DeviceClass: metadata.name: required")
    where = _where("DeviceClass", name)
    spec = _as_map(obj.get("spec"), f"{where}: spec")
    sels = tuple(_selector_expr(s, f"{where}: spec.selectors[{i}]") for i, s in enumerate(_as_list(spec.get("selectors"), f"{where}: spec.selectors")))
    config = tuple(_as_map(c, f"{where}: spec.config[{i}]") for i, c in enumerate(_as_list(spec.get("config"), f"{where}: spec.config")))
    return DeviceClass(name, sels, config)


def _selector_expr(raw: Any, where: str) -> str | None:
    raw = _as_map(raw, where)
    cel = raw.get("cel")
    if cel is None:
        return None
    expr = _as_map(cel, f"{where}.cel").get("expression")
    if not isinstance(expr, str):
        raise AllocationError(f"{where}.cel.expression: required, a CEL expression string")
    return expr


@dataclass(frozen=True)
class Toleration:
    key: str
    operator: str
    value: str
    effect: str

    def tolerates(self, taint: Taint) -> bool:
        """resourceclaim.ToleratesTaint."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        if self.operator in ("Equal", ""):
            return self.value == taint.value
        return False


@dataclass(frozen=True)
class Request:
    """One exact request or one subrequest of a firstAvailable request."""

    name: str
    parent: str | None
    class_name: str
    selectors: tuple[str | None, ...]
    mode: str
    count: int
    admin_access: bool | None
    tolerations: tuple[Toleration, ...]
    raw_tolerations: tuple[Mapping[str, Any], ...]
    capacity: Mapping[str, Any] | None  # capacity.requests, raw quantities
    has_capacity: bool

    @property
    def full_name(self) -> str:
        return f"{self.parent}/{self.name}" if self.parent else self.name

    @property
    def admin(self) -> bool:
        return bool(self.admin_access)


@dataclass(frozen=True)
class RequestEntry:
    name: str
    exact: Request | None
    subrequests: tuple[Request, ...]


@dataclass(frozen=True)
class Constraint:
    kind: str  # "match" | "distinct" | "" (empty: unsupported)
    attribute: str
    requests: frozenset[str]


@dataclass(eq=False)
class Claim:
    namespace: str
    name: str
    uid: str
    requests: tuple[RequestEntry, ...]
    constraints: tuple[Constraint, ...]
    config: tuple[Mapping[str, Any], ...]
    raw: Mapping[str, Any]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_claim(obj: Mapping[str, Any]) -> Claim:
    meta = _as_map(obj.get("metadata"), "ResourceClaim: metadata")
    name = str(meta.get("name") or "")
    ns = str(meta.get("namespace") or "default")
    where = f"ResourceClaim {ns}/{name}"
    spec = _as_map(obj.get("spec"), f"{where}: spec")
    devices = _as_map(spec.get("devices"), f"{where}: spec.devices")
    entries = []
    for i, raw in enumerate(_as_list(devices.get("requests"), f"{where}: spec.devices.requests")):
        raw = _as_map(raw, f"{where}: spec.devices.requests[{i}]")
        rname = str(raw.get("name", ""))
        rwhere = f"{where}: spec.devices.requests[{i}]"
        if raw.get("firstAvailable"):
            subs = tuple(_parse_request(_as_map(s, f"{rwhere}.firstAvailable[{j}]"), rname, f"{rwhere}.firstAvailable[{j}]")
                         for j, s in enumerate(_as_list(raw["firstAvailable"], f"{rwhere}.firstAvailable")))
            entries.append(RequestEntry(rname, None, subs))
        else:
            exact = _as_map(raw.get("exactly"), f"{rwhere}.exactly")
            entries.append(RequestEntry(rname, _parse_request({**exact, "name": rname}, None, f"{rwhere}.exactly"), ()))
    constraints = []
    for i, raw in enumerate(_as_list(devices.get("constraints"), f"{where}: spec.devices.constraints")):
        raw = _as_map(raw, f"{where}: spec.devices.constraints[{i}]")
        reqs = frozenset(str(r) for r in raw.get("requests") or ())
        if raw.get("matchAttribute"):
            constraints.append(Constraint("match", str(raw["matchAttribute"]), reqs))
        elif raw.get("distinctAttribute"):
            constraints.append(Constraint("distinct", str(raw["distinctAttribute"]), reqs))
        else:
            constraints.append(Constraint("", "", reqs))
    config = tuple(_as_map(c, f"{where}: spec.devices.config[{i}]")
                   for i, c in enumerate(_as_list(devices.get("config"), f"{where}: spec.devices.config")))
    return Claim(ns, name, str(meta.get("uid") or ""), tuple(entries), tuple(constraints), config, obj)


def _parse_request(raw: Mapping[str, Any], parent: str | None, where: str) -> Request:
    mode = raw.get("allocationMode") or "ExactCount"
    count = raw.get("count")
    if count is None:
        count = 1 if mode == "ExactCount" else 0
    if not isinstance(count, int) or isinstance(count, bool):
        raise AllocationError(f"{where}.count: must be an integer")
    tol_raw = tuple(_as_map(t, f"{where}.tolerations[{i}]") for i, t in enumerate(_as_list(raw.get("tolerations"), f"{where}.tolerations")))
    tols = tuple(Toleration(str(t.get("key", "") or ""), str(t.get("operator", "") or "Equal"), str(t.get("value", "") or ""),
                            str(t.get("effect", "") or "")) for t in tol_raw)
    cap = raw.get("capacity")
    admin = raw.get("adminAccess") if parent is None else None
    return Request(
        name=str(raw.get("name", "")), parent=parent, class_name=str(raw.get("deviceClassName") or ""),
        selectors=tuple(_selector_expr(s, f"{where}.selectors[{i}]") for i, s in enumerate(_as_list(raw.get("selectors"), f"{where}.selectors"))),
        mode=str(mode), count=count, admin_access=None if admin is None else bool(admin), tolerations=tols, raw_tolerations=tol_raw,
        capacity=_as_map(_as_map(cap, f"{where}.capacity").get("requests"), f"{where}.capacity.requests") if cap is not None else None,
        has_capacity=cap is not None,
    )
