"""One request's audit event (audit.k8s.io/v1 Event), recorded at its stages as kube-apiserver's audit filter
records it: RequestReceived when the request is authenticated, ResponseStarted when a long-running response
(watch, log, exec) starts, ResponseComplete when the response is done; a request whose credential is refused
gets one ResponseStarted event with an empty user. The level decides what goes in: Metadata the request's
who, what and outcome, Request also the request's body, RequestResponse also the response's."""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Mapping
from typing import Any, Protocol

from controlplane.audit.policy import LEVELS, Policy, RequestAttributes
from controlplane.authn import UserInfo
from controlplane.authz.attributes import request_verb

_LONG_RUNNING_SUBRESOURCES = ("log", "exec", "attach", "portforward", "proxy")
_RANK = {level: i for i, level in enumerate(LEVELS)}


class Sink(Protocol):
    def emit(self, event: dict[str, Any]) -> None: ...


class Clock:
    """Event timestamps (RFC 3339, microseconds, UTC) and audit IDs (random UUIDs, version 4), made cheaply:
    every request makes two timestamps and an ID, and os.urandom per ID would cost more than the rest of the
    event. The IDs need to be unique, not unguessable."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""
        self._random = random.Random(os.urandom(16))

    def now(self) -> str:
        t = time.time()
        second = int(t)
        if second != self._second:
            self._second, self._prefix = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._prefix}.{int((t - second) * 1e6):06d}Z"

    def audit_id(self) -> str:
        h = f"{self._random.getrandbits(128):032x}"
        return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:32]}"


def request_info(method: str, path: str, query: Mapping[str, str]) -> tuple[str, dict[str, str] | None]:
    """(verb, objectRef or None for a non-resource request), read from the path alone as kube-apiserver's
    RequestInfoFactory reads it (before the resource is looked up)."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return method.lower(), None
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3:  # /namespaces/<ns>/<resource>...
        namespace, rest = rest[1], rest[2:]
    elif rest[0] == "namespaces" and len(rest) == 2:  # the namespace object itself
        namespace = rest[1]
    resource = rest[0]
    name = rest[1] if len(rest) >= 2 else ""
    sub = rest[2] if len(rest) >= 3 else ""
    verb = request_verb(method, query, bool(name))
    ref = {"resource": resource, "namespace": namespace, "name": name, "apiGroup": group, "apiVersion": version,
           "subresource": sub}
    return verb, {k: v for k, v in ref.items() if v}


def _user(user: UserInfo) -> dict[str, Any]:
    out: dict[str, Any] = {"username": user.name}
    if user.uid:
        out["uid"] = user.uid
    if user.groups:
        out["groups"] = list(user.groups)
    if user.extra:
        out["extra"] = {k: list(v) for k, v in user.extra.items()}
    return out


def _copy(value: Any, omit_managed_fields: bool) -> Any:
    """A JSON copy of a body, which the request goes on changing after it was recorded."""
    copied = json.loads(json.dumps(value))
    if omit_managed_fields and isinstance(copied, dict) and isinstance(copied.get("metadata"), dict):
        copied["metadata"].pop("managedFields", None)
    return copied


class AuditEvent:
    """The event of one request; the handler tells it what happens, it emits a snapshot at each stage."""

    def __init__(self, sink: Sink, clock: Clock, level: str, omit: frozenset[str], omit_managed_fields: bool,
                 verb: str, uri: str, ref: dict[str, str] | None, user: UserInfo | None, source_ip: str,
                 user_agent: str | None) -> None:
        self._sink = sink
        self._clock = clock
        self.level = level
        self._omit = omit
        self._omit_managed = omit_managed_fields
        self.long_running = verb == "watch" or bool(ref and ref.get("subresource") in _LONG_RUNNING_SUBRESOURCES)
        self._fields: dict[str, Any] = {
            "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": level, "auditID": clock.audit_id(),
            "stage": "", "requestURI": uri, "verb": verb, "user": _user(user) if user is not None else {},
        }
        self._tail: dict[str, Any] = {"sourceIPs": [source_ip]}
        if user_agent:
            self._tail["userAgent"] = user_agent
        if ref is not None:
            self._tail["objectRef"] = ref
        self._received = clock.now()
        self._status: dict[str, Any] | None = None
        self._request_object: Any = None
        self._response_object: Any = None
        self.annotations: dict[str, str] = {}
        self._started = False
        self._done = False

    # ----- what the request tells it ---------------------------------------------------------------------

    def impersonated(self, user: UserInfo) -> None:
        self._fields["impersonatedUser"] = _user(user)

    def annotate(self, key: str, value: str, level: str = "Metadata") -> None:
        if _RANK[self.level] >= _RANK[level]:
            self.annotations.setdefault(key, value)  # the first value of a key is kept, as upstream keeps it

    def request_object(self, body: Any) -> None:
        if self.level in ("Request", "RequestResponse") and body is not None:
            self._request_object = _copy(body, self._omit_managed)

    def respond(self, code: int, body: bytes, content_type: str) -> None:
        """The response about to be written: its status, and its body at RequestResponse."""
        json_body = content_type.startswith("application/json")
        parsed: Any = None
        if json_body and (code >= 400 or self.level == "RequestResponse"):
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = None
        if code >= 400 and isinstance(parsed, dict) and parsed.get("kind") == "Status":
            self._status = {"metadata": {}, **{k: v for k, v in parsed.items()
                                               if k not in ("kind", "apiVersion", "metadata")}}
        else:
            self._status = {"metadata": {}, "code": code}
        if self.level == "RequestResponse" and parsed is not None:
            if self._omit_managed and isinstance(parsed, dict) and isinstance(parsed.get("metadata"), dict):
                parsed["metadata"].pop("managedFields", None)
            self._response_object = parsed

    def received(self) -> None:
        self._emit("RequestReceived")

    def started(self, code: int | str) -> None:
        """The response's head was written; a long-running response's ResponseStarted stage."""
        if self._status is None and isinstance(code, int):
            self._status = {"metadata": {}, "code": code}
        if self.long_running and not self._started:
            self._started = True
            self._emit("ResponseStarted")

    def complete(self) -> None:
        if not self._done:
            self._done = True
            self._emit("ResponseComplete")

    def failed_authentication(self, message: str) -> None:
        """A refused credential: one ResponseStarted event with the 401, as WithFailedAuthenticationAudit."""
        self._status = {"metadata": {}, "message": message, "code": 401}
        self._done = True
        self._emit("ResponseStarted")

    # ----- emitting --------------------------------------------------------------------------------------

    def _emit(self, stage: str) -> None:
        if stage in self._omit:
            return
        event = {**self._fields, "stage": stage, **self._tail}
        if self._status is not None and stage != "RequestReceived":
            event["responseStatus"] = self._status
        if self._request_object is not None:
            event["requestObject"] = self._request_object
        if self._response_object is not None and stage == "ResponseComplete":
            event["responseObject"] = self._response_object
        event["requestReceivedTimestamp"] = self._received
        event["stageTimestamp"] = self._clock.now() if stage != "RequestReceived" else self._received
        if self.annotations:
            event["annotations"] = dict(self.annotations)
        self._sink.emit(event)


def _auth_methods(headers: Any, has_certificate: bool) -> str:
    methods = []
    scheme, _, token = (headers.get("Authorization") or "").strip().partition(" ")
    if scheme.lower() == "basic":
        methods.append("basic")
    if scheme.lower() == "bearer" and token.strip():
        methods.append("bearer")
    if has_certificate:
        methods.append("x509")
    return ",".join(methods)


class Auditor:
    """The server's audit: a policy and where its events go (controlplane.audit.backend)."""

    def __init__(self, policy: Policy, sink: Sink) -> None:
        self.policy = policy
        self.sink = sink
        self._clock = Clock()

    def begin(self, method: str, uri: str, path: str, query: Mapping[str, str], user: UserInfo | None,
              source_ip: str, headers: Any) -> AuditEvent | None:
        """The event of a request authenticated as `user` (emitting RequestReceived), or None at level None.
        `user` None is a request whose credential was refused (see AuditEvent.failed_authentication)."""
        verb, ref = request_info(method, path, query)
        ref_ = ref or {}
        attrs = RequestAttributes(user.name if user else "", user.groups if user else (), verb, ref is not None,
                                  ref_.get("apiGroup", ""), ref_.get("resource", ""), ref_.get("subresource", ""),
                                  ref_.get("namespace", ""), ref_.get("name", ""), path)
        decision = self.policy.evaluate(attrs)
        if decision.level == "None":
            return None
        event = AuditEvent(self.sink, self._clock, decision.level, decision.omit_stages, decision.omit_managed_fields, verb, uri,
                           ref, user, source_ip, headers.get("User-Agent"))
        if user is not None:
            event.received()
        return event

    def failed_authentication(self, method: str, uri: str, path: str, query: Mapping[str, str], source_ip: str,
                              headers: Any, has_certificate: bool = False) -> None:
        event = self.begin(method, uri, path, query, None, source_ip, headers)
        if event is not None:
            methods = _auth_methods(headers, has_certificate)
            event.failed_authentication(f"Authentication failed, attempted: {methods}" if methods
                                        else "Authentication failed")

    def stop(self) -> None:
        stop = getattr(self.sink, "stop", None)
        if stop is not None:
            stop()
