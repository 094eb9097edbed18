"""The opaque device configuration: the `parameters` a ResourceClaim or DeviceClass passes to this driver.

The API is NVIDIA's (k8s-dra-driver-gpu, `resource.nvidia.com/v1beta1`), field for field, so claims written
for NVIDIA's driver carry over unchanged:

    apiVersion: resource.nvidia.com/v1beta1
    kind: GpuConfig                    # full GPUs; MigDeviceConfig for MIG devices
    sharing:
      strategy: TimeSlicing            # or MPS
      timeSlicingConfig:               # GpuConfig only (the interval is a setting of the full GPU)
        interval: Default              # Default | Short | Medium | Long
      mpsConfig:                       # only with strategy MPS
        defaultActiveThreadPercentage: 50          # 0..100
        defaultPinnedDeviceMemoryLimit: 10Gi       # at least 1Mi
        defaultPerDevicePinnedMemoryLimit:         # device -> limit, overriding the default
          "0": 4Gi                                 # key: a UUID of one of the daemon's devices, or an index
                                                   # into them sorted by UUID (NVIDIA's CUDA_VISIBLE_DEVICES order)

Our earlier `gpu.nvidia.com/v1alpha1` `GpuConfig` stays accepted as an alias with the same fields; unlike
NVIDIA's GpuConfig it applies to MIG devices too (it was our one kind for both), and its active thread
percentage starts at 1 as it always did. NVIDIA's other kinds (`VfioDeviceConfig`,
`ComputeDomainChannelConfig`, `ComputeDomainDaemonConfig`) configure things gpu-dra does not do (VFIO
passthrough, IMEX channels); they are refused by the validator, with that reason, so admission rejects them
rather than a pod waiting forever at prepare.

Unknown fields are errors, never ignored (NVIDIA's driver decodes strictly as well): a typo in a sharing
setting must not silently give a workload an exclusive GPU.

`validate_parameters` is the single validator (used by `gpu-dra validate`, API admission, `allocate` and
prepare); `parse` turns valid parameters into the typed model; `select` picks the config that applies to one
allocated device, with NVIDIA's precedence.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpudra.quantity import Quantity, QuantityError

API_GROUP = "resource.nvidia.com"
API_VERSION = f"{API_GROUP}/v1beta1"
ALIAS_API_VERSION = "gpu.nvidia.com/v1alpha1"
SUPPORTED_API_VERSIONS: tuple[str, ...] = (API_VERSION, ALIAS_API_VERSION)
KIND = "GpuConfig"
MIG_KIND = "MigDeviceConfig"
KINDS: dict[str, tuple[str, ...]] = {API_VERSION: (KIND, MIG_KIND), ALIAS_API_VERSION: (KIND,)}
# NVIDIA's kinds for what gpu-dra does not do, with the reason given to the user.
UNSUPPORTED_KINDS: dict[str, str] = {
    "VfioDeviceConfig": "VFIO passthrough (vfio-pci GPUs for virtual machines) is not supported by gpu-dra",
    "ComputeDomainChannelConfig": "it configures a ComputeDomain's IMEX channel: address it to the driver "
                                  "compute-domain.nvidia.com, not to the GPU driver",
    "ComputeDomainDaemonConfig": "it configures a ComputeDomain's IMEX daemon: address it to the driver "
                                 "compute-domain.nvidia.com, not to the GPU driver",
}
MIB = 1024 * 1024

GPU_DEVICE = "gpu"
MIG_DEVICE = "mig"

_UUID_KEY = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+$")
_INDEX_KEY = re.compile(r"^(0|[1-9][0-9]{0,3})$")


class SharingStrategy(str, Enum):
    TIME_SLICING = "TimeSlicing"
    MPS = "MPS"


class TimeSliceInterval(str, Enum):
    DEFAULT = "Default"
    SHORT = "Short"
    MEDIUM = "Medium"
    LONG = "Long"

    @property
    def level(self) -> int:
        """The compute-policy timeslice level NVIDIA's tools use: Default 0, Short 1, Medium 2, Long 3."""
        return list(TimeSliceInterval).index(self)


class TimeSlicingConfig(BaseModel):
    model_config = ConfigDict(frozen=True)
    interval: TimeSliceInterval = TimeSliceInterval.DEFAULT


class MpsConfig(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    default_active_thread_percentage: int | None = None
    default_pinned_device_memory_limit: Quantity | None = None
    # Keyed by one of the daemon's device UUIDs or an index into them sorted by UUID; overrides the default.
    default_per_device_pinned_memory_limit: dict[str, Quantity] = Field(default_factory=dict)
    # The control daemon in multi-user mode (`-M`): clients of every UID share one root MPS server instead of
    # queueing behind the server of whichever UID came first. Volta or newer (NVIDIA's `multiUser`).
    multi_user: bool = False

    def pinned_limits_mib(self, uuids: list[str] | tuple[str, ...]) -> dict[str, int]:
        """The pinned device memory limit (MiB) of each of an MPS daemon's devices, NVIDIA's way.

        `uuids` are the daemon's devices; an index key counts them sorted by UUID. The default applies to every
        device, per-device entries override it. A key that names none of the devices is an error (raised as
        ConfigError), as in NVIDIA's driver: the limit was meant for some device and must not be dropped."""
        ordered = sorted(uuids)
        limits: dict[str, int] = {}
        if self.default_pinned_device_memory_limit is not None:
            mib = self.default_pinned_device_memory_limit.as_int() // MIB
            limits = dict.fromkeys(ordered, mib)
        errors = []
        for key, limit in self.default_per_device_pinned_memory_limit.items():
            if key in ordered:
                limits[key] = limit.as_int() // MIB
            elif _INDEX_KEY.match(key) and int(key) < len(ordered):
                limits[ordered[int(key)]] = limit.as_int() // MIB
            else:
                errors.append(
                    f"sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[{key}]: names no device of this MPS daemon; "
                    f"accepted: a UUID of {', '.join(ordered) or 'its devices'} or an index from 0 to {len(ordered) - 1}"
                )
        if errors:
            raise ConfigError(errors)
        return limits


class Sharing(BaseModel):
    model_config = ConfigDict(frozen=True)
    strategy: SharingStrategy
    time_slicing: TimeSlicingConfig | None = None
    mps: MpsConfig | None = None


class GpuConfig(BaseModel):
    """One parsed config, of either kind (`kind` says which)."""

    model_config = ConfigDict(frozen=True)
    api_version: str = API_VERSION
    kind: str = KIND
    sharing: Sharing | None = None

    def applies_to(self, device_type: str) -> bool:
        """Whether this config may configure a device of `device_type` ("gpu" or "mig")."""
        if self.api_version == ALIAS_API_VERSION:
            return True
        return device_type == (MIG_DEVICE if self.kind == MIG_KIND else GPU_DEVICE)


class ConfigError(ValueError):
    """Invalid opaque parameters; `errors` holds the "field.path: message" lines."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


def _accepted(values: tuple[str, ...] | list[str]) -> str:
    return ", ".join(f'"{v}"' for v in values)


def _type_name(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return "null" if value is None else type(value).__name__


def _unknown_fields(obj: Mapping[str, Any], path: str, allowed: tuple[str, ...]) -> list[str]:
    prefix = f"{path}." if path else ""
    return [
        f"{prefix}{key}: unknown field; accepted fields: {_accepted(allowed)}" for key in obj if key not in allowed
    ]


def _positive_quantity(value: object, path: str) -> tuple[Quantity | None, list[str]]:
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None, [f"{path}: must be a quantity such as \"10Gi\" or \"512Mi\", got {_type_name(value)}"]
    try:
        q = Quantity.parse(str(value))
    except QuantityError as exc:
        return None, [f"{path}: invalid quantity {str(value)!r}: {exc}; use a quantity such as \"10Gi\""]
    if q.sign() <= 0:
        return None, [f"{path}: must be a positive quantity, got {str(value)!r}"]
    try:
        size = q.as_int()
    except (ValueError, OverflowError):
        return None, [f"{path}: must be a whole number of bytes that fits int64, got {str(value)!r}"]
    if size < MIB:
        # MPS takes limits in whole MiB (NVIDIA's driver refuses a limit under 1Mi too).
        return None, [f"{path}: must be at least 1Mi, got {str(value)!r}"]
    return q, []


def _validate_mps(mps: object, path: str, min_percentage: int) -> list[str]:
    if not isinstance(mps, Mapping):
        return [f"{path}: must be an object, got {_type_name(mps)}"]
    allowed = ("defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit", "defaultPerDevicePinnedMemoryLimit", "multiUser")
    errors = _unknown_fields(mps, path, allowed)
    if "multiUser" in mps and not isinstance(mps["multiUser"], bool):
        errors.append(f"{path}.multiUser: must be a boolean, got {_type_name(mps['multiUser'])}")
    if "defaultActiveThreadPercentage" in mps:
        pct = mps["defaultActiveThreadPercentage"]
        if isinstance(pct, bool) or not isinstance(pct, int):
            errors.append(
                f"{path}.defaultActiveThreadPercentage: must be an integer from {min_percentage} to 100, got {_type_name(pct)}"
            )
        elif not min_percentage <= pct <= 100:
            errors.append(f"{path}.defaultActiveThreadPercentage: must be from {min_percentage} to 100, got {pct}")
    if "defaultPinnedDeviceMemoryLimit" in mps:
        errors += _positive_quantity(mps["defaultPinnedDeviceMemoryLimit"], f"{path}.defaultPinnedDeviceMemoryLimit")[1]
    if "defaultPerDevicePinnedMemoryLimit" in mps:
        per_device = mps["defaultPerDevicePinnedMemoryLimit"]
        ppath = f"{path}.defaultPerDevicePinnedMemoryLimit"
        if not isinstance(per_device, Mapping):
            errors.append(f"{ppath}: must be an object mapping a GPU index or UUID to a quantity, got {_type_name(per_device)}")
        else:
            for key, limit in per_device.items():
                if not (_INDEX_KEY.match(str(key)) or _UUID_KEY.match(str(key))):
                    errors.append(
                        f"{ppath}[{key}]: key must be a device index (\"0\", \"1\", ...) or a UUID (\"GPU-...\" or \"MIG-...\")"
                    )
                errors += _positive_quantity(limit, f"{ppath}[{key}]")[1]
    return errors


def _validate_sharing(sharing: object, path: str, *, mig: bool, min_percentage: int) -> list[str]:
    if not isinstance(sharing, Mapping):
        return [f"{path}: must be an object, got {_type_name(sharing)}"]
    # MigDeviceConfig has no timeSlicingConfig: the interval is a setting of the full GPU.
    fields = ("strategy", "mpsConfig") if mig else ("strategy", "timeSlicingConfig", "mpsConfig")
    errors = _unknown_fields(sharing, path, fields)
    strategies = tuple(s.value for s in SharingStrategy)
    strategy = sharing.get("strategy")
    if strategy is None:
        errors.append(f"{path}.strategy: required; accepted values: {_accepted(strategies)}")
    elif strategy not in strategies:
        errors.append(f"{path}.strategy: unsupported value {strategy!r}; accepted values: {_accepted(strategies)}")
    if "timeSlicingConfig" in sharing and not mig:
        tpath = f"{path}.timeSlicingConfig"
        ts = sharing["timeSlicingConfig"]
        if strategy in strategies and strategy != SharingStrategy.TIME_SLICING.value:
            errors.append(f"{tpath}: only allowed with strategy \"TimeSlicing\", strategy is {strategy!r}")
        if not isinstance(ts, Mapping):
            errors.append(f"{tpath}: must be an object, got {_type_name(ts)}")
        else:
            errors += _unknown_fields(ts, tpath, ("interval",))
            intervals = tuple(i.value for i in TimeSliceInterval)
            if "interval" in ts and ts["interval"] not in intervals:
                errors.append(f"{tpath}.interval: unsupported value {ts['interval']!r}; accepted values: {_accepted(intervals)}")
    if "mpsConfig" in sharing:
        mpath = f"{path}.mpsConfig"
        if strategy in strategies and strategy != SharingStrategy.MPS.value:
            errors.append(f"{mpath}: only allowed with strategy \"MPS\", strategy is {strategy!r}")
        errors += _validate_mps(sharing["mpsConfig"], mpath, min_percentage)
    return errors


def validate_parameters(parameters: object) -> list[str]:
    """All problems with one opaque `parameters` object, as "field.path: message" (empty when valid)."""
    if not isinstance(parameters, Mapping):
        return [
            f"parameters: must be an object with apiVersion {API_VERSION!r} and kind {KIND!r} or {MIG_KIND!r}, "
            f"got {_type_name(parameters)}"
        ]
    api_version = parameters.get("apiVersion")
    kind = parameters.get("kind")
    wrong_types = [f"{name}: must be a string, got {_type_name(value)}"
                   for name, value in (("apiVersion", api_version), ("kind", kind))
                   if value is not None and not isinstance(value, str)]
    if wrong_types:
        return wrong_types
    if api_version == API_VERSION and kind in UNSUPPORTED_KINDS:
        # Say why rather than list fields: nothing in such an object could make it acceptable here.
        return [
            f"kind: {kind} is not supported: {UNSUPPORTED_KINDS[kind]}; accepted kinds of {API_VERSION}: "
            f"{_accepted(KINDS[API_VERSION])}"
        ]
    errors = _unknown_fields(parameters, "", ("apiVersion", "kind", "sharing"))
    if api_version is None:
        errors.append(f"apiVersion: required; accepted values: {_accepted(SUPPORTED_API_VERSIONS)}")
    elif api_version not in SUPPORTED_API_VERSIONS:
        errors.append(f"apiVersion: unsupported value {api_version!r}; accepted values: {_accepted(SUPPORTED_API_VERSIONS)}")
    kinds = KINDS.get(str(api_version), (KIND, MIG_KIND))
    if kind is None:
        errors.append(f"kind: required; accepted values: {_accepted(kinds)}")
    elif kind not in kinds:
        errors.append(f"kind: unsupported value {kind!r}; accepted values: {_accepted(kinds)}")
    if "sharing" in parameters and parameters["sharing"] is not None:
        errors += _validate_sharing(
            parameters["sharing"], "sharing", mig=kind == MIG_KIND,
            # NVIDIA's API accepts 0; our v1alpha1 always started at 1.
            min_percentage=1 if api_version == ALIAS_API_VERSION else 0,
        )
    return errors


def parse(parameters: object) -> GpuConfig:
    """The typed config; raises ConfigError (with all the errors) when the parameters are invalid."""
    errors = validate_parameters(parameters)
    if errors:
        raise ConfigError(errors)
    assert isinstance(parameters, Mapping)
    raw_sharing = parameters.get("sharing")
    if raw_sharing is None:
        return GpuConfig(api_version=parameters["apiVersion"], kind=parameters["kind"])
    strategy = SharingStrategy(raw_sharing["strategy"])
    time_slicing: TimeSlicingConfig | None = None
    mps: MpsConfig | None = None
    if strategy is SharingStrategy.TIME_SLICING:
        interval = (raw_sharing.get("timeSlicingConfig") or {}).get("interval", TimeSliceInterval.DEFAULT.value)
        time_slicing = TimeSlicingConfig(interval=TimeSliceInterval(interval))
    else:
        raw = raw_sharing.get("mpsConfig") or {}
        default_limit = raw.get("defaultPinnedDeviceMemoryLimit")
        mps = MpsConfig(
            default_active_thread_percentage=raw.get("defaultActiveThreadPercentage"),
            default_pinned_device_memory_limit=Quantity.parse(str(default_limit)) if default_limit is not None else None,
            default_per_device_pinned_memory_limit={
                str(k): Quantity.parse(str(v)) for k, v in (raw.get("defaultPerDevicePinnedMemoryLimit") or {}).items()
            },
            multi_user=bool(raw.get("multiUser", False)),
        )
    return GpuConfig(
        api_version=parameters["apiVersion"],
        kind=parameters["kind"],
        sharing=Sharing(strategy=strategy, time_slicing=time_slicing, mps=mps),
    )


@dataclass(frozen=True)
class Candidate:
    """A config of the allocation that is addressed to this driver, with the requests it names."""

    config: GpuConfig
    requests: tuple[str, ...] = ()
    where: str = ""


def _names(request: str, requests: tuple[str, ...]) -> bool:
    # A config naming a request covers its subrequests ("req/sub") too.
    return request in requests or request.split("/", 1)[0] in requests


def select(candidates: list[Candidate], request: str, device_type: str) -> GpuConfig | None:
    """The config of one allocated device, NVIDIA's way: `candidates` in allocation order (class configs, then
    claim configs); the last one that names the device's request wins, or else the last one naming no request
    whose kind fits the device (a GpuConfig for all requests skips MIG devices and the other way round).

    A config that names the request but is of the wrong kind for the device is an error (ConfigError), as in
    NVIDIA's driver: the user asked for a setting the device cannot take."""
    for c in reversed(candidates):
        if c.requests and _names(request, c.requests):
            if not c.config.applies_to(device_type):
                raise ConfigError([
                    f"{c.where or 'config'}: a {c.config.kind} cannot be applied to a device of type {device_type!r} "
                    f"(request {request!r}); use {KIND if device_type == GPU_DEVICE else MIG_KIND} for it"
                ])
            return c.config
        if not c.requests and c.config.applies_to(device_type):
            return c.config
    return None
