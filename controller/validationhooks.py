"""The validation hooks gpu-dra installs: the CEL checker, our opaque-parameter checks (GPU configs, and
ComputeDomain channel/daemon configs for compute-domain.nvidia.com), ComputeDomain objects, and the refusal of
NVIDIA's DeviceClasses for what gpu-dra does not do.

Every caller (`gpu-dra validate`, `allocate`/`explain`, the embedded API server's admission) gets the same hooks
from here, so an object is judged the same way offline and by the server.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpudra import DEFAULT_DRIVER_NAME, computedomain
from gpudra.deviceconfig import validate_parameters
from gpudra.validation.admission import Admission, validating_admission
from gpudra.validation.common import CelChecker, OpaqueValidators
from controller.cel.check import Checker

# DeviceClasses of NVIDIA's DRA driver for features gpu-dra does not have, with the reason the user is given.
# A claim naming one of them could never be allocated here; saying so at admission beats a pod pending forever.
UNSUPPORTED_CLASSES: dict[str, str] = {
    "vfio.gpu.nvidia.com": "NVIDIA's VFIO passthrough class; gpu-dra does not support VFIO passthrough (vfio-pci GPUs for virtual machines)",
    "imex.nvidia.com": "the IMEX channel class of NVIDIA's driver before ComputeDomains; use a ComputeDomain and its "
                       "channel ResourceClaimTemplate (class compute-domain-default-channel.nvidia.com) instead",
}


def cel_checker() -> CelChecker:
    """A CEL compile/cost checker that reuses its environments across calls."""
    return Checker()


def opaque_validators(driver_name: str = DEFAULT_DRIVER_NAME) -> OpaqueValidators:
    """Our GpuConfig schema check for opaque parameters addressed to `driver_name`, and the ComputeDomain configs'
    for compute-domain.nvidia.com."""
    return {driver_name: validate_parameters, computedomain.DRIVER: computedomain.validate_config}


def _requests(spec: Mapping[str, Any], path: str) -> list[tuple[str, Any]]:
    devices = spec.get("devices")
    if not isinstance(devices, Mapping):
        devices = {}
    out: list[tuple[str, Any]] = []
    for i, request in enumerate(devices.get("requests") or []):
        if not isinstance(request, Mapping):
            continue
        rpath = f"{path}.devices.requests[{i}]"
        if "deviceClassName" in request:  # resource.k8s.io/v1beta1 keeps the request's fields flat
            out.append((f"{rpath}.deviceClassName", request.get("deviceClassName")))
        if isinstance(request.get("exactly"), Mapping):
            out.append((f"{rpath}.exactly.deviceClassName", request["exactly"].get("deviceClassName")))
        for j, sub in enumerate(request.get("firstAvailable") or []):
            if isinstance(sub, Mapping):
                out.append((f"{rpath}.firstAvailable[{j}].deviceClassName", sub.get("deviceClassName")))
    return out


def unsupported_class_errors(obj: object) -> list[str]:
    """Errors for a DeviceClass, ResourceClaim or ResourceClaimTemplate that names one of UNSUPPORTED_CLASSES."""
    if not isinstance(obj, Mapping):
        return []
    kind = obj.get("kind")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        spec = {}
    if kind == "DeviceClass":
        name = (obj.get("metadata") or {}).get("name") if isinstance(obj.get("metadata"), Mapping) else None
        if name in UNSUPPORTED_CLASSES:
            return [f"metadata.name: Unsupported value: {name!r}: {UNSUPPORTED_CLASSES[name]}"]
        return []
    if kind == "ResourceClaimTemplate":
        inner = spec.get("spec")
        if not isinstance(inner, Mapping):
            inner = {}
        found = _requests(inner, "spec.spec")
    elif kind == "ResourceClaim":
        found = _requests(spec, "spec")
    else:
        return []
    return [
        f"{path}: Unsupported value: {name!r}: {UNSUPPORTED_CLASSES[name]}"
        for path, name in found
        if isinstance(name, str) and name in UNSUPPORTED_CLASSES
    ]


def validation_admission(driver_name: str = DEFAULT_DRIVER_NAME, kubernetes_version: str = "1.37") -> Admission:
    """The embedded API server's admission: Kubernetes' validation (of that release) with both hooks, then our
    class refusals. Those are checked on create only: what they look at (a DeviceClass's name, a claim's or
    template's spec) cannot change afterwards."""
    kubernetes = validating_admission(cel_checker(), opaque_validators(driver_name), kubernetes_version)

    def admit(obj: dict[str, Any], old: dict[str, Any] | None) -> list[str]:
        if obj.get("kind") == "ComputeDomain":
            return computedomain.validate_compute_domain(obj)
        return kubernetes(obj, old) + (unsupported_class_errors(obj) if old is None else [])

    return admit
