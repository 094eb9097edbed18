"""`gpu-dra controller`: the cluster agent (explanations, gang pre-allocation; in embedded mode also the
scheduler and claim-controller roles). Runs until SIGTERM/SIGINT, then releases its lease."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from controller.computedomain import DAEMON_IMAGE
from controller.leader import LeaseTimings
from controller.manager import ClusterRolesFactory, ControllerConfig, ControllerManager, default_identity
from gpudra import DEFAULT_DRIVER_NAME, cliopts
from gpudra.features import FeatureGateError
from gpudra.features import add_arguments as add_feature_arguments
from gpudra.features import from_arguments as features_from_arguments
from gpudra.kubeapi import KubeApi
from gpudra.logfmt import configure
from gpudra.ownpod import own_image, secret_names
from gpudra.signals import stop_on_signals

log = logging.getLogger("gpudra.controller")


def register(parser: argparse.ArgumentParser) -> None:
    cliopts.add_kubeconfig(parser)
    parser.add_argument("--embedded", action="store_true",
                        help="also play kube-scheduler and kube-controller-manager, for the embedded control plane "
                             "(`gpu-dra apiserver`; a source install: the roles are the testbed's, not in the image)")
    parser.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME, help="DRA driver name (default %(default)s)")
    parser.add_argument("--metrics-port", type=cliopts.port, default=None, help="serve Prometheus metrics on this port")
    parser.add_argument("--metrics-host", default="0.0.0.0", help="address for the metrics server (default %(default)s)")
    parser.add_argument("--binding-timeout", type=float, default=600.0,
                        help="embedded mode: seconds a pod waits for its devices' binding conditions (KEP-5007) before "
                             "its claims are deallocated and it is scheduled again (default %(default)s, as kube-scheduler)")
    parser.add_argument("--gang-timeout", type=float, default=300.0,
                        help="seconds a pre-allocated gang may wait for its pods before it is released (default %(default)s)")
    parser.add_argument("--leader-elect", dest="leader_elect", action=argparse.BooleanOptionalAction, default=True,
                        help="elect a leader through a coordination.k8s.io/v1 Lease (default on)")
    parser.add_argument("--identity", default=None, help="leader-election identity (default: hostname + random suffix)")
    parser.add_argument("--lease-namespace", default="kube-system", help="namespace of the Lease (default %(default)s)")
    parser.add_argument("--lease-name", default="gpu-dra-controller", help="name of the Lease (default %(default)s)")
    parser.add_argument("--lease-duration", type=float, default=15.0, help="seconds (default %(default)s)")
    parser.add_argument("--renew-deadline", type=float, default=10.0, help="seconds (default %(default)s)")
    parser.add_argument("--retry-period", type=float, default=2.0, help="seconds (default %(default)s)")
    parser.add_argument("--resync-period", type=float, default=30.0, help="seconds between full relists (default %(default)s)")
    parser.add_argument("--compute-domain-namespace", default="gpu-dra-system", metavar="NAMESPACE",
                        help="where ComputeDomains' IMEX daemon DaemonSets, daemon templates and cliques live (the "
                             "driver's namespace; the node agents' --compute-domain-namespace; default %(default)s)")
    parser.add_argument("--compute-domain-daemon-image", default=DAEMON_IMAGE, metavar="IMAGE",
                        help="image of the IMEX daemon pods' container, which runs `gpu-dra compute-domain-daemon "
                             "run`: this project's image (default %(default)s)")
    parser.add_argument("--compute-domain-daemon-image-from-pod", action="store_true",
                        help="as --compute-domain-daemon-image, with this controller's own image and (unless "
                             "--compute-domain-daemon-image-pull-secrets is given) its Pod's image pull secrets, read "
                             "from its Pod ($POD_NAME in $POD_NAMESPACE; container --container-name), so that one "
                             "image reference (kustomize `images:`) serves both")
    parser.add_argument("--compute-domain-daemon-image-pull-secrets", default=None, metavar="NAMES",
                        help="comma-separated image pull secrets (in --compute-domain-namespace) of the IMEX daemon "
                             "pods (NVIDIA's --cd-daemon-image-pull-secret-names)")
    parser.add_argument("--container-name", default="controller",
                        help="this controller's container in its Pod (default %(default)s)")
    parser.add_argument("--event-repeat", type=float, default=60.0,
                        help="seconds before an unchanged explanation Event is posted again (default %(default)s)")
    add_feature_arguments(parser, "DRA feature gate")
    cliopts.add_log_level(parser)


def config_from_args(args: argparse.Namespace) -> ControllerConfig:
    timings = LeaseTimings(args.lease_duration, args.renew_deadline, args.retry_period)
    timings.validate()
    if args.binding_timeout < 1:
        raise ValueError(f"--binding-timeout ({args.binding_timeout}) must be at least 1 second")
    if args.gang_timeout <= 0:
        raise ValueError(f"--gang-timeout ({args.gang_timeout}) must be greater than 0 seconds")
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        raise ValueError(f"--metrics-port ({args.metrics_port}) must be between 0 and 65535")
    if args.resync_period <= 0:
        raise ValueError(f"--resync-period ({args.resync_period}) must be greater than 0 seconds")
    return ControllerConfig(
        driver_name=args.driver_name,
        gang_timeout=args.gang_timeout,
        binding_timeout=args.binding_timeout,
        leader_elect=args.leader_elect,
        identity=args.identity or default_identity(),
        lease_namespace=args.lease_namespace,
        lease_name=args.lease_name,
        timings=timings,
        resync_period=args.resync_period,
        event_repeat_interval=args.event_repeat,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        features=features_from_arguments(args),
        compute_domain_namespace=args.compute_domain_namespace,
        compute_domain_daemon_image=args.compute_domain_daemon_image,
        compute_domain_daemon_pull_secrets=secret_names(args.compute_domain_daemon_image_pull_secrets or ""),
    )


def daemon_image_from_pod(api: Any, args: argparse.Namespace, config: ControllerConfig,
                          environ: Mapping[str, str]) -> ControllerConfig:
    """`config` with the IMEX daemon pods' image (and, unless given by flag, pull secrets) of this controller's
    own Pod ($POD_NAME in $POD_NAMESPACE); ValueError saying what is missing."""
    own = own_image(api, environ.get("POD_NAMESPACE", "gpu-dra-system"), environ.get("POD_NAME", ""),
                    args.container_name)
    secrets = config.compute_domain_daemon_pull_secrets \
        if args.compute_domain_daemon_image_pull_secrets is not None else own.pull_secrets
    return replace(config, compute_domain_daemon_image=own.image, compute_domain_daemon_pull_secrets=secrets)


class MissingRoles(Exception):
    """--embedded where the testbed is not installed."""


def embedded_roles() -> ClusterRolesFactory:
    """The testbed's kube-scheduler and kube-controller-manager roles; MissingRoles where the testbed is not
    installed (the image)."""
    try:
        from sim.roles.embedded import EmbeddedRoles  # noqa: PLC0415 - the testbed, only for --embedded
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "sim":
            raise
        raise MissingRoles("--embedded: the embedded control plane's scheduler and "
                          "controller-manager roles (package `sim`, the testbed) are not part of this installation (the "
                          "image runs beside a real kube-scheduler); install gpu-dra from a source checkout "
                          "(pip install .) to run it") from exc
    return EmbeddedRoles


def run(args: argparse.Namespace) -> int:
    configure(cliopts.log_level(args))
    try:
        config = config_from_args(args)
        roles = embedded_roles() if args.embedded else None
    except (ValueError, FeatureGateError, MissingRoles) as err:
        print(f"gpu-dra controller: {err}", file=sys.stderr)
        return 2
    try:
        source = cliopts.kubeconfig_source(args.kubeconfig)
        api = KubeApi.connect(kubeconfig=source)
    except cliopts.NoApiConfig as err:
        print(f"gpu-dra controller: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - any config loading failure is a usage error here
        where = f"kubeconfig {source}" if source else "in-cluster configuration"
        print(f"gpu-dra controller: cannot load {where}: {err}", file=sys.stderr)
        return 2
    if args.compute_domain_daemon_image_from_pod:
        try:
            config = daemon_image_from_pod(api, args, config, os.environ)
        except ValueError as err:
            print(f"gpu-dra controller: --compute-domain-daemon-image-from-pod: {err}", file=sys.stderr)
            api.close()
            return 2
    manager = ControllerManager(api, config, roles=roles)
    stop = stop_on_signals(notify=lambda sig: log.info("signal received; shutting down", extra={"signal": sig.name}))
    manager.start()
    try:
        while not stop.wait(1.0):
            pass
    finally:
        manager.stop(release=True)
        api.close()
    return 0
