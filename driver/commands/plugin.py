"""`gpu-dra plugin`: run the node agent (kubelet DRA plugin, slice publisher, health stream).

Stops cleanly on SIGTERM/SIGINT: sockets removed, checkpoint closed. With `--device-plugin` the legacy
device plugin shim is started beside it and shares the agent's checkpoint ledger.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudra import DEFAULT_DRIVER_NAME, cliopts, logfmt
from gpudra.privatedir import PrivateDirError, ensure_private_dir
from gpudra.ownpod import own_image, secret_names
from gpudra.signals import stop_on_signals

if TYPE_CHECKING:
    from driver.gputools import NvidiaTools
    from driver.mpsdaemon import MpsDaemonPods

log = logging.getLogger(__name__)

DEFAULT_KUBELET_DIR = "/var/lib/kubelet"
DEFAULT_CDI_DIR = "/var/run/cdi"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node", required=True, help="this node's name (the pool name)")
    parser.add_argument("--nvml", required=True,
                        help="real, sim:PROFILE, sim:/path/profile.yaml or sim:node-label (the profile this node's "
                             "gpu-dra.simulated-profile label names)")
    cliopts.add_kubeconfig(parser)
    parser.add_argument("--kubelet-dir", help=f"kubelet root dir (default {DEFAULT_KUBELET_DIR}; with a simulator, "
                                              "<private state dir>/kubelet)")
    parser.add_argument("--cdi-dir", help=f"dynamic CDI spec dir (default {DEFAULT_CDI_DIR}; with a simulator, "
                                          "<private state dir>/cdi)")
    parser.add_argument(
        "--driver-root",
        help="where the host's NVIDIA driver install is visible (default / with --nvml real, none with a simulator); "
        "libnvidia-ml.so.1, nvidia-smi and nvidia-cuda-mps-control are loaded and run from it by path, and its "
        "libraries, binaries, firmware and sockets go into every claim's CDI spec",
    )
    parser.add_argument(
        "--host-driver-root", default="/",
        help="where that driver install is on the host (default /; e.g. /run/nvidia/driver for a driver container)",
    )
    parser.add_argument(
        "--dev-root", default="/dev",
        help="with --nvml real: where the driver's device nodes are (default /dev); the agent waits for nvidiactl there",
    )
    parser.add_argument(
        "--proc-root", default="/proc",
        help="with --nvml real: the procfs the driver's device numbers are read from (/proc/devices, "
             "/proc/driver/nvidia/capabilities; default /proc)",
    )
    parser.add_argument(
        "--cdi-hook-path",
        help="an nvidia-cdi-hook (NVIDIA Container Toolkit 1.18 or later) on the host: claim specs then also carry "
             "its enable-cuda-compat and disable-device-node-modification hooks (default: none, specs carry files only)",
    )
    parser.add_argument(
        "--ldcache-hook", action=argparse.BooleanOptionalAction, default=True,
        help="install the agent's CDI hook under <kubelet-dir>/plugins/<driver>-cdi-hook and have every claim spec "
             "rebuild the container's ld.so.cache with the host's ldconfig, so that `ldconfig -p` lists libcuda "
             "(Triton, torch.compile) (default on; the hook needs /bin/sh and ldconfig on the host)",
    )
    parser.add_argument(
        "--mps-daemon-image",
        help="with --nvml real (or a simulated node whose driver install has nvidia-cuda-mps-control): run each "
        "claim's MPS control daemon as a pod of this image on this node (privileged, hostPID, driver root mounted), "
        "so that daemons outlive agent restarts; without it they run in this process",
    )
    parser.add_argument(
        "--mps-image-pull-secrets", default="",
        help="comma-separated image pull secrets (in --namespace) the MPS daemon pods use for --mps-daemon-image; "
             "pass the agent pod's own when its image is in a private registry",
    )
    parser.add_argument(
        "--mps-daemon-image-from-pod", action="store_true",
        help="as --mps-daemon-image, with this agent pod's own image, read from its Pod ($POD_NAME "
             "in --namespace; container --container-name), so that one image reference (kustomize `images:`) "
             "serves both",
    )
    parser.add_argument(
        "--mps-ready-timeout", type=_mps_ready_timeout, default=None, metavar="SECONDS",
        help="with --mps-daemon-image(-from-pod): how long a claim's MPS daemon pod gets from its Deployment's creation "
             "to a listening daemon (default 30, at most 40 of the kubelet's 45 s prepare timeout); a claim that "
             "times out keeps the Deployment and the kubelet's retry waits for the same pod",
    )
    parser.add_argument("--container-name", default="node-agent",
                        help="this agent's container in its Pod (default %(default)s)")
    parser.add_argument(
        "--namespace", default=os.environ.get("POD_NAMESPACE", "gpu-dra-system"),
        help="namespace of the MPS control daemon pods (default: $POD_NAMESPACE, else gpu-dra-system)",
    )
    parser.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME, help=f"DRA driver name (default {DEFAULT_DRIVER_NAME})")
    parser.add_argument("--device-plugin", action="store_true", help="also serve the legacy device plugin (nvidia.com/gpu)")
    parser.add_argument(
        "--device-plugin-resource", default="nvidia.com/gpu",
        help="extended resource name the device plugin serves (default nvidia.com/gpu)",
    )
    parser.add_argument("--partitionable", action="store_true", help="publish MIG-capable GPUs as partitionable devices")
    parser.add_argument(
        "--shared-capacity", action="store_true",
        help="publish full GPUs shared by capacity (memory, computeShare; DRAConsumableCapacity); prepare enforces each "
             "claim's part with MPS limits",
    )
    parser.add_argument("--binding-conditions", action=argparse.BooleanOptionalAction, default=True,
                        help="with --partitionable: MIG placements carry device binding conditions (KEP-5007) and the "
                             "agent creates the instance before the pod binds (default on; needs "
                             "DRADeviceBindingConditions, on from Kubernetes 1.36: use --no-binding-conditions on "
                             "1.34/1.35 clusters without it)")
    parser.add_argument("--reserved-gpus", default="", help="comma-separated GPU UUIDs kept for the device plugin (not published)")
    parser.add_argument("--rediscover-seconds", type=float, default=60.0,
                        help="walk the GPUs again this often (and on health events): a MIG layout changed outside the "
                             "agent is republished, a driver change makes the agent exit so its DaemonSet restarts it "
                             "(default 60; 0: never)")
    parser.add_argument("--metrics-port", type=cliopts.port, help="serve Prometheus metrics on this port")
    parser.add_argument(
        "--compute-domains", choices=("auto", "on", "off"), default="auto",
        help="serve compute-domain.nvidia.com (IMEX channels and daemons for ComputeDomains; default auto: on nodes "
             "whose GPUs are in an NVLink fabric clique)")
    parser.add_argument("--compute-domain-namespace", default="gpu-dra-system", metavar="NAMESPACE",
                        help="namespace of the ComputeDomainCliques (the driver's namespace; default %(default)s)")
    parser.add_argument(
        "--ignore-xids", type=xid_list, default=frozenset(),
        help="comma-separated Xids the health monitor drops entirely, on top of NVIDIA's application Xids (13, 31, "
             "43, 45, 68, 109), which never make a GPU unhealthy and show only as an informational taint",
    )
    parser.add_argument(
        "--pod-uid", default=os.environ.get("POD_UID", ""),
        help="this agent pod's UID (default: $POD_UID, from the downward API): the registration and DRA sockets "
             "carry it, so that two agent pods overlap safely in a rolling update (maxSurge); empty: fixed names",
    )
    parser.add_argument(
        "--healthcheck-port", type=cliopts.port,
        help="serve grpc.health.v1 on this TCP port for the kubelet's grpc probes: SERVING while the registration "
             "and DRA sockets, the node lock and NVML answer (default: off)",
    )
    parser.add_argument(
        "--node-labels", action="store_true",
        help="set GPU Feature Discovery's labels (nvidia.com/gpu.product, gpu.count, gpu.memory, ...) on this node and "
             "refresh them when they change; skipped while GFD runs there (nvidia.com/gfd.timestamp is set)",
    )
    parser.add_argument(
        "--allow-device-plugin-coexistence", action="store_true",
        help="publish DRA GPUs even when another device plugin advertises the --device-plugin-resource on this node "
             "(default: withhold them, with a Warning Event and the Node condition GpuDraDevicePluginConflict, "
             "so that no GPU is handed out twice)",
    )
    parser.add_argument(
        "--stale-claim-interval", type=float, default=600.0, metavar="SECONDS",
        help="how often prepared claims are checked against the API: one deleted, no longer allocated here or "
             "reserved for no pod (on two checks in a row) is unprepared by the agent itself (default %(default)s; "
             "0: off)",
    )
    parser.add_argument(
        "--node-resync-seconds", type=float, default=30.0,
        help="how often the Node is checked for another device plugin and its labels refreshed (default %(default)s)",
    )
    parser.add_argument(
        "--driver-upgrade-label", default="nvidia.com/gpu.deploy.gpu-dra", metavar="KEY",
        help="a node label the GPU Operator's driver manager pauses while it replaces the driver (give it as "
             "NODE_LABEL_FOR_GPU_POD_EVICTION in the ClusterPolicy's driver.manager.env): the agent sets it to \"true\" "
             "when absent and releases NVML while it says paused-for-driver-upgrade, as it does while "
             "nvidia.com/gpu-driver-upgrade-state is pod-restart-required (default %(default)s; empty: only the latter)",
    )
    parser.add_argument(
        "--driver-upgrade-poll-seconds", type=float, default=5.0, metavar="SECONDS",
        help="how often the Node's driver-upgrade labels are read (default %(default)s; 0: never, NVML is never "
             "released)",
    )
    cliopts.add_log_level(parser)


SIM_FROM_NODE_LABEL = "sim:node-label"
PROFILE_LABEL = "gpu-dra.simulated-profile"
# A fabric profile's NVLink clique (GB200 racks): a label value cannot hold the profile's `?clique=N`.
CLIQUE_LABEL = "gpu-dra.simulated-clique"


def resolve_nvml_spec(spec: str, api: Any, node: str) -> str:
    """`sim:node-label` -> `sim:<the profile the node's gpu-dra.simulated-profile label names>` (kind workers
    each simulate their own GPUs from one DaemonSet); any other spec as given. Raises ValueError naming the node,
    the label and what is accepted."""
    if spec != SIM_FROM_NODE_LABEL:
        return spec
    from driver.nvml import shipped_profiles
    from gpudra.kubeapi import ApiError, NotFound

    try:
        obj = api.get("Node", node)
    except NotFound as exc:
        raise ValueError(f"--nvml {spec}: Node {node} does not exist, so its {PROFILE_LABEL} label cannot be read") from exc
    except ApiError as exc:
        raise ValueError(f"--nvml {spec}: reading Node {node} failed: {exc}") from exc
    labels = (obj.get("metadata") or {}).get("labels") or {}
    profile = labels.get(PROFILE_LABEL, "")
    if not profile:
        raise ValueError(f"--nvml {spec}: Node {node} has no {PROFILE_LABEL} label; set it to one of "
                         f"{', '.join(shipped_profiles())} (e.g. kubectl label node {node} {PROFILE_LABEL}=dgx-a100)")
    clique = labels.get(CLIQUE_LABEL, "")
    if clique and not clique.isdigit():
        raise ValueError(f"--nvml {spec}: Node {node} label {CLIQUE_LABEL}={clique!r}: expected a clique id (digits)")
    return f"sim:{profile}" + (f"?clique={clique}" if clique else "")


def _connect(kubeconfig: str | None) -> Any:
    """The API client, or None after saying on stderr why there is none."""
    from gpudra.kubeapi import KubeApi

    source: str | None = None
    try:
        source = cliopts.kubeconfig_source(kubeconfig)
        return KubeApi.connect(kubeconfig=source)
    except cliopts.NoApiConfig as exc:
        print(f"error: {exc}", file=sys.stderr)
    except Exception as exc:
        where = source or "the in-cluster config"
        print(f"error: --kubeconfig: cannot connect with {where}: {exc}", file=sys.stderr)
    return None


def _compute_domain_proc(args: argparse.Namespace) -> Path | None:
    """Where the IMEX channels' device major is read (/proc/devices): the host's procfs, or on a simulated node the
    procfs its simulated driver install holds (sim.runtime.driverinstall)."""
    if args.nvml == "real":
        return Path(args.proc_root)
    root = _driver_root(args)
    return root / "proc" if root is not None and (root / "proc" / "devices").exists() else None


def _driver_root(args: argparse.Namespace) -> Path | None:
    # Simulated GPUs have no driver install: scanning this machine's / would put whatever NVIDIA files it
    # happens to hold (of another driver version) into the simulated claims' specs.
    if args.driver_root:
        return Path(args.driver_root)
    return Path("/") if args.nvml == "real" else None


def _mps_daemon_tools(nvml: Any, driver_root: Path | None) -> NvidiaTools | None:
    """NVIDIA's tools that talk to MPS daemons running in pods, or None where daemons cannot run in pods: the
    real driver's, or a simulated node's whose driver install has `nvidia-cuda-mps-control` (the upstream
    testbed's); other simulated nodes keep the simulator's daemons, which exist only in this process."""
    from driver.driverroot import DriverRoot, DriverRootError
    from driver.gputools import NvidiaTools
    from driver.nvml import RealNvml

    if isinstance(nvml, RealNvml):
        return nvml.tools
    if driver_root is None:
        return None
    root = DriverRoot(driver_root)
    try:
        root.find_binary("nvidia-cuda-mps-control")
    except DriverRootError:
        return None
    return NvidiaTools(driver_root=root)


NVML_RETRY_SECONDS = 10.0
# How long the liveness probe is answered SERVING while the agent starts after the driver is there (NVML init, the
# restore of prepared claims): the startup budget NVIDIA's plugin allows, as the manifest's startupProbe had it.
STARTUP_BUDGET_SECONDS = 600.0


def _real_nvml_when_ready(args: argparse.Namespace, stop: Any) -> Any:
    """Real NVML once the driver is there (driver.driverwait), with --driver-root and --host-driver-root set to where
    it was found; an exit code instead when stopped while waiting (0), or when the driver root changed after NVML
    was loaded from the old one (3: one process holds one NVML; the DaemonSet restarts the agent)."""
    from driver import driverwait
    from driver.nvml import load_backend
    from driver.nvmlapi import NvmlUnavailable

    given, host = Path(args.driver_root or "/"), args.host_driver_root
    tried: Path | None = None
    while True:
        where = driverwait.wait(given, host, Path(args.dev_root), stop)
        if where is None:
            return 0
        if tried is not None and where.root != tried:
            log.error("event=exit-for-driver-change msg=%s", logfmt.quote(
                f"the driver root moved to {where.describe()} after NVML was loaded from {tried}; exiting so that "
                "the DaemonSet restarts the agent on it"))
            return 3
        args.driver_root, args.host_driver_root = str(where.root), where.host_root
        tried = where.root
        try:
            return load_backend("real", node=args.node, driver_root=where.root)
        except NvmlUnavailable as exc:
            # nvmlInit fails while the kernel module is still loading or its version differs from the library's.
            log.warning("event=waiting-for-driver msg=%s", logfmt.quote(
                f"waiting for the NVIDIA driver: NVML from {where.describe()} does not start yet: {exc}; retrying "
                f"in {NVML_RETRY_SECONDS:g} s"))
        if stop.wait(NVML_RETRY_SECONDS):
            return 0


def _load_uvm(root: Path, proc_root: Path, node: str) -> Any:
    """Load nvidia-uvm through the driver root when it is not loaded; returns what the Node guard checks every
    resync: None while the module is loaded, else why CUDA lacks /dev/nvidia-uvm (the start's attempt said why)."""
    from driver.driverroot import DriverRoot
    from driver.gputools import UVM_MISSING, ensure_uvm_loaded, uvm_missing

    reason = ensure_uvm_loaded(DriverRoot(root), proc_root)
    if reason is None:
        log.info("event=nvidia-uvm node=%s msg=loaded", node)
    else:
        log.error("event=nvidia-uvm-missing node=%s msg=%s", node, logfmt.quote(reason))

    def check() -> str | None:
        missing = uvm_missing(proc_root)
        return None if missing is None else reason or f"{UVM_MISSING}: {missing}"

    return check


def xid_list(text: str) -> frozenset[int]:
    out = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if not part.isdigit() or not 0 < int(part) < 2**32:
            raise argparse.ArgumentTypeError(f"{part!r}: expected Xid numbers such as 13,31,43")
        out.add(int(part))
    return frozenset(out)


def _mps_ready_timeout(text: str) -> float:
    from driver.mpsdaemon import ready_timeout

    try:
        return ready_timeout(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _valid_instance(uid: str) -> bool:
    # It becomes part of socket file names.
    return len(uid) <= 64 and all(c.isascii() and (c.isalnum() or c in "-_") for c in uid)


def _driver_upgrade_watch(api: Any, agent: Any, args: argparse.Namespace) -> Any:
    """What releases NVML through a GPU Operator driver upgrade (driver.driverupgrade); None when turned off."""
    if args.driver_upgrade_poll_seconds <= 0:
        return None
    from driver.driverupgrade import NodeUpgradeWatch, UpgradeGate

    gate = UpgradeGate(release=agent.release_nvml, resume=agent.restart_on_new_driver, driver_ready=agent.driver_ready)
    return NodeUpgradeWatch(api, args.node, args.driver_upgrade_label, gate)


def _agent_probes(agent: Any, nvml: Any) -> list[Any]:
    from driver.checkpoint import LOCK_NAME
    from driver.plugin.healthcheck import lock_probe, nvml_probe, socket_probes

    return socket_probes(agent.paths) + [lock_probe(agent.paths.plugin_dir / LOCK_NAME),
                                         nvml_probe(nvml, lambda: agent.nvml_released)]


def simulated_state_dir(node: str) -> Path:
    """Where a simulated node keeps its kubelet and CDI dirs when none are given: per user and node, stable across
    restarts (the checkpoint survives), never the host's /var/lib/kubelet or /var/run/cdi. The name is predictable,
    so `node_dirs` uses it only when this user owns it and no one else can write into it."""
    return Path(tempfile.gettempdir()) / f"gpu-dra-sim-{os.getuid()}" / node


def node_dirs(args: argparse.Namespace) -> tuple[Path, Path, str]:
    """(kubelet dir, CDI dir, a notice or "") for the agent's flags."""
    if not args.nvml.startswith("sim:") or (args.kubelet_dir and args.cdi_dir):
        return Path(args.kubelet_dir or DEFAULT_KUBELET_DIR), Path(args.cdi_dir or DEFAULT_CDI_DIR), ""
    state = simulated_state_dir(args.node)
    ensure_private_dir(state.parent)
    ensure_private_dir(state)
    kubelet = Path(args.kubelet_dir) if args.kubelet_dir else state / "kubelet"
    cdi_dir = Path(args.cdi_dir) if args.cdi_dir else state / "cdi"
    unset = " and ".join(f for f, v in (("--kubelet-dir", args.kubelet_dir), ("--cdi-dir", args.cdi_dir)) if not v)
    return kubelet, cdi_dir, (f"simulated node {args.node}: {unset} not given; using the private state dir {state} "
                              f"(kubelet dir {kubelet}, CDI dir {cdi_dir}), never the host's {DEFAULT_KUBELET_DIR} "
                              f"or {DEFAULT_CDI_DIR}")


def run(args: argparse.Namespace) -> int:
    logfmt.configure(cliopts.log_level(args))
    if args.device_plugin:
        from driver.deviceplugin import extended_resource_name_error

        resource_error = extended_resource_name_error(args.device_plugin_resource)
        if resource_error:
            print(f"error: --device-plugin-resource: {resource_error}", file=sys.stderr)
            return 2
    if not args.host_driver_root.startswith("/"):
        print(f"error: --host-driver-root: {args.host_driver_root!r}: expected an absolute path on the host", file=sys.stderr)
        return 2
    if args.cdi_hook_path is not None and not args.cdi_hook_path.startswith("/"):
        print(f"error: --cdi-hook-path: {args.cdi_hook_path!r}: expected an absolute path on the host", file=sys.stderr)
        return 2
    if args.shared_capacity and args.partitionable:
        print("error: --shared-capacity and --partitionable exclude each other: a GPU shared by capacity cannot also "
              "be split into MIG placements", file=sys.stderr)
        return 2
    if args.pod_uid and not _valid_instance(args.pod_uid):
        print(f"error: --pod-uid: {args.pod_uid!r}: expected a pod UID (letters, digits, '-' and '_', at most 64)",
              file=sys.stderr)
        return 2
    reserved = frozenset(u.strip() for u in args.reserved_gpus.split(",") if u.strip())
    bad = sorted(u for u in reserved if not u.startswith("GPU-"))
    if bad:
        print(f"error: --reserved-gpus: {', '.join(bad)}: expected GPU UUIDs such as GPU-5f3c...", file=sys.stderr)
        return 2

    stop = stop_on_signals()
    health: Any = None
    health_server: Any = None
    if args.healthcheck_port is not None:
        # Served from the start: the probes see a live agent while it waits for the driver (driver.plugin.healthcheck).
        from driver.plugin.healthcheck import HealthServicer, serve

        health = HealthServicer([], frozenset({args.driver_name}))
        health.pending("waiting for the NVIDIA driver" if args.nvml == "real" else "starting")
        health_server, _ = serve(health, args.healthcheck_port)
    try:
        return _run(args, stop, health, reserved)
    finally:
        if health_server is not None:
            health_server.stop(grace=None)


def _run(args: argparse.Namespace, stop: Any, health: Any, reserved: frozenset[str]) -> int:
    from driver.discovery import discover
    from driver.health import HealthMonitor
    from driver.nvml import RealNvml, load_backend
    from driver.nvmlapi import BackendConfigError, NvmlUnavailable
    from driver.plugin.agent import (AgentSettings, NodeAgent, crash_hook_from_env, kubeapi_claim_getter,
                                     kubeapi_claim_lister)
    from driver.publisher import SlicePublisher

    api: Any = None
    if args.nvml == SIM_FROM_NODE_LABEL:  # the profile is on this node's Node: the API first
        api = _connect(args.kubeconfig)
        if api is None:
            return 2
        try:
            args.nvml = resolve_nvml_spec(args.nvml, api, args.node)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            api.close()
            return 2
    nvml: Any
    if args.nvml == "real":
        # The driver may come after the agent (a driver container still building): wait for it, don't crash-loop.
        loaded = _real_nvml_when_ready(args, stop)
        if not isinstance(loaded, RealNvml):
            return loaded
        nvml = loaded
    else:
        if args.driver_root:
            # A simulated node's driver install is found where a real one is (the GPU Operator's driver container
            # root under the host's /), without waiting: the simulator needs no driver to start.
            from driver import driverwait

            where = driverwait.candidate(Path(args.driver_root), args.host_driver_root)
            args.driver_root, args.host_driver_root = str(where.root), where.host_root
        try:
            nvml = load_backend(args.nvml, node=args.node, driver_root=_driver_root(args))
        except (NvmlUnavailable, BackendConfigError) as exc:
            print(f"error: --nvml {args.nvml}: {exc}", file=sys.stderr)
            return 2
    if health is not None:
        health.pending("starting: NVML discovery and the restore of prepared claims", STARTUP_BUDGET_SECONDS)
    inventory = discover(nvml, args.node)
    root = _driver_root(args)
    uvm_check = None
    if isinstance(nvml, RealNvml) and root is not None:
        uvm_check = _load_uvm(root, Path(args.proc_root), args.node)
    unknown = sorted(reserved - {g.uuid for g in inventory.gpus})
    if unknown:
        print(f"error: --reserved-gpus: {', '.join(unknown)}: not a GPU of this node", file=sys.stderr)
        return 2
    if api is None:
        api = _connect(args.kubeconfig)
        if api is None:
            return 2
    mps_tools = _mps_daemon_tools(nvml, _driver_root(args))
    mps_image = args.mps_daemon_image
    if args.mps_daemon_image_from_pod and not mps_image and mps_tools is not None:
        try:
            mps_image = own_image(api, args.namespace, os.environ.get("POD_NAME", ""), args.container_name).image
        except ValueError as exc:
            print(f"error: --mps-daemon-image-from-pod: {exc}", file=sys.stderr)
            return 2
    mps_daemons: MpsDaemonPods | None = None
    if mps_image and mps_tools is not None:
        from driver.mpsdaemon import DEFAULT_READY_TIMEOUT_S, MpsDaemonPods, MpsPodSettings

        mps_daemons = MpsDaemonPods(api, MpsPodSettings(
            namespace=args.namespace, node_name=args.node, image=mps_image,
            ready_timeout_s=args.mps_ready_timeout or DEFAULT_READY_TIMEOUT_S,
            host_driver_root=args.host_driver_root,
            image_pull_secrets=secret_names(args.mps_image_pull_secrets),
        ), mps_tools)
    try:
        kubelet_dir, cdi_dir, notice = node_dirs(args)
    except PrivateDirError as exc:
        print(f"gpu-dra plugin: error: {exc}", file=sys.stderr)
        return 1
    if notice:
        print(f"gpu-dra plugin: {notice}", file=sys.stderr, flush=True)
    settings = AgentSettings(
        node_name=args.node, driver_name=args.driver_name, kubelet_dir=kubelet_dir, cdi_dir=cdi_dir,
        partitionable=args.partitionable, shared_capacity=args.shared_capacity, reserved_uuids=reserved,
        metrics_port=args.metrics_port,
        driver_root=_driver_root(args), host_driver_root=args.host_driver_root,
        proc_root=Path(args.proc_root) if args.nvml == "real" else None, cdi_hook_path=args.cdi_hook_path,
        ldcache_hook=args.ldcache_hook,
        binding_conditions=args.binding_conditions, instance=args.pod_uid,
        rediscover_interval_s=args.rediscover_seconds if args.rediscover_seconds > 0 else None,
    )
    agent = NodeAgent(
        settings, nvml=nvml, inventory=inventory, get_claim=kubeapi_claim_getter(api),
        publisher=SlicePublisher(api, args.driver_name, args.node), fault_hook=crash_hook_from_env(),
        monitor_factory=lambda n, inv, cb: HealthMonitor(n, inv, cb, ignored_xids=args.ignore_xids), binding_api=api,
        list_claims=kubeapi_claim_lister(api), mps_daemons=mps_daemons,
    )
    from driver.nodeguard import GuardSettings, NodeGuard

    guard = NodeGuard(api, GuardSettings(
        node_name=args.node, resource=args.device_plugin_resource, shim_enabled=args.device_plugin,
        allow_coexistence=args.allow_device_plugin_coexistence, node_labels=args.node_labels,
    ), withhold=agent.withhold, inventory=agent.inventory, uvm_missing=uvm_check)
    if not args.device_plugin and not args.allow_device_plugin_coexistence:
        # Fail closed: nothing is published before the Node was seen free of another device plugin.
        agent.withhold(f"node {args.node} not checked yet for another device plugin serving {args.device_plugin_resource}")
    checked = guard.check()
    shim: Any = None
    sweeper: Any = None
    agent.start()
    exit_code = 0
    if args.stale_claim_interval > 0:
        from driver.staleclaims import StaleClaimSweeper

        sweeper = StaleClaimSweeper(lambda ns, name: api.try_get("ResourceClaim", name, namespace=ns), agent.preparer,
                                    args.driver_name, args.node, interval=args.stale_claim_interval)
        sweeper.start(stop)
    compute_domains: Any = None
    if args.compute_domains == "on" or (args.compute_domains == "auto" and any(
            g.fabric_clique_id is not None for g in inventory.gpus)):
        from driver.computedomain.agent import ComputeDomainAgent, ComputeDomainSettings

        compute_domains = ComputeDomainAgent(api, ComputeDomainSettings(
            node=args.node, kubelet_dir=kubelet_dir, cdi_dir=cdi_dir, namespace=args.compute_domain_namespace,
            driver_root=_driver_root(args), proc_root=_compute_domain_proc(args),
            host_driver_root=args.host_driver_root, dev_root=Path("/dev") if args.nvml == "real" else None),
            nvml, inventory, agent.driver_files)
        compute_domains.start()
    try:
        if args.device_plugin:
            from driver.deviceplugin import start_device_plugin

            shim = start_device_plugin(agent, resource_name=args.device_plugin_resource, api=api)
        if health is not None:
            health.up(_agent_probes(agent, nvml))
        # A failed check (the Node not registered yet, the API away) is retried sooner than the resync. The loop
        # ticks every second so that a driver change is acted on at once.
        next_check = time.monotonic() + (args.node_resync_seconds if checked else 2.0)
        upgrades = _driver_upgrade_watch(api, agent, args)
        next_upgrade_check = time.monotonic()
        while not stop.wait(1.0):
            if agent.exit_requested.is_set():
                exit_code = 3  # the driver changed under the agent: the DaemonSet restarts it on the new one
                break
            if time.monotonic() >= next_check:
                checked = guard.check()
                next_check = time.monotonic() + (args.node_resync_seconds if checked else 2.0)
            if upgrades is not None and time.monotonic() >= next_upgrade_check:
                upgrades.check()
                next_upgrade_check = time.monotonic() + args.driver_upgrade_poll_seconds
    finally:
        stop.set()
        if sweeper is not None:
            sweeper.join()
        if shim is not None:
            shim.stop()
        if compute_domains is not None:
            compute_domains.stop()
        agent.stop()
        api.close()
    return exit_code
