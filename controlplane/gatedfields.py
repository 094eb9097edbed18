"""Fields of disabled feature gates dropped on write, as kube-apiserver's strategies do (PrepareForCreate /
PrepareForUpdate: `dropDisabled*Fields`): with a gate off, a create loses that gate's fields; an update loses
them too unless the stored object already uses them (so that turning a gate off never destroys data).

`gpu-dra validate` keeps such fields as written (it checks what a file says); the server is what drops them.
Paths are in the storage version: `a.b` walks maps, `a[]` every list item, `a.*` every map value; the last
step is the field dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpudra.features import Features

_RESULT = "status.allocation.devices.results[]"


def _requests(prefix: str) -> dict[str, tuple[str, ...]]:
    """The gated request fields of a device claim at `prefix` (a claim's spec, or a template's spec.spec)."""
    req = f"{prefix}.devices.requests[]"
    return {
        "consumable_capacity": (f"{req}.exactly.capacity", f"{req}.firstAvailable[].capacity"),
        "device_taints": (f"{req}.exactly.tolerations", f"{req}.firstAvailable[].tolerations"),
    }


_DEVICE = "spec.devices[]"
# (group, kind) -> Features attribute -> paths of the fields that gate adds.
_GATED_FIELDS: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {
    ("resource.k8s.io", "ResourceSlice"): {
        "partitionable_devices": ("spec.sharedCounters", "spec.perDeviceNodeSelection", f"{_DEVICE}.consumesCounters",
                                  f"{_DEVICE}.nodeName", f"{_DEVICE}.nodeSelector", f"{_DEVICE}.allNodes"),
        "consumable_capacity": (f"{_DEVICE}.allowMultipleAllocations", f"{_DEVICE}.capacity.*.requestPolicy"),
        "device_binding_conditions": (f"{_DEVICE}.bindingConditions", f"{_DEVICE}.bindingFailureConditions",
                                      f"{_DEVICE}.bindsToNode"),
        "device_taints": (f"{_DEVICE}.taints",),
        "list_type_attributes": tuple(f"{_DEVICE}.attributes.*.{t}" for t in ("ints", "bools", "strings", "versions")),
    },
    ("resource.k8s.io", "ResourceClaim"): {
        "consumable_capacity": (*_requests("spec")["consumable_capacity"], f"{_RESULT}.shareID",
                                f"{_RESULT}.consumedCapacity"),
        "device_taints": (*_requests("spec")["device_taints"], f"{_RESULT}.tolerations"),
        "device_binding_conditions": (f"{_RESULT}.bindingConditions", f"{_RESULT}.bindingFailureConditions"),
    },
    ("resource.k8s.io", "ResourceClaimTemplate"): _requests("spec.spec"),
    ("resource.k8s.io", "DeviceClass"): {"extended_resource": ("spec.extendedResourceName",)},
    ("scheduling.k8s.io", "PodGroup"): {"workload_resource_claims": ("spec.resourceClaims",)},
}


def _steps(path: str) -> tuple[str, ...]:
    out: list[str] = []
    for part in path.split("."):
        if part.endswith("[]"):
            out += [part[:-2], "[]"]
        else:
            out.append(part)
    return tuple(out)


# (group, kind) -> (Features attribute, the steps of each of its paths): split once, not on every write.
_GATED_STEPS: dict[tuple[str, str], tuple[tuple[str, tuple[tuple[str, ...], ...]], ...]] = {
    type_key: tuple((gate, tuple(_steps(p) for p in paths)) for gate, paths in gates.items())
    for type_key, gates in _GATED_FIELDS.items()
}


def _parents(obj: Any, steps: tuple[str, ...]) -> list[dict[str, Any]]:
    """The maps that hold the path's last step."""
    current = [obj]
    for step in steps[:-1]:
        nxt: list[Any] = []
        for value in current:
            if step == "[]":
                nxt += value if isinstance(value, list) else []
            elif step == "*":
                nxt += list(value.values()) if isinstance(value, dict) else []
            elif isinstance(value, dict) and step in value:
                nxt.append(value[step])
        if not nxt:
            return []
        current = nxt
    return [v for v in current if isinstance(v, dict)]


def _uses(obj: Any, paths: tuple[tuple[str, ...], ...]) -> bool:
    return any(steps[-1] in parent for steps in paths for parent in _parents(obj, steps))


@dataclass(frozen=True)
class GatedFields:
    """Drops the fields of the gates `features` has off."""

    features: Features
    # (group, kind) -> the steps of each path whose gate is off, per gate; filled on first use of a type.
    _off: dict[tuple[str, str], tuple[tuple[tuple[str, ...], ...], ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def _disabled(self, group: str, kind: str) -> tuple[tuple[tuple[str, ...], ...], ...]:
        key = (group, kind)
        off = self._off.get(key)
        if off is None:
            off = tuple(paths for gate, paths in _GATED_STEPS.get(key, ()) if not getattr(self.features, gate))
            self._off[key] = off
        return off

    def drop_disabled(self, group: str, kind: str, new: dict[str, Any], old: dict[str, Any] | None) -> None:
        for paths in self._disabled(group, kind):
            if old is not None and _uses(old, paths):
                continue
            for steps in paths:
                for parent in _parents(new, steps):
                    parent.pop(steps[-1], None)
                if steps[-2:-1] == ("*",):
                    # An attribute left with no value at all (only a list one) goes too.
                    for holder in _parents(new, steps[:-1]):
                        for key in [k for k, v in holder.items() if v == {}]:
                            del holder[key]
