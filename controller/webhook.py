"""The validating admission webhook: AdmissionReview v1 in, AdmissionReview v1 out, judged by the same admission
callable as `gpu-dra validate` and the embedded control plane (controller.validationhooks), served over HTTPS.

kube-apiserver sends the object in the version the webhook's rules name (`matchPolicy: Equivalent` converts), so
the manifests ask for resource.k8s.io/v1; older versions are accepted and converted by the validation rules too.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gpudra.strictjson import StrictJsonError, loads
from gpudra.validation.admission import Admission

log = logging.getLogger("gpu-dra.webhook")

REVIEW_API_VERSION = "admission.k8s.io/v1"
VALIDATE_PATH = "/validate"
# kube-apiserver caps a webhook request body at 3 MiB worth of object; refuse anything far larger unread.
MAX_BODY_BYTES = 8 * 1024 * 1024
# What is read and dropped of a refused body, at most, so that its client reads the 413.
DISCARD_MAX_BYTES = 128 * 1024 * 1024
DISCARD_S = 10.0
CHECKED_KINDS = frozenset({"DeviceClass", "ResourceClaim", "ResourceClaimTemplate"})


class BadReview(ValueError):
    """The request is not an AdmissionReview v1 this webhook can answer (HTTP 400)."""


def review_response(review: object, admit: Admission) -> dict[str, Any]:
    """The AdmissionReview answering `review`: allowed, or refused with every error in the status message."""
    if not isinstance(review, Mapping):
        raise BadReview("expected a JSON object (an AdmissionReview)")
    if review.get("apiVersion") != REVIEW_API_VERSION or review.get("kind") != "AdmissionReview":
        raise BadReview(f"expected apiVersion {REVIEW_API_VERSION} kind AdmissionReview, got "
                        f"apiVersion {review.get('apiVersion')!r} kind {review.get('kind')!r}")
    request = review.get("request")
    if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str) or not request["uid"]:
        raise BadReview("request.uid: required (the AdmissionReview's request with its uid)")
    uid = request["uid"]
    obj = request.get("object")
    old = request.get("oldObject")
    operation = request.get("operation")
    errors: list[str] = []
    # DELETE and CONNECT carry no object to judge; kinds we do not check are let through.
    if operation in ("CREATE", "UPDATE") and isinstance(obj, dict) and obj.get("kind") in CHECKED_KINDS:
        errors = admit(obj, old if operation == "UPDATE" and isinstance(old, dict) else None)
    response: dict[str, Any] = {"uid": uid, "allowed": not errors}
    if errors and isinstance(obj, dict):
        meta: Mapping[str, Any] = obj["metadata"] if isinstance(obj.get("metadata"), Mapping) else {}
        name = "/".join(str(p) for p in (meta.get("namespace"), meta.get("name")) if p)
        response["status"] = {
            "code": int(HTTPStatus.UNPROCESSABLE_ENTITY), "reason": "Invalid",
            "message": f"{obj.get('kind')} {name or '(unnamed)'} is invalid: " + "; ".join(errors),
        }
    return {"apiVersion": REVIEW_API_VERSION, "kind": "AdmissionReview", "response": response}


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path

    def stamp(self) -> tuple[int, int]:
        return (os.stat(self.cert).st_mtime_ns, os.stat(self.key).st_mtime_ns)


class ReloadingTlsContext:
    """A server TLS context that picks up a renewed certificate (cert-manager rotates the Secret's files in
    place) at the next connection, without a restart."""

    def __init__(self, files: TlsFiles) -> None:
        self._files = files
        self._lock = threading.Lock()
        self._stamp = files.stamp()
        self.context = self._load()

    def _load(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(self._files.cert), str(self._files.key))
        return context

    def current(self) -> ssl.SSLContext:
        with self._lock:
            try:
                stamp = self._files.stamp()
                if stamp != self._stamp:
                    self.context = self._load()
                    self._stamp = stamp
                    log.info("event=tls-reloaded cert=%s", self._files.cert)
            except (OSError, ssl.SSLError) as exc:
                # Half-written during a rotation: keep serving the previous certificate and try again next time.
                log.warning("event=tls-reload-failed cert=%s error=%r", self._files.cert, str(exc))
            return self.context


def _handler(admit: Admission) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            log.debug("event=http %s", format % args)

        def _send(self, status: HTTPStatus, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: HTTPStatus, message: str) -> None:
            log.warning("event=bad-request path=%s status=%d message=%r", self.path, status, message)
            self._send(status, {"error": message})

        def _discard(self, length: int) -> None:
            """Read and drop (bounded in bytes and time) the body a client still sends after its refusal: closing
            with it unread resets the connection, and a client that sends all before reading loses the answer."""
            deadline = time.monotonic() + DISCARD_S
            left = min(length, DISCARD_MAX_BYTES)
            try:
                self.connection.settimeout(DISCARD_S)
                while left > 0 and time.monotonic() < deadline:
                    chunk = self.rfile.read1(min(left, 1 << 16))
                    if not chunk:
                        return
                    left -= len(chunk)
            except OSError:
                return

        def do_GET(self) -> None:
            if self.path in ("/healthz", "/readyz"):
                self._send(HTTPStatus.OK, {"status": "ok"})
            else:
                self._error(HTTPStatus.NOT_FOUND, f"{self.path}: not found (POST AdmissionReviews to {VALIDATE_PATH})")

        def do_POST(self) -> None:
            if self.path.split("?", 1)[0] != VALIDATE_PATH:
                self._error(HTTPStatus.NOT_FOUND, f"{self.path}: not found (POST AdmissionReviews to {VALIDATE_PATH})")
                return
            if self.headers.get("Content-Type", "").split(";", 1)[0].strip() != "application/json":
                self._error(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "Content-Type: expected application/json")
                return
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self._error(HTTPStatus.LENGTH_REQUIRED, "Content-Length: required")
                return
            if not 0 <= length <= MAX_BODY_BYTES:
                self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body of {length} bytes; at most {MAX_BODY_BYTES}")
                self.close_connection = True
                self._discard(length)
                return
            try:
                review = loads(self.rfile.read(length).decode("utf-8"))
                answer = review_response(review, admit)
            except (StrictJsonError, UnicodeDecodeError, BadReview) as exc:
                self._error(HTTPStatus.BAD_REQUEST, f"AdmissionReview: {exc}")
                return
            except Exception as exc:  # noqa: BLE001 - one bad object must not take the webhook down
                log.exception("event=review-failed")
                self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"validation failed: {exc}")
                return
            r = answer["response"]
            log.info("event=review uid=%s allowed=%s", r["uid"], r["allowed"])
            self._send(HTTPStatus.OK, answer)

    return Handler


class WebhookServer(ThreadingHTTPServer):
    """HTTPS: each accepted connection is wrapped with the current certificate (handshake in the worker)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], admit: Admission, tls: ReloadingTlsContext) -> None:
        self.tls = tls
        super().__init__(address, _handler(admit))

    def get_request(self) -> tuple[Any, Any]:
        conn, addr = self.socket.accept()
        return self.tls.current().wrap_socket(conn, server_side=True, do_handshake_on_connect=False), addr

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(10.0)
        try:
            request.do_handshake()
        except (ssl.SSLError, OSError) as exc:
            log.warning("event=tls-handshake-failed client=%s error=%r", client_address[0], str(exc))
            return
        super().finish_request(request, client_address)
