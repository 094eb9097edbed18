"""HTTP serving for the embedded control plane: the connection (request head, body, responses) and the filter
chain (authentication, impersonation, authorization, admission set up for writes) in front of the REST handlers
of controlplane.handlers (reads, writes, subresources, discovery) and controlplane.watchserve."""

from __future__ import annotations

import dataclasses
import json
import re
import select
import socket
import time
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from controlplane import filters, httphead
from controlplane import resources as res
from controlplane import status as st
from controlplane import health, protobuf
from controlplane.admission.chain import RequestAdmission
from controlplane.admission.request import AdmissionRequest
from controlplane.audit.event import AuditEvent
from controlplane.authn import UserInfo
from controlplane.handlers import discovery, reads, subresources, writes
from controlplane.protobufbodies import protobuf_request, protobuf_response
from controlplane.params import bool_param
from controlplane.routing import Route, ServerContext, encode
from controlplane.serving import wait_ready
from controlplane.watchserve import WatchStream
from gpudra import strictjson

# kube-apiserver's limit on a request body it decodes (MaxRequestBodyBytes, 3 MiB): larger is 413.
MAX_BODY_BYTES = 3 * 1024 * 1024
_WRITE_TIMEOUT_S = 30.0
_LINGER_S = 2.0  # a refused request's unread body is read and dropped until the client is silent this long
_LINGER_MAX_BYTES = 64 * 1024 * 1024
_DIGITS = re.compile(r"^[0-9]+$")
_POD_CONNECT = frozenset({"exec", "attach", "portforward"})
_OPERATIONS = {"POST": "CREATE", "PUT": "UPDATE", "PATCH": "UPDATE", "DELETE": "DELETE"}


class SocketWriter:
    """The handler's `wfile` on a non-blocking socket: whole writes, each wait for the client to read bounded
    by a timeout, so a client that stops reading cannot hold a thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        sent = 0
        while sent < len(view):
            try:
                sent += self.sock.send(view[sent:])
            except (BlockingIOError, InterruptedError):
                if not wait_ready(self.sock, select.POLLOUT, _WRITE_TIMEOUT_S):
                    raise TimeoutError("the client did not read the response in time") from None
        return len(view)

    def flush(self) -> None:
        return None

    def close(self) -> None:
        return None


class ApiHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gpu-dra-apiserver"
    # Responses are written in one piece; Nagle would hold small ones back for a delayed ACK.
    disable_nagle_algorithm = True
    # http.server types these as a buffered file and an email Message; this handler duck-types both with its own
    # (a socket writer with whole writes, controlplane.httphead's header index).
    wfile: SocketWriter  # type: ignore[assignment]
    headers: httphead.Headers  # type: ignore[assignment]
    _ctx: ServerContext
    _audit: AuditEvent | None = None  # the request's audit event (controlplane.audit), when one is recorded

    @classmethod
    def for_connection(cls, conn: Any, server: Any, ctx: ServerContext) -> ApiHandler:
        """A handler for a pooled connection: serves one request per `serve_one` call, kept across requests."""
        h = cls.__new__(cls)
        h.request = h.connection = conn.sock
        h.client_address = conn.address
        h.server = server
        h._ctx = ctx
        h.rfile = conn.rfile
        h.wfile = SocketWriter(conn.sock)
        return h

    def serve_one(self) -> bool:
        """Handle one request; False when the connection must be closed afterwards."""
        self._warnings: list[str] = []
        self.handle_one_request()
        return not self.close_connection

    def handle_one_request(self) -> None:
        """Read one request head (controlplane.httphead, not the stdlib's MIME parser) and dispatch it to
        `do_<METHOD>`, with http.server's limits, status codes and keep-alive rules."""
        self.close_connection = True
        self.command = ""
        self.requestline = ""
        self.request_version = "HTTP/1.1"
        try:
            raw = self.rfile.readline(httphead.MAX_LINE + 1)
            if len(raw) > httphead.MAX_LINE:
                self.send_error(414)
                return
            if not raw:
                return  # the client closed the connection
            self.raw_requestline = raw
            self.requestline = str(raw, "iso-8859-1").rstrip("\r\n")
            try:
                line = httphead.parse_request_line(raw)
                if line is None:
                    return  # an empty line: http.server closes the connection without an answer
                self.request_version = line.version
                self.headers = httphead.read_headers(self.rfile)
            except httphead.HeadError as err:
                self.send_error(err.code, err.message)
                return
            self.command, self.path = line.method, line.target
            # HTTP/1.1 keeps the connection unless told otherwise; HTTP/1.0 closes it unless told otherwise.
            self.close_connection = line.version_number < (1, 1)
            options = httphead.connection_tokens(self.headers)
            if "close" in options:
                self.close_connection = True
            elif "keep-alive" in options:
                self.close_connection = False
            if ((self.headers.get("Expect") or "").lower() == "100-continue"
                    and line.version_number >= (1, 1)):
                self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            method = getattr(self, "do_" + line.method, None)
            if method is None:
                self.send_error(501, f"Unsupported method ({line.method!r})")
                return
            method()
        except TimeoutError:
            self.close_connection = True

    @property
    def ctx(self) -> ServerContext:
        return self._ctx

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature fixed by the base class
        return  # per-request access logs would swamp the structured logs of the processes using us

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # No access log (as log_message); a long-running response's audit event is at ResponseStarted.
        if self._audit is not None:
            self._audit.started(code)

    # ----- plumbing ------------------------------------------------------------------------------------------

    def _connection_header(self) -> str:
        # HTTP/1.0 clients keep the connection only when told so; 1.1 clients are told when it closes.
        if self.close_connection:
            return "Connection: close\r\n"
        if self.request_version == "HTTP/1.0":
            return "Connection: keep-alive\r\n"
        return ""

    def _send(self, code: int, body: bytes, content_type: str = "application/json") -> None:
        warnings = "".join(f"Warning: 299 - {json.dumps(w)}\r\n" for w in getattr(self, "_warnings", ()))
        head = (f"HTTP/1.1 {code} {self.responses.get(code, ('',))[0]}\r\n"
                f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                f"Cache-Control: no-cache, private\r\n{warnings}{self._connection_header()}\r\n").encode()
        if self._audit is not None:
            self._audit.respond(code, body, content_type)
        self.wfile.write(head + body)
        self.log_request(code)

    def _send_json(self, code: int, value: Any) -> None:
        if getattr(self, "_protobuf_out", False) and isinstance(value, dict):
            body = protobuf_response(value)  # None: no message type for it, answered in JSON (the client's fallback)
            if body is not None:
                self._send(code, body, protobuf.MEDIA_TYPE)
                return
        self._send(code, self.ctx.store.json_of(value) if isinstance(value, dict) else encode(value))

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Protocol-level errors of the base class (malformed request line, oversized headers, unknown method)
        answered with a Status body like every other error, and the connection closed."""
        self.close_connection = True
        reasons = {400: "BadRequest", 404: "NotFound", 405: "MethodNotAllowed", 408: "Timeout",
                   413: "RequestEntityTooLarge", 414: "RequestURITooLong", 431: "RequestHeaderFieldsTooLarge",
                   501: "MethodNotAllowed", 505: "BadRequest"}
        text = message or self.responses.get(code, ("error",))[0]
        if not hasattr(self, "request_version"):
            self.request_version = "HTTP/1.1"
        try:
            self._send_json(code, st.StatusError(code, reasons.get(code, "BadRequest"), text).body())
        except OSError:
            pass

    def _send_error(self, err: st.StatusError) -> None:
        self._send_json(err.code, err.body())

    def _read_raw_body(self) -> bytes:
        chunked = "chunked" in (self.headers.get("Transfer-Encoding") or "").lower()
        text = self.headers.get("Content-Length")
        if chunked:
            return self._read_chunked()
        if text is None or text.strip() == "":
            return b""
        if len(self.headers.get_all("Content-Length") or []) > 1 or not _DIGITS.match(text.strip()):
            self.close_connection = True
            raise st.bad_request(f"Content-Length: Invalid value: {json.dumps(text)}: must be a non-negative "
                                 "decimal number of bytes")
        length = int(text.strip())
        if length > MAX_BODY_BYTES:
            self.close_connection = True  # the body stays unread
            raise st.StatusError(413, "RequestEntityTooLarge", f"Request entity too large: limit is {MAX_BODY_BYTES}")
        raw = self.rfile.read(length) if length else b""
        if len(raw) != length:
            self.close_connection = True
            raise st.bad_request(f"the request body ended after {len(raw)} of the {length} bytes in Content-Length")
        return raw

    def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(1024)
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                size = -1
            if size < 0 or not line.endswith(b"\n"):
                self.close_connection = True
                raise st.bad_request("the chunked request body is malformed")
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            total += size
            if total > MAX_BODY_BYTES:
                self.close_connection = True
                raise st.StatusError(413, "RequestEntityTooLarge", f"Request entity too large: limit is {MAX_BODY_BYTES}")
            data = self.rfile.read(size)
            if len(data) != size or self.rfile.readline(3) not in (b"\r\n", b"\n"):
                self.close_connection = True
                raise st.bad_request("the chunked request body is malformed")
            parts.append(data)

    def _read_body(self) -> Any:
        raw = self._read_raw_body()
        self._duplicates: list[str] = []
        if not raw:
            return None
        media_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if media_type == protobuf.MEDIA_TYPE:
            return protobuf_request(raw)
        if self.command != "PATCH" and media_type not in ("", "application/json"):
            # As kube-apiserver's input negotiation: a body is decoded only as a media type the server serves (none
            # given is JSON); the patch handler checks the patch media types itself.
            raise st.StatusError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                                 f"accepted media types include: application/json, {protobuf.MEDIA_TYPE}")
        try:
            value, self._duplicates = strictjson.decode(raw)
            return value
        except strictjson.StrictJsonError as exc:
            raise st.bad_request(f"the request body is not valid JSON: {exc}; this server accepts JSON and "
                                 f"{protobuf.MEDIA_TYPE}") from exc

    def _dispatch(self, method: str) -> None:
        self._protobuf_out = False
        self._audit = None
        try:
            if self.path.startswith("/") and "#" not in self.path:
                path, _, raw_query = self.path.partition("?")  # what urlsplit gives for an origin-form target
            else:
                url = urlsplit(self.path)
                path, raw_query = url.path, url.query
            query = {k: v[-1] for k, v in parse_qs(raw_query, keep_blank_values=True).items()} if raw_query else {}
            self._route(method, path, query)
        except st.StatusError as err:
            self._drain()
            self._send_error(err)
            if self.close_connection and not getattr(self, "_body_read", True):
                self._lingering_close()
        except OSError:  # the client went away, or stopped sending or reading in time
            self.close_connection = True
        except Exception as exc:  # a bad request must never take the server down
            self._drain()
            self._send_error(st.StatusError(500, "InternalError", f"internal error: {type(exc).__name__}: {exc}"))
        if self._audit is not None:
            self._audit.complete()
            self._audit = None

    def _lingering_close(self) -> None:
        """After refusing a request whose body was not read (413, bad Content-Length): stop sending, then read
        and drop what the client is still sending, for a bounded time, so that its kernel does not answer
        our close with a reset that discards the response before the client reads it."""
        try:
            self.connection.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + _WRITE_TIMEOUT_S
            dropped = 0
            while dropped < _LINGER_MAX_BYTES:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self.connection.settimeout(min(remaining, _LINGER_S))  # a client silent this long is done
                chunk = self.connection.recv(1 << 16)
                if not chunk:
                    break
                dropped += len(chunk)
        except OSError:
            pass

    def _drain(self) -> None:
        # Unread request bodies would be parsed as the next request on a kept-alive connection.
        if not getattr(self, "_body_read", False):
            self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802 - names fixed by BaseHTTPRequestHandler
        self._body_read = True
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._body_read = False
        self._dispatch("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._body_read = False
        self._dispatch("PUT")

    def do_PATCH(self) -> None:  # noqa: N802
        self._body_read = False
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:  # noqa: N802
        self._body_read = False
        self._dispatch("DELETE")

    def _body(self) -> Any:
        value = self._read_body()
        self._body_read = True
        if self._audit is not None:
            self._audit.request_object(value)
        return value

    # ----- routing -------------------------------------------------------------------------------------------

    def _authenticate(self) -> UserInfo:
        sec = self.ctx.security
        # The internal listener behind the TLS front requires credentials whatever the plain port does.
        strict = getattr(self.server, "requires_credentials", False)
        peer = sec.client_identities(self.client_address) if strict else None
        return filters.authenticate(self.headers.get("Authorization"), sec.authenticator, sec.accounts,
                                    sec.unauthenticated_as_admin and not strict, peer)

    def _route(self, method: str, path: str, query: dict[str, str]) -> None:
        parts = [p for p in path.split("/") if p]
        ctx = self.ctx
        security = ctx.security
        authorizer = security.authorizer
        auditor = ctx.audit
        try:
            authenticated = self._authenticate()
        except st.StatusError:
            if auditor is not None:
                presented = getattr(self.server, "requires_credentials", False) and \
                    security.client_identities(self.client_address) is not None
                auditor.failed_authentication(method, self.path, path, query, self.client_address[0], self.headers,
                                              presented)
            raise
        if auditor is not None:
            self._audit = auditor.begin(method, self.path, path, query, authenticated, self.client_address[0],
                                        self.headers)
        self._user = user = filters.impersonate(authenticated, self.headers, authorizer)
        if self._audit is not None and user is not authenticated:
            self._audit.impersonated(user)
        if method == "GET" and len(parts) == 1 and parts[0] in health.ENDPOINTS:
            filters.authorize(authorizer, filters.path_attributes(user, method, path), self._audit)
            code, text = health.report(parts[0], ctx.store.storage_failure, "verbose" in query)
            self._send(code, text, "text/plain; charset=utf-8")
            return
        if method == "GET":
            doc = discovery.document(self, parts, ctx.registry)
            if doc is not None:
                filters.authorize(authorizer, filters.path_attributes(user, method, path), self._audit)
                if isinstance(doc, tuple):
                    self._send(200, doc[0], doc[1])
                elif isinstance(doc, bytes):
                    self._send(200, doc, "text/plain; charset=utf-8")
                else:
                    self._send_json(200, doc)
                return
        if len(parts) >= 2 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise st.StatusError(404, "NotFound", f"the server could not find the requested resource ({path})")
        route = self._resolve(group, version, rest, path)
        attrs = filters.resource_attributes(user, method, route.rt, route.namespace, route.name,
                                            route.subresource, query)
        filters.authorize(authorizer, attrs, self._audit)
        if (route.subresource in _POD_CONNECT and route.rt.kind == "Pod" and not route.rt.group
                and security.connect_requires_create and attrs.verb != "create"):
            # The pod registry's Connect: a WebSocket upgrade is a GET, authorized above as `get`; it must also
            # be allowed to `create`, as the SPDY POST is.
            authorizer.require(dataclasses.replace(attrs, verb="create"))
        dry_run = query.get("dryRun", "")
        if dry_run not in ("", "All"):
            raise st.bad_request(f"dryRun: Unsupported value: {json.dumps(dry_run)}: supported values: \"All\"")
        if route.rt.virtual or route.subresource == "token":
            subresources.review(self, method, route, user)
            return
        if method == "GET":
            self._serve(method, route, query)  # reads write nothing: no admission
            return
        operation = _OPERATIONS.get(method, "")
        namespace, subresource, verb, api_version, audit = (route.namespace, route.subresource or "", attrs.verb,
                                                            route.version or "", self._audit)

        def request(rt: res.ResourceType, name: str) -> AdmissionRequest:
            return AdmissionRequest(user, operation, rt, namespace, name, subresource, verb, bool(dry_run),
                                    authorizer, api_version, audit)

        store = ctx.store
        self._admit = admit = RequestAdmission(security.admission, request, self._request_warnings)
        with store.admitting(admit):
            if dry_run:
                with store.dry_run():
                    self._serve(method, route, query)
            else:
                self._serve(method, route, query)

    def _request_warnings(self) -> list[str]:
        return self._warnings  # replaced by a write's field policy (handlers.writes), so read when admitted

    def _resolve(self, group: str, version: str, rest: list[str], path: str) -> Route:
        reg = self.ctx.registry
        namespace = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            candidate = reg.by_route(group, version, rest[2])
            if candidate is not None and candidate.namespaced:
                namespace, rest = rest[1], rest[2:]
        if not rest:
            raise st.StatusError(404, "NotFound", f"the server could not find the requested resource ({path})")
        rt = reg.by_route(group, version, rest[0])
        if rt is None:
            gv = f"{group}/{version}" if group else version
            raise st.StatusError(404, "NotFound", f"the server could not find the requested resource ({path}): "
                                                  f"no resource {rest[0]!r} in {gv}")
        if len(rest) > 3:
            raise st.StatusError(404, "NotFound", f"the server could not find the requested resource ({path})")
        name = rest[1] if len(rest) >= 2 else None
        sub = rest[2] if len(rest) == 3 else None
        if sub is not None and not ((sub == "status" and rt.has_status) or sub in rt.extra_subresources):
            raise st.StatusError(404, "NotFound", f"the server could not find the requested resource ({path}): "
                                                  f"{rt.plural} has no subresource {sub!r}")
        if rt.namespaced and name is not None and not namespace:
            raise st.StatusError(404, "NotFound", f"the server could not find the requested resource ({path}): "
                                                  f"{rt.plural} are namespaced; use /namespaces/NAMESPACE/{rt.plural}")
        return Route(rt, namespace, name, sub, version)

    def _serve(self, method: str, r: Route, query: dict[str, str]) -> None:
        """The REST handler of the route (controlplane.handlers), after authorization and with admission set up."""
        self._protobuf_out = protobuf.accepts(self.headers.get("Accept"))
        if r.name is None:
            if method == "GET":
                if bool_param(query, "watch"):
                    WatchStream(self).serve(r, query)
                else:
                    reads.list_objects(self, r, query)
                return
            if method == "POST":
                writes.create(self, r, query)
                return
            raise st.method_not_allowed(f"{method} is not supported on the collection {r.rt.plural}; "
                                        "supported: GET (list, watch) and POST (create)")
        if subresources.serve(self, method, r, query):
            return
        if method == "GET":
            reads.get_object(self, r, query)
        elif method == "PUT":
            writes.update(self, r, query)
        elif method == "PATCH":
            writes.patch(self, r, query)
        elif method == "DELETE":
            writes.delete(self, r, query)
        else:
            raise st.method_not_allowed(f"{method} is not supported on {r.rt.plural}")
