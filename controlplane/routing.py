"""A request's resource route (type, namespace, name, subresource, API version) and the conversion between the
version it speaks and the storage version; the one JSON encoder of responses."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from controlplane import resources as res
from controlplane import status as st
from controlplane.audit.event import Auditor
from controlplane.crds import serving as crd_serving
from controlplane.podlogs import PodLogSource
from controlplane.security import Security
from controlplane.store import RequestAdmission as StoreAdmission
from controlplane.store import Store
from gpudra.conversion import ConversionError, from_storage, split_api_version, to_storage

CONVERTED_KINDS = frozenset({"DeviceClass", "ResourceClaim", "ResourceClaimTemplate", "ResourceSlice",
                              "DeviceTaintRule"})


@dataclass(frozen=True)
class Route:
    rt: res.ResourceType
    namespace: str  # "" for cluster-scoped requests and all-namespaces lists
    name: str | None
    subresource: str | None
    version: str = ""  # the API version the request speaks; "" or rt.version means the storage version

    @property
    def converts(self) -> bool:
        return bool(self.version) and self.version != self.rt.version

    def shown(self, obj: dict[str, Any]) -> dict[str, Any]:
        """A stored object as this request's API version shows it."""
        if self.rt.custom is not None:
            return self.rt.custom.shown(obj, self.version) if self.converts else obj
        return from_storage(obj, self.version) if self.converts else obj

    def stored(self, body: Any) -> Any:
        """A request body in storage form. The body's own apiVersion decides what it is, as kube-apiserver
        decodes it; without one, the URL's version does."""
        if isinstance(body, dict) and self.rt.custom is not None:
            return crd_serving.stored(self.rt, body, self.version)
        if not isinstance(body, dict) or self.rt.kind not in CONVERTED_KINDS:
            return body
        group, version = split_api_version(body.get("apiVersion"))
        if not body.get("apiVersion"):
            group, version = self.rt.group, self.version or self.rt.version
        if group != self.rt.group or version not in self.rt.versions:
            raise st.bad_request(f"the API version in the data ({body.get('apiVersion')}) does not match the "
                                 f"expected API version ({self.rt.api_version_at(self.version or self.rt.version)});"
                                 f" {self.rt.kind} is served at "
                                 + ", ".join(self.rt.api_version_at(v) for v in self.rt.versions))
        if version == self.rt.version:
            return body  # already the storage version: nothing to convert (the hot path of every agent)
        try:
            return to_storage({**body, "apiVersion": self.rt.api_version_at(version), "kind": self.rt.kind})
        except ConversionError as exc:
            raise st.bad_request(f"{self.rt.kind} in {self.rt.api_version_at(version)}: {exc.path}: {exc}") from exc


_ENCODER = json.JSONEncoder(separators=(",", ":"))  # one for every response (json.dumps would build one per call)


def encode(value: Any) -> bytes:
    return _ENCODER.encode(value).encode()


class ServerContext(Protocol):
    store: Store
    registry: res.Registry
    bookmark_interval: float
    pod_logs: PodLogSource | None
    security: Security
    kubernetes_version: str
    audit: Auditor | None

    @property
    def stopping(self) -> bool: ...


class Responder(Protocol):
    """What a long-lived response (a watch, a followed log) uses of the request handler it came from."""
    wfile: Any
    connection: Any
    server: Any
    headers: Any
    close_connection: bool

    @property
    def ctx(self) -> ServerContext: ...

    def log_request(self, code: int | str = ..., size: int | str = ...) -> None: ...

    def _send(self, code: int, body: bytes, content_type: str = ...) -> None: ...


def start_chunked(h: Responder, content_type: str, refusal: str) -> None:
    """Begin a long-lived chunked 200 (a watch, a followed log). It leaves the worker pool first, so that a pool
    full of them refuses the next one with 429 (`refusal`) instead of starving short requests."""
    detach = getattr(h.server, "detach_for_watch", None)
    if detach is not None and not detach():
        raise st.StatusError(429, "TooManyRequests", refusal)
    h.close_connection = True
    h.wfile.write(f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nTransfer-Encoding: chunked\r\n"
                  "Cache-Control: no-cache, private\r\n\r\n".encode())
    h.log_request(200)


class RequestHandler(Responder, Protocol):
    """What the endpoint handlers (controlplane.handlers) use of the request being served: its path, body,
    admission chain and warnings, and the JSON answer (controlplane.handler.ApiHandler)."""
    path: str
    _warnings: list[str]

    @property
    def _admit(self) -> StoreAdmission: ...

    def _send_json(self, code: int, value: Any) -> None: ...

    def _body(self) -> Any: ...
