"""`application/vnd.kubernetes.protobuf` bodies: kube-apiserver's protobuf serializer, transcoding to and from the
JSON objects the server keeps, driven by upstream's message descriptors (controlplane/k8sproto, see controlplane.k8sapi).

A body is the 4-byte magic `k8s\\x00` and a `runtime.Unknown` whose typeMeta names the object and whose raw
bytes are the object's message. Messages map onto JSON field by field (k8s.io's proto field names are the JSON
names); the types apimachinery serializes specially (Time, MicroTime, Duration, Quantity, IntOrString,
RawExtension, FieldsV1, the `items` wrappers of string lists) are converted as their Go JSON marshalers do.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime, timezone
from functools import cache
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from controlplane.k8sapi import DESCRIPTORS, GO_FIELDS

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"
_META = "k8s.io.apimachinery.pkg.apis.meta.v1."
_TIME, _MICRO_TIME, _DURATION = _META + "Time", _META + "MicroTime", _META + "Duration"
_FIELDS_V1 = _META + "FieldsV1"
_QUANTITY = "k8s.io.apimachinery.pkg.api.resource.Quantity"
_INT_OR_STRING = "k8s.io.apimachinery.pkg.util.intstr.IntOrString"
_RAW = "k8s.io.apimachinery.pkg.runtime.RawExtension"
_UNKNOWN = "k8s.io.apimachinery.pkg.runtime.Unknown"


class ProtobufError(ValueError):
    """A protobuf body that cannot be decoded, or an object with no message type; the message says which."""


@cache
def _pool() -> descriptor_pool.DescriptorPool:
    files = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTORS.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for f in files.file:
        pool.Add(f)
    return pool


@cache
def _go_fields(which: str) -> dict[str, frozenset[str]]:
    return {k: frozenset(v) for k, v in json.loads(GO_FIELDS.read_text())[which].items()}


def _is_zero(value: Any) -> bool:
    # Go's JSON writes every non-pointer struct ({} when empty) except Time, whose zero value it writes as null.
    if isinstance(value, Message):
        return value.DESCRIPTOR.full_name in (_TIME, _MICRO_TIME) and not value.ListFields()
    return value in ("", 0, False)


def _message_class(full_name: str) -> type[Message]:
    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(full_name))


def message_name(api_version: str, kind: str) -> str:
    """`apps/v1` Deployment -> k8s.io.api.apps.v1.Deployment; meta's own kinds (Status, ...) are meta.v1's."""
    group, _, version = api_version.rpartition("/")
    if kind in ("Status", "DeleteOptions", "APIResourceList", "APIGroupList", "APIGroup", "APIVersions"):
        return _META + kind
    short = group.split(".")[0] if group else "core"
    return f"k8s.io.api.{short}.{version}.{kind}"


def has_message(api_version: str, kind: str) -> bool:
    try:
        _pool().FindMessageTypeByName(message_name(api_version, kind))
    except KeyError:
        return False
    return True


# ----- decoding ----------------------------------------------------------------------------------------------

def decode(body: bytes) -> dict[str, Any]:
    """A request body as the JSON object it stands for, with apiVersion and kind from its envelope."""
    if not body.startswith(MAGIC):
        raise ProtobufError("the protobuf body does not start with the Kubernetes magic number k8s\\x00")
    try:
        unknown: Any = _message_class(_UNKNOWN).FromString(body[len(MAGIC):])
    except DecodeError as exc:
        raise ProtobufError(f"the protobuf envelope (runtime.Unknown) cannot be decoded: {exc}") from None
    api_version, kind = unknown.typeMeta.apiVersion, unknown.typeMeta.kind
    if not kind:
        raise ProtobufError("the protobuf envelope names no kind (typeMeta.kind is empty)")
    if not has_message(api_version, kind):
        raise ProtobufError(f"no protobuf message type for {kind} in {api_version or 'v1'}")
    try:
        msg = _message_class(message_name(api_version, kind)).FromString(unknown.raw)
    except DecodeError as exc:
        raise ProtobufError(f"{kind} in {api_version}: the protobuf message cannot be decoded: {exc}") from None
    return {"apiVersion": api_version, "kind": kind, **_to_json(msg)}


def _rfc3339(seconds: int, nanos: int, micro: bool) -> str:
    moment = datetime.fromtimestamp(seconds, timezone.utc)
    if micro:
        return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{nanos // 1000:06d}Z"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _duration_text(ns: int) -> str:
    """Go's time.Duration.String for the whole-second values the API uses (1h0m0s, 1m30s, 500ms)."""
    if ns == 0:
        return "0s"
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    if ns < 1_000_000_000:
        return f"{sign}{ns / 1_000_000:g}ms"
    seconds = ns / 1e9
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    text = f"{s:g}s"
    if h or m:
        text = f"{int(m)}m" + text
    if h:
        text = f"{int(h)}h" + text
    return sign + text


def _special_to_json(msg: Any) -> tuple[bool, Any]:  # a dynamic message: its fields are known only at run time
    name = msg.DESCRIPTOR.full_name
    if name in (_TIME, _MICRO_TIME):
        return True, _rfc3339(msg.seconds, msg.nanos, name == _MICRO_TIME)
    if name == _DURATION:
        return True, _duration_text(msg.duration)
    if name == _QUANTITY:
        return True, msg.string
    if name == _INT_OR_STRING:
        return True, (msg.strVal if msg.type == 1 else msg.intVal)
    if name in (_RAW, _FIELDS_V1):
        raw = msg.raw if name == _RAW else msg.Raw
        return True, (json.loads(raw) if raw else None)
    if _is_items_wrapper(msg.DESCRIPTOR):
        return True, list(msg.items)
    return False, None


def _is_items_wrapper(desc: Any) -> bool:
    # ExtraValue, OptionalNames, ...: a message that only wraps a string list marshals as the list itself.
    return [f.name for f in desc.fields] == ["items"] and desc.fields[0].is_repeated \
        and desc.fields[0].type == FieldDescriptor.TYPE_STRING


def _value_to_json(field: Any, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        special, converted = _special_to_json(value)
        return converted if special else _to_json(value)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode()
    return value


def _to_json(msg: Message) -> Any:
    special, converted = _special_to_json(msg)
    if special:
        return converted
    out: dict[str, Any] = {}
    omit = _go_fields("omitZero").get(msg.DESCRIPTOR.full_name, frozenset())
    inline = _go_fields("inline").get(msg.DESCRIPTOR.full_name, frozenset())
    for field, value in msg.ListFields():
        if field.name in omit and _is_zero(value):
            continue  # Go's zero value of a non-pointer omitempty field: not set
        if field.name in inline:
            out.update(_to_json(value))  # an embedded struct: its fields are the outer object's in JSON
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            vfield = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _value_to_json(vfield, v) for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [_value_to_json(field, v) for v in value]
        else:
            out[field.name] = _value_to_json(field, value)
    return out


# ----- encoding ----------------------------------------------------------------------------------------------

def encode(obj: dict[str, Any]) -> bytes:
    """An object (with apiVersion and kind) as a protobuf body; ProtobufError when its kind has no message."""
    api_version, kind = str(obj.get("apiVersion") or ""), str(obj.get("kind") or "")
    if not has_message(api_version, kind):
        raise ProtobufError(f"no protobuf message type for {kind} in {api_version}")
    msg = _message_class(message_name(api_version, kind))()
    _from_json(msg, {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")})
    unknown: Any = _message_class(_UNKNOWN)()
    unknown.typeMeta.apiVersion = api_version
    unknown.typeMeta.kind = kind
    unknown.raw = msg.SerializeToString()
    return MAGIC + unknown.SerializeToString()


def _parse_time(text: str) -> tuple[int, int]:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int(moment.timestamp()), moment.microsecond * 1000


def _special_from_json(msg: Any, value: Any) -> bool:  # a dynamic message, as above
    name = msg.DESCRIPTOR.full_name
    if name in (_TIME, _MICRO_TIME):
        msg.seconds, msg.nanos = _parse_time(str(value))
    elif name == _QUANTITY:
        msg.string = str(value)
    elif name == _INT_OR_STRING:
        if isinstance(value, str):
            msg.type, msg.strVal = 1, value
        else:
            msg.type, msg.intVal = 0, int(value)
    elif name == _RAW:
        msg.raw = json.dumps(value, separators=(",", ":")).encode()
    elif name == _FIELDS_V1:
        msg.Raw = json.dumps(value, separators=(",", ":")).encode()
    elif name == _DURATION:
        raise ProtobufError("a Duration field is not encoded to protobuf by this server")
    elif _is_items_wrapper(msg.DESCRIPTOR):
        msg.items.extend(str(v) for v in value)
    else:
        return False
    return True


def _scalar(field: Any, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64decode(value) if isinstance(value, str) else bytes(value)
    if field.type == FieldDescriptor.TYPE_BOOL:
        return bool(value)
    if field.type == FieldDescriptor.TYPE_STRING:
        return str(value)
    if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return float(value)
    return int(value)


def _from_json(msg: Message, value: Any) -> None:
    if _special_from_json(msg, value):
        return
    if not isinstance(value, dict):
        raise ProtobufError(f"{msg.DESCRIPTOR.name}: expected an object, got {type(value).__name__}")
    fields = msg.DESCRIPTOR.fields_by_name
    inline = _go_fields("inline").get(msg.DESCRIPTOR.full_name, frozenset())
    if inline:
        for name in inline:
            inner = fields[name].message_type.fields_by_name  # type: ignore[union-attr]
            part = {k: v for k, v in value.items() if k in inner and k not in fields}
            if part:
                _from_json(getattr(msg, name), part)
    for key, item in value.items():
        field = fields.get(key)
        if field is None or item is None:
            continue  # nothing a message can hold (unknown fields are dropped, as by the Go decoder)
        target = getattr(msg, key)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            vfield = field.message_type.fields_by_name["value"]
            for k, v in (item or {}).items():
                if v is None:
                    continue
                if vfield.type == FieldDescriptor.TYPE_MESSAGE:
                    _from_json(target[k], v)
                else:
                    target[k] = _scalar(vfield, v)
        elif field.is_repeated:
            for v in item:
                if field.type == FieldDescriptor.TYPE_MESSAGE:
                    _from_json(target.add(), v)
                else:
                    target.append(_scalar(field, v))
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            _from_json(target, item)
            if not target.ListFields():
                target.SetInParent()  # an empty object ({}) is still present
        else:
            setattr(msg, key, _scalar(field, item))


def accepts(accept_header: str | None) -> bool:
    """Whether a client prefers protobuf: its first Accept media type is ours (kubectl sends
    `application/vnd.kubernetes.protobuf,application/json`)."""
    if not accept_header:
        return False
    first = accept_header.split(",")[0].split(";")[0].strip()
    return first == MEDIA_TYPE
