"""SPDY/3.1 framing as Kubernetes' streams use it (moby/spdystream, the kubelet's port-forward and kubectl's
fallback): control frames (SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE)
and data frames, header blocks compressed with one zlib stream per direction over the SPDY/3 dictionary.

Pure framing: bytes in, frames out and back. The transport (a socket, or WebSocket messages carrying the bytes
as kubectl 1.31+ tunnels them) is the caller's. Flow control is not enforced, as spdystream does not."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

VERSION = 3
SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE = 1, 2, 3, 4, 6, 7, 8, 9
FLAG_FIN = 0x01
RST_PROTOCOL_ERROR, RST_INVALID_STREAM, RST_REFUSED_STREAM, RST_CANCEL = 1, 2, 3, 5
MAX_DATA = (1 << 24) - 1
# A header block decompresses to far less in practice; more is an attack on the decompressor.
MAX_HEADER_BLOCK = 1 << 20

# The SPDY/3 header compression dictionary (draft 3, section 2.6.10.1): length-prefixed common header names and
# values, then a run of common status codes, dates and media types.
_DICTIONARY_WORDS = (
    "options", "head", "post", "put", "delete", "trace", "accept", "accept-charset", "accept-encoding",
    "accept-language", "accept-ranges", "age", "allow", "authorization", "cache-control", "connection",
    "content-base", "content-encoding", "content-language", "content-length", "content-location", "content-md5",
    "content-range", "content-type", "date", "etag", "expect", "expires", "from", "host", "if-match",
    "if-modified-since", "if-none-match", "if-range", "if-unmodified-since", "last-modified", "location",
    "max-forwards", "pragma", "proxy-authenticate", "proxy-authorization", "range", "referer", "retry-after",
    "server", "te", "trailer", "transfer-encoding", "upgrade", "user-agent", "vary", "via", "warning",
    "www-authenticate", "method", "get", "status", "200 OK", "version", "HTTP/1.1", "url", "public", "set-cookie",
    "keep-alive", "origin"
)
_DICTIONARY_TAIL = (
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505"
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request401 Unauthorized"
    "403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 Service Unavailable"
    "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT"
    "chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,"
    "text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
)
DICTIONARY = b"".join(struct.pack("!I", len(w)) + w.encode() for w in _DICTIONARY_WORDS) + _DICTIONARY_TAIL.encode()


class SpdyError(Exception):
    """The peer sent something that is not SPDY/3.1."""


@dataclass
class Frame:
    """A control frame (kind is its type) or a data frame (kind 0); headers are lowercase names."""

    kind: int
    flags: int
    stream_id: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    data: bytes = b""
    status: int = 0  # RST_STREAM's and GOAWAY's status
    ping_id: int = 0
    delta: int = 0  # WINDOW_UPDATE

    @property
    def fin(self) -> bool:
        return bool(self.flags & FLAG_FIN)


def encode_headers(headers: dict[str, str]) -> bytes:
    out = [struct.pack("!I", len(headers))]
    for name, value in headers.items():
        n, v = name.lower().encode(), value.encode()
        out.append(struct.pack("!I", len(n)) + n + struct.pack("!I", len(v)) + v)
    return b"".join(out)


def decode_headers(block: bytes) -> dict[str, str]:
    def take(at: int, n: int) -> bytes:
        if at + n > len(block):
            raise SpdyError("header block is shorter than its lengths say")
        return block[at:at + n]

    count = struct.unpack("!I", take(0, 4))[0]
    at, out = 4, {}
    for _ in range(count):
        n = struct.unpack("!I", take(at, 4))[0]
        name = take(at + 4, n).decode(errors="replace")
        at += 4 + n
        n = struct.unpack("!I", take(at, 4))[0]
        out[name.lower()] = take(at + 4, n).decode(errors="replace").split("\x00")[0]
        at += 4 + n
    return out


class Reader:
    """Frames from a byte source (`recv(n)` returns at most n bytes, b'' at end); one decompressor for the
    connection's header blocks, as the protocol requires."""

    def __init__(self, recv: Callable[[int], bytes]) -> None:
        self._recv = recv
        self._buf = b""
        self._inflate = zlib.decompressobj(zdict=DICTIONARY)

    def _exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self._recv(max(65536, n - len(self._buf)))
            if not chunk:
                raise EOFError("connection closed")
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def _headers(self, block: bytes) -> dict[str, str]:
        try:
            raw = self._inflate.decompress(block, MAX_HEADER_BLOCK)
        except zlib.error as exc:
            raise SpdyError(f"header block does not decompress: {exc}") from exc
        if self._inflate.unconsumed_tail:
            raise SpdyError(f"header block is over {MAX_HEADER_BLOCK} bytes")
        return decode_headers(raw)

    def read(self) -> Frame:
        """The next frame; EOFError at the end of the connection, SpdyError on a malformed one."""
        head = self._exact(8)
        word, flags_len = struct.unpack("!II", head)
        flags, length = flags_len >> 24, flags_len & 0xFFFFFF
        payload = self._exact(length)
        if not word & 0x80000000:
            return Frame(0, flags, word & 0x7FFFFFFF, data=payload)
        version, kind = (word >> 16) & 0x7FFF, word & 0xFFFF
        if version != VERSION:
            raise SpdyError(f"SPDY version {version} is not supported (only {VERSION})")

        def u32(at: int) -> int:
            if len(payload) < at + 4:
                raise SpdyError(f"control frame {kind} is too short ({length} bytes)")
            return int(struct.unpack("!I", payload[at:at + 4])[0])

        if kind == SYN_STREAM:
            return Frame(kind, flags, u32(0) & 0x7FFFFFFF, headers=self._headers(payload[10:]))
        if kind in (SYN_REPLY, HEADERS):
            return Frame(kind, flags, u32(0) & 0x7FFFFFFF, headers=self._headers(payload[4:]))
        if kind == RST_STREAM:
            return Frame(kind, flags, u32(0) & 0x7FFFFFFF, status=u32(4))
        if kind == PING:
            return Frame(kind, flags, ping_id=u32(0))
        if kind == GOAWAY:
            return Frame(kind, flags, u32(0) & 0x7FFFFFFF, status=u32(4) if length >= 8 else 0)
        if kind == WINDOW_UPDATE:
            return Frame(kind, flags, u32(0) & 0x7FFFFFFF, delta=u32(4) & 0x7FFFFFFF)
        return Frame(kind, flags)  # SETTINGS and frame types a receiver ignores


class Writer:
    """Serialized frames; one compressor for the connection's header blocks. Not thread-safe: the caller writes
    each frame's bytes before encoding the next (the compressor's state is the stream's)."""

    def __init__(self) -> None:
        self._deflate = zlib.compressobj(9, zdict=DICTIONARY)

    @staticmethod
    def _control(kind: int, flags: int, payload: bytes) -> bytes:
        return struct.pack("!II", 0x80000000 | VERSION << 16 | kind, flags << 24 | len(payload)) + payload

    def _block(self, headers: dict[str, str]) -> bytes:
        return self._deflate.compress(encode_headers(headers)) + self._deflate.flush(zlib.Z_SYNC_FLUSH)

    def syn_stream(self, stream_id: int, headers: dict[str, str], *, fin: bool = False) -> bytes:
        return self._control(SYN_STREAM, FLAG_FIN if fin else 0,
                             struct.pack("!IIBB", stream_id, 0, 0, 0) + self._block(headers))

    def syn_reply(self, stream_id: int, headers: dict[str, str] | None = None, *, fin: bool = False) -> bytes:
        return self._control(SYN_REPLY, FLAG_FIN if fin else 0, struct.pack("!I", stream_id) + self._block(headers or {}))

    def rst_stream(self, stream_id: int, status: int) -> bytes:
        return self._control(RST_STREAM, 0, struct.pack("!II", stream_id, status))

    def ping(self, ping_id: int) -> bytes:
        return self._control(PING, 0, struct.pack("!I", ping_id))

    def goaway(self, last_good: int, status: int = 0) -> bytes:
        return self._control(GOAWAY, 0, struct.pack("!II", last_good, status))

    @staticmethod
    def data(stream_id: int, payload: bytes, *, fin: bool = False) -> bytes:
        out = []
        for at in range(0, max(len(payload), 1), MAX_DATA):
            chunk = payload[at:at + MAX_DATA]
            last = at + MAX_DATA >= len(payload)
            out.append(struct.pack("!II", stream_id & 0x7FFFFFFF, (FLAG_FIN if fin and last else 0) << 24 | len(chunk))
                       + chunk)
        return b"".join(out)
