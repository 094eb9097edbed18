"""HTTP routing for the embedded control plane: Kubernetes' REST paths onto the store."""

from __future__ import annotations

import base64
import json
import re
import select
import socket
import time
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from controlplane import filters, httphead, reviews
from controlplane import resources as res
from controlplane import execproxy, portforwardtunnel, scale
from controlplane.crds import openapi as crd_openapi
from controlplane.crds import serving as crd_serving
from controlplane import status as st
from controlplane import health, protobuf
from controlplane.admission.request import AdmissionRequest
from controlplane.authn import UserInfo
from controlplane.protobufbodies import protobuf_request, protobuf_response
from controlplane.openapi import openapi_group_version, openapi_root, openapi_v2, openapi_v2_protobuf
from controlplane.params import bool_param, int_param
from controlplane.podlogserve import PodLogStream
from controlplane.podpriority import admit_pod_priority
from controlplane.routing import CONVERTED_KINDS, Route, ServerContext, encode
from controlplane.security import ensure_default_account
from controlplane.selectors import FieldSelector, LabelSelector, SelectorError
from controlplane.serving import wait_ready
from controlplane.store import FIELD_VALIDATION, FieldPolicy, Filter
from controlplane.tables import INCLUDE_OBJECT, to_table, wants_table
from controlplane.watchserve import WatchStream
from gpudra import strictjson
from gpudra.conversion import split_api_version
from gpudra.validation import schema

# kube-openapi answers the "...spec.v2@v1.0+protobuf" Accept with this Content-Type (no "@": mime would refuse it).
_OPENAPI_V2_PROTOBUF = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
_NO_SERVER_SIDE_APPLY = ("server-side apply is not supported by gpu-dra's embedded control plane (it keeps no "
                         "field managers); use client-side apply: kubectl apply without --server-side")
# kube-apiserver's limit on a request body it decodes (MaxRequestBodyBytes, 3 MiB): larger is 413.
MAX_BODY_BYTES = 3 * 1024 * 1024
_WRITE_TIMEOUT_S = 30.0
_LINGER_S = 2.0  # a refused request's unread body is read and dropped until the client is silent this long
_LINGER_MAX_BYTES = 64 * 1024 * 1024
_DIGITS = re.compile(r"^[0-9]+$")


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
        return  # as log_message, without formatting a line for nobody

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
        if (self.headers.get("Content-Type") or "").split(";")[0].strip() == protobuf.MEDIA_TYPE:
            return protobuf_request(raw)
        try:
            value, self._duplicates = strictjson.decode(raw)
            return value
        except strictjson.StrictJsonError as exc:
            raise st.bad_request(f"the request body is not valid JSON: {exc}; this server accepts JSON and "
                                 f"{protobuf.MEDIA_TYPE}") from exc

    def _dispatch(self, method: str) -> None:
        self._protobuf_out = False
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
        return value

    def _stored(self, r: Route, body: Any, policy: FieldPolicy) -> Any:
        """The body in storage form. One in another served version is checked against that version's schema
        first, so that unknown fields and wrong types are named as the client wrote them."""
        if isinstance(body, dict) and r.rt.kind in CONVERTED_KINDS:
            if body.get("apiVersion"):
                group, version = split_api_version(body.get("apiVersion"))
            else:
                group, version = r.rt.group, r.version or r.rt.version
            if group == r.rt.group and version != r.rt.version and version in r.rt.versions:
                body = self.ctx.store.clean_fields(r.rt, body, policy, version)
        return r.stored(body)

    def _field_policy(self, query: dict[str, str], body: Any) -> FieldPolicy:
        mode = query.get("fieldValidation") or "Warn"
        if mode not in FIELD_VALIDATION:
            raise st.bad_request(f"fieldValidation: Unsupported value: {json.dumps(mode)}: supported values: "
                                 '"Ignore", "Warn", "Strict"')
        policy = FieldPolicy(mode, list(getattr(self, "_duplicates", [])))
        self._warnings = policy.warnings
        return policy

    # ----- routing -------------------------------------------------------------------------------------------

    def _authenticate(self) -> UserInfo:
        sec = self.ctx.security
        # The internal listener behind the TLS front requires credentials whatever the plain port does.
        lenient = sec.unauthenticated_as_admin and not getattr(self.server, "requires_credentials", False)
        return filters.authenticate(self.headers.get("Authorization"), sec.authenticator, sec.accounts, lenient)

    def _route(self, method: str, path: str, query: dict[str, str]) -> None:
        parts = [p for p in path.split("/") if p]
        reg = self.ctx.registry
        authorizer = self.ctx.security.authorizer
        self._user = user = filters.impersonate(self._authenticate(), self.headers, authorizer)
        if method == "GET" and len(parts) == 1 and parts[0] in health.ENDPOINTS:
            authorizer.require(filters.path_attributes(user, method, path))
            code, text = health.report(parts[0], self.ctx.store.storage_failure, "verbose" in query)
            self._send(code, text, "text/plain; charset=utf-8")
            return
        if method == "GET":
            doc = self._discovery(parts, reg)
            if doc is not None:
                authorizer.require(filters.path_attributes(user, method, path))
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
        authorizer.require(attrs)
        dry_run = query.get("dryRun", "")
        if dry_run not in ("", "All"):
            raise st.bad_request(f"dryRun: Unsupported value: {json.dumps(dry_run)}: supported values: \"All\"")
        if route.rt.virtual or route.subresource == "token":
            self._review(method, route, user)
            return
        store = self.ctx.store
        if method == "GET":
            self._serve(method, route, query)  # reads write nothing: no admission
            return
        admission = self.ctx.security.admission
        operation = {"POST": "CREATE", "PUT": "UPDATE", "PATCH": "UPDATE", "DELETE": "DELETE"}.get(method, "")

        def admit(rt: res.ResourceType, name: str, obj: dict[str, Any] | None, old: dict[str, Any] | None) -> None:
            req = AdmissionRequest(user, operation, rt, route.namespace, name, route.subresource or "", attrs.verb,
                                   bool(dry_run), authorizer)
            admission.admit(req, obj, old, self._warnings)

        self._admit = admit
        with store.admitting(admit):
            if dry_run:
                with store.dry_run():
                    self._serve(method, route, query)
            else:
                self._serve(method, route, query)

    def _discovery(self, parts: list[str], reg: res.Registry) -> dict[str, Any] | bytes | tuple[bytes, str] | None:
        if parts == ["version"]:
            return res.server_version(self.ctx.kubernetes_version)
        if parts == ["openapi", "v2"]:
            if "protobuf" in (self.headers.get("Accept") or ""):
                return openapi_v2_protobuf(reg), _OPENAPI_V2_PROTOBUF
            return openapi_v2(reg)
        if parts[:2] == ["openapi", "v3"]:
            if len(parts) == 2:
                return openapi_root(reg)
            gv_path = "/".join(parts[2:])
            return (crd_openapi.group_version(reg, gv_path) or openapi_group_version(reg, gv_path)
                    or self._not_found_path(parts))
        if parts == ["api"]:
            return res.api_versions()
        if parts == ["apis"]:
            return res.api_group_list(reg)
        if len(parts) == 2 and parts[0] == "api":
            return res.api_resource_list(reg, "", parts[1]) or self._not_found_path(parts)
        if len(parts) == 2 and parts[0] == "apis":
            return res.api_group(reg, parts[1]) or self._not_found_path(parts)
        if len(parts) == 3 and parts[0] == "apis":
            return res.api_resource_list(reg, parts[1], parts[2]) or self._not_found_path(parts)
        return None

    @staticmethod
    def _not_found_path(parts: list[str]) -> dict[str, Any]:
        raise st.StatusError(404, "NotFound", f"the server could not find the requested resource (/{'/'.join(parts)})")

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

    def _review(self, method: str, r: Route, user: UserInfo) -> None:
        """The endpoints that answer without storing: reviews and TokenRequest (POST only)."""
        if method != "POST" or (r.subresource == "token" and not r.name) or (r.rt.virtual and r.name):
            raise st.method_not_allowed(f"{method} is not supported on {r.rt.plural}"
                                        f"{'/' + r.subresource if r.subresource else ''}; supported: POST (create)")
        body = self._body()
        authorizer = self.ctx.security.authorizer
        if r.rt.kind == "SelfSubjectAccessReview":
            answer = reviews.self_subject_access_review(body, user, authorizer)
        elif r.rt.kind == "SubjectAccessReview":
            answer = reviews.subject_access_review(body, authorizer)
        elif r.rt.kind == "SelfSubjectRulesReview":
            answer = reviews.self_subject_rules_review(body, user, self.ctx.security.rbac)
        elif r.rt.kind == "SelfSubjectReview":
            answer = reviews.self_subject_review(user)
        else:
            store, reg = self.ctx.store, self.ctx.registry
            account = store.get(r.rt, r.namespace, r.name or "")

            def get(kind: str, ns: str, name: str) -> dict[str, Any] | None:
                rt = reg.by_kind(kind)
                try:
                    return store.get(rt, ns, name) if rt is not None else None
                except st.StatusError:
                    return None
            answer = reviews.token_request(r.namespace, r.name or "", account, body,
                                           self.ctx.security.authenticator, get)
        self._send_json(201, answer)

    def _serve(self, method: str, r: Route, query: dict[str, str]) -> None:
        store = self.ctx.store
        self._protobuf_out = protobuf.accepts(self.headers.get("Accept"))
        if r.name is None:
            if method == "GET":
                if bool_param(query, "watch"):
                    WatchStream(self).serve(r, query)
                else:
                    self._list(r, query)
                return
            if method == "POST":
                body = self._body()
                policy = self._field_policy(query, body)
                body = self._stored(r, body, policy)
                if r.rt.kind == "Pod" and isinstance(body, dict):
                    body = admit_pod_priority(store, self.ctx.registry, body)
                obj = store.create(r.rt, r.namespace, body, policy)
                if r.rt.kind == "Namespace" and not store.in_dry_run:
                    ensure_default_account(store, self.ctx.registry, obj["metadata"]["name"])
                self._send_json(201, r.shown(obj))
                return
            raise st.method_not_allowed(f"{method} is not supported on the collection {r.rt.plural}; "
                                        "supported: GET (list, watch) and POST (create)")
        if r.subresource == "log":
            if method != "GET":
                raise st.method_not_allowed(f"{method} is not supported on pods/log; supported: GET")
            PodLogStream(self).serve(r, query)
            return
        if r.subresource == "finalize" and method != "PUT":  # namespaces/finalize is an update only
            raise st.method_not_allowed("the server does not allow this method on the requested resource")
        if r.subresource in execproxy.SUBRESOURCES:  # controlplane.execproxy: relayed to the node's kubelet
            if method not in ("GET", "POST"):
                raise st.method_not_allowed(f"{method} is not supported on pods/{r.subresource}; supported: GET, POST")
            if method == "GET":  # a WebSocket session is also authorized as create (AuthorizePodWebsocketUpgradeCreatePermission)
                self.ctx.security.authorizer.require(filters.resource_attributes(
                    self._user, "POST", r.rt, r.namespace, r.name, r.subresource, query))
            host, port, container = execproxy.target(store, r.rt, self.ctx.registry.by_kind("Node"), r.namespace,
                                                     r.name or "", query.get("container"), r.subresource)
            self.close_connection = True
            if r.subresource == "portforward" and portforwardtunnel.is_websocket(self.headers):
                portforwardtunnel.serve(self.connection, self.headers, host, port, r.namespace, r.name or "")
                return
            execproxy.relay(self.connection, self.headers, host, port, r.subresource, r.namespace, r.name or "",
                            container, urlsplit(self.path).query)
            return
        if r.subresource == "scale" and r.rt.custom is not None:  # a CRD's scale subresource (its paths)
            self._send_json(200, crd_serving.serve_scale(store, r.rt, r.namespace, r.name or "", method, query,
                                                         self._body() if method != "GET" else None,
                                                         (self.headers.get("Content-Type") or "")))
            return
        if r.subresource == "scale":  # controlplane.scale: Deployments, ReplicaSets, StatefulSets
            body = None if method == "GET" else self._body()
            self._send_json(200, scale.serve(store, r.rt, r.namespace, r.name or "", method, body,
                                             self.headers.get("Content-Type")))
            return
        if r.subresource == "binding":
            if method != "POST":
                raise st.method_not_allowed(f"{method} is not supported on pods/binding; supported: POST")
            self._send_json(201, store.bind(r.namespace, r.name, self._body()))
            return
        if method == "GET":
            obj = store.get(r.rt, r.namespace, r.name)
            store.await_durable(obj["metadata"].get("resourceVersion"))
            self._send_object(200, r, obj, query)
        elif method == "PUT":
            body = self._body()
            policy = self._field_policy(query, body)
            self._send_json(200, r.shown(store.update(r.rt, r.namespace, r.name, self._stored(r, body, policy),
                                                      r.subresource, policy)))
        elif method == "PATCH":
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if ctype == "application/merge-patch+json":
                kind = "merge"
            elif ctype == "application/strategic-merge-patch+json":
                kind = "strategic"
            elif ctype == "application/json-patch+json":
                kind = "json"
            elif ctype == "application/apply-patch+yaml":
                self._body()
                # 415 is what makes kubectl say "Server-side apply not available on the server".
                raise st.StatusError(415, "UnsupportedMediaType", _NO_SERVER_SIDE_APPLY)
            else:
                self._body()
                raise st.unsupported_media_type(ctype)
            body = self._body()
            policy = self._field_policy(query, body)
            codec = (r.shown, r.stored) if r.converts else None
            self._send_json(200, r.shown(store.patch(r.rt, r.namespace, r.name, kind, body, r.subresource,
                                                     codec, policy, r.version or r.rt.version)))
        elif method == "DELETE":
            body = self._body()
            if body is not None and not isinstance(body, dict):
                raise st.bad_request("the body of a delete must be a DeleteOptions object")
            options = body or {}
            report = schema.check_fields("V1DeleteOptions", options)
            if report.type_errors:
                raise st.bad_request(f"DeleteOptions in version \"v1\" cannot be handled as a DeleteOptions: json: "
                                     f"{report.type_errors[0]}")
            if "propagationPolicy" in query:
                options = {**options, "propagationPolicy": query["propagationPolicy"]}
            propagation = options.get("propagationPolicy")
            if propagation not in (None, "Foreground", "Background", "Orphan"):
                raise st.bad_request(f"propagationPolicy: Unsupported value: {json.dumps(propagation)}: supported values: "
                                     '"Foreground", "Background", "Orphan"')
            self._admit(r.rt, r.name, None, store.get(r.rt, r.namespace, r.name))
            deleted = store.delete(r.rt, r.namespace, r.name, options)
            self._send_json(200, r.shown(deleted) if deleted.get("kind") == r.rt.kind else deleted)
        else:
            raise st.method_not_allowed(f"{method} is not supported on {r.rt.plural}")

    def _include_object(self, query: dict[str, str]) -> str:
        include = query.get("includeObject") or "Metadata"
        if include not in INCLUDE_OBJECT:
            raise st.bad_request(f"includeObject: Unsupported value: {include!r}: supported values: "
                                 + ", ".join(f'"{v}"' for v in INCLUDE_OBJECT))
        return include

    def _send_object(self, code: int, r: Route, obj: dict[str, Any], query: dict[str, str] | None = None) -> None:
        if wants_table(self.headers.get("Accept")):
            include = self._include_object(query or {})
            self._send_json(code, to_table(r.rt, [obj], obj["metadata"].get("resourceVersion", ""), include,
                                           r.shown))
        else:
            self._send_json(code, r.shown(obj))

    # ----- list and watch ------------------------------------------------------------------------------------

    def _filter(self, r: Route, query: dict[str, str]) -> Filter:
        try:
            labels = LabelSelector.parse(query.get("labelSelector"))
            fields = FieldSelector.parse(query.get("fieldSelector"))
            fields.check_fields(lambda f: r.rt.field_value({}, f) is not None, r.rt.selectable_fields,
                                f'"{r.rt.kind}" in version "{r.rt.api_version_at(r.version or r.rt.version)}"')
        except SelectorError as exc:
            raise st.bad_request(str(exc)) from exc
        return Filter(r.rt, r.namespace or None, labels, fields)

    def _list(self, r: Route, query: dict[str, str]) -> None:
        flt = self._filter(r, query)
        int_param(query, "resourceVersion")
        int_param(query, "timeoutSeconds")
        limit = int_param(query, "limit") or 0
        items, rv = self.ctx.store.list(flt)
        self.ctx.store.await_durable(rv)
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        start = 0
        token = query.get("continue")
        if token:
            try:
                decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
                after = (decoded["ns"], decoded["name"])
            except (ValueError, KeyError, TypeError):
                raise st.StatusError(400, "BadRequest", "continue: invalid token; pass back the metadata.continue "
                                                        "value of the previous list unchanged") from None
            start = next((i for i, obj in enumerate(items) if self._sort_key(obj) > after), len(items))
        if limit > 0 and start + limit < len(items):
            last = items[start + limit - 1]
            ns, name = self._sort_key(last)
            meta["continue"] = base64.urlsafe_b64encode(encode({"ns": ns, "name": name})).decode()
            meta["remainingItemCount"] = len(items) - start - limit
            items = items[start:start + limit]
        else:
            items = items[start:]
        if wants_table(self.headers.get("Accept")):
            include = self._include_object(query)
            extra = {k: v for k, v in meta.items() if k != "resourceVersion"}
            self._send_json(200, to_table(r.rt, items, str(rv), include, r.shown, meta=extra))
            return
        # Items are already serialized JSON objects in the store; splice them in without re-encoding twice.
        head = encode({"kind": r.rt.kind + "List", "apiVersion": r.rt.api_version_at(r.version or r.rt.version),
                        "metadata": meta})[:-1]
        json_of = self.ctx.store.json_of
        body = head + b',"items":[' + b",".join(json_of(r.shown(i)) for i in items) + b"]}"
        self._send(200, body)

    @staticmethod
    def _sort_key(obj: dict[str, Any]) -> tuple[str, str]:
        m = obj.get("metadata") or {}
        return (m.get("namespace") or "", m.get("name") or "")
