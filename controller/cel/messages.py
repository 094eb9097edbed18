"""Protobuf message types the CEL environment needs, built in code from descriptors.

Two groups live in one private descriptor pool:

- ``kubernetes.Quantity`` and ``kubernetes.Semver``: the values of Kubernetes' quantity and semver CEL
  libraries. cel-expr-python only carries protobuf messages as custom values, so these are messages; CEL's
  ``==`` on messages compares fields, so each message holds a normalised form whose field equality is
  Kubernetes' semantic equality (``quantity("1Gi") == quantity("1073741824")``; build metadata ignored for
  semver). ``kubernetes.DRADevice`` declares the ``device`` variable for the type checker only.
- ``cel.expr.CheckedExpr``/``cel.expr.ParsedExpr`` and the parts of cel-spec's syntax.proto/checked.proto they
  reference, so that ``Expression.serialize()`` can be read back for the cost estimate and for folding
  literal quantities and semvers. No PyPI package ships these stubs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, struct_pb2

_F = descriptor_pb2.FieldDescriptorProto
_OPT, _REP = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED

QUANTITY_TYPE = "kubernetes.Quantity"
SEMVER_TYPE = "kubernetes.Semver"
DEVICE_TYPE = "kubernetes.DRADevice"
STRICT_DEVICE_TYPE = "kubernetes.DRADeviceStrict"
CHECKED_EXPR_TYPE = "cel.expr.CheckedExpr"
PARSED_EXPR_TYPE = "cel.expr.ParsedExpr"


def _field(msg: descriptor_pb2.DescriptorProto, name: str, number: int, kind: int,
           type_name: str = "", label: int = _OPT, oneof: int | None = None) -> None:
    f = msg.field.add(name=name, number=number, type=kind, label=label)
    if type_name:
        f.type_name = type_name
    if oneof is not None:
        f.oneof_index = oneof


def _map_field(msg: descriptor_pb2.DescriptorProto, package: str, name: str, number: int, key_kind: int,
               value_kind: int, value_type: str = "") -> None:
    entry_name = "".join(p.capitalize() for p in name.split("_")) + "Entry"
    entry = msg.nested_type.add(name=entry_name)
    entry.options.map_entry = True
    _field(entry, "key", 1, key_kind)
    _field(entry, "value", 2, value_kind, value_type)
    full = f".{package}.{msg.name}.{entry_name}"
    _field(msg, name, number, _F.TYPE_MESSAGE, full, _REP)


def _message(fdp: descriptor_pb2.FileDescriptorProto, name: str) -> descriptor_pb2.DescriptorProto:
    return fdp.message_type.add(name=name)


def _kubernetes_file() -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto(name="gpudra/cel/kubernetes.proto", package="kubernetes",
                                             syntax="proto3")
    fdp.dependency.append("google/protobuf/struct.proto")
    q = _message(fdp, "Quantity")
    # value = coefficient * 10**exponent, normalised (no trailing zeros in coefficient; zero is "0", 0).
    _field(q, "coefficient", 1, _F.TYPE_STRING)
    _field(q, "exponent", 2, _F.TYPE_SINT64)
    s = _message(fdp, "Semver")
    _field(s, "major", 1, _F.TYPE_UINT64)
    _field(s, "minor", 2, _F.TYPE_UINT64)
    _field(s, "patch", 3, _F.TYPE_UINT64)
    _field(s, "prerelease", 4, _F.TYPE_STRING)
    # The checker sees attributes and capacity as map(string, map(string, dyn)); a Struct map value is
    # exactly that type for CEL. Capacity values are Quantity at run time.
    for name, gated in ((DEVICE_TYPE, True), (STRICT_DEVICE_TYPE, False)):
        d = _message(fdp, name.split(".")[1])
        _field(d, "driver", 1, _F.TYPE_STRING)
        _map_field(d, "kubernetes", "attributes", 2, _F.TYPE_STRING, _F.TYPE_MESSAGE, ".google.protobuf.Struct")
        _map_field(d, "kubernetes", "capacity", 3, _F.TYPE_STRING, _F.TYPE_MESSAGE, ".google.protobuf.Struct")
        if gated:
            _field(d, "allowMultipleAllocations", 4, _F.TYPE_BOOL)
    return fdp


def _cel_expr_file() -> descriptor_pb2.FileDescriptorProto:
    """The subset of cel-spec's syntax.proto and checked.proto read by the cost estimator (same field numbers)."""
    fdp = descriptor_pb2.FileDescriptorProto(name="gpudra/cel/cel_expr.proto", package="cel.expr", syntax="proto3")
    const = _message(fdp, "Constant")
    const.oneof_decl.add(name="constant_kind")
    _field(const, "bool_value", 2, _F.TYPE_BOOL, oneof=0)
    _field(const, "int64_value", 3, _F.TYPE_INT64, oneof=0)
    _field(const, "uint64_value", 4, _F.TYPE_UINT64, oneof=0)
    _field(const, "double_value", 5, _F.TYPE_DOUBLE, oneof=0)
    _field(const, "string_value", 6, _F.TYPE_STRING, oneof=0)
    _field(const, "bytes_value", 7, _F.TYPE_BYTES, oneof=0)

    expr = _message(fdp, "Expr")
    expr.oneof_decl.add(name="expr_kind")
    _field(expr, "id", 2, _F.TYPE_INT64)
    nested = {}
    for name in ("Ident", "Select", "Call", "CreateList", "CreateStruct", "Comprehension"):
        nested[name] = expr.nested_type.add(name=name)
    E, X = ".cel.expr.Expr", ".cel.expr.Expr."
    _field(nested["Ident"], "name", 1, _F.TYPE_STRING)
    _field(nested["Select"], "operand", 1, _F.TYPE_MESSAGE, E)
    _field(nested["Select"], "field", 2, _F.TYPE_STRING)
    _field(nested["Select"], "test_only", 3, _F.TYPE_BOOL)
    _field(nested["Call"], "target", 1, _F.TYPE_MESSAGE, E)
    _field(nested["Call"], "function", 2, _F.TYPE_STRING)
    _field(nested["Call"], "args", 3, _F.TYPE_MESSAGE, E, _REP)
    _field(nested["CreateList"], "elements", 1, _F.TYPE_MESSAGE, E, _REP)
    entry = nested["CreateStruct"].nested_type.add(name="Entry")
    entry.oneof_decl.add(name="key_kind")
    _field(entry, "id", 1, _F.TYPE_INT64)
    _field(entry, "field_key", 2, _F.TYPE_STRING, oneof=0)
    _field(entry, "map_key", 3, _F.TYPE_MESSAGE, E, oneof=0)
    _field(entry, "value", 4, _F.TYPE_MESSAGE, E)
    _field(nested["CreateStruct"], "message_name", 1, _F.TYPE_STRING)
    _field(nested["CreateStruct"], "entries", 2, _F.TYPE_MESSAGE, X + "CreateStruct.Entry", _REP)
    comp = nested["Comprehension"]
    _field(comp, "iter_var", 1, _F.TYPE_STRING)
    _field(comp, "iter_range", 2, _F.TYPE_MESSAGE, E)
    _field(comp, "accu_var", 3, _F.TYPE_STRING)
    _field(comp, "accu_init", 4, _F.TYPE_MESSAGE, E)
    _field(comp, "loop_condition", 5, _F.TYPE_MESSAGE, E)
    _field(comp, "loop_step", 6, _F.TYPE_MESSAGE, E)
    _field(comp, "result", 7, _F.TYPE_MESSAGE, E)
    _field(comp, "iter_var2", 8, _F.TYPE_STRING)
    _field(expr, "const_expr", 3, _F.TYPE_MESSAGE, ".cel.expr.Constant", oneof=0)
    for number, name in ((4, "Ident"), (5, "Select"), (6, "Call"), (7, "CreateList"), (8, "CreateStruct"),
                         (9, "Comprehension")):
        field_name = {"Ident": "ident_expr", "Select": "select_expr", "Call": "call_expr",
                      "CreateList": "list_expr", "CreateStruct": "struct_expr",
                      "Comprehension": "comprehension_expr"}[name]
        _field(expr, field_name, number, _F.TYPE_MESSAGE, X + name, oneof=0)

    typ = _message(fdp, "Type")
    typ.oneof_decl.add(name="type_kind")
    prim = typ.enum_type.add(name="PrimitiveType")
    for number, name in enumerate(("PRIMITIVE_TYPE_UNSPECIFIED", "BOOL", "INT64", "UINT64", "DOUBLE", "STRING",
                                   "BYTES")):
        prim.value.add(name=name, number=number)
    lt = typ.nested_type.add(name="ListType")
    _field(lt, "elem_type", 1, _F.TYPE_MESSAGE, ".cel.expr.Type")
    mt = typ.nested_type.add(name="MapType")
    _field(mt, "key_type", 1, _F.TYPE_MESSAGE, ".cel.expr.Type")
    _field(mt, "value_type", 2, _F.TYPE_MESSAGE, ".cel.expr.Type")
    at = typ.nested_type.add(name="AbstractType")
    _field(at, "name", 1, _F.TYPE_STRING)
    _field(at, "parameter_types", 2, _F.TYPE_MESSAGE, ".cel.expr.Type", _REP)
    _field(typ, "primitive", 3, _F.TYPE_ENUM, ".cel.expr.Type.PrimitiveType", oneof=0)
    _field(typ, "wrapper", 4, _F.TYPE_ENUM, ".cel.expr.Type.PrimitiveType", oneof=0)
    _field(typ, "list_type", 6, _F.TYPE_MESSAGE, ".cel.expr.Type.ListType", oneof=0)
    _field(typ, "map_type", 7, _F.TYPE_MESSAGE, ".cel.expr.Type.MapType", oneof=0)
    _field(typ, "message_type", 9, _F.TYPE_STRING, oneof=0)
    _field(typ, "type_param", 10, _F.TYPE_STRING, oneof=0)
    _field(typ, "abstract_type", 14, _F.TYPE_MESSAGE, ".cel.expr.Type.AbstractType", oneof=0)

    ref = _message(fdp, "Reference")
    _field(ref, "name", 1, _F.TYPE_STRING)
    _field(ref, "overload_id", 3, _F.TYPE_STRING, label=_REP)

    checked = _message(fdp, "CheckedExpr")
    # Map fields are built by hand: their entry key is int64.
    for name, number, value in (("reference_map", 2, ".cel.expr.Reference"), ("type_map", 3, ".cel.expr.Type")):
        entry_name = "".join(p.capitalize() for p in name.split("_")) + "Entry"
        e = checked.nested_type.add(name=entry_name)
        e.options.map_entry = True
        _field(e, "key", 1, _F.TYPE_INT64)
        _field(e, "value", 2, _F.TYPE_MESSAGE, value)
        _field(checked, name, number, _F.TYPE_MESSAGE, f".cel.expr.CheckedExpr.{entry_name}", _REP)
    _field(checked, "expr", 4, _F.TYPE_MESSAGE, E)

    # Where each expression node starts in the source (offsets in code points), for splitting a selector into its
    # top-level terms. Macro calls (field 5) are left as unknown fields.
    info = _message(fdp, "SourceInfo")
    _field(info, "syntax_version", 1, _F.TYPE_STRING)
    _field(info, "location", 2, _F.TYPE_STRING)
    _field(info, "line_offsets", 3, _F.TYPE_INT32, label=_REP)
    positions = info.nested_type.add(name="PositionsEntry")
    positions.options.map_entry = True
    _field(positions, "key", 1, _F.TYPE_INT64)
    _field(positions, "value", 2, _F.TYPE_INT32)
    _field(info, "positions", 4, _F.TYPE_MESSAGE, ".cel.expr.SourceInfo.PositionsEntry", _REP)
    _field(checked, "source_info", 5, _F.TYPE_MESSAGE, ".cel.expr.SourceInfo")

    # What an unchecked Expression.serialize() holds.
    parsed = _message(fdp, "ParsedExpr")
    _field(parsed, "expr", 2, _F.TYPE_MESSAGE, E)
    _field(parsed, "source_info", 3, _F.TYPE_MESSAGE, ".cel.expr.SourceInfo")
    return fdp


@dataclass(frozen=True)
class MessageTypes:
    """The descriptor pool and the Python classes built from it."""

    pool: descriptor_pool.DescriptorPool
    Quantity: Any
    Semver: Any
    CheckedExpr: Any
    ParsedExpr: Any


def build_message_types() -> MessageTypes:
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(struct_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(_kubernetes_file())
    pool.Add(_cel_expr_file())

    def cls(name: str) -> Any:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))

    return MessageTypes(pool=pool, Quantity=cls(QUANTITY_TYPE), Semver=cls(SEMVER_TYPE),
                        CheckedExpr=cls(CHECKED_EXPR_TYPE), ParsedExpr=cls(PARSED_EXPR_TYPE))
