"""Kubernetes' CEL function libraries that cel-expr-python lacks: quantity, semver, regex find/findAll and
Kubernetes' list functions (isSorted, sum, min, max).

Kubernetes' list ``indexOf``/``lastIndexOf`` are missing: cel-cpp's strings extension owns those
function names and cel-expr-python cannot add overloads to a function another library declared.

Names, overloads and error texts follow k8s.io/apiserver/pkg/cel/library. Implementations raise
``ValueError``; cel-expr-python turns that into a CEL error value carrying the message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cel_expr_python import cel

from controller.cel.deadline import EvaluationDeadline
from controller.cel.messages import QUANTITY_TYPE, SEMVER_TYPE, MessageTypes
from controller.cel.regex import Regex, RegexCache, RegexError
from controller.cel.values import (MessageMemo, compare_quantity_messages, quantity_from_message, quantity_to_message,
                                   semver_to_message)
from gpudra.quantity import Quantity, QuantityError, is_quantity
from gpudra.semver import Semver, SemverError, is_semver

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


def _cmp(a: Any, b: Any) -> int:
    return (a > b) - (a < b)


@dataclass(frozen=True)
class _Fn:
    name: str
    overload_id: str
    result: cel.Type
    params: tuple[cel.Type, ...]
    member: bool
    impl: Callable[..., Any]


# resourceapi.ResourceSliceMaxAttributeValuesPerDevice: the longest list attribute (KEP-5491) and the cost of `includes`.
MAX_ATTRIBUTE_VALUES_PER_DEVICE = 48


def _equal(a: Any, b: Any) -> bool:
    # CEL equality: values of different types are never equal (1 == true is false, unlike Python's).
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return type(a) is type(b) and a == b if not isinstance(a, (int, float)) else a == b


class KubernetesLibrary:
    """Function declarations with their implementations, bound to one set of message classes."""

    def __init__(self, types: MessageTypes, *, includes: bool = False,
                 deadline: EvaluationDeadline | None = None) -> None:
        self._types = types
        self._with_includes = includes
        self.quantity_type = cel.Type(QUANTITY_TYPE)
        self.semver_type = cel.Type(SEMVER_TYPE)
        # Selectors call quantity("40Gi") / semver("550.0.0") with the same literal for every device.
        self._quantity_literals = MessageMemo()
        self._semver_literals = MessageMemo()
        self._regexes = RegexCache()
        # The wall-clock bound of the evaluation in progress, checked by every function implemented here.
        self.deadline = deadline or EvaluationDeadline()

    # ---- quantity -----------------------------------------------------------------------------

    def _quantity(self, text: str) -> Any:
        cached = self._quantity_literals.get(text)
        if cached is not None:
            return cached
        try:
            message = quantity_to_message(Quantity.parse(text), self._types.Quantity)
        except QuantityError as err:
            raise ValueError(str(err)) from None
        return self._quantity_literals.put(text, message)

    @staticmethod
    def _sign(q: Any) -> int:
        return _cmp(int(q.coefficient or "0"), 0)

    @staticmethod
    def _q_compare(a: Any, b: Any) -> int:
        return compare_quantity_messages(a, b)

    def _q_add(self, a: Any, b: Any) -> Any:
        return self._arith(a, quantity_from_message(b), 1)

    def _q_add_int(self, a: Any, b: int) -> Any:
        return self._arith(a, Quantity.from_int(b, "DecimalExponent"), 1)

    def _q_sub(self, a: Any, b: Any) -> Any:
        return self._arith(a, quantity_from_message(b), -1)

    def _q_sub_int(self, a: Any, b: int) -> Any:
        return self._arith(a, Quantity.from_int(b, "DecimalExponent"), -1)

    def _arith(self, a: Any, b: Quantity, sign: int) -> Any:
        left = quantity_from_message(a)
        result = left.add(b) if sign > 0 else left.sub(b)
        return quantity_to_message(result, self._types.Quantity)

    @staticmethod
    def _q_is_integer(q: Any) -> bool:
        return quantity_from_message(q).is_integer()

    @staticmethod
    def _q_as_integer(q: Any) -> int:
        try:
            return quantity_from_message(q).as_int()
        except QuantityError:
            raise ValueError("cannot convert value to integer") from None

    @staticmethod
    def _q_as_float(q: Any) -> float:
        return quantity_from_message(q).as_approximate_float()

    # ---- semver -------------------------------------------------------------------------------

    def _semver(self, text: str, normalize: bool = False) -> Any:
        key = (text, normalize)
        cached = self._semver_literals.get(key)
        if cached is not None:
            return cached
        try:
            message = semver_to_message(Semver.parse(text, normalize=normalize), self._types.Semver)
        except SemverError as err:
            raise ValueError(str(err)) from None
        return self._semver_literals.put(key, message)


    @staticmethod
    def _from_semver_message(msg: Any) -> Semver:
        text = f"{msg.major}.{msg.minor}.{msg.patch}"
        if msg.prerelease:
            text += f"-{msg.prerelease}"
        return Semver.parse(text)

    def _v_compare(self, a: Any, b: Any) -> int:
        core = _cmp((a.major, a.minor, a.patch), (b.major, b.minor, b.patch))
        if core or (not a.prerelease and not b.prerelease):
            return core
        return self._from_semver_message(a).compare(self._from_semver_message(b))

    # ---- regex (Kubernetes' library.Regex) ------------------------------------------------------

    def _compile_regex(self, pattern: str) -> Regex:
        try:
            return self._regexes.get(pattern)
        except RegexError as err:
            raise ValueError(f"Illegal regex: {err}") from None

    def _find(self, text: str, pattern: str) -> str:
        return self._compile_regex(pattern).find(text)

    def _find_all(self, text: str, pattern: str, limit: int = -1) -> list[str]:
        return self._compile_regex(pattern).find_all(text, limit)

    # ---- lists (Kubernetes' library.Lists) ------------------------------------------------------

    @staticmethod
    def _comparable(values: Sequence[Any], fn: str) -> None:
        kinds = {type(v) for v in values}
        if len(kinds) > 1 and not kinds <= {int, float}:
            raise ValueError(f"{fn}: list elements must be of one comparable type, found {sorted(k.__name__ for k in kinds)}")

    def _is_sorted(self, values: list[Any]) -> bool:
        self._comparable(values, "isSorted")
        return all(values[i] <= values[i + 1] for i in range(len(values) - 1))

    def _sum(self, values: list[Any]) -> Any:
        self._comparable(values, "sum")
        if any(isinstance(v, float) for v in values):
            return float(sum(values))
        total = sum(values)
        if not _INT64_MIN <= total <= _INT64_MAX:
            raise ValueError("integer overflow")
        return total

    def _min(self, values: list[Any]) -> Any:
        if not values:
            raise ValueError("min(list) called on empty list")
        self._comparable(values, "min")
        return min(values)

    def _max(self, values: list[Any]) -> Any:
        if not values:
            raise ValueError("max(list) called on empty list")
        self._comparable(values, "max")
        return max(values)

    # ---- declarations -------------------------------------------------------------------------

    def _functions(self) -> list[_Fn]:
        Q, V = self.quantity_type, self.semver_type
        S, B, I, D = cel.Type.STRING, cel.Type.BOOL, cel.Type.INT, cel.Type.DOUBLE  # noqa: E741 (CEL type letters)
        L = cel.Type.List(cel.Type.DYN)
        DYN = cel.Type.DYN
        return [
            _Fn("quantity", "string_to_quantity", Q, (S,), False, self._quantity),
            _Fn("isQuantity", "is_quantity_string", B, (S,), False, is_quantity),
            _Fn("sign", "quantity_sign", I, (Q,), False, self._sign),
            _Fn("isGreaterThan", "quantity_is_greater_than", B, (Q, Q), True,
                lambda a, b: self._q_compare(a, b) == 1),
            _Fn("isLessThan", "quantity_is_less_than", B, (Q, Q), True, lambda a, b: self._q_compare(a, b) == -1),
            _Fn("compareTo", "quantity_compare_to", I, (Q, Q), True, self._q_compare),
            _Fn("asApproximateFloat", "quantity_get_float", D, (Q,), True, self._q_as_float),
            _Fn("asInteger", "quantity_get_int", I, (Q,), True, self._q_as_integer),
            _Fn("isInteger", "quantity_is_integer", B, (Q,), True, self._q_is_integer),
            _Fn("add", "quantity_add", Q, (Q, Q), True, self._q_add),
            _Fn("add", "quantity_add_int", Q, (Q, I), True, self._q_add_int),
            _Fn("sub", "quantity_sub", Q, (Q, Q), True, self._q_sub),
            _Fn("sub", "quantity_sub_int", Q, (Q, I), True, self._q_sub_int),
            _Fn("semver", "string_to_semver", V, (S,), False, self._semver),
            _Fn("semver", "string_bool_to_semver", V, (S, B), False, self._semver),
            _Fn("isSemver", "is_semver_string", B, (S,), False, is_semver),
            _Fn("isSemver", "is_semver_string_bool", B, (S, B), False, is_semver),
            _Fn("isGreaterThan", "semver_is_greater_than", B, (V, V), True, lambda a, b: self._v_compare(a, b) == 1),
            _Fn("isLessThan", "semver_is_less_than", B, (V, V), True, lambda a, b: self._v_compare(a, b) == -1),
            _Fn("compareTo", "semver_compare_to", I, (V, V), True, self._v_compare),
            _Fn("major", "semver_major", I, (V,), True, lambda v: int(v.major)),
            _Fn("minor", "semver_minor", I, (V,), True, lambda v: int(v.minor)),
            _Fn("patch", "semver_patch", I, (V,), True, lambda v: int(v.patch)),
            _Fn("find", "string_find_n", S, (S, S), True, self._find),
            _Fn("findAll", "string_find_all", cel.Type.List(S), (S, S), True, self._find_all),
            _Fn("findAll", "string_find_all_n", cel.Type.List(S), (S, S, I), True, self._find_all),
            _Fn("isSorted", "list_is_sorted", B, (L,), True, self._is_sorted),
            _Fn("sum", "list_sum", DYN, (L,), True, self._sum),
            _Fn("min", "list_min", DYN, (L,), True, self._min),
            _Fn("max", "list_max", DYN, (L,), True, self._max),
        ] + ([_Fn("includes", "dra_includes_dyn_dyn", B, (DYN, DYN), True, self._includes)] if self._with_includes else [])

    @staticmethod
    def _includes(target: Any, arg: Any) -> bool:
        """KEP-5491's `includes`: a list holds the value, or a scalar equals it. Lists longer than a device's
        attribute value limit are refused so the cost stays bounded."""
        if isinstance(target, (list, tuple)):
            for i, item in enumerate(target):
                if i >= MAX_ATTRIBUTE_VALUES_PER_DEVICE:
                    raise ValueError(f"'includes' function cannot be applied to lists longer than "
                                     f"{MAX_ATTRIBUTE_VALUES_PER_DEVICE} values")
                if _equal(item, arg):
                    return True
            return False
        return _equal(target, arg)

    def checker_declarations(self) -> list[cel.FunctionDecl]:
        """Typed declarations for the type checker (no implementations: that environment never evaluates)."""
        by_name: dict[str, list[cel.Overload]] = {}
        for fn in self._functions():
            by_name.setdefault(fn.name, []).append(
                cel.Overload(fn.overload_id, fn.result, list(fn.params), is_member=fn.member))
        return [cel.FunctionDecl(name, overloads) for name, overloads in by_name.items()]

    def runtime_declarations(self) -> list[cel.FunctionDecl]:
        """Declarations with implementations for evaluation.

        cel-cpp's runtime registry tells message types apart only as "a message", so quantity and semver
        overloads of one name and shape would collide; those become one dyn-typed overload that dispatches
        on the message type (the typed checker has already chosen a valid overload).
        """
        groups: dict[tuple[str, bool, tuple[str, ...]], list[_Fn]] = {}
        for fn in self._functions():
            kinds = tuple("message" if self._is_message(p) else p.name() for p in fn.params)
            groups.setdefault((fn.name, fn.member, kinds), []).append(fn)
        by_name: dict[str, list[cel.Overload]] = {}
        for (name, member, _), fns in groups.items():
            if name == "includes":
                by_name[name] = self._includes_runtime(fns[0])
                continue
            if len(fns) == 1:
                for fn in fns:
                    by_name.setdefault(name, []).append(cel.Overload(
                        fn.overload_id, fn.result, list(fn.params), is_member=fn.member, impl=self._bounded(fn.impl)))
                continue
            first = fns[0]
            by_name.setdefault(name, []).append(cel.Overload(
                f"{first.overload_id}_dispatch", first.result, list(first.params), is_member=member,
                impl=self._bounded(self._dispatcher(name, fns))))
        return [cel.FunctionDecl(name, overloads) for name, overloads in by_name.items()]

    def _includes_runtime(self, fn: _Fn) -> list[cel.Overload]:
        """`includes(dyn, dyn)` for evaluation: cel-cpp's runtime matches overloads by concrete kinds only, so
        one overload per (receiver kind, argument kind) pair, all with the same implementation (messages share
        one kind there, so the semver type stands for quantities too)."""
        kinds = [cel.Type.INT, cel.Type.UINT, cel.Type.DOUBLE, cel.Type.STRING, cel.Type.BOOL, cel.Type.BYTES,
                 cel.Type.NULL, cel.Type.List(cel.Type.DYN), cel.Type.Map(cel.Type.DYN, cel.Type.DYN), self.semver_type]
        impl = self._bounded(fn.impl)
        return [cel.Overload(f"{fn.overload_id}_{i}_{j}", fn.result, [recv, arg], is_member=True, impl=impl)
                for i, recv in enumerate(kinds) for j, arg in enumerate(kinds)]

    def _bounded(self, impl: Callable[..., Any]) -> Callable[..., Any]:
        """`impl` that first checks the evaluation's deadline (deadline.py)."""
        check = self.deadline.check

        def bounded(*args: Any) -> Any:
            check()
            return impl(*args)

        return bounded

    def _is_message(self, t: cel.Type) -> bool:
        return t == self.quantity_type or t == self.semver_type

    def _dispatcher(self, name: str, fns: list[_Fn]) -> Callable[..., Any]:
        by_type: dict[str | None, Callable[..., Any]] = {}
        for fn in fns:
            first = fn.params[0]
            by_type[QUANTITY_TYPE if first == self.quantity_type else SEMVER_TYPE] = fn.impl

        def dispatch(*args: Any) -> Any:
            receiver_type = _message_name(args[0])
            impl = by_type.get(receiver_type)
            if impl is None or any(_message_name(a) != receiver_type for a in args[1:]):
                raise ValueError(f"no such overload: {name}")
            return impl(*args)

        return dispatch


def _message_name(value: Any) -> str | None:
    """The full protobuf type name of a message argument; None for a plain CEL value."""
    descriptor = getattr(value, "DESCRIPTOR", None)
    return descriptor.full_name if descriptor is not None else None
