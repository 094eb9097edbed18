"""Kubernetes DRA feature gates, with each release's defaults (1.34 to 1.37; 1.37 by default).

Kubernetes keeps a versioned history per gate (`pkg/features/kube_features.go`: VersionedSpecs of version,
default, stage and lock); a component started for release V takes, for every gate, the newest entry not
newer than V. The table below is that history for the gates our allocator, CEL environment, validation and
embedded control plane consult, read from the release-1.34 .. 1.37 sources. `Features.for_version("1.35")`
gives what a 1.35 kube-scheduler would run with; `Features()` is the newest release's.

The version also selects behaviour that changed without a gate (allocator fixes, error texts):
`Features.at_least("1.37")`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields, replace
from typing import Any

SUPPORTED_VERSIONS: tuple[str, ...] = ("1.34", "1.35", "1.36", "1.37")
DEFAULT_VERSION = SUPPORTED_VERSIONS[-1]


@dataclass(frozen=True)
class GateStage:
    """One entry of a gate's history: from `version` on, the gate defaults to `default`."""

    version: str
    default: bool
    stage: str  # alpha | beta | GA
    locked: bool = False  # LockToDefault: cannot be set to the other value


@dataclass(frozen=True)
class Gate:
    name: str
    attr: str  # field on Features
    history: tuple[GateStage, ...]

    def at(self, version: str) -> GateStage | None:
        """The entry in force at `version`; None when the gate does not exist yet."""
        current = None
        for entry in self.history:
            if _key(entry.version) <= _key(version):
                current = entry
        return current


GATES: tuple[Gate, ...] = (
    # pods/exec, pods/attach and pods/portforward also need `create` when reached by GET (a WebSocket
    # upgrade), as their SPDY POST does (KEP-4006; the pod registry's Connect checks it).
    Gate("AuthorizePodWebsocketUpgradeCreatePermission", "pod_websocket_create_permission", (
        GateStage("1.35", True, "beta"),)),
    Gate("DRAAdminAccess", "admin_access", (
        GateStage("1.32", False, "alpha"), GateStage("1.34", True, "beta"), GateStage("1.36", True, "GA", True))),
    Gate("DRAConsumableCapacity", "consumable_capacity", (
        GateStage("1.34", False, "alpha"), GateStage("1.36", True, "beta"))),
    Gate("DRADeviceBindingConditions", "device_binding_conditions", (
        GateStage("1.34", False, "alpha"), GateStage("1.36", True, "beta"))),
    Gate("DRADeviceTaintRules", "device_taint_rules", (
        GateStage("1.35", False, "alpha"), GateStage("1.36", False, "beta"), GateStage("1.37", True, "GA"))),
    Gate("DRADeviceTaints", "device_taints", (
        GateStage("1.33", False, "alpha"), GateStage("1.36", True, "beta"), GateStage("1.37", True, "GA"))),
    Gate("DRAExtendedResource", "extended_resource", (
        GateStage("1.34", False, "alpha"), GateStage("1.36", True, "beta"), GateStage("1.37", True, "GA", True))),
    # Beta and on in 1.37 (MinCompatibilityVersion 1.37: off when emulating an older release).
    Gate("DRAFractionalCapacityRange", "fractional_capacity_range", (GateStage("1.37", True, "beta"),)),
    Gate("DRAListTypeAttributes", "list_type_attributes", (GateStage("1.36", False, "alpha"),)),
    Gate("DRAPartitionableDevices", "partitionable_devices", (
        GateStage("1.33", False, "alpha"), GateStage("1.36", True, "beta"))),
    Gate("DRAPrioritizedList", "prioritized_list", (
        GateStage("1.33", False, "alpha"), GateStage("1.34", True, "beta"), GateStage("1.36", True, "GA"),
        GateStage("1.37", True, "GA", True))),
    Gate("DRAResourceClaimDeviceStatus", "resource_claim_device_status", (
        GateStage("1.32", False, "alpha"), GateStage("1.33", True, "beta"), GateStage("1.37", True, "GA", True))),
    # Status writes checked per field on the synthetic resourceclaims/binding and resourceclaims/driver
    # subresources (KEP-5538); beta and on from 1.36.
    Gate("DRAResourceClaimGranularStatusAuthorization", "granular_status_authorization", (
        GateStage("1.36", True, "beta"),)),
    Gate("DRASchedulerFilterTimeout", "scheduler_filter_timeout", (GateStage("1.34", True, "beta"),)),
    Gate("DRAWorkloadResourceClaims", "workload_resource_claims", (
        GateStage("1.36", False, "alpha"), GateStage("1.37", False, "beta"))),
    Gate("GenericWorkload", "generic_workload", (
        GateStage("1.35", False, "alpha"), GateStage("1.37", False, "beta"))),
)
_BY_NAME = {g.name: g for g in GATES}


class FeatureGateError(ValueError):
    pass


def _key(version: str) -> tuple[int, int]:
    major, _, minor = version.partition(".")
    return int(major), int(minor)


def check_version(version: str) -> str:
    """`version` normalised ("v1.36.2" -> "1.36"); FeatureGateError when outside the supported range."""
    text = version.strip().lstrip("v")
    parts = text.split(".")
    short = ".".join(parts[:2])
    if short not in SUPPORTED_VERSIONS or not all(p.isdigit() for p in parts):
        raise FeatureGateError(f"--kubernetes-version {version!r}: supported versions are "
                               f"{', '.join(SUPPORTED_VERSIONS)} (optionally with a patch number, e.g. 1.36.2)")
    return short


@dataclass(frozen=True)
class Features:
    """Which DRA feature gates are on, and for which Kubernetes release. Defaults are 1.37's."""

    kubernetes_version: str = DEFAULT_VERSION
    pod_websocket_create_permission: bool = True
    admin_access: bool = True
    consumable_capacity: bool = True
    device_binding_conditions: bool = True
    device_taint_rules: bool = True
    device_taints: bool = True
    extended_resource: bool = True
    fractional_capacity_range: bool = True
    list_type_attributes: bool = False
    partitionable_devices: bool = True
    prioritized_list: bool = True
    resource_claim_device_status: bool = True
    granular_status_authorization: bool = True
    scheduler_filter_timeout: bool = True
    workload_resource_claims: bool = False
    generic_workload: bool = False

    @classmethod
    def for_version(cls, version: str = DEFAULT_VERSION) -> "Features":
        """The defaults of Kubernetes `version` (gates that do not exist there are off)."""
        short = check_version(version)
        values: dict[str, Any] = {"kubernetes_version": short}
        for gate in GATES:
            entry = gate.at(short)
            values[gate.attr] = bool(entry and entry.default)
        return cls(**values)

    @classmethod
    def parse(cls, specs: list[str] | None, version: str | None = None) -> "Features":
        """`--feature` values (`Gate`, `Gate=true`, `Gate=false`, or comma-separated lists of them) over the
        defaults of `version`. As in Kubernetes, a gate unknown to that release and a change of a gate locked
        to its default are errors."""
        base = cls.for_version(version or DEFAULT_VERSION)
        values: dict[str, Any] = {}
        for spec in specs or []:
            for item in filter(None, (s.strip() for s in spec.split(","))):
                name, _, raw = item.partition("=")
                name = name.strip()
                gate = _BY_NAME.get(name)
                entry = gate.at(base.kubernetes_version) if gate else None
                if gate is None or entry is None:
                    known = sorted(g.name for g in GATES if g.at(base.kubernetes_version))
                    raise FeatureGateError(
                        f"--feature {item!r}: unknown feature gate {name!r} in Kubernetes {base.kubernetes_version}; "
                        f"known gates: {', '.join(known)}")
                raw = raw.strip().lower() or "true"
                if raw not in ("true", "false"):
                    raise FeatureGateError(f"--feature {item!r}: value must be true or false, not {raw!r}")
                value = raw == "true"
                if entry.locked and value != entry.default:
                    raise FeatureGateError(
                        f"--feature {item!r}: cannot set feature gate {name} to {raw}, feature is locked to "
                        f"{str(entry.default).lower()} in Kubernetes {base.kubernetes_version}")
                values[gate.attr] = value
        return replace(base, **values)

    def at_least(self, version: str) -> bool:
        return _key(self.kubernetes_version) >= _key(version)

    def enabled(self) -> dict[str, bool]:
        """Gate name -> state for the gates this release knows, for reports."""
        by_field = {f.name: getattr(self, f.name) for f in fields(self)}
        return {g.name: bool(by_field[g.attr]) for g in GATES if g.at(self.kubernetes_version)}


def stage_of(gate: str, version: str = DEFAULT_VERSION) -> GateStage | None:
    """The history entry of `gate` in force at `version` (None: unknown gate or not yet introduced)."""
    g = _BY_NAME.get(gate)
    return g.at(check_version(version)) if g else None


def add_arguments(parser: argparse.ArgumentParser, what: str = "feature gate") -> None:
    """`--kubernetes-version` and `--feature`, the same on every command that allocates or validates."""
    parser.add_argument("--kubernetes-version", default=DEFAULT_VERSION, metavar="VERSION",
                        help=f"Kubernetes release whose DRA semantics and gate defaults apply "
                             f"({SUPPORTED_VERSIONS[0]}..{SUPPORTED_VERSIONS[-1]}, default %(default)s)")
    parser.add_argument("--feature", action="append", default=[], metavar="GATE[=true|false]",
                        help=f"{what} over that release's defaults, e.g. DRAListTypeAttributes (repeatable)")


def from_arguments(args: argparse.Namespace) -> Features:
    """Features from `--kubernetes-version` and `--feature`; FeatureGateError names the bad value."""
    return Features.parse(getattr(args, "feature", None), getattr(args, "kubernetes_version", None))
