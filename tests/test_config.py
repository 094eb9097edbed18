"""The opaque GpuConfig: validation messages name the field and what is accepted; parse gives typed values."""

from __future__ import annotations

import pytest

from gpudra import deviceconfig as config
from gpudra.deviceconfig import ConfigError, SharingStrategy, TimeSliceInterval

BASE = {"apiVersion": "gpu.nvidia.com/v1alpha1", "kind": "GpuConfig"}


def test_minimal_config_is_valid_and_exclusive() -> None:
    assert config.validate_parameters(BASE) == []
    assert config.parse(BASE).sharing is None


def test_time_slicing_defaults_to_default_interval() -> None:
    parsed = config.parse({**BASE, "sharing": {"strategy": "TimeSlicing"}})
    assert parsed.sharing is not None and parsed.sharing.strategy is SharingStrategy.TIME_SLICING
    assert parsed.sharing.time_slicing is not None
    assert parsed.sharing.time_slicing.interval is TimeSliceInterval.DEFAULT
    long = config.parse({**BASE, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}})
    assert long.sharing is not None and long.sharing.time_slicing is not None
    assert long.sharing.time_slicing.interval.level == 3


def test_mps_limits_per_device_override_default() -> None:
    parsed = config.parse(
        {
            **BASE,
            "sharing": {
                "strategy": "MPS",
                "mpsConfig": {
                    "defaultActiveThreadPercentage": 50,
                    "defaultPinnedDeviceMemoryLimit": "10Gi",
                    "defaultPerDevicePinnedMemoryLimit": {"1": "2Gi", "GPU-abc": "1Gi"},
                },
            },
        }
    )
    assert parsed.sharing is not None and parsed.sharing.mps is not None
    mps = parsed.sharing.mps
    assert mps.default_active_thread_percentage == 50
    # NVIDIA's semantics: index keys count the daemon's devices sorted by UUID; UUID keys name one of them.
    assert mps.pinned_limits_mib(["GPU-x", "GPU-abc", "GPU-b"]) == {"GPU-abc": 1024, "GPU-b": 2048, "GPU-x": 10240}
    with pytest.raises(ConfigError) as info:
        mps.pinned_limits_mib(["GPU-x"])
    assert info.value.errors == [
        "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[1]: names no device of this MPS daemon; "
        "accepted: a UUID of GPU-x or an index from 0 to 0",
        "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[GPU-abc]: names no device of this MPS daemon; "
        "accepted: a UUID of GPU-x or an index from 0 to 0",
    ]


@pytest.mark.parametrize(
    "parameters,expected",
    [
        ("nope", "parameters: must be an object"),
        ({"kind": "GpuConfig"}, 'apiVersion: required; accepted values: "resource.nvidia.com/v1beta1", "gpu.nvidia.com/v1alpha1"'),
        ({**BASE, "apiVersion": "resource.nvidia.com/v1"}, "apiVersion: unsupported value 'resource.nvidia.com/v1'"),
        ({**BASE, "kind": "MigConfig"}, "kind: unsupported value 'MigConfig'; accepted values: \"GpuConfig\""),
        ({**BASE, "kind": "MigDeviceConfig"}, "kind: unsupported value 'MigDeviceConfig'; accepted values: \"GpuConfig\""),
        ({**BASE, "sharnig": {}}, 'sharnig: unknown field; accepted fields: "apiVersion", "kind", "sharing"'),
        ({**BASE, "sharing": {}}, 'sharing.strategy: required; accepted values: "TimeSlicing", "MPS"'),
        ({**BASE, "sharing": {"strategy": "Exclusive"}}, "sharing.strategy: unsupported value 'Exclusive'"),
        (
            {**BASE, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}}},
            'sharing.timeSlicingConfig.interval: unsupported value \'Forever\'; accepted values: "Default", "Short", "Medium", "Long"',
        ),
        (
            {**BASE, "sharing": {"strategy": "TimeSlicing", "mpsConfig": {}}},
            'sharing.mpsConfig: only allowed with strategy "MPS"',
        ),
        (
            {**BASE, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 0}}},
            "sharing.mpsConfig.defaultActiveThreadPercentage: must be from 1 to 100, got 0",
        ),
        (
            {**BASE, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": True}}},
            "sharing.mpsConfig.defaultActiveThreadPercentage: must be an integer from 1 to 100, got boolean",
        ),
        (
            {**BASE, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "lots"}}},
            "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: invalid quantity 'lots'",
        ),
        (
            {**BASE, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "-1Gi"}}},
            "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: must be a positive quantity",
        ),
        (
            {**BASE, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1000Ki"}}},
            "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: must be at least 1Mi, got '1000Ki'",
        ),
        (
            {**BASE, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"gpu0": "1Gi"}}}},
            "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[gpu0]: key must be a device index",
        ),
        (
            {**BASE, "sharing": {"strategy": "MPS", "mpsConfig": {"multiUser": "yes"}}},
            "sharing.mpsConfig.multiUser: must be a boolean, got string",
        ),
    ],
)
def test_invalid_parameters_name_field_and_accepted_values(parameters: object, expected: str) -> None:
    errors = config.validate_parameters(parameters)
    assert any(e.startswith(expected) for e in errors), errors
    with pytest.raises(ConfigError) as info:
        config.parse(parameters)
    assert info.value.errors == errors


NV = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}
NV_MIG = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig"}


@pytest.mark.parametrize(
    "parameters",
    [
        NV,
        NV_MIG,
        {**NV, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}},
        {**NV, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 0}}},
        {**NV_MIG, "sharing": {"strategy": "TimeSlicing"}},
        {
            **NV_MIG,
            "sharing": {
                "strategy": "MPS",
                "mpsConfig": {"defaultActiveThreadPercentage": 25, "defaultPerDevicePinnedMemoryLimit": {"0": "5Gi"}},
            },
        },
    ],
)
def test_nvidia_api_is_accepted(parameters: dict) -> None:
    assert config.validate_parameters(parameters) == []
    parsed = config.parse(parameters)
    assert (parsed.api_version, parsed.kind) == (parameters["apiVersion"], parameters["kind"])


@pytest.mark.parametrize(
    "parameters,expected",
    [
        (
            {**NV_MIG, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}},
            'sharing.timeSlicingConfig: unknown field; accepted fields: "strategy", "mpsConfig"',
        ),
        (
            {**NV, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}}},
            "sharing.mpsConfig.defaultActiveThreadPercentage: must be from 0 to 100, got 101",
        ),
        (
            {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig", "iommu": {}},
            "kind: VfioDeviceConfig is not supported: VFIO passthrough (vfio-pci GPUs for virtual machines) is not "
            'supported by gpu-dra; accepted kinds of resource.nvidia.com/v1beta1: "GpuConfig", "MigDeviceConfig"',
        ),
        (
            {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig", "domainID": "x"},
            "kind: ComputeDomainChannelConfig is not supported: it configures a ComputeDomain's IMEX channel: address it "
            "to the driver compute-domain.nvidia.com",
        ),
    ],
)
def test_nvidia_api_errors(parameters: dict, expected: str) -> None:
    errors = config.validate_parameters(parameters)
    assert any(e.startswith(expected) for e in errors), errors


def test_select_follows_nvidia_precedence() -> None:
    ts = config.parse({**NV, "sharing": {"strategy": "TimeSlicing"}})
    mps = config.parse({**NV, "sharing": {"strategy": "MPS"}})
    mig = config.parse({**NV_MIG, "sharing": {"strategy": "MPS"}})
    alias = config.parse(BASE)
    C = config.Candidate
    # Last config naming the request wins over later ones naming no request... and over earlier ones.
    cands = [C(ts), C(mps, ("a",)), C(mig)]
    assert config.select(cands, "a", "gpu") is mps
    assert config.select(cands, "a/sub", "gpu") is mps  # a subrequest is covered by its parent's name
    # A config for all requests applies only to its kind of device.
    assert config.select(cands, "b", "gpu") is ts
    assert config.select(cands, "b", "mig") is mig
    assert config.select([C(ts)], "b", "mig") is None
    # Our v1alpha1 GpuConfig applies to both kinds.
    assert config.select([C(alias)], "b", "mig") is alias
    # Naming a request whose device is of the other kind is an error.
    with pytest.raises(ConfigError) as info:
        config.select([C(ts, ("a",), "spec.devices.config[0]")], "a", "mig")
    assert info.value.errors == [
        "spec.devices.config[0]: a GpuConfig cannot be applied to a device of type 'mig' (request 'a'); use MigDeviceConfig for it"
    ]


def test_mps_multi_user_is_parsed() -> None:
    multi = config.parse({**BASE, "sharing": {"strategy": "MPS", "mpsConfig": {"multiUser": True}}})
    assert multi.sharing is not None and multi.sharing.mps is not None and multi.sharing.mps.multi_user is True
    plain = config.parse({**BASE, "sharing": {"strategy": "MPS"}})
    assert plain.sharing is not None and plain.sharing.mps is not None and plain.sharing.mps.multi_user is False
