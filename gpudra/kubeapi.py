"""`KubeApi`: the one Kubernetes API access layer every component uses, on the official `kubernetes` client.

Requests go through the official client's `ApiClient`: its configuration loading, auth (and token refresh),
TLS and urllib3 connection pool, so the same code runs against a real cluster and against `gpu-dra apiserver`.
Bodies are plain dicts sent and received as JSON: the typed `*Api` methods validate a dict body into pydantic
models first (about 3 ms for a 128-device ResourceSlice, and they reject fields newer than the client), and even
the generic `param_serialize` + `call_api` path walks every body and header in Python on each call; so each
request is encoded once with `json` and sent on the ApiClient's own pool (`bench kubeapi` measures both paths).

`get` raises `NotFound` for a missing object; `try_get` returns None instead. `delete` tolerates a missing
object and says whether it deleted anything.
"""

from __future__ import annotations

import datetime
import functools
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlencode

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from gpudra import http1
from gpudra.http1 import Reply

log = logging.getLogger("gpudra.kubeapi")
T = TypeVar("T")
# One page of a list (`list` names a method inside KubeApi).
Items = list[dict[str, Any]]


@dataclass(frozen=True)
class KindInfo:
    group: str
    version: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
            if subresource:
                base += f"/{subresource}"
        return base


KINDS: dict[str, KindInfo] = {
    "Node": KindInfo("", "v1", "nodes", False),
    "Namespace": KindInfo("", "v1", "namespaces", False),
    "Pod": KindInfo("", "v1", "pods", True),
    "Event": KindInfo("", "v1", "events", True),
    "ResourceQuota": KindInfo("", "v1", "resourcequotas", True),
    "ServiceAccount": KindInfo("", "v1", "serviceaccounts", True),
    "ConfigMap": KindInfo("", "v1", "configmaps", True),
    "Secret": KindInfo("", "v1", "secrets", True),
    "Lease": KindInfo("coordination.k8s.io", "v1", "leases", True),
    "Role": KindInfo("rbac.authorization.k8s.io", "v1", "roles", True),
    "RoleBinding": KindInfo("rbac.authorization.k8s.io", "v1", "rolebindings", True),
    "ClusterRole": KindInfo("rbac.authorization.k8s.io", "v1", "clusterroles", False),
    "ClusterRoleBinding": KindInfo("rbac.authorization.k8s.io", "v1", "clusterrolebindings", False),
    "ValidatingAdmissionPolicy": KindInfo("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", False),
    "ValidatingAdmissionPolicyBinding": KindInfo("admissionregistration.k8s.io", "v1",
                                                 "validatingadmissionpolicybindings", False),
    "ValidatingWebhookConfiguration": KindInfo("admissionregistration.k8s.io", "v1",
                                               "validatingwebhookconfigurations", False),
    "MutatingWebhookConfiguration": KindInfo("admissionregistration.k8s.io", "v1",
                                             "mutatingwebhookconfigurations", False),
    "PriorityClass": KindInfo("scheduling.k8s.io", "v1", "priorityclasses", False),
    "PodDisruptionBudget": KindInfo("policy", "v1", "poddisruptionbudgets", True),
    "Service": KindInfo("", "v1", "services", True),
    "EndpointSlice": KindInfo("discovery.k8s.io", "v1", "endpointslices", True),
    "Workload": KindInfo("scheduling.k8s.io", "v1beta1", "workloads", True),
    "PodGroup": KindInfo("scheduling.k8s.io", "v1beta1", "podgroups", True),
    "DeviceClass": KindInfo("resource.k8s.io", "v1", "deviceclasses", False),
    "ResourceSlice": KindInfo("resource.k8s.io", "v1", "resourceslices", False),
    "DeviceTaintRule": KindInfo("resource.k8s.io", "v1", "devicetaintrules", False),
    "ResourceClaim": KindInfo("resource.k8s.io", "v1", "resourceclaims", True),
    "ResourceClaimTemplate": KindInfo("resource.k8s.io", "v1", "resourceclaimtemplates", True),
    "Deployment": KindInfo("apps", "v1", "deployments", True),
    "ReplicaSet": KindInfo("apps", "v1", "replicasets", True),
    "StatefulSet": KindInfo("apps", "v1", "statefulsets", True),
    "Job": KindInfo("batch", "v1", "jobs", True),
    "CronJob": KindInfo("batch", "v1", "cronjobs", True),
    "DaemonSet": KindInfo("apps", "v1", "daemonsets", True),
    "ControllerRevision": KindInfo("apps", "v1", "controllerrevisions", True),
    "CustomResourceDefinition": KindInfo("apiextensions.k8s.io", "v1", "customresourcedefinitions", False),
    # NVIDIA's compute-domain API (served from its CRDs).
    "ComputeDomain": KindInfo("resource.nvidia.com", "v1beta1", "computedomains", True),
    "ComputeDomainClique": KindInfo("resource.nvidia.com", "v1beta1", "computedomaincliques", True),
}


# ----- errors ------------------------------------------------------------------------------------------------


class ApiError(Exception):
    """A failed API call: HTTP status, Kubernetes reason, message and field causes."""

    def __init__(self, status: int, reason: str, message: str, causes: list[dict[str, Any]] | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.causes = causes or []


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    pass


class AlreadyExists(ApiError):
    pass


class Invalid(ApiError):
    pass


class Gone(ApiError):
    """The requested resourceVersion is too old (HTTP 410)."""


def error_from_response(status: int, data: bytes | None) -> ApiError:
    body: dict[str, Any] = {}
    if data:
        try:
            decoded = json.loads(data)
            if isinstance(decoded, dict):
                body = decoded
        except ValueError:
            pass
    reason = str(body.get("reason") or "")
    message = str(body.get("message") or (data or b"").decode(errors="replace")[:500] or f"HTTP {status}")
    causes = (body.get("details") or {}).get("causes") or []
    if status == 404:
        cls: type[ApiError] = NotFound
    elif status == 409:
        cls = AlreadyExists if reason == "AlreadyExists" else Conflict
    elif status == 422:
        cls = Invalid
    elif status == 410:
        cls = Gone
    else:
        cls = ApiError
    return cls(status, reason or "Unknown", message, causes)


def kind_info(kind: str) -> KindInfo:
    info = KINDS.get(kind)
    if info is None:
        raise ValueError(f"unknown kind {kind!r}; accepted: {', '.join(sorted(KINDS))}")
    return info


def retry_on_conflict(fn: Callable[[], T], attempts: int = 10, base_delay: float = 0.005) -> T:
    """Call `fn` until it does not raise `Conflict`, with jittered exponential backoff; re-raises the last."""
    for attempt in range(attempts):
        try:
            return fn()
        except Conflict:
            if attempt == attempts - 1:
                raise
            time.sleep(random.uniform(0, base_delay * (2 ** min(attempt, 8))))
    raise AssertionError("unreachable: the loop returns or raises")


_RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})


# Methods a request may be repeated with (RFC 9110 9.2.2): retried on a fresh connection when a kept-alive one
# ended without a response.
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class KubeApi:
    """Thread-safe: the underlying urllib3 pool is shared and each call holds no state of its own."""

    def __init__(self, api_client: k8s_client.ApiClient, *, retries: int = 6, backoff: float = 0.05,
                 max_backoff: float = 2.0) -> None:
        self.client = api_client
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._typed_lock = threading.Lock()
        self._typed: dict[str, Any] = {}
        self._pool: Any = None  # the host's urllib3 connection pool, taken from the ApiClient's PoolManager
        self._prefix = ""  # a path the host URL carries (an API behind a path-routing proxy)
        self._host_header = ""

    # ----- construction --------------------------------------------------------------------------------------

    @classmethod
    def connect(cls, kubeconfig: str | None = None, url: str | None = None, *, context: str | None = None,
                pool_size: int = 32) -> KubeApi:
        """From a plain http URL (the embedded server), a kubeconfig file, or (neither) in-cluster config."""
        cfg = k8s_client.Configuration()
        if url:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"url {url!r}: expected http://HOST:PORT or https://HOST:PORT")
            cfg.host = url.rstrip("/")
        elif kubeconfig:
            k8s_config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
        else:
            k8s_config.load_incluster_config(client_configuration=cfg)
        cfg.connection_pool_maxsize = pool_size
        return cls(k8s_client.ApiClient(cfg))

    def close(self) -> None:
        self.client.close()

    @property
    def host(self) -> str:
        return str(self.client.configuration.host)

    def typed(self, name: str) -> Any:
        """The official typed API object (`"CoreV1Api"`, `"ResourceV1Api"`, ...) sharing this connection."""
        with self._typed_lock:
            api = self._typed.get(name)
            if api is None:
                api = getattr(k8s_client, name)(self.client)
                self._typed[name] = api
            return api

    # ----- the request core ----------------------------------------------------------------------------------

    def _call(self, method: str, path: str, *, query: list[tuple[str, Any]] | None = None, body: Any = None,
              content_type: str | None = None, stream: bool = False,
              timeout: float | tuple[float, float] | None = None) -> Any:
        target = path
        if query:
            target += "?" + urlencode([(k, _query_value(v)) for k, v in query])
        data = json.dumps(body, default=self._json_default).encode() if body is not None else None
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                reply = self._exchange(method, target, data, content_type, timeout, stream=stream)
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                # A create may have reached the server before the connection broke; only retry it when the
                # connection was never established, so a retry cannot create a second object.
                connect_only = isinstance(getattr(exc, "reason", exc), (urllib3.exceptions.NewConnectionError,
                                                                        urllib3.exceptions.ConnectTimeoutError,
                                                                        ConnectionRefusedError))
                if attempt == self.retries or (method == "POST" and not connect_only):
                    raise ApiError(0, "ConnectionError", f"{method} {path}: {exc}") from exc
                self._sleep(delay, attempt)
                delay = min(delay * 2, self.max_backoff)
                continue
            if not isinstance(reply, Reply):
                return reply  # a stream
            status = reply.status
            if 200 <= status < 300:
                return json.loads(reply.data or b"null")
            if status in _RETRYABLE_STATUS and attempt < self.retries:
                retry_after = reply.headers.get("retry-after")
                self._sleep(float(retry_after) if retry_after and retry_after.isdigit() else delay, attempt)
                delay = min(delay * 2, self.max_backoff)
                continue
            raise error_from_response(status, reply.data)
        raise AssertionError("unreachable: the loop returns or raises")

    def _headers(self, method: str, target: str, data: bytes | None, content_type: str | None) -> dict[str, Any]:
        """The ApiClient's default headers (User-Agent), cookie and auth (`update_params_for_auth`, which also runs
        a token refresh hook) for one request."""
        headers: dict[str, Any] = {"Accept": "application/json", **self.client.default_headers}
        if data is not None:
            headers["Content-Type"] = content_type or "application/json"
        if self.client.cookie:
            headers["Cookie"] = self.client.cookie
        self.client.update_params_for_auth(headers, [], ["BearerToken"], target.split("?", 1)[0], method, None)
        return headers

    def _host_pool(self) -> Any:
        """The host's urllib3 connection pool, from the ApiClient's PoolManager (None behind a proxy). Going to it
        directly skips the PoolManager's per-call URL parsing and pool lookup."""
        manager = self.client.rest_client.pool_manager
        if isinstance(manager, urllib3.ProxyManager):
            return None
        pool = self._pool
        if pool is None or pool.pool is None:  # first use, or closed (the manager dropped it)
            host = self.client.configuration.host
            pool = self._pool = manager.connection_from_url(host)
            url = urllib3.util.parse_url(host)
            self._prefix = (url.path or "").rstrip("/")
            self._host_header = url.netloc or ""
        return pool

    def _exchange(self, method: str, target: str, data: bytes | None, content_type: str | None,
                  timeout: float | tuple[float, float] | None, *, stream: bool = False) -> Any:
        """One request on a connection of the host's pool with `gpudra.http1` (through urllib3 behind a proxy): a
        Reply read whole, or with `stream` and a 2xx status a stream of lines (`http1.Stream`, or urllib3's
        response behind a proxy) holding the connection until closed. A kept-alive connection the server closed
        meanwhile is retried once on a fresh one, as Go's net/http does: any request that was not fully written, and
        an idempotent one that got no byte of a response (a create could have been acted on)."""
        headers = self._headers(method, target, data, content_type)
        pool = self._host_pool()
        if pool is None:
            response = self._through_proxy(method, target, data, headers, timeout)
            if stream and 200 <= response.status < 300:
                return response
            reply = Reply(response.status, {k.lower(): v for k, v in response.headers.items()}, response.read(), False)
            response.release_conn()
            return reply
        request = http1.encode_request(method, self._prefix + target, self._host_header, headers, data)
        connect_timeout, read_timeout = timeout if isinstance(timeout, tuple) else (timeout, timeout)
        for fresh in (False, True):
            conn = pool._get_conn()  # noqa: SLF001 - the pool's own checkout: liveness check, size limit
            reused = conn.sock is not None
            try:
                if not reused:
                    if connect_timeout is not None:
                        conn.timeout = connect_timeout
                    conn.connect()
                conn.sock.settimeout(read_timeout)
                result = http1.exchange(conn.sock, request, bodyless=method == "HEAD", stream=stream)
            except (http1.NothingSent, http1.NothingReceived) as exc:
                self._give_back(pool, conn, close=True)
                if reused and not fresh and (isinstance(exc, http1.NothingSent) or method in _IDEMPOTENT):
                    continue
                raise
            except BaseException:
                self._give_back(pool, conn, close=True)
                raise
            if isinstance(result, http1.Stream):
                result.on_close = functools.partial(self._give_back, pool, conn, close=True)
            else:
                self._give_back(pool, conn, close=not result.keep_alive)
            return result
        raise AssertionError("unreachable: the loop returns or raises")

    @staticmethod
    def _give_back(pool: Any, conn: Any, *, close: bool) -> None:
        if close:
            conn.close()  # it connects again on its next use
        pool._put_conn(conn)  # noqa: SLF001

    def _through_proxy(self, method: str, target: str, data: bytes | None, headers: dict[str, Any],
                       timeout: float | tuple[float, float] | None) -> Any:
        """A request through the ApiClient's ProxyManager (a proxy is configured); the response is left unread."""
        if isinstance(timeout, tuple):
            pool_timeout: Any = urllib3.Timeout(connect=timeout[0], read=timeout[1])
        elif timeout:
            pool_timeout = urllib3.Timeout(total=timeout)
        else:
            pool_timeout = None
        return self.client.rest_client.pool_manager.request(method, self.client.configuration.host + target, body=data,
                                                            headers=headers, timeout=pool_timeout, preload_content=False)

    def _json_default(self, value: Any) -> Any:
        # What the official client's sanitize_for_serialization does for values JSON lacks (YAML timestamps, models).
        if isinstance(value, (datetime.datetime, datetime.date)):
            return value.isoformat()
        return self.client.sanitize_for_serialization(value)

    def _sleep(self, delay: float, attempt: int) -> None:
        time.sleep(min(self.max_backoff, delay) * random.uniform(0.5, 1.0))

    @staticmethod
    def _namespace(info: KindInfo, namespace: str | None, obj: dict[str, Any] | None = None) -> str | None:
        if not info.namespaced:
            return None
        return namespace or ((obj or {}).get("metadata") or {}).get("namespace") or "default"

    # ----- verbs ---------------------------------------------------------------------------------------------

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        info = kind_info(kind)
        return self._call("GET", info.path(self._namespace(info, namespace), name))

    def try_get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            return self.get(kind, name, namespace)
        except NotFound:
            return None

    def list(self, kind: str, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        resource_version = ""
        for page, page_rv in self.list_pages(kind, namespace, label_selector, field_selector):
            items.extend(page)
            resource_version = page_rv
        return items, resource_version

    def list_pages(self, kind: str, namespace: str | None = None, label_selector: str | None = None,
                   field_selector: str | None = None, limit: int | None = None,
                   ) -> Iterator[tuple[Items, str]]:
        """The list one page at a time (`limit` items each, None: as the server pages it), with the list's
        resourceVersion: a caller that keeps a few items of a large list never holds all of them at once."""
        info = kind_info(kind)
        query: list[tuple[str, Any]] = []
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        if limit is not None:
            query.append(("limit", limit))
        cont: str | None = None
        while True:
            page_query = query + ([("continue", cont)] if cont else [])
            result = self._call("GET", info.path(namespace if info.namespaced else None), query=page_query)
            items = result.get("items") or []
            for item in items:
                # Lists omit kind/apiVersion on items; callers get complete objects.
                item.setdefault("apiVersion", info.api_version)
                item.setdefault("kind", kind)
            meta = result.get("metadata") or {}
            cont = meta.get("continue")
            yield items, str(meta.get("resourceVersion") or "")
            if not cont:
                return

    def create(self, kind: str, obj: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        info = kind_info(kind)
        body = {"apiVersion": info.api_version, "kind": kind, **obj}
        return self._call("POST", info.path(self._namespace(info, namespace, obj)), body=body)

    def create_token(self, namespace: str, service_account: str, spec: dict[str, Any] | None = None) -> str:
        """A TokenRequest for the ServiceAccount (`kubectl create token`); the token."""
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec or {}}
        path = KINDS["ServiceAccount"].path(namespace, service_account, "token")
        answer = self._call("POST", path, body=body)
        return str(answer["status"]["token"])

    def _put(self, kind: str, obj: dict[str, Any], subresource: str | None) -> dict[str, Any]:
        info = kind_info(kind)
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            raise ValueError(f"{kind}: metadata.name is required to replace an object")
        body = {"apiVersion": info.api_version, "kind": kind, **obj}
        path = info.path(self._namespace(info, None, obj), name, subresource)
        return self._call("PUT", path, body=body)

    def replace(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        """PUT; raises `Conflict` when obj's metadata.resourceVersion is stale."""
        return self._put(kind, obj, None)

    def replace_status(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        return self._put(kind, obj, "status")

    def patch(self, kind: str, name: str, patch: Any, namespace: str | None = None, patch_type: str = "merge",
              subresource: str | None = None) -> dict[str, Any]:
        """`patch_type` "merge" (RFC 7386 merge patch), "strategic" or "json" (RFC 6902 list of operations)."""
        types = {"merge": "application/merge-patch+json", "json": "application/json-patch+json",
                 "strategic": "application/strategic-merge-patch+json"}
        if patch_type not in types:
            raise ValueError(f"patch_type {patch_type!r}: accepted: {', '.join(types)}")
        if patch_type == "json" and not isinstance(patch, list):
            raise ValueError("patch_type 'json' needs a list of RFC 6902 operations")
        info = kind_info(kind)
        path = info.path(self._namespace(info, namespace), name, subresource)
        return self._call("PATCH", path, body=patch, content_type=types[patch_type])

    def delete(self, kind: str, name: str, namespace: str | None = None, *, propagation: str | None = None,
               uid: str | None = None, resource_version: str | None = None,
               grace_period_seconds: int | None = None) -> bool:
        """Delete; True when the server accepted it (a pod may stay Terminating for its grace period), False when
        the object did not exist."""
        info = kind_info(kind)
        options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if propagation:
            options["propagationPolicy"] = propagation
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        pre = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        if pre:
            options["preconditions"] = pre
        try:
            self._call("DELETE", info.path(self._namespace(info, namespace), name), body=options)
        except NotFound:
            return False
        return True

    def bind_pod(self, namespace: str, name: str, node: str, uid: str | None = None) -> None:
        """POST pods/NAME/binding: sets spec.nodeName; raises `Conflict` if the pod is already bound."""
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        self._call("POST", KINDS["Pod"].path(namespace, name, "binding"), body=body)

    def retry_on_conflict(self, fn: Callable[[], T], attempts: int = 10) -> T:
        return retry_on_conflict(fn, attempts)

    # ----- watch ---------------------------------------------------------------------------------------------

    def watch(self, kind: str, namespace: str | None = None, label_selector: str | None = None,
              field_selector: str | None = None, resource_version: str | None = None,
              stop: threading.Event | None = None, *, bookmarks: bool = False,
              server_timeout: int = 300) -> Iterator[tuple[str, dict[str, Any]]]:
        """Events as (type, object) until `stop` is set.

        Without `resource_version` the current objects come first as ADDED events (list, then watch). A dropped
        connection resumes from the last seen resourceVersion; a 410 (history compacted) relists and emits the
        difference to what was already delivered (ADDED, MODIFIED, DELETED), so consumers stay consistent.
        BOOKMARK events are only yielded when `bookmarks` is true.
        """
        return _Watch(self, kind_info(kind), kind, namespace, label_selector, field_selector, resource_version,
                      stop or threading.Event(), bookmarks, server_timeout).run()


def _obj_key(obj: dict[str, Any]) -> tuple[str, str]:
    m = obj.get("metadata") or {}
    return (m.get("namespace") or "", m.get("name") or "")


class _Watch:
    """The state of one resumable watch: the last resourceVersion and the objects delivered so far."""

    def __init__(self, api: KubeApi, info: KindInfo, kind: str, namespace: str | None, label_selector: str | None,
                 field_selector: str | None, resource_version: str | None, stop: threading.Event,
                 bookmarks: bool, server_timeout: int) -> None:
        self.api = api
        self.info = info
        self.kind = kind
        self.namespace = namespace if info.namespaced else None
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.rv = resource_version
        self.stop = stop
        self.bookmarks = bookmarks
        self.server_timeout = server_timeout
        # Delivered objects, by (namespace, name); only needed to compute the difference after a relist.
        self.known: dict[tuple[str, str], dict[str, Any]] = {}

    def _relist(self) -> Iterator[tuple[str, dict[str, Any]]]:
        items, rv = self.api.list(self.kind, self.namespace, self.label_selector, self.field_selector)
        fresh = {_obj_key(i): i for i in items}
        for key, old in list(self.known.items()):
            if key not in fresh:
                del self.known[key]
                yield "DELETED", old
        for key, obj in fresh.items():
            previous = self.known.get(key)
            self.known[key] = obj
            if previous is None:
                yield "ADDED", obj
            elif (previous.get("metadata") or {}).get("resourceVersion") != (obj.get("metadata") or {}).get("resourceVersion"):
                yield "MODIFIED", obj
        self.rv = rv

    def _open(self) -> Any:
        query: list[tuple[str, Any]] = [("watch", "true"), ("resourceVersion", self.rv),
                                        ("allowWatchBookmarks", "true"),
                                        ("timeoutSeconds", self.server_timeout)]
        if self.label_selector:
            query.append(("labelSelector", self.label_selector))
        if self.field_selector:
            query.append(("fieldSelector", self.field_selector))
        return self.api._call("GET", self.info.path(self.namespace), query=query, stream=True,
                              timeout=(10.0, self.server_timeout + 30.0))

    def run(self) -> Iterator[tuple[str, dict[str, Any]]]:
        delay = self.api.backoff
        if not self.rv:
            yield from self._relist()
        while not self.stop.is_set():
            try:
                response = self._open()
            except Gone:
                yield from self._relist()
                continue
            except ApiError as err:
                if self.stop.is_set():
                    return
                log.warning("watch kind=%s open failed status=%s reason=%s msg=%r; retrying", self.kind,
                            err.status, err.reason, err.message)
                self.stop.wait(delay)
                delay = min(delay * 2, self.api.max_backoff)
                continue
            delay = self.api.backoff
            closer = threading.Thread(target=self._close_on_stop, args=(response,), daemon=True,
                                      name=f"watch-{self.kind}-closer")
            closer.start()
            try:
                relist = yield from self._consume(response)
            finally:
                response.close()
            if relist:
                yield from self._relist()

    def _close_on_stop(self, response: Any) -> None:
        # A blocked socket read only returns when the socket is shut down; this is what makes `stop` prompt.
        while not self.stop.wait(0.5):
            if response.closed:
                return
        try:
            response.shutdown()
        except Exception:  # noqa: BLE001 - the stream may already be closed; nothing else to do
            pass

    def _consume(self, response: Any) -> Generator[tuple[str, dict[str, Any]], None, bool]:
        """Yield events from one stream; returns True when the caller must relist (410)."""
        try:
            for line in response:
                if self.stop.is_set():
                    return False
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    log.warning("watch kind=%s undecodable event dropped: %r", self.kind, line[:200])
                    continue
                etype = event.get("type")
                obj = event.get("object") or {}
                if etype == "ERROR":
                    if obj.get("code") == 410:
                        return True
                    log.warning("watch kind=%s error event: %s", self.kind, obj.get("message"))
                    return False
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if rv:
                    self.rv = rv
                if etype == "BOOKMARK":
                    if self.bookmarks:
                        yield etype, obj
                    continue
                obj.setdefault("apiVersion", self.info.api_version)
                obj.setdefault("kind", self.kind)
                key = _obj_key(obj)
                if etype == "DELETED":
                    self.known.pop(key, None)
                else:
                    self.known[key] = obj
                yield etype, obj
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            if not self.stop.is_set():
                log.info("watch kind=%s stream ended (%s); resuming from resourceVersion %s", self.kind, exc, self.rv)
        return False
