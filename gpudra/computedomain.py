"""NVIDIA's compute-domain API as both sides use it: names, labels, the opaque channel and daemon configs
(`resource.nvidia.com/v1beta1` ComputeDomainChannelConfig / ComputeDomainDaemonConfig), and the validation of
ComputeDomain objects beyond their CRD's schema (what `gpu-dra validate` and admission add).

Facts from NVIDIA's driver (api/nvidia.com/resource/v1beta1, templates/compute-domain-*.tmpl.yaml).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

DRIVER = "compute-domain.nvidia.com"
API_GROUP = "resource.nvidia.com"
API_VERSION = "resource.nvidia.com/v1beta1"
CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"
DAEMON_CLASS = "compute-domain-daemon.nvidia.com"
CHANNEL_CONFIG_KIND = "ComputeDomainChannelConfig"
DAEMON_CONFIG_KIND = "ComputeDomainDaemonConfig"
# On nodes (set by the kubelet plugin when it prepares a domain's channel there) and on the objects the controller
# makes for a domain: the domain's uid. The daemon DaemonSet selects nodes by it.
DOMAIN_LABEL = "resource.nvidia.com/computeDomain"
FINALIZER = "resource.nvidia.com/computeDomain"
# GPU Feature Discovery's label for a node's NVLink clique: "<clusterUuid>.<cliqueId>".
CLIQUE_LABEL = "nvidia.com/gpu.clique"
# IMEX channels per node (the driver's default NVreg_ImexChannelCount), and how many we publish as devices:
# the default channel class selects id 0 only; `allocationMode: All` injects every channel's device node.
MAX_CHANNELS = 2048
PUBLISHED_CHANNELS = 127
CHANNEL_DEVICE_DIR = "/dev/nvidia-caps-imex-channels"
CHANNEL_MAJOR_NAME = "nvidia-caps-imex-channels"
ALLOCATION_MODES = ("Single", "All")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def channel_path(channel: int) -> str:
    return f"{CHANNEL_DEVICE_DIR}/channel{channel}"


def clique_object_name(domain_uid: str, clique: str) -> str:
    """NVIDIA's ComputeDomainClique name: `<computeDomainUID>.<cliqueID>`."""
    return f"{domain_uid}.{clique}"


def validate_config(params: object) -> list[str]:
    """Errors of an opaque config addressed to compute-domain.nvidia.com (paths relative to `parameters`)."""
    if not isinstance(params, Mapping):
        return ["Invalid value: must be an object"]
    errors: list[str] = []
    if params.get("apiVersion") != API_VERSION:
        errors.append(f"apiVersion: Unsupported value: {params.get('apiVersion')!r}: supported values: "
                      f"{API_VERSION!r}")
    kind = params.get("kind")
    if kind not in (CHANNEL_CONFIG_KIND, DAEMON_CONFIG_KIND):
        errors.append(f"kind: Unsupported value: {kind!r}: supported values: {CHANNEL_CONFIG_KIND!r}, "
                      f"{DAEMON_CONFIG_KIND!r}")
    allowed = {"apiVersion", "kind", "domainID"} | ({"allocationMode"} if kind == CHANNEL_CONFIG_KIND else set())
    for key in params:
        if key not in allowed:
            errors.append(f"{key}: Invalid value: unknown field; {kind} has {', '.join(sorted(allowed))}")
    if not params.get("domainID"):
        errors.append("domainID: Required value: domainID cannot be empty")
    mode = params.get("allocationMode")
    if kind == CHANNEL_CONFIG_KIND and mode not in (None, "", *ALLOCATION_MODES):
        errors.append(f"allocationMode: Unsupported value: {mode!r}: supported values: \"All\", \"Single\"")
    return errors


def validate_compute_domain(obj: Mapping[str, Any]) -> list[str]:
    """What a ComputeDomain needs beyond its CRD schema for the controller to act on it."""
    spec_raw = obj.get("spec")
    spec: Mapping[str, Any] = spec_raw if isinstance(spec_raw, Mapping) else {}
    errors: list[str] = []
    channel = spec.get("channel") if isinstance(spec.get("channel"), Mapping) else None
    if channel is None:
        return ["spec.channel: Required value"]
    rct = channel.get("resourceClaimTemplate") if isinstance(channel.get("resourceClaimTemplate"), Mapping) else None
    name = rct.get("name") if rct else None
    if not name:
        errors.append("spec.channel.resourceClaimTemplate.name: Required value: the name of the ResourceClaimTemplate "
                      "the controller creates for the domain's channel")
    elif not isinstance(name, str) or len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        errors.append(f"spec.channel.resourceClaimTemplate.name: Invalid value: {name!r}: a lowercase RFC 1123 "
                      "subdomain (lower case alphanumeric characters, '-' or '.', at most 253 characters)")
    mode = channel.get("allocationMode", "Single")
    if mode not in ALLOCATION_MODES:
        errors.append(f"spec.channel.allocationMode: Unsupported value: {mode!r}: supported values: \"All\", \"Single\"")
    nodes = spec.get("numNodes", 0)
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 0:
        errors.append(f"spec.numNodes: Invalid value: {nodes!r}: must be an integer, zero or greater")
    return errors
