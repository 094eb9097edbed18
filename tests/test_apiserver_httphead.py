"""The API server's own request-head parser (controlplane.httphead), alone and on the wire."""

from __future__ import annotations

import io
import json
import socket
from urllib.parse import urlsplit

import pytest

from controlplane import EmbeddedApiServer
from controlplane.httphead import MAX_HEADERS, MAX_LINE, HeadError, connection_tokens, parse_request_line, read_headers

LEASES = "/apis/coordination.k8s.io/v1/namespaces/default/leases"


def _headers(raw: bytes) -> tuple[object, bytes]:
    f = io.BufferedReader(io.BytesIO(raw))  # type: ignore[arg-type]
    return read_headers(f), f.read()


# ----- the request line ---------------------------------------------------------------------------------------


def test_request_line_fields() -> None:
    line = parse_request_line(b"PATCH /api/v1/pods?x=1 HTTP/1.1\r\n")
    assert line is not None
    assert (line.method, line.target, line.version, line.version_number) == ("PATCH", "/api/v1/pods?x=1", "HTTP/1.1", (1, 1))
    old = parse_request_line(b"GET /api HTTP/1.0\n")
    assert old is not None and old.version_number == (1, 0)
    simple = parse_request_line(b"GET /api\r\n")  # HTTP/0.9
    assert simple is not None and simple.version == "HTTP/0.9" and simple.version_number == (0, 9)
    collapsed = parse_request_line(b"GET //evil.example/x HTTP/1.1\r\n")
    assert collapsed is not None and collapsed.target == "/evil.example/x"
    assert parse_request_line(b"\r\n") is None
    assert parse_request_line(b"   \r\n") is None


@pytest.mark.parametrize("raw,code,text", [
    (b"GARBAGE\r\n", 400, "Bad request syntax ('GARBAGE')"),
    (b"GET / x HTTP/1.1\r\n", 400, "Bad request syntax"),
    (b"GET / HTTQ/1.1\r\n", 400, "Bad request version ('HTTQ/1.1')"),
    (b"GET / HTTP/1\r\n", 400, "Bad request version"),
    (b"GET / HTTP/1.x\r\n", 400, "Bad request version"),
    (b"GET / HTTP/12345678901.1\r\n", 400, "Bad request version"),
    (b"GET / HTTP/2.0\r\n", 505, "Invalid HTTP version (2.0)"),
    (b"POST /api\r\n", 400, "Bad HTTP/0.9 request type ('POST')"),
])
def test_malformed_request_lines(raw: bytes, code: int, text: str) -> None:
    with pytest.raises(HeadError) as err:
        parse_request_line(raw)
    assert err.value.code == code and text in err.value.message


# ----- header fields --------------------------------------------------------------------------------------------


def test_headers_case_insensitive_duplicates_and_what_follows_is_untouched() -> None:
    headers, rest = _headers(b"Host: x\r\ncontent-TYPE:  application/json \r\nX-A: 1\r\nx-a: 2\r\n\r\n{\"body\":1}")
    assert headers.get("Content-Type") == "application/json"  # type: ignore[attr-defined]
    assert headers["HOST"] == "x"  # type: ignore[index]
    assert headers.get("X-A") == "1" and headers.get_all("x-A") == ["1", "2"]  # type: ignore[attr-defined]
    assert headers.get("Missing") is None and headers.get("Missing", "d") == "d"  # type: ignore[attr-defined]
    assert headers.get_all("Missing") is None  # type: ignore[attr-defined]
    assert "content-type" in headers and "missing" not in headers  # type: ignore[operator]
    assert headers.keys() == ["Host", "content-TYPE", "X-A", "x-a"]  # type: ignore[attr-defined]
    assert rest == b"{\"body\":1}"


def test_headers_end_at_a_bare_newline_or_the_end_of_input() -> None:
    headers, rest = _headers(b"A: 1\nB: 2\n\nbody")
    assert headers.get("B") == "2" and rest == b"body"  # type: ignore[attr-defined]
    headers, rest = _headers(b"A: 1\r\n")
    assert headers.get("A") == "1" and rest == b""  # type: ignore[attr-defined]
    headers, _ = _headers(b"Empty:\r\n\r\n")
    assert headers.get("Empty") == ""  # type: ignore[attr-defined]


def test_folded_header_lines_join_with_one_space() -> None:
    headers, _ = _headers(b"Accept: application/json;as=Table,\r\n \t application/json\r\nX: y\r\n\r\n")
    assert headers.get("Accept") == "application/json;as=Table, application/json"  # type: ignore[attr-defined]
    assert headers.get("X") == "y"  # type: ignore[attr-defined]


@pytest.mark.parametrize("raw", [
    b"NoColonHere\r\n\r\n",
    b"Bad Name: x\r\n\r\n",
    b"Bad : x\r\n\r\n",
    b": no name\r\n\r\n",
    b" leading-fold: x\r\n\r\n",
])
def test_malformed_header_lines_are_400(raw: bytes) -> None:
    with pytest.raises(HeadError) as err:
        _headers(raw)
    assert err.value.code == 400 and "malformed MIME header" in err.value.message


def test_header_limits_are_431() -> None:
    ok, _ = _headers(b"".join(b"X-%d: y\r\n" % i for i in range(MAX_HEADERS)) + b"\r\n")
    assert len(ok) == MAX_HEADERS  # type: ignore[arg-type]
    with pytest.raises(HeadError) as err:
        _headers(b"".join(b"X-%d: y\r\n" % i for i in range(MAX_HEADERS + 1)) + b"\r\n")
    assert (err.value.code, err.value.message) == (431, "Too many headers")
    with pytest.raises(HeadError) as err:
        _headers(b"X: " + b"a" * MAX_LINE + b"\r\n\r\n")
    assert (err.value.code, err.value.message) == (431, "Line too long")


def test_connection_options() -> None:
    headers, _ = _headers(b"Connection: Keep-Alive, Upgrade\r\nconnection: close\r\n\r\n")
    assert connection_tokens(headers) == {"keep-alive", "upgrade", "close"}  # type: ignore[arg-type]
    none, _ = _headers(b"\r\n")
    assert connection_tokens(none) == set()  # type: ignore[arg-type]


# ----- on the wire ------------------------------------------------------------------------------------------------


def _raw(srv: EmbeddedApiServer, request: bytes) -> bytes:
    u = urlsplit(srv.url)
    assert u.hostname and u.port
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(request)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def _answers(raw: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Every response in `raw`: status, lower-cased headers and body (Content-Length framed)."""
    out = []
    while raw:
        head, _, raw = raw.partition(b"\r\n\r\n")
        lines = head.decode("iso-8859-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        code = int(lines[0].split()[1])
        if code == 100:
            out.append((code, headers, b""))
            continue
        length = int(headers["content-length"])
        out.append((code, headers, raw[:length]))
        raw = raw[length:]
    return out


def test_malformed_header_on_the_wire_is_400_status_and_closes(server: EmbeddedApiServer) -> None:
    answers = _answers(_raw(server, b"GET /api HTTP/1.1\r\nHost x\r\n\r\nGET /api HTTP/1.1\r\n\r\n"))
    assert len(answers) == 1  # the connection is closed after the refusal: the second request is not served
    code, headers, body = answers[0]
    status = json.loads(body)
    assert code == 400 and headers["connection"] == "close"
    assert status["kind"] == "Status" and "malformed MIME header line" in status["message"]


def test_pipelined_requests_with_folded_and_duplicate_headers(server: EmbeddedApiServer) -> None:
    lease = json.dumps({"metadata": {"name": "piped"}, "spec": {}}).encode()
    request = (b"POST " + LEASES.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json;\r\n"
               b"  charset=utf-8\r\nX-Dup: 1\r\nX-Dup: 2\r\nContent-Length: %d\r\n\r\n%b" % (len(lease), lease))
    get = b"GET " + LEASES.encode() + b"/piped HTTP/1.1\r\nhost: x\r\nCONNECTION: close\r\n\r\n"
    answers = _answers(_raw(server, request + get))
    assert [a[0] for a in answers] == [201, 200]
    assert json.loads(answers[1][2])["metadata"]["name"] == "piped"
    assert answers[1][1]["connection"] == "close"


def test_duplicate_content_length_is_400(server: EmbeddedApiServer) -> None:
    answers = _answers(_raw(server, b"POST " + LEASES.encode() + b" HTTP/1.1\r\nContent-Length: 2\r\n"
                                    b"content-length: 2\r\n\r\n{}"))
    assert answers[0][0] == 400 and "Content-Length" in json.loads(answers[0][2])["message"]


def test_missing_content_length_is_an_empty_body(server: EmbeddedApiServer) -> None:
    answers = _answers(_raw(server, b"POST " + LEASES.encode() + b" HTTP/1.1\r\nConnection: close\r\n\r\n"))
    code, _, body = answers[0]
    assert code == 400 and "must be a JSON object" in json.loads(body)["message"]


def test_expect_100_continue_then_the_answer(server: EmbeddedApiServer) -> None:
    lease = json.dumps({"metadata": {"name": "expect"}, "spec": {}}).encode()
    answers = _answers(_raw(server, b"POST " + LEASES.encode() + b" HTTP/1.1\r\nExpect: 100-continue\r\n"
                                    b"Connection: close\r\nContent-Length: %d\r\n\r\n%b" % (len(lease), lease)))
    assert [a[0] for a in answers] == [100, 201]


def test_http_1_0_closes_unless_kept_alive(server: EmbeddedApiServer) -> None:
    get = b"GET " + LEASES.encode() + b" HTTP/1.0\r\n\r\n"
    answers = _answers(_raw(server, get + get))
    assert len(answers) == 1 and answers[0][0] == 200 and answers[0][1]["connection"] == "close"


def test_blank_request_line_closes_without_an_answer(server: EmbeddedApiServer) -> None:
    assert _raw(server, b"\r\nGET /api HTTP/1.1\r\n\r\n") == b""
