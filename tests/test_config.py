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
    assert mps.pinned_limit_bytes("GPU-x", 0) == 10 * 2**30
    assert mps.pinned_limit_bytes("GPU-x", 1) == 2 * 2**30
    assert mps.pinned_limit_bytes("GPU-abc", 0) == 2**30


@pytest.mark.parametrize(
    "parameters,expected",
    [
        ("nope", "parameters: must be an object"),
        ({"kind": "GpuConfig"}, 'apiVersion: required; accepted values: "gpu.nvidia.com/v1alpha1", "resource.nvidia.com/v1beta1"'),
        ({**BASE, "apiVersion": "resource.nvidia.com/v1alpha9"}, "apiVersion: unsupported value 'resource.nvidia.com/v1alpha9'"),
        ({**BASE, "kind": "MigConfig"}, "kind: unsupported value 'MigConfig'; accepted values: \"GpuConfig\""),
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
            {**BASE, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"gpu0": "1Gi"}}}},
            "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[gpu0]: key must be a GPU index",
        ),
    ],
)
def test_invalid_parameters_name_field_and_accepted_values(parameters: object, expected: str) -> None:
    errors = config.validate_parameters(parameters)
    assert any(e.startswith(expected) for e in errors), errors
    with pytest.raises(ConfigError) as info:
        config.parse(parameters)
    assert info.value.errors == errors


def test_merge_last_wins() -> None:
    a = config.parse({**BASE, "sharing": {"strategy": "TimeSlicing"}})
    b = config.parse(BASE)
    assert config.merge([a, b]) is b
    assert config.merge([]) is None
