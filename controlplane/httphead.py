"""Reading one HTTP/1.x request head (request line and header fields) off a connection.

The standard library parses request headers with the `email` package's feed parser (a MIME parser, built for
mail), which cost the embedded server about a fifth of its CPU per request. This is the small subset an HTTP
server needs, with the limits `http.server` applies (a line of at most 65,536 bytes, at most 100 header
lines) and the status codes it answers with. Header names are matched case-insensitively; a name given twice
keeps both values, in order (`get` answers the first, as `email.message.Message.get` does).

Malformed header lines (no colon, a name that is not an RFC 9110 token, a continuation line before any field)
are a 400, as Go's net/http (kube-apiserver) answers them. Obsolete line folding (a line starting with a space
or tab) continues the previous field's value, the fold replaced by one space (RFC 9112, section 5.2).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

MAX_LINE = 65536  # http.server's and http.client's _MAXLINE
MAX_HEADERS = 100  # http.client's _MAXHEADERS
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_READ_LIMIT = MAX_LINE + 1
_END = frozenset({b"\r\n", b"\n", b""})
_EOL = "\r\n"
_VERSION = re.compile(r"^HTTP/([0-9]{1,10})\.([0-9]{1,10})$")


class LineReader(Protocol):
    def readline(self, size: int = -1, /) -> bytes: ...


class HeadError(Exception):
    """A request head the server refuses: `code` is the HTTP status, `message` the reason given to the client."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Headers:
    """Header fields in arrival order; lookups ignore case."""

    __slots__ = ("fields", "_index")

    def __init__(self, fields: list[tuple[str, str]] | None = None) -> None:
        self.fields: list[tuple[str, str]] = fields if fields is not None else []
        index: dict[str, list[str]] = {}
        for name, value in self.fields:
            key = name.lower()
            if key in index:
                index[key].append(value)
            else:
                index[key] = [value]
        self._index = index

    def add(self, name: str, value: str) -> None:
        self.fields.append((name, value))
        values = self._index.get(name.lower())
        if values is None:
            self._index[name.lower()] = [value]
        else:
            values.append(value)

    def get(self, name: str, default: Any = None) -> Any:
        """The first value of `name`, or `default` when absent."""
        values = self._index.get(name.lower())
        return values[0] if values else default

    def get_all(self, name: str, default: Any = None) -> Any:
        """Every value of `name` in order, or `default` when absent."""
        values = self._index.get(name.lower())
        return list(values) if values else default

    def __getitem__(self, name: str) -> str | None:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._index

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __repr__(self) -> str:
        return f"Headers({self.fields!r})"

    def items(self) -> list[tuple[str, str]]:
        return list(self.fields)

    def keys(self) -> list[str]:
        return [name for name, _ in self.fields]

    def values(self) -> list[str]:
        return [value for _, value in self.fields]


@dataclass(frozen=True)
class RequestLine:
    method: str
    target: str
    version: str  # "HTTP/1.1", "HTTP/1.0", ... or "HTTP/0.9" for a two-word GET
    version_number: tuple[int, int]


def parse_request_line(raw: bytes) -> RequestLine | None:
    """The request line `raw` (with its line ending); None for an empty line, HeadError when malformed.
    The checks and messages are http.server's."""
    text = str(raw, "iso-8859-1").rstrip("\r\n")
    words = text.split()
    if not words:
        return None
    version, number = "HTTP/0.9", (0, 9)
    if len(words) >= 3:
        version = words[-1]
        m = _VERSION.match(version)
        if m is None:
            raise HeadError(400, f"Bad request version ({version!r})")
        number = (int(m.group(1)), int(m.group(2)))
        if number >= (2, 0):
            raise HeadError(505, f"Invalid HTTP version ({version[5:]})")
    if not 2 <= len(words) <= 3:
        raise HeadError(400, f"Bad request syntax ({text!r})")
    method, target = words[0], words[1]
    if len(words) == 2 and method != "GET":
        raise HeadError(400, f"Bad HTTP/0.9 request type ({method!r})")
    if target.startswith("//"):
        target = "/" + target.lstrip("/")  # as http.server: never a scheme-relative URL
    return RequestLine(method, target, version, number)


def read_headers(rfile: LineReader) -> Headers:
    """Header lines up to the empty line (or the end of input); HeadError (431 or 400) when over the limits
    or malformed."""
    fields: list[tuple[str, str]] = []
    readline = rfile.readline
    lines = 0
    while True:
        line = readline(_READ_LIMIT)
        if len(line) > MAX_LINE:
            raise HeadError(431, "Line too long")
        if line in _END:
            break
        lines += 1
        if lines > MAX_HEADERS:  # every line counts, folded ones too, as in http.client
            raise HeadError(431, "Too many headers")
        text = line.decode("iso-8859-1")
        if text[0] in " \t":
            # Obsolete line folding: the value continues, the fold read as one space.
            more = text.strip(" \t\r\n")
            if not fields:
                raise HeadError(400, f"malformed MIME header initial line: {text.rstrip(_EOL)!r}")
            if more:
                name, value = fields[-1]
                fields[-1] = (name, f"{value} {more}" if value else more)
            continue
        name, colon, value = text.partition(":")
        if not colon or not _TOKEN.match(name):
            raise HeadError(400, f"malformed MIME header line: {text.rstrip(_EOL)!r}")
        fields.append((name, value.strip(" \t\r\n")))
    return Headers(fields)


def connection_tokens(headers: Headers) -> set[str]:
    """The lower-cased options of every Connection field ("close", "keep-alive", ...)."""
    return {t.strip().lower() for v in headers.get_all("Connection", []) for t in v.split(",") if t.strip()}
