"""One HTTP/1.1 request and its response on a connection of urllib3's pool, without `http.client`.

Why: `http.client` builds each request header by header and parses each response's headers with the `email`
package; on loopback that cost about 10x the socket work (`bench kubeapi`: ~250 µs of client CPU per GET against
~25 µs here). The connection still comes from, and goes back to, the ApiClient's urllib3 pool, so TLS, the
connect timeout and the pool's size and liveness checks stay the official client's.

Only what the API server speaks to KubeApi is read: a status line, headers, and a body with Content-Length,
chunked transfer coding, or (Connection: close) until the end of the stream; a watch's body is read as a
`Stream` of lines.
"""

from __future__ import annotations

import io
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

MAX_LINE = 65536  # longest status or header line accepted (http.client's limit)
MAX_HEADERS = 100  # as http.client


class ProtocolError(OSError):
    """The peer broke the protocol or the connection; nothing of a response was usable."""


class NothingSent(ProtocolError):
    """The connection broke before the whole request was written: the server cannot have acted on it."""


class NothingReceived(ProtocolError):
    """The connection ended (or was reset) before any byte of a response, after the request was written: a
    kept-alive connection the server had closed, or a server that went away while handling the request."""


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]  # lower-cased names; a repeated header keeps its last value
    data: bytes
    keep_alive: bool


def encode_request(method: str, target: str, host: str, headers: dict[str, Any], body: bytes | None) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if body is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body or b'')}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + body if body else head


def exchange(sock: socket.socket, request: bytes, *, bodyless: bool = False, stream: bool = False) -> Reply | Stream:
    """Send `request` and read the response: whole, or (`stream`, and a 2xx status) as a Stream of lines that
    owns the socket from then on. `bodyless` for a HEAD request."""
    try:
        sock.sendall(request)
    except (BrokenPipeError, ConnectionResetError) as exc:
        raise NothingSent(f"the connection broke while sending the request: {exc}") from exc
    reader = sock.makefile("rb")
    handed_over = False
    try:
        status, headers, keep_alive = read_head(reader)
        if stream and 200 <= status < 300:
            handed_over = True
            return Stream(sock, reader, headers)
        return read_rest(reader, status, headers, keep_alive, bodyless=bodyless)
    finally:
        if not handed_over:
            reader.close()  # the socket stays open: makefile readers share it


def read_rest(reader: io.BufferedIOBase, status: int, headers: dict[str, str], keep_alive: bool, *,
              bodyless: bool = False) -> Reply:
    """The body after `read_head`, read whole."""
    if bodyless or status in (204, 304) or 100 <= status < 200:
        return Reply(status, headers, b"", keep_alive)
    if _chunked(headers):
        return Reply(status, headers, b"".join(_chunks(reader)), keep_alive)
    length = headers.get("content-length")
    if length is not None:
        try:
            size = int(length)
        except ValueError:
            raise ProtocolError(f"Content-Length {length!r} is not a number") from None
        data = reader.read(size) if size else b""
        if len(data) != size:
            raise ProtocolError(f"the connection ended after {len(data)} of {size} body bytes")
        return Reply(status, headers, data, keep_alive)
    # Neither length nor chunks: the body runs to the end of the connection, which cannot be reused.
    return Reply(status, headers, reader.read(), False)


def read_head(reader: io.BufferedIOBase) -> tuple[int, dict[str, str], bool]:
    """Status, headers (lower-cased names) and whether the connection may be reused."""
    try:
        line = reader.readline(MAX_LINE + 1)
    except ConnectionResetError as exc:
        raise NothingReceived(f"the connection was reset before a response: {exc}") from exc
    if not line:
        raise NothingReceived("the server closed the connection without a response")
    status, version = _status_line(line)
    headers: dict[str, str] = {}
    count = 0
    while True:
        raw = reader.readline(MAX_LINE + 1)
        if len(raw) > MAX_LINE:
            raise ProtocolError("response header line too long")
        if raw in (b"\r\n", b"\n"):
            break
        if not raw:
            raise ProtocolError("the connection ended inside the response headers")
        count += 1
        if count > MAX_HEADERS:
            raise ProtocolError(f"more than {MAX_HEADERS} response headers")
        name, sep, value = raw.decode("latin-1").partition(":")
        if not sep:
            raise ProtocolError(f"malformed response header line {raw[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
    return status, headers, keep_alive


class Stream:
    """A response body read line by line as it arrives (a watch), on a connection it owns until closed: chunked,
    or until the connection ends."""

    def __init__(self, sock: socket.socket, reader: io.BufferedIOBase, headers: dict[str, str]) -> None:
        self._sock = sock
        self._reader = reader
        self._chunked = _chunked(headers)
        self.closed = False
        self.on_close: Callable[[], None] | None = None  # what owns the connection: hand it back

    def __iter__(self) -> Iterator[bytes]:
        if not self._chunked:
            yield from self._reader
            return
        pending = b""
        for chunk in _chunks(self._reader):
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            yield from lines
        if pending:
            yield pending

    def shutdown(self) -> None:
        """Make a read blocked in another thread return (the stream then ends)."""
        self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._reader.close()
        if self.on_close is not None:
            self.on_close()


def _status_line(line: bytes) -> tuple[int, str]:
    if len(line) > MAX_LINE:
        raise ProtocolError("response status line too long")
    parts = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit() or len(parts[1]) != 3:
        raise ProtocolError(f"malformed response status line {line[:80]!r}")
    return int(parts[1]), parts[0]


def _chunked(headers: dict[str, str]) -> bool:
    return "chunked" in headers.get("transfer-encoding", "").lower()


def _chunks(reader: io.BufferedIOBase) -> Iterator[bytes]:
    while True:
        size_line = reader.readline(MAX_LINE + 1)
        if not size_line:
            raise ProtocolError("the connection ended inside a chunked body")
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise ProtocolError(f"malformed chunk size line {size_line[:80]!r}") from None
        if size == 0:
            break
        chunk = reader.read(size)
        if len(chunk) != size or reader.read(2) != b"\r\n":
            raise ProtocolError("the connection ended inside a chunk")
        yield chunk
    while True:  # trailer fields, up to the blank line
        trailer = reader.readline(MAX_LINE + 1)
        if trailer in (b"\r\n", b"\n", b""):
            return
