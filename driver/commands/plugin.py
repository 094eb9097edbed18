"""`gpu-dra plugin`: run the node agent (kubelet DRA plugin, slice publisher, health stream).

Stops cleanly on SIGTERM/SIGINT: sockets removed, checkpoint closed. With `--device-plugin` the legacy
device plugin shim is started beside it and shares the agent's checkpoint ledger.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from gpudra import DEFAULT_DRIVER_NAME, cliopts, logfmt

log = logging.getLogger(__name__)

DEFAULT_KUBELET_DIR = "/var/lib/kubelet"
DEFAULT_CDI_DIR = "/var/run/cdi"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node", required=True, help="this node's name (the pool name)")
    parser.add_argument("--nvml", required=True, help="real, sim:PROFILE or sim:/path/profile.yaml")
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
        "--mps-daemon-image",
        help="with --nvml real: run each claim's MPS control daemon as a pod of this image on this node (privileged, "
        "hostPID, driver root mounted), so that daemons outlive agent restarts; without it they run in this process",
    )
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
    parser.add_argument("--metrics-port", type=cliopts.port, help="serve Prometheus metrics on this port")
    parser.add_argument(
        "--compute-domains", choices=("auto", "on", "off"), default="auto",
        help="serve compute-domain.nvidia.com (IMEX channels and daemons for ComputeDomains; default auto: on nodes "
             "whose GPUs are in an NVLink fabric clique)")
    parser.add_argument("--compute-domain-namespace", default="gpu-dra-system", metavar="NAMESPACE",
                        help="namespace of the ComputeDomainCliques (the driver's namespace; default %(default)s)")
    parser.add_argument(
        "--node-labels", action="store_true",
        help="set GPU Feature Discovery's labels (nvidia.com/gpu.product, gpu.count, gpu.memory, ...) on this node",
    )
    cliopts.add_log_level(parser)


def _driver_root(args: argparse.Namespace) -> Path | None:
    # Simulated GPUs have no driver install: scanning this machine's / would put whatever NVIDIA files it
    # happens to hold (of another driver version) into the simulated claims' specs.
    if args.driver_root:
        return Path(args.driver_root)
    return Path("/") if args.nvml == "real" else None


def _label_node(api: Any, node: str, inventory: Any) -> bool:
    from driver.nodelabels import apply_node_labels

    try:
        apply_node_labels(api, node, inventory)
    except Exception as exc:  # noqa: BLE001 - any API failure: keep serving claims, try again later
        log.warning("event=node-labels-failed node=%s error=%r", node, str(exc))
        return False
    return True


def simulated_state_dir(node: str) -> Path:
    """Where a simulated node keeps its kubelet and CDI dirs when none are given: per user and node, stable across
    restarts (the checkpoint survives), never the host's /var/lib/kubelet or /var/run/cdi."""
    return Path(tempfile.gettempdir()) / f"gpu-dra-sim-{os.getuid()}" / node


def node_dirs(args: argparse.Namespace) -> tuple[Path, Path, str]:
    """(kubelet dir, CDI dir, a notice or "") for the agent's flags."""
    if not args.nvml.startswith("sim:") or (args.kubelet_dir and args.cdi_dir):
        return Path(args.kubelet_dir or DEFAULT_KUBELET_DIR), Path(args.cdi_dir or DEFAULT_CDI_DIR), ""
    state = simulated_state_dir(args.node)
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
    if args.shared_capacity and args.partitionable:
        print("error: --shared-capacity and --partitionable exclude each other: a GPU shared by capacity cannot also "
              "be split into MIG placements", file=sys.stderr)
        return 2
    reserved = frozenset(u.strip() for u in args.reserved_gpus.split(",") if u.strip())
    bad = sorted(u for u in reserved if not u.startswith("GPU-"))
    if bad:
        print(f"error: --reserved-gpus: {', '.join(bad)}: expected GPU UUIDs such as GPU-5f3c...", file=sys.stderr)
        return 2

    from driver.discovery import discover
    from driver.health import HealthMonitor
    from driver.nvml import load_backend
    from driver.nvmlapi import BackendConfigError, NvmlUnavailable
    from driver.plugin.agent import AgentSettings, NodeAgent, crash_hook_from_env, kubeapi_claim_getter
    from driver.publisher import SlicePublisher
    from gpudra.kubeapi import KubeApi

    try:
        nvml = load_backend(args.nvml, node=args.node, driver_root=_driver_root(args))
    except (NvmlUnavailable, BackendConfigError) as exc:
        print(f"error: --nvml {args.nvml}: {exc}", file=sys.stderr)
        return 2
    inventory = discover(nvml, args.node)
    unknown = sorted(reserved - {g.uuid for g in inventory.gpus})
    if unknown:
        print(f"error: --reserved-gpus: {', '.join(unknown)}: not a GPU of this node", file=sys.stderr)
        return 2
    try:
        source = cliopts.kubeconfig_source(args.kubeconfig)
        api = KubeApi.connect(kubeconfig=source)
    except cliopts.NoApiConfig as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        where = source or "the in-cluster config"
        print(f"error: --kubeconfig: cannot connect with {where}: {exc}", file=sys.stderr)
        return 2
    if args.mps_daemon_image and args.nvml == "real":
        from driver.mpsdaemon import MpsDaemonPods, MpsPodSettings

        nvml.run_mps_daemons_as_pods(MpsDaemonPods(api, MpsPodSettings(
            namespace=args.namespace, node_name=args.node, image=args.mps_daemon_image,
            host_driver_root=args.host_driver_root,
        ), nvml.tools))
    kubelet_dir, cdi_dir, notice = node_dirs(args)
    if notice:
        print(f"gpu-dra plugin: {notice}", file=sys.stderr, flush=True)
    settings = AgentSettings(
        node_name=args.node, driver_name=args.driver_name, kubelet_dir=kubelet_dir, cdi_dir=cdi_dir,
        partitionable=args.partitionable, shared_capacity=args.shared_capacity, reserved_uuids=reserved,
        metrics_port=args.metrics_port,
        driver_root=_driver_root(args), host_driver_root=args.host_driver_root,
        proc_root=Path("/proc") if args.nvml == "real" else None,
        binding_conditions=args.binding_conditions,
    )
    agent = NodeAgent(
        settings, nvml=nvml, inventory=inventory, get_claim=kubeapi_claim_getter(api),
        publisher=SlicePublisher(api, args.driver_name, args.node), fault_hook=crash_hook_from_env(),
        monitor_factory=lambda n, inv, cb: HealthMonitor(n, inv, cb), binding_api=api,
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    shim: Any = None
    agent.start()
    compute_domains: Any = None
    if args.compute_domains == "on" or (args.compute_domains == "auto" and any(
            g.fabric_clique_id is not None for g in inventory.gpus)):
        from driver.computedomain.agent import ComputeDomainAgent, ComputeDomainSettings

        compute_domains = ComputeDomainAgent(api, ComputeDomainSettings(
            node=args.node, kubelet_dir=kubelet_dir, cdi_dir=cdi_dir, namespace=args.compute_domain_namespace,
            driver_root=_driver_root(args), proc_root=Path("/proc") if args.nvml == "real" else None), nvml, inventory)
        compute_domains.start()
    labels_pending = bool(args.node_labels)
    try:
        if args.device_plugin:
            from driver.deviceplugin import start_device_plugin

            shim = start_device_plugin(agent, resource_name=args.device_plugin_resource, api=api)
        tick = 0
        while True:
            # Labels are retried every 30 s until they are set (the Node may not exist yet); a failure only logs.
            if labels_pending and tick % 30 == 0:
                labels_pending = not _label_node(api, args.node, inventory)
            if stop.wait(1.0):
                break
            tick += 1
    finally:
        if shim is not None:
            shim.stop()
        if compute_domains is not None:
            compute_domains.stop()
        agent.stop()
        api.close()
    return 0
