"""The kubelet's streaming protocol for `kubectl exec` over WebSocket (RFC 6455), as kubectl 1.30+ speaks it:
subprotocols v5.channel.k8s.io (and v4): every binary message starts with a channel byte (0 stdin, 1 stdout,
2 stderr, 3 the final metav1.Status, 4 terminal resize); v5 adds channel 255, whose message [255, N] closes
channel N (kubectl sends it for stdin at EOF). Pure framing here; the connection is the caller's."""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import struct
from typing import Any

PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x1, 0x2, 0x8, 0x9, 0xA
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
MAX_FRAME = 16 * 1024 * 1024


class WsError(Exception):
    pass


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()


def choose_protocol(offered: str) -> str | None:
    names = [p.strip() for p in offered.split(",") if p.strip()]
    return next((p for p in PROTOCOLS if p in names), None)


def frame(opcode: int, payload: bytes) -> bytes:
    """A server frame (unmasked, FIN set)."""
    head = bytes([0x80 | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([n])
    elif n < 1 << 16:
        head += bytes([126]) + struct.pack("!H", n)
    else:
        head += bytes([127]) + struct.pack("!Q", n)
    return head + payload


def _read_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise WsError("connection closed")
        out += chunk
    return out


def read_message(sock: socket.socket) -> tuple[int, bytes]:
    """One message (fragments joined) from a client: (opcode, payload)."""
    opcode, data = 0, b""
    while True:
        b0, b1 = _read_exact(sock, 2)
        op = b0 & 0x0F
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", _read_exact(sock, 2))[0]
        elif n == 127:
            n = struct.unpack("!Q", _read_exact(sock, 8))[0]
        if n > MAX_FRAME:
            raise WsError(f"frame of {n} bytes is over the limit")
        mask = _read_exact(sock, 4) if b1 & 0x80 else b""
        payload = _read_exact(sock, n)
        if mask:
            payload = bytes(c ^ mask[i % 4] for i, c in enumerate(payload))
        if op >= 0x8:  # control frames come whole, between fragments
            return op, payload
        if op:
            opcode = op
        data += payload
        if b0 & 0x80:
            return opcode, data


def status_message(exit_code: int | None, error: str = "") -> bytes:
    """Channel 3's final metav1.Status: Success, NonZeroExitCode with the code, or an InternalError."""
    status: dict[str, Any]
    if error:
        status = {"metadata": {}, "status": "Failure", "message": error, "reason": "InternalError", "code": 500}
    elif exit_code == 0:
        status = {"metadata": {}, "status": "Success"}
    else:
        status = {"metadata": {}, "status": "Failure",
                  "message": f"command terminated with non-zero exit code: exit status {exit_code}",
                  "reason": "NonZeroExitCode",
                  "details": {"causes": [{"reason": "ExitCode", "message": str(exit_code)}]}}
    return bytes([ERROR]) + json.dumps(status).encode()
