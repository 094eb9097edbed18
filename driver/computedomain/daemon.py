"""The compute-domain daemon (NVIDIA's cmd/compute-domain-daemon): what runs in each IMEX daemon pod.

`run` joins the domain's ComputeDomainClique with this pod's IP and clique (an index, the lowest free one), writes
the IMEX daemon config from the template the kubelet plugin's prepare left in /imexd, writes the static nodes
config of DNS names (`compute-domain-daemon-<index>`, MAX_NODES_PER_IMEX_DOMAIN of them: NVIDIA's default
IMEXDaemonsWithDNSNames mode) and keeps /etc/hosts mapping the clique's daemons' names to their IPs, starts
`nvidia-imex` (from PATH: the claim's CDI spec mounts the driver's), restarts it if it dies, sends it SIGUSR1 when
the mapping changes (so a peer's new IP needs no restart), and reports its own entry Ready or NotReady from
`nvidia-imex-ctl -q` (the same check the pod's probes run). SIGTERM stops nvidia-imex, removes the entry and
exits 0.

Paths are the container's (/imexd, /etc/hosts, the ServiceAccount token). `CONTAINER_ROOT_ENV`, when set, is the
directory those paths are under: the simulated kubelet runs this pod as a host process (sim.runtime.hostprocess)
and has no private root to give it.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudra import computedomain as cd
from gpudra.atomicfile import atomic_write
from gpudra.kubeapi import AlreadyExists, ApiError, Conflict, KubeApi
from gpudra.signals import stop_on_signals

log = logging.getLogger("gpu-dra.compute-domain-daemon")

CONTAINER_ROOT_ENV = "GPU_DRA_CONTAINER_ROOT"
CONFIG_DIR = "/imexd"
CONFIG = f"{CONFIG_DIR}/imexd.cfg"
CONFIG_TEMPLATE = f"{CONFIG_DIR}/imexd.cfg.tmpl"
NODES_CONFIG = f"{CONFIG_DIR}/nodes.cfg"
HOSTS = "/etc/hosts"
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DNS_PREFIX = "compute-domain-daemon-"
HOSTS_MARK = "# Compute Domain Daemon mappings"
# The label NVIDIA's daemon puts on its own pod (the controller finds a node's clique by it).
POD_CLIQUE_LABEL = "resource.nvidia.com/computeDomain.cliqueID"
DEFAULT_MAX_NODES = 18  # one GB200 NVL72 rack: 18 compute trays
RECONCILE_S = 1.0


class DaemonError(Exception):
    pass


# ----- pure parts --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DaemonEnv:
    """What the pod's env (its spec's and the daemon claim's CDI edits) tells the daemon."""

    clique_id: str
    domain_uid: str
    domain_name: str
    domain_namespace: str
    node_name: str
    pod_ip: str
    pod_name: str
    pod_namespace: str
    max_nodes: int

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> DaemonEnv:
        if not env.get("COMPUTE_DOMAIN_UUID"):
            raise DaemonError("COMPUTE_DOMAIN_UUID is not set: the daemon claim's CDI edits were not applied (is CDI "
                              "enabled in the container runtime?)")
        missing = [k for k in ("NODE_NAME", "POD_IP", "POD_NAME", "POD_NAMESPACE") if not env.get(k)]
        if missing:
            raise DaemonError(f"{', '.join(missing)} not set: the DaemonSet's pod template sets them from the "
                              "downward API (spec.nodeName, status.podIP, metadata.name, metadata.namespace)")
        raw = env.get("MAX_NODES_PER_IMEX_DOMAIN") or str(DEFAULT_MAX_NODES)
        try:
            max_nodes = int(raw)
        except ValueError:
            max_nodes = 0
        if max_nodes <= 0:
            raise DaemonError(f"MAX_NODES_PER_IMEX_DOMAIN: Invalid value: {raw!r}: expected a positive integer")
        return cls(env.get("CLIQUE_ID") or "", env["COMPUTE_DOMAIN_UUID"], env.get("COMPUTE_DOMAIN_NAME") or "",
                   env.get("COMPUTE_DOMAIN_NAMESPACE") or "default", env["NODE_NAME"], env["POD_IP"],
                   env["POD_NAME"], env["POD_NAMESPACE"], max_nodes)


def dns_name(index: int) -> str:
    return f"{DNS_PREFIX}{index:04d}"


def nodes_config(max_nodes: int) -> str:
    """The static nodes config: every name a daemon of the clique can have; /etc/hosts says which exist."""
    return "".join(f"{dns_name(i)}\n" for i in range(max_nodes))


def render_config(template: str, pod_ip: str) -> str:
    """imexd.cfg from the kubelet plugin's template (Go template fields, as NVIDIA's)."""
    return (template.replace("{{ .IMEXCmdBindInterfaceIP }}", pod_ip)
            .replace("{{ .IMEXDaemonNodesConfigPath }}", NODES_CONFIG))


def clique_mapping(daemons: Sequence[Mapping[str, Any]], clique_id: str, max_nodes: int) -> dict[str, str]:
    """DNS name -> IP of the clique's daemons (an index out of range is refused, as NVIDIA's)."""
    out = {}
    for d in daemons:
        if d.get("cliqueID") != clique_id or not d.get("ipAddress"):
            continue
        index = int(d.get("index", -1))
        if not 0 <= index < max_nodes:
            raise DaemonError(f"daemon of node {d.get('nodeName')} has index {index}: must be in [0, {max_nodes})")
        out[dns_name(index)] = str(d["ipAddress"])
    return out


def hosts_file(current: str, mapping: Mapping[str, str]) -> str:
    """/etc/hosts with the daemons' names replaced by `mapping` (every other line kept)."""
    lines = [line for line in current.splitlines() if DNS_PREFIX not in line and line != HOSTS_MARK]
    if mapping:
        lines += [HOSTS_MARK] + [f"{ip}\t{name}" for name, ip in sorted(mapping.items())]
    return "".join(f"{line}\n" for line in lines)


def join_clique(daemons: Sequence[Mapping[str, Any]], env: DaemonEnv, status: str | None) -> list[dict[str, Any]] | None:
    """The clique's daemons with this node's entry added or updated (status None: removed); None if unchanged."""
    out = [dict(d) for d in daemons]
    mine = next((d for d in out if d.get("nodeName") == env.node_name), None)
    if status is None:
        return None if mine is None else [d for d in out if d is not mine]
    if mine is None:
        used = {int(d.get("index", -1)) for d in out}
        index = next(i for i in range(len(out) + 1) if i not in used)
        if index >= env.max_nodes:
            raise DaemonError(f"clique {env.clique_id} has {len(out)} daemons: no index left below "
                              f"MAX_NODES_PER_IMEX_DOMAIN={env.max_nodes}")
        out.append({"nodeName": env.node_name, "ipAddress": env.pod_ip, "cliqueID": env.clique_id, "index": index,
                    "status": status})
        return out
    if mine.get("ipAddress") == env.pod_ip and mine.get("status") == status and mine.get("cliqueID") == env.clique_id:
        return None
    mine.update(ipAddress=env.pod_ip, status=status, cliqueID=env.clique_id)
    return out


# ----- the edges ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Paths:
    """The container's paths, under `root` (/ in a container)."""

    root: Path

    def at(self, container_path: str) -> Path:
        return self.root / container_path.lstrip("/")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Paths:
        return cls(Path(env.get(CONTAINER_ROOT_ENV) or "/"))


def check(clique_id: str, timeout: float = 10.0) -> tuple[bool, str]:
    """`nvidia-imex-ctl -c /imexd/imexd.cfg -q` printing READY (what the pod's probes run). No clique: nothing to
    check (this node has no NVLink fabric), as NVIDIA's."""
    if not clique_id:
        return True, "check succeeded (noop, clique ID is empty)"
    try:
        out = subprocess.run(["nvidia-imex-ctl", "-c", CONFIG, "-q"], capture_output=True, timeout=timeout,
                             check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"nvidia-imex-ctl: {exc}"
    text = (out.stdout + out.stderr).decode(errors="replace")
    if out.returncode != 0:
        return False, f"nvidia-imex-ctl exited with status {out.returncode}: {text.strip()}"
    return text == "READY\n", text.strip()


def connect(paths: Paths, env: Mapping[str, str]) -> KubeApi:
    """The in-cluster client, as client-go's rest.InClusterConfig: KUBERNETES_SERVICE_HOST/PORT and the pod's
    ServiceAccount token and CA. Without a ca.crt the API server is taken to speak plain HTTP (the simulator's
    embedded control plane does)."""
    from kubernetes import client as k8s_client

    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise DaemonError("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set: not running in a pod")
    token_dir = paths.at(TOKEN_DIR)
    try:
        token = (token_dir / "token").read_text().strip()
    except OSError as exc:
        raise DaemonError(f"{TOKEN_DIR}/token: {exc.strerror or exc} (does the pod mount its ServiceAccount "
                          "token?)") from None
    cfg = k8s_client.Configuration()
    ca = token_dir / "ca.crt"
    address = f"[{host}]" if ":" in host else host
    if ca.exists():
        cfg.host, cfg.ssl_ca_cert = f"https://{address}:{port}", str(ca)
    else:
        cfg.host = f"http://{address}:{port}"
    cfg.api_key = {"BearerToken": f"Bearer {token}"}
    return KubeApi(k8s_client.ApiClient(cfg))


class ImexProcess:
    """nvidia-imex as a child: started, restarted when it exits, signalled, stopped."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = list(argv)
        self.process: subprocess.Popen[bytes] | None = None

    def ensure_started(self) -> bool:
        """True when a fresh process was started."""
        if self.process is not None and self.process.poll() is None:
            return False
        if self.process is not None:
            log.warning("event=imex-exited status=%s", self.process.returncode)
        try:
            self.process = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL)
        except OSError as exc:
            raise DaemonError(f"cannot start {self.argv[0]}: {exc}") from None
        log.info("event=imex-started pid=%d", self.process.pid)
        return True

    def signal(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class ComputeDomainDaemon:
    def __init__(self, api: KubeApi, env: DaemonEnv, paths: Paths, *,
                 checker: Callable[[], tuple[bool, str]] | None = None, interval: float = RECONCILE_S) -> None:
        self.api = api
        self.env = env
        self.paths = paths
        self.interval = interval
        self.checker = checker or (lambda: check(env.clique_id))
        self.imex = ImexProcess(["nvidia-imex", "-c", CONFIG])
        self.stop = threading.Event()
        self.mapping: dict[str, str] | None = None
        self.reported: str | None = None

    @property
    def clique_name(self) -> str:
        return cd.clique_object_name(self.env.domain_uid, self.env.clique_id)

    def _update_clique(self, status: str | None) -> list[dict[str, Any]]:
        """Write this node's entry (status None: remove it); the clique's daemons after."""
        ns, name = self.env.pod_namespace, self.clique_name
        for _ in range(10):
            obj = self.api.try_get("ComputeDomainClique", name, namespace=ns)
            if obj is None:
                if status is None:
                    return []
                try:
                    self.api.create("ComputeDomainClique", {
                        "apiVersion": cd.API_VERSION, "kind": "ComputeDomainClique",
                        "metadata": {"name": name, "namespace": ns, "labels": {cd.DOMAIN_LABEL: self.env.domain_uid}},
                        "daemons": []}, namespace=ns)
                except AlreadyExists:
                    pass
                continue
            daemons = obj.get("daemons") or []
            changed = join_clique(daemons, self.env, status)
            if changed is None:
                return [dict(d) for d in daemons]
            try:
                self.api.replace("ComputeDomainClique", {**obj, "daemons": changed})
                return changed
            except Conflict:
                continue
        raise DaemonError(f"ComputeDomainClique {ns}/{name}: too many concurrent writers")

    def prepare(self) -> None:
        """Label the pod with its clique, write imexd.cfg and the static nodes config."""
        self.api.patch("Pod", self.env.pod_name, {"metadata": {"labels": {POD_CLIQUE_LABEL: self.env.clique_id}}},
                       namespace=self.env.pod_namespace)
        template = self.paths.at(CONFIG_TEMPLATE)
        try:
            text = template.read_text()
        except OSError as exc:
            raise DaemonError(f"{CONFIG_TEMPLATE}: {exc.strerror or exc} (the daemon claim's prepare writes it; is "
                              f"{CONFIG_DIR} mounted from the claim's CDI spec?)") from None
        atomic_write(self.paths.at(CONFIG), render_config(text, self.env.pod_ip).encode(), mode=0o644)
        atomic_write(self.paths.at(NODES_CONFIG), nodes_config(self.env.max_nodes).encode(), mode=0o644)

    def _write_hosts(self, mapping: Mapping[str, str]) -> None:
        hosts = self.paths.at(HOSTS)
        try:
            current = hosts.read_text()
        except FileNotFoundError:
            current = ""
        # In place (not a rename): the container's /etc/hosts is a file bind-mounted by the runtime.
        hosts.write_text(hosts_file(current, mapping))

    def reconcile(self) -> None:
        daemons = self._update_clique(self.reported or "NotReady")
        mapping = clique_mapping(daemons, self.env.clique_id, self.env.max_nodes)
        updated = mapping != self.mapping
        if updated:
            self._write_hosts(mapping)
            self.mapping = mapping
            log.info("event=dns-names %s", " ".join(f"{n}={ip}" for n, ip in sorted(mapping.items())) or "-")
        fresh = self.imex.ensure_started()
        if updated and not fresh:
            self.imex.signal(signal.SIGUSR1)  # re-resolve the names and reconnect, no restart
        ready, said = self.checker()
        status = "Ready" if ready else "NotReady"
        if status != self.reported:
            log.info("event=imex-%s said=%r", status.lower(), said)
            self.reported = status
            self._update_clique(status)

    def run(self) -> int:
        if not self.env.clique_id:
            log.info("event=no-clique node=%s: no IMEX daemon to run", self.env.node_name)
            self.stop.wait()
            return 0
        self.prepare()
        try:
            while not self.stop.is_set():
                try:
                    self.reconcile()
                except (ApiError, OSError) as exc:  # the API server restarting must not end the daemon
                    log.warning("event=reconcile-failed error=%r", str(exc))
                self.stop.wait(self.interval)
        finally:
            self.imex.stop()
            try:
                self._update_clique(None)
            except (ApiError, DaemonError, OSError) as exc:
                log.warning("event=clique-leave-failed error=%r", str(exc))
        log.info("event=exiting")
        return 0


def run_daemon(environ: Mapping[str, str]) -> int:
    env = DaemonEnv.from_env(environ)
    paths = Paths.from_env(environ)
    api = connect(paths, environ)
    daemon = ComputeDomainDaemon(api, env, paths)
    stop_on_signals(daemon.stop, notify=lambda sig: log.info("event=signal signal=%s: shutting down", sig.name))
    try:
        return daemon.run()
    finally:
        api.close()


def check_once(environ: Mapping[str, str]) -> tuple[bool, str]:
    return check(environ.get("CLIQUE_ID") or "")
