"""Static worst-case cost of a checked selector, after cel-go's checker cost estimator.

cel-expr-python has no runtime cost limit, so Kubernetes' runtime limit (1,000,000 units per
evaluation) is enforced before evaluation, on the estimate. The estimate follows cel-go's model
(identifiers and field selections 1, most calls 1, string work 0.1 per character, regexes 0.25 per
pattern character, list/map literals 10/30, comprehensions: range size times the per-iteration cost)
and Kubernetes' declared sizes of the ``device`` variable (k8s.io/dynamic-resource-allocation/cel):
at most 32 domains, 32 ids per domain, attribute values of at most 64 characters, domains of at most
63, ids of at most 32, a driver name of at most 63. Unknown sizes are unbounded, as in cel-go.

The same walk records which attribute/capacity domains the expression looks up by constant name, so
that evaluation can supply an empty map for them (Kubernetes returns an empty map for unknown domains).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import any_pb2

from controller.cel.messages import MessageTypes

INF = math.inf
STRING_TRAVERSAL_FACTOR = 0.1
REGEX_LENGTH_FACTOR = 0.25
LIST_CREATE_COST = 10
MAP_CREATE_COST = 30
STRUCT_CREATE_COST = 40

_MAX_DOMAINS_OR_IDS = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice


@dataclass(frozen=True)
class Shape:
    """What the estimator knows about a value: its maximum size and, for containers, its parts."""

    size: float = INF
    elem: "Shape | None" = None
    key: "Shape | None" = None
    fields: tuple[tuple[str, "Shape"], ...] = ()

    def field(self, name: str) -> "Shape | None":
        return dict(self.fields).get(name)


UNKNOWN = Shape()
SCALAR = Shape(size=1)
_ATTRIBUTE_VALUE = Shape(size=64)
_ID = Shape(size=32)
_DOMAIN = Shape(size=63)
_ATTRIBUTES = Shape(size=_MAX_DOMAINS_OR_IDS, key=_DOMAIN,
                    elem=Shape(size=_MAX_DOMAINS_OR_IDS, key=_ID, elem=_ATTRIBUTE_VALUE))
_CAPACITY = Shape(size=_MAX_DOMAINS_OR_IDS, key=_DOMAIN, elem=Shape(size=_MAX_DOMAINS_OR_IDS, key=_ID, elem=SCALAR))
DEVICE_SHAPE = Shape(size=4, fields=(("driver", Shape(size=63)), ("attributes", _ATTRIBUTES),
                                     ("capacity", _CAPACITY), ("allowMultipleAllocations", SCALAR)))


@dataclass(frozen=True)
class CostEstimate:
    max: int
    attribute_domains: frozenset[str] = frozenset()
    capacity_domains: frozenset[str] = frozenset()


def _ceil(value: float) -> float:
    return value if value == INF else float(math.ceil(value))


def _traverse(size: float, factor: float = STRING_TRAVERSAL_FACTOR) -> float:
    return _ceil(size * factor)


@dataclass
class _Walker:
    scopes: list[dict[str, Shape]] = field(default_factory=list)
    attribute_domains: set[str] = field(default_factory=set)
    capacity_domains: set[str] = field(default_factory=set)

    # ---- helpers ------------------------------------------------------------------------------

    def _lookup(self, name: str) -> Shape:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return DEVICE_SHAPE if name == "device" else UNKNOWN

    @staticmethod
    def _device_map(expr: Any) -> str | None:
        """'attributes' / 'capacity' when expr is exactly device.attributes / device.capacity."""
        if expr.WhichOneof("expr_kind") != "select_expr":
            return None
        sel = expr.select_expr
        if sel.test_only or sel.operand.WhichOneof("expr_kind") != "ident_expr":
            return None
        if sel.operand.ident_expr.name != "device" or sel.field not in ("attributes", "capacity"):
            return None
        return sel.field

    def _note_domain(self, operand: Any, key: Any) -> None:
        which = self._device_map(operand)
        if which is None or key.WhichOneof("expr_kind") != "const_expr":
            return
        const = key.const_expr
        if const.WhichOneof("constant_kind") != "string_value":
            return
        (self.attribute_domains if which == "attributes" else self.capacity_domains).add(const.string_value)

    # ---- walk ---------------------------------------------------------------------------------

    def visit(self, expr: Any) -> tuple[float, Shape]:
        kind = expr.WhichOneof("expr_kind")
        if kind == "const_expr":
            const = expr.const_expr
            which = const.WhichOneof("constant_kind")
            if which == "string_value":
                return 0, Shape(size=len(const.string_value))
            if which == "bytes_value":
                return 0, Shape(size=len(const.bytes_value))
            return 0, SCALAR
        if kind == "ident_expr":
            return 1, self._lookup(expr.ident_expr.name)
        if kind == "select_expr":
            sel = expr.select_expr
            cost, shape = self.visit(sel.operand)
            if sel.test_only:
                # Kubernetes disables has() cost (PresenceTestHasCost(false)).
                return cost, SCALAR
            if self._device_map(sel.operand) is not None:
                self._note_domain_name(sel.operand, sel.field)
            inner = shape.field(sel.field) or shape.elem or UNKNOWN
            return cost + 1, inner
        if kind == "call_expr":
            return self._call(expr.call_expr)
        if kind == "list_expr":
            cost = float(LIST_CREATE_COST)
            elem: Shape | None = None
            for e in expr.list_expr.elements:
                c, s = self.visit(e)
                cost += c
                elem = s if elem is None or s.size > elem.size else elem
            return cost, Shape(size=len(expr.list_expr.elements), elem=elem or UNKNOWN)
        if kind == "struct_expr":
            struct = expr.struct_expr
            cost = float(MAP_CREATE_COST if not struct.message_name else STRUCT_CREATE_COST)
            key: Shape | None = None
            elem = None
            for entry in struct.entries:
                if entry.WhichOneof("key_kind") == "map_key":
                    c, key = self.visit(entry.map_key)
                    cost += c
                c, elem = self.visit(entry.value)
                cost += c
            return cost, Shape(size=len(struct.entries), key=key or UNKNOWN, elem=elem or UNKNOWN)
        if kind == "comprehension_expr":
            return self._comprehension(expr.comprehension_expr)
        return 0, UNKNOWN

    def _note_domain_name(self, operand: Any, name: str) -> None:
        which = self._device_map(operand)
        if which == "attributes":
            self.attribute_domains.add(name)
        elif which == "capacity":
            self.capacity_domains.add(name)

    def _comprehension(self, comp: Any) -> tuple[float, Shape]:
        range_cost, range_shape = self.visit(comp.iter_range)
        init_cost, init_shape = self.visit(comp.accu_init)
        scope: dict[str, Shape] = {comp.accu_var: init_shape}
        is_map = range_shape.key is not None
        elem = range_shape.elem or UNKNOWN
        if comp.iter_var2:
            # Two-variable form: (index, value) over lists, (key, value) over maps.
            scope[comp.iter_var] = (range_shape.key or SCALAR) if is_map else SCALAR
            scope[comp.iter_var2] = elem
        else:
            scope[comp.iter_var] = (range_shape.key or UNKNOWN) if is_map else elem
        self.scopes.append(scope)
        try:
            cond_cost, _ = self.visit(comp.loop_condition)
            step_cost, step_shape = self.visit(comp.loop_step)
            scope[comp.accu_var] = Shape(size=range_shape.size, elem=step_shape.elem or elem) \
                if step_shape.elem is not None else init_shape
            result_cost, result_shape = self.visit(comp.result)
        finally:
            self.scopes.pop()
        iterations = range_shape.size
        loop = 0.0 if iterations == 0 else iterations * (cond_cost + step_cost)
        return range_cost + init_cost + loop + result_cost, result_shape

    def _call(self, call: Any) -> tuple[float, Shape]:
        fn = call.function
        target: tuple[float, Shape] | None = None
        if call.HasField("target"):
            target = self.visit(call.target)
        args = [self.visit(a) for a in call.args]
        arg_cost = sum(c for c, _ in args) + (target[0] if target else 0)
        shapes = [s for _, s in args]
        recv = target[1] if target else (shapes[0] if shapes else UNKNOWN)
        rest = shapes if target else shapes[1:]

        if fn in ("_&&_", "_||_"):
            return arg_cost, SCALAR
        if fn == "_?_:_":
            return args[0][0] + max(args[1][0], args[2][0]), max(shapes[1], shapes[2], key=lambda s: s.size)
        if fn in ("_[_]", "_[?_]"):
            self._note_domain(call.args[0], call.args[1])
            return arg_cost + 1, shapes[0].elem or UNKNOWN
        if fn == "_?._":
            const = call.args[1].const_expr if call.args[1].WhichOneof("expr_kind") == "const_expr" else None
            if const is not None and const.WhichOneof("constant_kind") == "string_value":
                self._note_domain_name(call.args[0], const.string_value)
                return arg_cost + 1, shapes[0].field(const.string_value) or shapes[0].elem or UNKNOWN
            return arg_cost + 1, UNKNOWN
        if fn == "@in":
            return arg_cost + (shapes[1].size if shapes[1].key is None else 1), SCALAR
        if fn in ("_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_"):
            smaller = min(shapes[0].size, shapes[1].size)
            return arg_cost + max(1.0, _traverse(smaller)), SCALAR
        if fn == "_+_":
            size = shapes[0].size + shapes[1].size
            elem = shapes[0].elem or shapes[1].elem
            if elem is not None:
                return arg_cost + 1, Shape(size=size, elem=elem)
            return arg_cost + max(1.0, _traverse(size)), Shape(size=size)
        if fn in ("contains", "startsWith", "endsWith"):
            return arg_cost + max(1.0, _traverse(recv.size)), SCALAR
        if fn in ("matches", "find", "findAll"):
            pattern = rest[0].size if rest else INF
            string_cost = _traverse(recv.size + (1 if fn != "matches" else 0))
            cost = string_cost * _traverse(pattern, REGEX_LENGTH_FACTOR)
            result = Shape(size=recv.size) if fn != "findAll" else Shape(size=recv.size, elem=Shape(size=recv.size))
            return arg_cost + cost, result
        if fn in ("lowerAscii", "upperAscii", "substring", "trim", "reverse", "charAt"):
            return arg_cost + _traverse(recv.size), Shape(size=recv.size)
        if fn in ("quantity", "isQuantity", "semver", "isSemver", "string", "bytes", "int", "uint", "double"):
            first = shapes[0] if shapes else UNKNOWN
            return arg_cost + max(1.0, _traverse(first.size)), Shape(size=first.size) if fn in ("string", "bytes") \
                else SCALAR
        if fn == "replace":
            return arg_cost + _traverse(recv.size, 2 * STRING_TRAVERSAL_FACTOR), UNKNOWN if not rest else \
                Shape(size=_replace_size(recv.size, rest))
        if fn == "split":
            return arg_cost + _traverse(recv.size, 2 * STRING_TRAVERSAL_FACTOR), \
                Shape(size=recv.size, elem=Shape(size=recv.size))
        if fn == "join":
            total = recv.size * (recv.elem.size if recv.elem else INF)
            if rest:
                total += rest[0].size * max(recv.size - 1, 0)
            return arg_cost + _traverse(total), Shape(size=total)
        if fn in ("indexOf", "lastIndexOf") and recv.elem is None:
            return arg_cost + _traverse(recv.size), SCALAR
        if fn in ("isSorted", "sum", "min", "max", "indexOf", "lastIndexOf"):
            per_elem = 1 + (_traverse(recv.elem.size) if recv.elem is not None and recv.elem.size != 1 else 0)
            return arg_cost + recv.size * per_elem, recv.elem or UNKNOWN
        if fn in ("sets.contains", "sets.intersects", "sets.equivalent"):
            return arg_cost + shapes[0].size * shapes[1].size, SCALAR
        if fn == "size":
            return arg_cost + 1, SCALAR
        if fn == "includes":
            # Kubernetes' draCostEstimator: linear in the longest list attribute (48 values).
            return arg_cost + 48, SCALAR
        if fn in ("optional.of", "optional.ofNonZeroValue", "value", "orValue", "or"):
            inner = shapes[-1] if shapes else UNKNOWN
            return arg_cost + 1, max(inner, recv, key=lambda s: s.size) if fn in ("orValue", "or") else inner
        return arg_cost + 1, UNKNOWN


def _replace_size(size: float, rest: list[Shape]) -> float:
    if len(rest) < 2:
        return INF
    old, new = rest[0], rest[1]
    if old.size == 0:
        return size + (size + 1) * new.size
    return max(size, _ceil(size / max(old.size, 1)) * new.size)


def checked_expr(serialized: bytes, types: MessageTypes) -> Any:
    """The cel.expr.CheckedExpr in ``Expression.serialize()`` output (a google.protobuf.Any)."""
    wrapper = any_pb2.Any()
    wrapper.ParseFromString(serialized)
    checked = types.CheckedExpr()
    checked.ParseFromString(wrapper.value)
    return checked


def estimate_checked_cost(serialized: bytes, types: MessageTypes) -> CostEstimate:
    """Worst-case cost of ``Expression.serialize()`` output (a google.protobuf.Any holding a CheckedExpr)."""
    checked = checked_expr(serialized, types)
    walker = _Walker()
    cost, _ = walker.visit(checked.expr)
    bounded = cost if cost != INF and cost < 2**63 else 2**63 - 1
    return CostEstimate(max=int(bounded), attribute_domains=frozenset(walker.attribute_domains),
                        capacity_domains=frozenset(walker.capacity_domains))
