"""The handler's two uses of controlplane.protobuf: a request body decoded (400 when it cannot be), a response
encoded when the object's kind has a message type (None otherwise: the client's JSON fallback is used)."""

from __future__ import annotations

from typing import Any

from controlplane import protobuf
from controlplane import status as st


def protobuf_request(raw: bytes) -> dict[str, Any]:
    try:
        return protobuf.decode(raw)
    except protobuf.ProtobufError as exc:
        raise st.bad_request(f"the request body is not a valid {protobuf.MEDIA_TYPE} object: {exc}") from None


def protobuf_response(value: dict[str, Any]) -> bytes | None:
    if not protobuf.has_message(str(value.get("apiVersion") or ""), str(value.get("kind") or "")):
        return None
    try:
        return protobuf.encode(value)
    except (protobuf.ProtobufError, ValueError, TypeError):
        return None  # a value the message cannot hold: JSON says it as stored
