"""`EmbeddedApiServer`: the store, the HTTP server and the background workers, started and stopped together."""

from __future__ import annotations

import ipaddress
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import yaml

from controlplane.crds.manager import DefinitionController
from controlplane.handler import ApiHandler
from controlplane.serving import Connection, PooledHttpServer
from controlplane.podpriority import system_priority_classes
from controlplane.podlogs import PodLogSource
from gpudra.atomicfile import atomic_write
from controlplane.backend import HistoryLimits
from controlplane.gatedfields import GatedFields
from controlplane.resources import Registry, known_group_versions, registry_for
from controlplane.runtimeconfig import RuntimeConfig
from controlplane.status import StatusError
from controlplane.store import Store
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
    `persist_interval` is accepted for compatibility and unused (there is no periodic snapshot any more)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, state_file: str | Path | None = None,
                 admission: Admission | None = None, *, bookmark_interval: float = 60.0,
                 history_limit: int = 20000, history_bytes: int = HistoryLimits.bytes,
                 history_age_s: float = HistoryLimits.age_s, registry: Registry | None = None,
                 persist_interval: float = 0.5, kubernetes_version: str = "1.37",
                 runtime_config: str | list[str] | RuntimeConfig | None = None,
                 features: Features | None = None) -> None:
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
        self._stop = threading.Event()
        self._httpd: PooledHttpServer | None = None
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
        self._spawn("apiserver-gc", self._gc_loop)
        self._spawn("apiserver-crds", DefinitionController(self.store, self._stop).run)
        return self.url

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
        pc_rt = self.registry.by_kind("PriorityClass")
        for pc in system_priority_classes() if pc_rt is not None else []:
            try:
                self.store.get(pc_rt, "", pc["metadata"]["name"])  # type: ignore[arg-type]
            except StatusError:
                self.store.create(pc_rt, "", pc)  # type: ignore[arg-type]

    def _gc_loop(self) -> None:
        while self.store.collect_garbage_once(timeout=1.0):
            pass

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._stop.set()
        self._httpd.stop()
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
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "gpu-dra", "cluster": {"server": self.url}}],
            "users": [{"name": "gpu-dra", "user": {}}],
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
