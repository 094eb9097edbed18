"""What a cluster is made of (its spec) and where its state lives (a per-user XDG state directory).

Pure: parsing `--nodes`, the state layout, and the JSON the supervisor and the `cluster` commands exchange.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from driver.unixsocket import MAX_UNIX_SOCKET_PATH
from gpudra.atomicfile import atomic_write
from sim.demo.cluster import NODES, NodeSpec
from sim.demo.processes import pid_alive

DEFAULT_NAME = "gpu-dra"
RUNTIMES = ("auto", "podman", "none")
# A cluster name becomes part of a kubeconfig context and of paths: a DNS label keeps both simple.
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
MAX_SOCKET_PATH_BYTES = MAX_UNIX_SOCKET_PATH  # what gRPC can bind (sun_path less its limits)
# The longest socket path under a node's link (the registration socket of the default driver name).
LONGEST_SOCKET_SUFFIX = "/{node}/kubelet/plugins_registry/gpu.nvidia.com-reg.sock"


class SpecError(ValueError):
    """A bad `cluster up` argument; the message names the flag and what is accepted."""


def name_error(name: str, what: str) -> str | None:
    if _NAME.match(name):
        return None
    return (f"{what} {name!r}: must be a DNS label (lower-case letters, digits and '-', starting and ending with a "
            "letter or digit, at most 63 characters)")


def parse_nodes(text: str, shipped: list[str], *, device_plugin: bool) -> tuple[NodeSpec, ...]:
    """`NAME=PROFILE[,NAME=PROFILE...]` -> node specs; PROFILE is a shipped profile or a profile file path."""
    nodes: list[NodeSpec] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, profile = item.partition("=")
        if not sep or not name or not profile:
            raise SpecError(f"--nodes: {item!r}: expected NAME=PROFILE (e.g. a100-1=dgx-a100)")
        problem = name_error(name, "--nodes: node name")
        if problem:
            raise SpecError(problem)
        profile, _, options = profile.partition("?")
        if profile not in shipped and not Path(profile).is_file():
            raise SpecError(f"--nodes: {item!r}: profile {profile!r} is neither a shipped profile "
                            f"({', '.join(shipped)}) nor a profile file")
        if options and not re.fullmatch(r"clique=\d{1,9}", options):
            raise SpecError(f"--nodes: {item!r}: unknown profile option {options!r}; accepted: ?clique=N (the node's "
                            "NVLink clique, for fabric profiles such as gb200-nvl)")
        if any(n.name == name for n in nodes):
            raise SpecError(f"--nodes: node {name!r} is given twice")
        full = str(Path(profile).absolute()) if profile not in shipped else profile
        if profile not in shipped:
            _check_profile_file(item, full)
        nodes.append(NodeSpec(name, full + (f"?{options}" if options else ""), device_plugin))
    if not nodes:
        raise SpecError("--nodes: expected at least one NAME=PROFILE")
    return tuple(nodes)


def _check_profile_file(item: str, path: str) -> None:
    """A profile file is loaded now, so that one that is not a simulator profile fails `up` at once with the
    loader's message (the file and the field), not the supervisor later."""
    from sim.nvml.profile import ProfileError, load_profile

    try:
        load_profile(path)
    except (ProfileError, ValueError) as exc:
        detail = str(exc) if isinstance(exc, ProfileError) else f"{path}: not a text file ({exc})"
        raise SpecError(f"--nodes: {item!r}: not a simulator profile: {detail}") from None


def gb200_racks(text: str, *, device_plugin: bool) -> tuple[NodeSpec, ...]:
    """`--gb200-racks RACKS[xTRAYS]`: RACKS GB200 NVL racks of TRAYS compute trays (4 GPUs each; a real NVL72 rack
    has 18), each rack one NVLink clique (ids 1, 2, ...), nodes `gb200-r<R>-t<T>`."""
    m = re.fullmatch(r"(\d+)(?:x(\d+))?", text.strip())
    if m is None or int(m.group(1)) < 1 or (m.group(2) is not None and not 1 <= int(m.group(2)) <= 18):
        raise SpecError(f"--gb200-racks {text!r}: expected RACKS or RACKSxTRAYS (e.g. 2x2: two racks of two trays; "
                        "a rack has at most 18 trays)")
    racks, trays = int(m.group(1)), int(m.group(2) or 18)
    if racks * trays > 64:
        raise SpecError(f"--gb200-racks {text!r}: {racks * trays} trays; at most 64 simulated nodes")
    return tuple(NodeSpec(f"gb200-r{r}-t{t}", f"gb200-nvl?clique={r}", device_plugin)
                 for r in range(1, racks + 1) for t in range(1, trays + 1))


def with_addresses(name: str, nodes: tuple[NodeSpec, ...]) -> tuple[NodeSpec, ...]:
    """Give every node its own loopback address, 127.<from the cluster name>.<n>, so that node services that talk
    to each other (IMEX daemons) do so as on separate hosts, and two clusters on one machine do not meet."""
    second = 16 + sum(name.encode()) % 224
    return tuple(replace(n, address=f"127.{second}.{i // 250}.{i % 250 + 1}") for i, n in enumerate(nodes))


def default_nodes(*, device_plugin: bool) -> tuple[NodeSpec, ...]:
    """The demo's four nodes; --device-plugin serves nvidia.com/gpu on every node, not only the V100."""
    return tuple(NodeSpec(n.name, n.profile, n.device_plugin or device_plugin) for n in NODES)


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    nodes: tuple[NodeSpec, ...]
    runtime: str = "auto"
    features: tuple[str, ...] = ()
    partitionable: bool = False
    links: str = ""  # the short directory of node links (ClusterPaths.links), fixed at `up`
    runtime_config: tuple[str, ...] = ()  # the apiserver's --runtime-config entries

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "nodes": [asdict(n) for n in self.nodes], "runtime": self.runtime,
                "features": list(self.features), "partitionable": self.partitionable, "links": self.links,
                "runtimeConfig": list(self.runtime_config)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClusterSpec:
        return cls(str(data["name"]), tuple(NodeSpec(**n) for n in data["nodes"]), str(data.get("runtime", "auto")),
                   tuple(data.get("features") or ()), bool(data.get("partitionable")), str(data.get("links") or ""),
                   tuple(data.get("runtimeConfig") or ()))

    def node(self, name: str) -> NodeSpec | None:
        return next((n for n in self.nodes if n.name == name), None)


def links_home(environ: dict[str, str] | os._Environ[str] = os.environ) -> Path:
    """Where node links live: $XDG_RUNTIME_DIR/gd (the place for a user's sockets), else /tmp/gd-UID. Short, as
    every byte here is one less for the node's socket paths below it (105 at most)."""
    base = environ.get("XDG_RUNTIME_DIR") or ""
    if base and Path(base).is_absolute() and Path(base).is_dir():
        return Path(base) / "gd"
    return Path("/tmp") / f"gd-{os.getuid()}"


def state_home(environ: dict[str, str] | os._Environ[str] = os.environ) -> Path:
    """$XDG_STATE_HOME/gpu-dra, or ~/.local/state/gpu-dra (the XDG default)."""
    base = environ.get("XDG_STATE_HOME") or ""
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".local" / "state"
    return root / "gpu-dra" / "clusters"


@dataclass(frozen=True)
class ClusterPaths:
    """One cluster's state directory and what is in it."""

    root: Path

    @property
    def spec(self) -> Path:
        return self.root / "spec.json"

    @property
    def status(self) -> Path:
        """Written by the supervisor: phase, server URL, processes, progress steps."""
        return self.root / "supervisor.json"

    @property
    def store(self) -> Path:
        """The control plane's durable store (`gpu-dra apiserver --state`)."""
        return self.root / "store.db"

    @property
    def tls(self) -> Path:
        """The control plane's CA and serving certificate, kept so kubeconfigs trust it across its restarts."""
        return self.root / "tls"

    @property
    def kubeconfig(self) -> Path:
        """The cluster's own kubeconfig, used by its processes (users get a merged context instead)."""
        return self.root / "kubeconfig"

    @property
    def user_kubeconfig(self) -> Path:
        """Records which user kubeconfig file got the context, so `down` removes it from there."""
        return self.root / "user-kubeconfig.json"

    @property
    def pod_logs(self) -> Path:
        """The kubelets' /var/log/pods, served by the control plane as pods/log (`kubectl logs`)."""
        return self.root / "pod-logs"

    @property
    def keeper_pid(self) -> Path:
        return self.root / "keeper.pid"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def node(self, name: str) -> Path:
        return self.root / "nodes" / name

    def node_link(self, links: Path, name: str) -> Path:
        """A short path (a symlink to `node(name)`) the node's sockets are reached by: unix socket paths must fit
        105 bytes, and a state directory under a home directory often makes them longer."""
        return links / name

    def faults(self, node: str) -> Path:
        return self.node(node) / "faults.json"

    def socket_problem(self, links: Path, nodes: tuple[NodeSpec, ...]) -> str | None:
        longest = max(len(str(links).encode()) + len(LONGEST_SOCKET_SUFFIX.format(node=n.name)) for n in nodes)
        if longest <= MAX_SOCKET_PATH_BYTES:
            return None
        return (f"link directory {links}: too long: node sockets under it would be {longest} bytes, at most "
                f"{MAX_SOCKET_PATH_BYTES} fit; set XDG_RUNTIME_DIR to a shorter directory, or use shorter node names")


def cluster_paths(name: str, environ: dict[str, str] | os._Environ[str] = os.environ) -> ClusterPaths:
    return ClusterPaths(state_home(environ) / name)


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, (json.dumps(data, indent=2) + "\n").encode())


def read_json(path: Path) -> Any:
    """The file's JSON, or None when it is missing or half-written."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


@dataclass
class ProcessInfo:
    role: str  # apiserver, controller, plugin, kubelet, supervisor
    pid: int
    node: str | None = None
    restarts: int = 0


@dataclass
class SupervisorStatus:
    """What the supervisor publishes in supervisor.json."""

    pid: int
    phase: str = "starting"  # starting, ready, failed, stopping
    server: str | None = None
    error: str | None = None
    steps: list[str] = field(default_factory=list)
    processes: list[ProcessInfo] = field(default_factory=list)
    # What does not work now: [{component, message}] (Supervisor.failing).
    failing: list[dict[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "phase": self.phase, "server": self.server, "error": self.error, "steps": self.steps,
                "processes": [asdict(p) for p in self.processes], "failing": self.failing}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SupervisorStatus:
        return cls(int(data["pid"]), str(data.get("phase")), data.get("server"), data.get("error"),
                   list(data.get("steps") or []), [ProcessInfo(**p) for p in data.get("processes") or []],
                   [dict(f) for f in data.get("failing") or [] if isinstance(f, dict)])


def pid_is_ours(pid: int, marker: str) -> bool:
    """The process is alive and its command line mentions `marker` (the state dir), so a reused pid is never
    mistaken for one of the cluster's processes."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return pid_alive(pid) and not Path("/proc").is_dir()  # no /proc (macOS): trust the pid
    return marker in cmdline
