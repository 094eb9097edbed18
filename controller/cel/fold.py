"""Compile-time folding of literal quantities and semvers in a parsed selector.

``quantity("40Gi")`` and ``semver("550.0.0")`` with a literal argument give the same value for every
device, yet each evaluation would call into Python to parse the text and hand a message back. Folding
rewrites such a call into the message literal it returns (``kubernetes.Quantity{coefficient: "4294967296",
exponent: 1}`` for ``40Gi``), which cel-cpp builds natively, and ``isQuantity``/``isSemver`` of a literal into the
boolean it returns. A literal that does not parse is left as a call, so it fails at evaluation exactly
as before (and only where evaluation reaches it).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import any_pb2

from controller.cel.messages import PARSED_EXPR_TYPE, QUANTITY_TYPE, SEMVER_TYPE, MessageTypes
from controller.cel.values import quantity_parts
from gpudra.quantity import Quantity, QuantityError
from gpudra.semver import Semver, SemverError

_EXPR = "cel.expr.Expr"
_ENTRY = "cel.expr.Expr.CreateStruct.Entry"


def _string_arg(expr: Any) -> str | None:
    if expr.WhichOneof("expr_kind") != "const_expr" or expr.const_expr.WhichOneof("constant_kind") != "string_value":
        return None
    return str(expr.const_expr.string_value)


def _bool_arg(expr: Any) -> bool | None:
    if expr.WhichOneof("expr_kind") != "const_expr" or expr.const_expr.WhichOneof("constant_kind") != "bool_value":
        return None
    return bool(expr.const_expr.bool_value)


def _literal_args(call: Any) -> tuple[str, bool] | None:
    """(text, normalize) of ``f("text")`` or ``f("text", true|false)`` with no receiver; else None."""
    if call.HasField("target") or not 1 <= len(call.args) <= 2:
        return None
    text = _string_arg(call.args[0])
    if text is None:
        return None
    if len(call.args) == 1:
        return text, False
    normalize = _bool_arg(call.args[1])
    return None if normalize is None else (text, normalize)


class _Folder:
    def __init__(self, next_id: int) -> None:
        self.next_id = next_id
        self.folded = 0

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _struct(self, expr: Any, type_name: str, fields: list[tuple[str, str, Any]]) -> None:
        node_id = expr.id
        expr.Clear()
        expr.id = node_id
        expr.struct_expr.message_name = type_name
        for name, kind, value in fields:
            entry = expr.struct_expr.entries.add(id=self._id(), field_key=name)
            entry.value.id = self._id()
            setattr(entry.value.const_expr, kind, value)
        self.folded += 1

    def _bool(self, expr: Any, value: bool) -> None:
        node_id = expr.id
        expr.Clear()
        expr.id = node_id
        expr.const_expr.bool_value = value
        self.folded += 1

    def fold(self, expr: Any) -> None:
        if expr.WhichOneof("expr_kind") == "call_expr":
            call = expr.call_expr
            literal = _literal_args(call)
            if literal is not None and self._fold_call(expr, call.function, *literal):
                return
        _each_expr(expr, self.fold)

    def _fold_call(self, expr: Any, function: str, text: str, normalize: bool) -> bool:
        if function == "quantity" and len(expr.call_expr.args) == 1:
            try:
                coefficient, exponent = quantity_parts(Quantity.parse(text))
            except QuantityError:
                return False
            self._struct(expr, QUANTITY_TYPE, [("coefficient", "string_value", str(coefficient)),
                                               ("exponent", "int64_value", exponent)])
            return True
        if function == "isQuantity" and len(expr.call_expr.args) == 1:
            try:
                Quantity.parse(text)
            except QuantityError:
                self._bool(expr, False)
            else:
                self._bool(expr, True)
            return True
        if function in ("semver", "isSemver"):
            try:
                version = Semver.parse(text, normalize=normalize)
            except SemverError:
                if function == "isSemver":
                    self._bool(expr, False)
                    return True
                return False
            if function == "isSemver":
                self._bool(expr, True)
                return True
            prerelease = ".".join(str(p) for p in version.prerelease)
            self._struct(expr, SEMVER_TYPE, [("major", "uint64_value", version.major),
                                             ("minor", "uint64_value", version.minor),
                                             ("patch", "uint64_value", version.patch),
                                             ("prerelease", "string_value", prerelease)])
            return True
        return False


def _each_expr(message: Any, visit: Any) -> None:
    """Call ``visit`` on every Expr directly below ``message`` (through lists, structs, comprehensions)."""
    for descriptor, value in message.ListFields():
        if descriptor.message_type is None:
            continue
        items = value if descriptor.is_repeated else (value,)
        for item in items:
            if item.DESCRIPTOR.full_name == _EXPR:
                visit(item)
            else:
                _each_expr(item, visit)


def _max_id(message: Any) -> int:
    highest = 0
    for descriptor, value in message.ListFields():
        if descriptor.name == "id" and message.DESCRIPTOR.full_name in (_EXPR, _ENTRY):
            highest = max(highest, int(value))
        elif descriptor.message_type is not None:
            items = value if descriptor.is_repeated else (value,)
            for item in items:
                highest = max(highest, _max_id(item))
    return highest


def fold_literals(serialized: bytes, types: MessageTypes) -> bytes | None:
    """The parsed expression (``Expression.serialize()`` of an unchecked compile) with literal quantity and
    semver calls folded; None when it holds nothing to fold or is not a parsed expression."""
    wrapper = any_pb2.Any()
    wrapper.ParseFromString(serialized)
    if wrapper.type_url.rpartition("/")[2] != PARSED_EXPR_TYPE:
        return None
    parsed = types.ParsedExpr()
    parsed.ParseFromString(wrapper.value)
    folder = _Folder(_max_id(parsed.expr))
    folder.fold(parsed.expr)
    if not folder.folded:
        return None
    wrapper.value = parsed.SerializeToString()
    return wrapper.SerializeToString()
