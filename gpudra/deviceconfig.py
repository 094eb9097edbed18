"""Our opaque device configuration: the `parameters` a ResourceClaim or DeviceClass passes to this driver.

    apiVersion: gpu.nvidia.com/v1alpha1
    kind: GpuConfig
    sharing:
      strategy: TimeSlicing            # or MPS
      timeSlicingConfig:
        interval: Default              # Default | Short | Medium | Long
      mpsConfig:                       # only with strategy MPS
        defaultActiveThreadPercentage: 50          # 1..100
        defaultPinnedDeviceMemoryLimit: 10Gi       # positive quantity
        defaultPerDevicePinnedMemoryLimit:         # GPU index or UUID -> positive quantity
          "0": 4Gi

The field names follow NVIDIA's k8s-dra-driver-gpu GpuConfig (`timeSlicingConfig`, `mpsConfig`) so existing
claims read naturally; the group is ours (`gpu.nvidia.com`, the driver name) and the version starts at
v1alpha1; NVIDIA's own `resource.nvidia.com/v1beta1` GpuConfig is accepted too. One kind covers full GPUs and MIG devices. Unknown fields are errors, never ignored: a typo in a
sharing setting must not silently give a workload an exclusive GPU.

`validate_parameters` is the single validator (used by `gpu-dra validate`, API admission and prepare);
`parse` turns valid parameters into the typed model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpudra.quantity import Quantity, QuantityError

API_GROUP = "gpu.nvidia.com"
API_VERSION = f"{API_GROUP}/v1alpha1"
# NVIDIA's k8s-dra-driver-gpu names the same kind `resource.nvidia.com/v1beta1` (its quickstart manifests use it);
# the fields we read are the same, so claims written for that driver are accepted as they are.
NVIDIA_API_VERSION = "resource.nvidia.com/v1beta1"
SUPPORTED_API_VERSIONS: tuple[str, ...] = (API_VERSION, NVIDIA_API_VERSION)
KIND = "GpuConfig"

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
    # Keyed by GPU index ("0") or UUID; overrides the default for that device.
    default_per_device_pinned_memory_limit: dict[str, Quantity] = Field(default_factory=dict)

    def pinned_limit_bytes(self, uuid: str, index: int) -> int | None:
        """The pinned device memory limit for one device, per-device entries winning over the default."""
        for key in (uuid, str(index)):
            if key in self.default_per_device_pinned_memory_limit:
                return self.default_per_device_pinned_memory_limit[key].as_int()
        if self.default_pinned_device_memory_limit is not None:
            return self.default_pinned_device_memory_limit.as_int()
        return None


class Sharing(BaseModel):
    model_config = ConfigDict(frozen=True)
    strategy: SharingStrategy
    time_slicing: TimeSlicingConfig | None = None
    mps: MpsConfig | None = None


class GpuConfig(BaseModel):
    model_config = ConfigDict(frozen=True)
    api_version: str = API_VERSION
    kind: str = KIND
    sharing: Sharing | None = None


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
        q.as_int()
    except (ValueError, OverflowError):
        return None, [f"{path}: must be a whole number of bytes that fits int64, got {str(value)!r}"]
    return q, []


def _validate_mps(mps: object, path: str) -> list[str]:
    if not isinstance(mps, Mapping):
        return [f"{path}: must be an object, got {_type_name(mps)}"]
    allowed = ("defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit", "defaultPerDevicePinnedMemoryLimit")
    errors = _unknown_fields(mps, path, allowed)
    if "defaultActiveThreadPercentage" in mps:
        pct = mps["defaultActiveThreadPercentage"]
        if isinstance(pct, bool) or not isinstance(pct, int):
            errors.append(f"{path}.defaultActiveThreadPercentage: must be an integer from 1 to 100, got {_type_name(pct)}")
        elif not 1 <= pct <= 100:
            errors.append(f"{path}.defaultActiveThreadPercentage: must be from 1 to 100, got {pct}")
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
                        f"{ppath}[{key}]: key must be a GPU index (\"0\", \"1\", ...) or a UUID (\"GPU-...\" or \"MIG-...\")"
                    )
                errors += _positive_quantity(limit, f"{ppath}[{key}]")[1]
    return errors


def _validate_sharing(sharing: object, path: str) -> list[str]:
    if not isinstance(sharing, Mapping):
        return [f"{path}: must be an object, got {_type_name(sharing)}"]
    errors = _unknown_fields(sharing, path, ("strategy", "timeSlicingConfig", "mpsConfig"))
    strategies = tuple(s.value for s in SharingStrategy)
    strategy = sharing.get("strategy")
    if strategy is None:
        errors.append(f"{path}.strategy: required; accepted values: {_accepted(strategies)}")
    elif strategy not in strategies:
        errors.append(f"{path}.strategy: unsupported value {strategy!r}; accepted values: {_accepted(strategies)}")
    if "timeSlicingConfig" in sharing:
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
        errors += _validate_mps(sharing["mpsConfig"], mpath)
    return errors


def validate_parameters(parameters: object) -> list[str]:
    """All problems with one opaque `parameters` object, as "field.path: message" (empty when valid)."""
    if not isinstance(parameters, Mapping):
        return [f"parameters: must be an object with apiVersion {API_VERSION!r} and kind {KIND!r}, got {_type_name(parameters)}"]
    errors = _unknown_fields(parameters, "", ("apiVersion", "kind", "sharing"))
    api_version = parameters.get("apiVersion")
    if api_version is None:
        errors.append(f"apiVersion: required; accepted values: {_accepted(SUPPORTED_API_VERSIONS)}")
    elif api_version not in SUPPORTED_API_VERSIONS:
        errors.append(f"apiVersion: unsupported value {api_version!r}; accepted values: {_accepted(SUPPORTED_API_VERSIONS)}")
    kind = parameters.get("kind")
    if kind is None:
        errors.append(f"kind: required; accepted values: \"{KIND}\"")
    elif kind != KIND:
        errors.append(f"kind: unsupported value {kind!r}; accepted values: \"{KIND}\"")
    if "sharing" in parameters and parameters["sharing"] is not None:
        errors += _validate_sharing(parameters["sharing"], "sharing")
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
        )
    return GpuConfig(
        api_version=parameters["apiVersion"],
        kind=parameters["kind"],
        sharing=Sharing(strategy=strategy, time_slicing=time_slicing, mps=mps),
    )


def merge(configs: list[GpuConfig]) -> GpuConfig | None:
    """The effective config of one device from the configs that apply to it, in allocation order.

    The allocation lists class configs first and claim configs after them; the last one wins as a whole
    (NVIDIA's driver does the same), so a claim can override its class's sharing setting.
    """
    return configs[-1] if configs else None
