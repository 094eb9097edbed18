"""Which parts of a device a selector reads: the key under which its results can be shared between devices.

A selector that touches ``device`` only as ``device.driver``, ``device.allowMultipleAllocations``,
``device.attributes[<domain>].<id>`` and ``device.capacity[<domain>].<id>`` (constant domain and id, by field
or by index, with or without ``has()``) sees nothing else of a device: its result is a function of those
values (present or not). Devices of one model repeat the same values, so the result of one evaluation holds
for every device with equal values there. Anything else (the whole attribute map, a computed key, optional
access, a comprehension variable named ``device``) reads more than a fixed set of values: such a selector has
no footprint and every device is evaluated on its own.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from google.protobuf import any_pb2

from controller.cel.device import DeviceView
from controller.cel.messages import CHECKED_EXPR_TYPE, PARSED_EXPR_TYPE
from gpudra.semver import Semver

# A part of the device: ("driver",), ("allowMultipleAllocations",), ("attributes"|"capacity", domain, id).
Path = tuple[str, ...]
_SCALAR_FIELDS = ("driver", "allowMultipleAllocations")
_MAPS = ("attributes", "capacity")
_MISSING = ("<missing>",)  # not a value any device field can hold


class _Unbounded(Exception):
    """The expression reads the device in a way no fixed set of paths describes."""


def _const_string(expr: Any) -> str | None:
    if expr.WhichOneof("expr_kind") != "const_expr" or expr.const_expr.WhichOneof("constant_kind") != "string_value":
        return None
    return str(expr.const_expr.string_value)


def _is_device(expr: Any) -> bool:
    return expr.WhichOneof("expr_kind") == "ident_expr" and expr.ident_expr.name == "device"


def _member(expr: Any) -> tuple[Any, str] | None:
    """(operand, constant name) of ``x.name`` (not has()) or ``x["name"]``; None for anything else."""
    kind = expr.WhichOneof("expr_kind")
    if kind == "select_expr" and not expr.select_expr.test_only:
        return expr.select_expr.operand, expr.select_expr.field
    if kind == "call_expr":
        call = expr.call_expr
        if call.function == "_[_]" and not call.HasField("target") and len(call.args) == 2:
            key = _const_string(call.args[1])
            if key is not None:
                return call.args[0], key
    return None


def _device_map(expr: Any) -> str | None:
    """'attributes' or 'capacity' when expr is device.attributes / device.capacity (or by index)."""
    member = _member(expr)
    if member is None or not _is_device(member[0]) or member[1] not in _MAPS:
        return None
    return member[1]


class _Walker:
    def __init__(self) -> None:
        self.paths: set[Path] = set()

    def visit(self, expr: Any) -> None:
        kind = expr.WhichOneof("expr_kind")
        if kind == "ident_expr":
            if expr.ident_expr.name == "device":
                raise _Unbounded  # the device (or a map of it) used as a whole
            return
        # device.driver / device.allowMultipleAllocations, as a value or in has()
        if kind == "select_expr" and _is_device(expr.select_expr.operand):
            if expr.select_expr.field not in _SCALAR_FIELDS:
                raise _Unbounded
            self.paths.add((expr.select_expr.field,))
            return
        # device.<map>[<domain>].<id>, as a value or in has()
        if kind == "select_expr" or (kind == "call_expr" and expr.call_expr.function == "_[_]"):
            if kind == "select_expr":
                inner, ident = expr.select_expr.operand, expr.select_expr.field
            else:
                call = expr.call_expr
                inner, ident = (call.args[0], _const_string(call.args[1])) if len(call.args) == 2 else (None, None)
            domain = _member(inner) if inner is not None else None
            if domain is not None:
                which = _device_map(domain[0])
                if which is not None:
                    if ident is None:
                        raise _Unbounded  # a computed id
                    self.paths.add((which, domain[1], ident))
                    return
        if kind == "comprehension_expr":
            comp = expr.comprehension_expr
            if "device" in (comp.iter_var, comp.iter_var2, comp.accu_var):
                raise _Unbounded  # a local named device: the walk cannot tell it from the variable
        _each_child(expr, self.visit)


def _each_child(expr: Any, visit: Any) -> None:
    kind = expr.WhichOneof("expr_kind")
    if kind == "select_expr":
        visit(expr.select_expr.operand)
    elif kind == "call_expr":
        call = expr.call_expr
        if call.HasField("target"):
            visit(call.target)
        for arg in call.args:
            visit(arg)
    elif kind == "list_expr":
        for element in expr.list_expr.elements:
            visit(element)
    elif kind == "struct_expr":
        for entry in expr.struct_expr.entries:
            if entry.WhichOneof("key_kind") == "map_key":
                visit(entry.map_key)
            visit(entry.value)
    elif kind == "comprehension_expr":
        comp = expr.comprehension_expr
        for part in (comp.iter_range, comp.accu_init, comp.loop_condition, comp.loop_step, comp.result):
            visit(part)


def _canonical(value: Any) -> Hashable:
    """A key equal for two values exactly when CEL sees the same value (1 and True differ; a semver's build
    metadata, which its CEL value drops, does not count; quantities compare by value, as their CEL values do)."""
    if type(value) is Semver:
        return (Semver, value.major, value.minor, value.patch, value.prerelease)
    if type(value) is list:
        return (list, tuple(_canonical(v) for v in value))
    return (type(value), value)


@dataclass(frozen=True)
class Footprint:
    """The device paths a selector reads."""

    paths: tuple[Path, ...]

    def key(self, device: DeviceView) -> tuple[Hashable, ...]:
        """The values of the paths on `device`: devices with equal keys get equal results."""
        out: list[Hashable] = []
        for path in self.paths:
            head = path[0]
            if head == "driver":
                out.append(device.driver)
            elif head == "allowMultipleAllocations":
                out.append(device.allow_multiple_allocations)
            else:
                ids = (device.attributes if head == "attributes" else device.capacity).get(path[1])
                value = _MISSING if ids is None else ids.get(path[2], _MISSING)
                out.append(_MISSING if value is _MISSING else _canonical(value))
        return tuple(out)


def footprint_of(expr: Any) -> Footprint | None:
    """The footprint of a checked or parsed expression (a ``cel.expr.Expr``); None when it has none."""
    walker = _Walker()
    try:
        walker.visit(expr)
    except _Unbounded:
        return None
    return Footprint(tuple(sorted(walker.paths)))


def parsed_footprint(serialized: bytes, types: Any) -> Footprint | None:
    """The footprint of ``Expression.serialize()`` output (a google.protobuf.Any holding a ParsedExpr or a
    CheckedExpr); None when it has none or is neither."""
    wrapper = any_pb2.Any()
    wrapper.ParseFromString(serialized)
    kind = wrapper.type_url.rpartition("/")[2]
    if kind == PARSED_EXPR_TYPE:
        message = types.ParsedExpr()
    elif kind == CHECKED_EXPR_TYPE:
        message = types.CheckedExpr()
    else:
        return None
    message.ParseFromString(wrapper.value)
    return footprint_of(message.expr)
