"""DeviceView: the compact, typed view of one device that selectors are evaluated against."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, cast

from gpudra.quantity import Quantity, QuantityError
from gpudra.semver import Semver, SemverError

AttributeValue = int | bool | str | Semver
Attribute = AttributeValue | list[AttributeValue]  # list-type attributes (KEP-5491) are lists

_ATTRIBUTE_KINDS = ("int", "bool", "string", "version")
_LIST_KINDS = {"ints": "int", "bools": "bool", "strings": "string", "versions": "version"}
_PLAIN = {"string": str, "int": int, "bool": bool}


def split_qualified_name(name: str, default_domain: str) -> tuple[str, str]:
    """(domain, id) of a QualifiedName; names without a domain belong to ``default_domain`` (the driver)."""
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (default_domain, name)


def parse_attribute(name: str, raw: Any) -> Attribute:
    """One v1 DeviceAttribute (``{"int": 5}``, ``{"version": "1.2.3"}``, ``{"strings": ["a"]}``, ...) as a Python
    value; list-type attributes (KEP-5491) become lists."""
    if type(raw) is dict and len(raw) == 1:
        # The common shapes, answered as the checks below would answer them: one plain string, int or bool.
        ((kind, value),) = raw.items()
        if type(value) is _PLAIN.get(kind):
            return cast(AttributeValue, value)  # its type() was just checked
    if not isinstance(raw, Mapping):
        raise ValueError(f"attributes[{name}]: must be an object with one of {', '.join(_ATTRIBUTE_KINDS)}")
    lists = [k for k in _LIST_KINDS if raw.get(k) is not None]
    present = [k for k in _ATTRIBUTE_KINDS if raw.get(k) is not None] + lists
    if len(present) != 1:
        raise ValueError(f"attributes[{name}]: must set exactly one of {', '.join(_ATTRIBUTE_KINDS)}, "
                         f"found {present or 'none'}")
    if lists:
        kind = lists[0]
        if not isinstance(raw[kind], list):
            raise ValueError(f"attributes[{name}].{kind}: must be a list")
        element = _LIST_KINDS[kind]
        return [parse_attribute(f"{name}.{kind}[{i}]", {element: v}) for i, v in enumerate(raw[kind])]  # type: ignore[misc]
    kind = present[0]
    value = raw[kind]
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"attributes[{name}].int: must be an integer, not {value!r}")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"attributes[{name}].bool: must be true or false, not {value!r}")
        return value
    if not isinstance(value, str):
        raise ValueError(f"attributes[{name}].{kind}: must be a string, not {value!r}")
    if kind == "version":
        try:
            return _parse_version(value)
        except SemverError as err:
            raise ValueError(f"attributes[{name}].version: parse semantic version: {err}") from None
    return value


def parse_capacity(name: str, raw: Any) -> Quantity:
    """One v1 DeviceCapacity (``{"value": "80Gi", ...}``) as a Quantity."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("value"), (str, int)):
        raise ValueError(f"capacity[{name}].value: must be a quantity string such as \"80Gi\"")
    try:
        return _parse_quantity(str(raw["value"]))
    except QuantityError as err:
        raise ValueError(f"capacity[{name}].value: {err}") from None


@functools.lru_cache(maxsize=1024)
def _parse_version(text: str) -> Semver:
    # Semvers are immutable and every device of a node repeats the same driver and CUDA versions.
    return Semver.parse(text)


@functools.lru_cache(maxsize=1024)
def _parse_quantity(text: str) -> Quantity:
    # Quantities are immutable and devices of a model repeat the same few texts ("80Gi"); errors are not cached.
    return Quantity.parse(text)


@dataclass(eq=False)
class DeviceView:
    """A device as CEL sees it: attribute and capacity maps by domain, then by id.

    Evaluation data is cached on the view per environment, so a device evaluated by many selectors
    is converted once.
    """

    driver: str
    attributes: dict[str, dict[str, Attribute]]
    capacity: dict[str, dict[str, Quantity]]
    allow_multiple_allocations: bool = False
    name: str = ""
    _cel_cache: dict[Any, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_slice_device(cls, driver: str, device: Mapping[str, Any]) -> "DeviceView":
        """Build from a resource.k8s.io/v1 ResourceSlice ``spec.devices[]`` entry of ``driver``.

        Raises ValueError naming the device and field when an attribute or capacity is malformed.
        """
        name = str(device.get("name", ""))
        try:
            attributes: dict[str, dict[str, Attribute]] = {}
            for qualified, raw in (device.get("attributes") or {}).items():
                if raw == {}:
                    continue  # a value of a type this version does not know: invisible to CEL, as in Kubernetes
                domain, ident = split_qualified_name(qualified, driver)
                attributes.setdefault(domain, {})[ident] = parse_attribute(qualified, raw)
            capacity: dict[str, dict[str, Quantity]] = {}
            for qualified, raw in (device.get("capacity") or {}).items():
                domain, ident = split_qualified_name(qualified, driver)
                capacity.setdefault(domain, {})[ident] = parse_capacity(qualified, raw)
        except ValueError as err:
            raise ValueError(f"device {name or '<unnamed>'} of driver {driver}: {err}") from None
        allow = device.get("allowMultipleAllocations")
        return cls(driver=driver, attributes=attributes, capacity=capacity,
                   allow_multiple_allocations=bool(allow), name=name)

    @cached_property
    def qualified_attributes(self) -> dict[str, Attribute]:
        """Attributes by fully-qualified name (``gpu.nvidia.com/productName``), as constraints use them."""
        return {f"{domain}/{ident}": value for domain, ids in self.attributes.items() for ident, value in ids.items()}

    @cached_property
    def qualified_capacity(self) -> dict[str, Quantity]:
        """Capacities by fully-qualified name."""
        return {f"{domain}/{ident}": value for domain, ids in self.capacity.items() for ident, value in ids.items()}

    @property
    def holds_evaluation_data(self) -> bool:
        """Whether an evaluation has converted this device for CEL (worth keeping the view for)."""
        return bool(self._cel_cache)

    def cached(self, key: Any, build: Callable[[], Any]) -> Any:
        """Per-view memo used by the CEL environment for evaluation data (keyed by environment)."""
        value = self._cel_cache.get(key)
        if value is None:
            value = build()
            self._cel_cache[key] = value
        return value
