"""gpudra.http1: the lean request/response exchange KubeApi uses on its pool's connections."""

from __future__ import annotations

import io
import socket
import threading
from typing import Any

import pytest

from gpudra import http1
from gpudra.kubeapi import ApiError, KubeApi


def reply_of(raw: bytes, **kwargs: Any) -> http1.Reply:
    reader = io.BufferedReader(io.BytesIO(raw))  # type: ignore[arg-type]
    return http1.read_rest(reader, *http1.read_head(reader), **kwargs)


def test_content_length_chunked_and_until_close_bodies() -> None:
    r = reply_of(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
    assert (r.status, r.headers["content-type"], r.data, r.keep_alive) == (201, "application/json", b"{}", True)
    r = reply_of(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-T: 1\r\n\r\n")
    assert r.data == b"abcde" and r.keep_alive
    r = reply_of(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nrest of stream")
    assert r.data == b"rest of stream" and not r.keep_alive
    r = reply_of(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")
    assert r.data == b"" and not r.keep_alive  # HTTP/1.0 without keep-alive closes
    r = reply_of(b"HTTP/1.1 204 No Content\r\n\r\n")
    assert (r.status, r.data) == (204, b"")
    assert reply_of(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", bodyless=True).data == b""


@pytest.mark.parametrize(("raw", "message"), [
    (b"", "without a response"),
    (b"SPDY/3 200 OK\r\n\r\n", "malformed response status line"),
    (b"HTTP/1.1 2000 OK\r\n\r\n", "malformed response status line"),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed response header line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "after 5 of 10 body bytes"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", "is not a number"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", "inside a chunk"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n", "inside the response headers"),
    (b"HTTP/1.1 200 OK\r\n" + b"X: 1\r\n" * 101 + b"\r\n", "more than 100 response headers"),
    (b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70000 + b"\r\n\r\n", "header line too long"),
])
def test_broken_responses_are_protocol_errors(raw: bytes, message: str) -> None:
    with pytest.raises(http1.ProtocolError, match=message):
        reply_of(raw)


def test_requests_carry_host_headers_and_length() -> None:
    req = http1.encode_request("PUT", "/api/v1/x?y=1", "h:1", {"Accept": "application/json"}, b'{"a":1}')
    assert req == b'PUT /api/v1/x?y=1 HTTP/1.1\r\nHost: h:1\r\nAccept: application/json\r\nContent-Length: 7\r\n\r\n{"a":1}'
    assert b"Content-Length" not in http1.encode_request("GET", "/", "h", {}, None)
    assert b"Content-Length: 0" in http1.encode_request("POST", "/", "h", {}, None)


def test_a_kept_alive_connection_that_ends_without_a_response_is_retried_only_for_idempotent_requests() -> None:
    """Each connection answers one request, then reads the next one and closes without answering (a server that
    closed the idle connection meanwhile). A GET goes again on a fresh connection; a POST is not repeated (the
    server could have acted on it), as Go's net/http decides."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    served: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn, conn.makefile("rb") as rfile:
                line = rfile.readline()
                length = 0
                while (header := rfile.readline()) not in (b"\r\n", b""):
                    if header.lower().startswith(b"content-length:"):
                        length = int(header.split(b":")[1])
                served.append(line + rfile.read(length))
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n{\"ok\": true}")
                rfile.readline()  # the next request arrives; the connection closes unanswered

    threading.Thread(target=serve, daemon=True).start()
    api = KubeApi.connect(url=f"http://127.0.0.1:{port}")
    api.retries = 0  # only the fresh-connection retry of the exchange itself
    try:
        assert api._call("GET", "/api/v1/nodes") == {"ok": True}
        assert api._call("GET", "/api/v1/nodes") == {"ok": True}  # its first connection died unanswered
        with pytest.raises(ApiError, match="ConnectionError|without a response"):
            api._call("POST", "/api/v1/namespaces", body={"metadata": {"name": "x"}})
        assert [s.split(b" ")[0] for s in served] == [b"GET", b"GET"]
    finally:
        api.close()
        listener.close()


def test_a_stream_yields_lines_across_chunk_boundaries_and_hands_its_connection_back_once() -> None:
    left, right = socket.socketpair()
    try:
        right.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                      b"6\r\n{\"a\":1\r\n" b"8\r\n}\n{\"b\":2\r\n" b"2\r\n}\n\r\n" b"0\r\n\r\n")
        stream = http1.exchange(left, b"GET /watch HTTP/1.1\r\n\r\n", stream=True)
        assert isinstance(stream, http1.Stream)
        handed_back: list[bool] = []
        stream.on_close = lambda: handed_back.append(True)
        assert list(stream) == [b'{"a":1}', b'{"b":2}']
        stream.close()
        stream.close()
        assert stream.closed and handed_back == [True]
        # An error status is read whole, not streamed.
        right.sendall(b"HTTP/1.1 410 Gone\r\nContent-Length: 2\r\n\r\n{}")
        reply = http1.exchange(left, b"GET /watch HTTP/1.1\r\n\r\n", stream=True)
        assert isinstance(reply, http1.Reply) and (reply.status, reply.data) == (410, b"{}")
    finally:
        left.close()
        right.close()
