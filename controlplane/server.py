"""`EmbeddedApiServer`: the store, the HTTP server and the background workers, started and stopped together."""

from __future__ import annotations

import base64
import ipaddress
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import yaml

from controlplane.admission.policy import Expressions
from controlplane.audit.event import Auditor
from controlplane.crds.manager import DefinitionController
from controlplane.handler import ApiHandler
from controlplane.podlogs import PodLogSource
from controlplane.backend import HistoryLimits
from controlplane.gatedfields import GatedFields
from controlplane import services
from controlplane.podpriority import system_priority_classes
from controlplane.resources import Registry, known_group_versions, registry_for
from controlplane.runtimeconfig import RuntimeConfig
from controlplane.security import Security, build_security, ensure_bootstrap_policy, ensure_default_account
from controlplane.serving import Connection, PooledHttpServer
from controlplane.status import StatusError
from controlplane.store import Filter, Store
from controlplane.tls import (
    Certificates,
    TlsFront,
    issue_client_certificate,
    load_or_make,
    make_certificates,
    server_context,
)
from gpudra.atomicfile import atomic_write
from gpudra.features import Features
from gpudra.validation.admission import Admission

_INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


def check_loopback(host: str) -> None:
    """Refuse to listen anywhere but loopback: the embedded server has no authentication at all."""
    if host == "localhost":
        return
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"--address {host!r}: not an IP address; the embedded apiserver listens on loopback only "
                         "(accepted: 127.0.0.1, another 127.x.y.z address, ::1 or localhost)") from None
    if not addr.is_loopback:
        raise ValueError(f"--address {host}: not a loopback address; the embedded apiserver has no authentication "
                         "and listens on loopback only (accepted: 127.0.0.1, another 127.x.y.z address, ::1 or "
                         "localhost)")


class EmbeddedApiServer:
    """A Kubernetes-compatible API server on loopback, in memory or durable in the SQLite database `state_file`.

    With `state_file`, every write is committed to the database before it is answered (see persistence.py);
    `persist_interval` is accepted for compatibility and unused (there is no periodic snapshot any more).

    Requests pass authentication, authorization (Node, RBAC) and admission (`controlplane.security`).
    `unauthenticated_as_admin` keeps kube-apiserver's old insecure-port behaviour for library use and tests (a
    request without credentials is the admin); the programs (`gpu-dra apiserver`, demo, cluster) turn it off,
    so such a request is system:anonymous. The kubeconfig written is always the admin's (a bearer token).
    `token_key` signs the tokens it issues (random when absent: tokens then die with the process).
    With `tls`, the server also serves HTTPS on `tls_port` (`tls_url`; a CA made at start or kept in `tls_dir`,
    in the kubeconfig),
    where credentials are always required: kubectl sends its token only there (controlplane/tls.py). There,
    client certificates signed by `client_ca` (PEM; kube-apiserver's --client-ca-file) authenticate their CN
    in their Os; without it, those the server's own CA signed do (`client_certificate`).
    `audit` records the requests its policy selects (controlplane.audit; stopped, its log flushed, with the
    server).
    `expressions` is the CEL engine ValidatingAdmissionPolicies are evaluated with (none: policies are stored
    but not enforced, which only library users without the controller package get)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, state_file: str | Path | None = None,
                 admission: Admission | None = None, *, bookmark_interval: float = 60.0,
                 history_limit: int = 20000, history_bytes: int = HistoryLimits.bytes,
                 history_age_s: float = HistoryLimits.age_s, registry: Registry | None = None,
                 persist_interval: float = 0.5, kubernetes_version: str = "1.37",
                 runtime_config: str | list[str] | RuntimeConfig | None = None,
                 features: Features | None = None,
                 unauthenticated_as_admin: bool = True, expressions: Expressions | None = None,
                 token_key: bytes | None = None, tls: bool = False, tls_port: int = 0,
                 tls_dir: str | Path | None = None, client_ca: bytes | None = None,
                 audit: Auditor | None = None) -> None:
        """`runtime_config` is kube-apiserver's `--runtime-config` (GA versions only when None; the beta
        versions of resource.k8s.io and scheduling.k8s.io are off by default, as in 1.37); `features`, the
        feature gates (the release's defaults when None): gated types are served and gated fields kept only
        with their gate on."""
        check_loopback(host)
        self.kubernetes_version = kubernetes_version
        self.host = host
        self.port = port
        self.state_file = Path(state_file) if state_file else None
        self.features = features or Features.for_version(kubernetes_version)
        if not isinstance(runtime_config, RuntimeConfig):
            runtime_config = RuntimeConfig.parse(runtime_config, known_group_versions())
        self.runtime_config = runtime_config
        # A registry of its own: served CustomResourceDefinitions add types to it.
        self.registry = (Registry(types=registry.types) if registry is not None
                         else registry_for(kubernetes_version, runtime_config, self.features))
        self.bookmark_interval = bookmark_interval
        self.persist_interval = persist_interval
        self.store = Store(self.registry, admission, HistoryLimits(history_limit, history_bytes, history_age_s),
                           GatedFields(self.features))
        self.security: Security = build_security(self.store, self.registry, self.features,
                                                 expressions=expressions,
                                                 unauthenticated_as_admin=unauthenticated_as_admin,
                                                 token_key=token_key)
        # Where a webhook's service reference is reached: (namespace, name) -> (host, port). TLS still verifies
        # `<name>.<namespace>.svc`, as kube-apiserver's service resolver does.
        self.service_endpoints: dict[tuple[str, str], tuple[str, int]] = {}
        self.security.webhooks.resolve = self._resolve_service
        self.security.mutating_webhooks.resolve = self._resolve_service
        self._stop = threading.Event()
        self._httpd: PooledHttpServer | None = None
        self.tls = tls
        self.tls_port = tls_port
        self.tls_url = ""
        self.tls_dir = Path(tls_dir) if tls_dir else None
        self.certificates: Certificates | None = None
        self.client_ca = client_ca
        self.audit = audit
        self._strict_httpd: PooledHttpServer | None = None
        self._tls_front: TlsFront | None = None
        self._threads: list[threading.Thread] = []
        self.url = ""
        # Where pods/log reads container logs; a testbed with a container runtime registers one.
        self.pod_logs: PodLogSource | None = None

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def start(self) -> str:
        if self.state_file is not None:
            for problem in self.store.open_durable(self.state_file):
                print(f"level=warning component=apiserver msg={problem!r}", file=sys.stderr)
        self._ensure_namespaces()
        host = "127.0.0.1" if self.host == "localhost" else self.host
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, self.port))
            listener.listen(1024)
        except OSError:
            listener.close()
            self.store.close()
            raise
        self.port = listener.getsockname()[1]
        self.url = f"http://[{host}]:{self.port}" if family == socket.AF_INET6 else f"http://{host}:{self.port}"
        self._httpd = PooledHttpServer(listener, self._make_handler)
        self._httpd.start()
        if self.tls:
            try:
                self._start_tls(host, family)
            except (OSError, RuntimeError):
                self.stop()
                raise
        self._spawn("apiserver-gc", self._gc_loop)
        self._spawn("apiserver-crds", DefinitionController(self.store, self._stop).run)
        return self.url

    def _start_tls(self, host: str, family: socket.AddressFamily) -> None:
        self.certificates = load_or_make(self.tls_dir) if self.tls_dir else make_certificates()
        internal = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        internal.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        internal.bind(("127.0.0.1", 0))
        internal.listen(1024)
        self._strict_httpd = PooledHttpServer(internal, self._make_handler)
        self._strict_httpd.requires_credentials = True  # type: ignore[attr-defined]
        self._strict_httpd.start()
        front = socket.socket(family, socket.SOCK_STREAM)
        front.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            front.bind((host, self.tls_port))
            front.listen(1024)
        except OSError:
            front.close()
            raise
        self.tls_port = front.getsockname()[1]
        try:
            context = server_context(self.certificates, self.client_ca or self.certificates.ca_pem)
        except ValueError as exc:
            front.close()
            raise ValueError(f"the client CA: {exc}") from None
        self._tls_front = TlsFront(front, internal.getsockname()[:2], context, self.security.client_identities)
        self._tls_front.start()
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        self.tls_url = f"https://{shown}:{self.tls_port}"

    def _resolve_service(self, namespace: str, name: str, port: int) -> tuple[str, int]:
        return self.service_endpoints.get((namespace, name), (f"{name}.{namespace}.svc", port))

    def client_certificate(self, user: str, groups: tuple[str, ...] = ()) -> tuple[bytes, bytes]:
        """A client certificate (PEM) and key for `user` in `groups`, signed by the server's CA (TLS only)."""
        if self.certificates is None:
            raise RuntimeError("client_certificate: the server serves no TLS; start it with tls=True")
        return issue_client_certificate(self.certificates, user, groups)

    @property
    def admin_token(self) -> str:
        """The person's credential (`kubernetes-admin` in system:masters), as the kubeconfig carries it."""
        return self.security.authenticator.admin_token

    def node_token(self, node: str) -> str:
        """A kubelet's credential: `system:node:<node>` in system:nodes (a client certificate on a cluster)."""
        return self.security.authenticator.node_token(node)

    def service_account_token(self, namespace: str, name: str, *, node: str | None = None,
                              expiration_seconds: int = 86400 * 365) -> str:
        """A TokenRequest token of an existing ServiceAccount, bound to Node `node` when given (so it carries
        `authentication.kubernetes.io/node-name`, as a DaemonSet pod's projected token does)."""
        from controlplane.authn import BoundObject

        sa_rt, node_rt = self.registry.by_kind("ServiceAccount"), self.registry.by_kind("Node")
        assert sa_rt is not None and node_rt is not None
        account = self.store.get(sa_rt, namespace, name)
        bound = None
        if node is not None:
            node_obj = self.store.get(node_rt, "", node)
            bound = BoundObject("Node", node, str(node_obj["metadata"]["uid"]))
        token, _ = self.security.authenticator.service_account_token(
            namespace, name, str(account["metadata"]["uid"]), expiration_seconds=expiration_seconds, node=bound)
        return token

    def _make_handler(self, conn: Connection, server: PooledHttpServer) -> ApiHandler:
        return ApiHandler.for_connection(conn, server, self)

    def _spawn(self, name: str, target: Any) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _ensure_namespaces(self) -> None:
        ns_rt = self.registry.by_kind("Namespace")
        assert ns_rt is not None
        for name in _INITIAL_NAMESPACES:
            try:
                self.store.get(ns_rt, "", name)
            except StatusError:
                self.store.create(ns_rt, "", {"metadata": {"name": name}})
        ensure_bootstrap_policy(self.store, self.registry)
        ns_items = self.store.list(Filter(ns_rt))[0]
        for ns in ns_items:
            if not ns["metadata"].get("deletionTimestamp"):
                ensure_default_account(self.store, self.registry, ns["metadata"]["name"])
        svc_rt = self.registry.by_kind("Service")
        if svc_rt is not None:
            try:
                self.store.get(svc_rt, "default", "kubernetes")
            except StatusError:
                self.store.create(svc_rt, "default", services.kubernetes_service())
        pc_rt = self.registry.by_kind("PriorityClass")
        if pc_rt is None:
            return
        for pc in system_priority_classes():
            try:
                self.store.get(pc_rt, "", pc["metadata"]["name"])
            except StatusError:
                self.store.create(pc_rt, "", pc)

    def _gc_loop(self) -> None:
        while self.store.collect_garbage_once(timeout=1.0):
            pass

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._stop.set()
        if self._tls_front is not None:
            self._tls_front.stop()
            self._tls_front = None
        if self._strict_httpd is not None:
            self._strict_httpd.stop()
            self._strict_httpd = None
        self._httpd.stop()
        if self.audit is not None:
            self.audit.stop()
        self.store.close()
        for t in self._threads:
            t.join(timeout=5)
        self._threads = []
        self._httpd = None

    def __enter__(self) -> EmbeddedApiServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kubeconfig(self) -> dict[str, Any]:
        """The admin's kubeconfig: the HTTPS endpoint and its CA when serving TLS, else the plain one."""
        cluster: dict[str, Any] = {"server": self.url}
        if self.tls_url and self.certificates is not None:
            cluster = {"server": self.tls_url,
                       "certificate-authority-data": base64.b64encode(self.certificates.ca_pem).decode()}
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "gpu-dra", "cluster": cluster}],
            "users": [{"name": "gpu-dra", "user": {"token": self.admin_token}}],
            "contexts": [{"name": "gpu-dra", "context": {"cluster": "gpu-dra", "user": "gpu-dra",
                                                         "namespace": "default"}}],
            "current-context": "gpu-dra",
            "preferences": {},
        }

    def write_kubeconfig(self, path: str | Path) -> Path:
        if not self.url:
            raise RuntimeError("write_kubeconfig: the server has not been started; call start() first")
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, yaml.safe_dump(self.kubeconfig(), sort_keys=False).encode())
        return target
