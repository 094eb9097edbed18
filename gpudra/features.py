"""Kubernetes DRA feature gates, with Kubernetes 1.35 defaults."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

# Gate name -> field name; 1.35 defaults live on the dataclass below.
_GATE_FIELDS = {
    "DRAPrioritizedList": "prioritized_list",
    "DRAAdminAccess": "admin_access",
    "DRAResourceClaimDeviceStatus": "resource_claim_device_status",
    "DRASchedulerFilterTimeout": "scheduler_filter_timeout",
    "DRAPartitionableDevices": "partitionable_devices",
    "DRADeviceTaints": "device_taints",
    "DRAConsumableCapacity": "consumable_capacity",
    "DRAExtendedResource": "extended_resource",
    "DRADeviceBindingConditions": "device_binding_conditions",
    "DRADeviceTaintRules": "device_taint_rules",
}


class FeatureGateError(ValueError):
    pass


@dataclass(frozen=True)
class Features:
    """Which DRA feature gates are on. Defaults are Kubernetes 1.35's, except device taints and
    DeviceTaintRules, which are 1.37's (GA): the embedded control plane serves DeviceTaintRule at v1."""

    prioritized_list: bool = True  # beta
    admin_access: bool = True  # beta
    resource_claim_device_status: bool = True  # beta
    scheduler_filter_timeout: bool = True  # beta
    partitionable_devices: bool = False  # alpha
    device_taints: bool = True  # GA in 1.37 (DeviceTaintRule served at resource.k8s.io/v1)
    consumable_capacity: bool = False  # alpha
    extended_resource: bool = False  # alpha
    device_binding_conditions: bool = False  # alpha
    device_taint_rules: bool = True  # GA in 1.37, with DRADeviceTaints

    @classmethod
    def parse(cls, specs: list[str] | None) -> "Features":
        """Parse `--feature` values: `Gate`, `Gate=true`, `Gate=false`, or comma-separated lists of them."""
        values: dict[str, bool] = {}
        for spec in specs or []:
            for item in filter(None, (s.strip() for s in spec.split(","))):
                name, _, raw = item.partition("=")
                if name not in _GATE_FIELDS:
                    raise FeatureGateError(
                        f"--feature {item!r}: unknown feature gate {name!r}; known gates: {', '.join(sorted(_GATE_FIELDS))}"
                    )
                raw = raw.strip().lower() or "true"
                if raw not in ("true", "false"):
                    raise FeatureGateError(f"--feature {item!r}: value must be true or false, not {raw!r}")
                values[_GATE_FIELDS[name]] = raw == "true"
        return replace(cls(), **values)

    def enabled(self) -> dict[str, bool]:
        """Gate name -> state, for reports."""
        by_field = {f.name: getattr(self, f.name) for f in fields(self)}
        return {gate: by_field[attr] for gate, attr in _GATE_FIELDS.items()}
