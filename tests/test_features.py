"""Feature-gate defaults per Kubernetes release (kube_features.go VersionedSpecs, release-1.34 .. 1.37)."""

from __future__ import annotations

import pytest

from gpudra.features import DEFAULT_VERSION, FeatureGateError, Features, check_version, stage_of

# Gate -> default in 1.34, 1.35, 1.36, 1.37 (None: the gate does not exist in that release).
EXPECTED = {
    "DRAAdminAccess": (True, True, True, True),
    "DRAConsumableCapacity": (False, False, True, True),
    "DRADeviceBindingConditions": (False, False, True, True),
    "DRADeviceTaintRules": (None, False, False, True),
    "DRADeviceTaints": (False, False, True, True),
    "DRAExtendedResource": (False, False, True, True),
    "DRAFractionalCapacityRange": (None, None, None, True),
    "DRAListTypeAttributes": (None, None, False, False),
    "DRAPartitionableDevices": (False, False, True, True),
    "DRAPrioritizedList": (True, True, True, True),
    "DRAResourceClaimDeviceStatus": (True, True, True, True),
    "DRAResourceClaimGranularStatusAuthorization": (None, None, True, True),
    "DRASchedulerFilterTimeout": (True, True, True, True),
    "DRAWorkloadResourceClaims": (None, None, False, False),
    "GenericWorkload": (None, False, False, False),
    "AuthorizePodWebsocketUpgradeCreatePermission": (None, True, True, True),
}
VERSIONS = ("1.34", "1.35", "1.36", "1.37")


@pytest.mark.parametrize("version", VERSIONS)
def test_defaults_per_release(version: str) -> None:
    enabled = Features.for_version(version).enabled()
    i = VERSIONS.index(version)
    expected = {gate: values[i] for gate, values in EXPECTED.items() if values[i] is not None}
    assert enabled == expected


def test_newest_release_is_the_default() -> None:
    assert DEFAULT_VERSION == "1.37"
    assert Features() == Features.for_version("1.37") == Features.parse([])


def test_stages_and_locks() -> None:
    assert stage_of("DRADeviceTaints", "1.37").stage == "GA"
    assert stage_of("DRAPartitionableDevices", "1.36").stage == "beta"
    assert stage_of("DRAPrioritizedList", "1.36").locked is False
    assert stage_of("DRAPrioritizedList", "1.37").locked is True
    assert stage_of("DRAListTypeAttributes", "1.35") is None


def test_override_over_release_defaults() -> None:
    f = Features.parse(["DRAPartitionableDevices,DRADeviceTaints=true"], "1.35")
    assert f.partitionable_devices and f.device_taints and not f.consumable_capacity
    assert f.kubernetes_version == "1.35"
    assert not Features.parse(["DRAConsumableCapacity=false"], "1.37").consumable_capacity
    assert Features.parse(["DRAListTypeAttributes"]).list_type_attributes


@pytest.mark.parametrize(("specs", "version", "message"), [
    (["DRAPrioritizedList=false"], "1.37", "cannot set feature gate DRAPrioritizedList to false, feature is locked to true"),
    (["DRAAdminAccess=false"], "1.36", "feature is locked to true in Kubernetes 1.36"),
    (["DRADeviceTaintRules"], "1.34", "unknown feature gate 'DRADeviceTaintRules' in Kubernetes 1.34"),
    (["DRANoSuchGate"], "1.37", "unknown feature gate 'DRANoSuchGate'"),
    (["DRAPartitionableDevices=maybe"], "1.37", "value must be true or false, not 'maybe'"),
])
def test_rejected_settings(specs: list[str], version: str, message: str) -> None:
    with pytest.raises(FeatureGateError, match=message):
        Features.parse(specs, version)


@pytest.mark.parametrize(("given", "short"), [("1.36", "1.36"), ("v1.37.0", "1.37"), ("1.34.3", "1.34")])
def test_version_spellings(given: str, short: str) -> None:
    assert check_version(given) == short


@pytest.mark.parametrize("bad", ["1.33", "1.38", "2.0", "latest", "1.36.x"])
def test_unsupported_versions(bad: str) -> None:
    with pytest.raises(FeatureGateError, match="supported versions are 1.34, 1.35, 1.36, 1.37"):
        check_version(bad)


def test_at_least() -> None:
    assert Features.for_version("1.37").at_least("1.37")
    assert not Features.for_version("1.36").at_least("1.37")
