"""driver.slices: the pure inventory -> ResourceSlices step."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from controller.cel.device import DeviceView
from controller.cel.environment import CelEnvironment
from driver.discovery import discover
from driver.inventory import Gpu, Health
from driver.nvml import load_backend, shipped_profiles
from driver.slices import (
    APPLICATION_XIDS,
    SliceBuildError,
    SliceSettings,
    binary_quantity,
    build_slices,
    counter_set_name,
    gpu_device_name,
    mig_device_name,
    mig_health,
    semver_of,
    slice_name,
)
from gpudra import validation
from gpudra.quantity import Quantity
from tests.gpu_fixtures import H100_PROFILES, MIB, h100, inventory, t4, with_mig

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
K8S_VERSIONS = ("1.34.0", "1.35.0")  # kubernetes-validate ships strict schemas for 1.25 .. 1.37


def settings(**kw: Any) -> SliceSettings:
    return SliceSettings(node_name=kw.pop("node_name", "node-a"), **kw)


def devices(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for s in slices for d in s["spec"].get("devices", [])]


def by_name(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in devices(slices)}


def structurally_valid(slices: list[dict[str, Any]]) -> None:
    for s in slices:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(s, version, strict=True)


# --- names -----------------------------------------------------------------------------------


def test_gpu_names_come_from_uuid_not_enumeration_order() -> None:
    gpus = [h100(i) for i in range(4)]
    renumbered = [replace(g, index=3 - g.index, minor=10 + g.index) for g in reversed(gpus)]
    a = build_slices(inventory(gpus), settings())
    b = build_slices(inventory(renumbered), settings())
    assert a == b
    names = [d["name"] for d in devices(a)]
    assert len(set(names)) == 4
    for g in gpus:
        assert gpu_device_name(g) in names
        assert gpu_device_name(g) == gpu_device_name(replace(g, index=99, minor=42))


def test_device_names_are_dns_labels_and_distinct_for_similar_uuids() -> None:
    # UUIDs that differ only in the last digit must not collide.
    gpus = [replace(h100(0), uuid=f"GPU-00000000-0000-0000-0000-00000000000{i}") for i in range(8)]
    names = {gpu_device_name(g) for g in gpus}
    assert len(names) == 8
    for g in gpus:
        assert DNS_LABEL.match(gpu_device_name(g)) and len(gpu_device_name(g)) <= 63
    # Upper- and lower-case spellings of one UUID are one GPU.
    assert gpu_device_name(replace(gpus[0], uuid=gpus[0].uuid.upper())) == gpu_device_name(gpus[0])


def test_mig_names_are_placement_based_and_shared_with_partitionable_devices() -> None:
    gpu = with_mig(h100(0), [("3g.40gb", 4), ("1g.10gb+me", 0)])
    mig = gpu.mig_devices[1]
    assert mig_device_name(gpu, mig) == f"{gpu_device_name(gpu)}-mig-1g-10gb-me-0"
    profile = next(p for p in H100_PROFILES if p.name == "1g.10gb+me")
    assert mig_device_name(gpu, profile, profile.placements[0]) == mig_device_name(gpu, mig)
    # A recreated MIG device (new UUID) keeps its name.
    assert mig_device_name(gpu, replace(mig, uuid="MIG-ffffffff-0000-0000-0000-000000000000")) == mig_device_name(gpu, mig)
    with pytest.raises(TypeError, match="needs a placement"):
        mig_device_name(gpu, profile)


def test_long_profile_names_stay_valid_labels() -> None:
    gpu = h100(0)
    long_profile = replace(H100_PROFILES[0], name="7g.80gb+" + "x" * 80)
    name = mig_device_name(gpu, long_profile, long_profile.placements[0])
    other = mig_device_name(gpu, replace(long_profile, name=long_profile.name + "y"), long_profile.placements[0])
    assert DNS_LABEL.match(name) and len(name) <= 63
    assert name != other


def test_slice_names_are_deterministic_and_bounded() -> None:
    assert slice_name("node-a", "gpu.nvidia.com", 0) == "node-a-gpu.nvidia.com-0"
    long_node = ".".join(["a" * 60] * 4)  # 243 characters
    name = slice_name(long_node, "gpu.nvidia.com", 12)
    assert len(name) <= 253 and name.endswith("-12")
    assert name == slice_name(long_node, "gpu.nvidia.com", 12)


def test_settings_reject_invalid_names() -> None:
    with pytest.raises(ValueError, match="node_name 'Node_A'.*DNS subdomain"):
        SliceSettings(node_name="Node_A")
    with pytest.raises(ValueError, match="driver_name.*63"):
        SliceSettings(node_name="n", driver_name="x" * 64)
    with pytest.raises(ValueError, match="generation -1"):
        SliceSettings(node_name="n", generation=-1)


# --- values ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "text"), [(0, "0"), (1, "1"), (1536, "1536"), (81920 * MIB, "80Gi"), (81559 * MIB, "81559Mi"), (1024**6, "1Ei")]
)
def test_binary_quantity_is_canonical(n: int, text: str) -> None:
    assert binary_quantity(n) == text


def test_binary_quantity_matches_shared_quantity_type() -> None:
    for n in (0, 1, 1536, 81559 * MIB, 80 * 1024**3, 15360 * MIB):
        parsed = Quantity.parse(binary_quantity(n))
        assert parsed.as_int() == n
        assert str(parsed) == binary_quantity(n)


@pytest.mark.parametrize(
    ("raw", "want"),
    [("9.0", "9.0.0"), ("580.95.05", "580.95.5"), ("13.0", "13.0.0"), ("12", "12.0.0"), ("1.2.3.4", None), ("abc", None), ("", None)],
)
def test_semver_normalisation(raw: str, want: str | None) -> None:
    assert semver_of(raw) == want


# --- attributes and capacity ------------------------------------------------------------------


def test_full_gpu_attributes_and_capacity() -> None:
    gpu = h100(2)
    s = build_slices(inventory([gpu]), settings())
    assert len(s) == 1
    spec = s[0]["spec"]
    assert spec["driver"] == "gpu.nvidia.com" and spec["nodeName"] == "node-a"
    assert spec["pool"] == {"name": "node-a", "generation": 0, "resourceSliceCount": 1}
    (dev,) = spec["devices"]
    assert dev["name"] == gpu_device_name(gpu)
    assert dev["attributes"] == {
        "type": {"string": "gpu"},
        "uuid": {"string": gpu.uuid},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "580.95.5"},
        "cudaDriverVersion": {"version": "13.0.0"},
        "migCapable": {"bool": True},
        "migEnabled": {"bool": False},
        "nvlinkDomain": {"string": "nvlink-79fb5a60f134808e"},
        "numaNode": {"int": 0},
        "resource.kubernetes.io/pciBusID": {"string": "0000:38:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:37"},
            "resource.kubernetes.io/numaNode": {"int": 0},
    }
    assert dev["capacity"] == {"memory": {"value": "81559Mi"}}
    assert "taints" not in dev and "consumesCounters" not in dev


def test_index_and_minor_are_never_published() -> None:
    gpu = replace(h100(0), index=5, minor=7)
    for part in (False, True):
        for dev in devices(build_slices(inventory([gpu, with_mig(h100(1), [("7g.80gb", 0)])]), settings(partitionable=part))):
            for key in dev["attributes"]:
                assert key.lower() not in ("index", "minor")


def test_optional_attributes_are_left_out_when_unknown() -> None:
    gpu = t4(0)
    (dev,) = devices(build_slices(inventory([gpu]), settings()))
    attrs = dev["attributes"]
    assert "numaNode" not in attrs and "nvlinkDomain" not in attrs
    assert "resource.kubernetes.io/pcieRoot" not in attrs
    assert attrs["migCapable"] == {"bool": False}
    assert attrs["cudaComputeCapability"] == {"version": "7.5.0"}
    odd = replace(gpu, cuda_compute_capability="weird")
    (dev2,) = devices(build_slices(inventory([odd]), settings()))
    assert "cudaComputeCapability" not in dev2["attributes"]


def test_fabric_attributes() -> None:
    gpu = replace(h100(0), fabric_cluster_uuid="5a2b8c3d-0000-1111-2222-333344445555", fabric_clique_id=7)
    (dev,) = devices(build_slices(inventory([gpu]), settings()))
    assert dev["attributes"]["fabricClusterUUID"] == {"string": "5a2b8c3d-0000-1111-2222-333344445555"}
    assert dev["attributes"]["fabricCliqueID"] == {"int": 7}


def test_addressing_mode_on_gpus_and_their_mig_devices() -> None:
    gpu = with_mig(replace(h100(0), addressing_mode="ATS"), [("3g.40gb", 4)])
    devs = devices(build_slices(inventory([gpu, h100(1)]), settings()))
    assert [d["attributes"].get("addressingMode") for d in devs] == [{"string": "ATS"}, None]


def test_mig_enabled_gpu_publishes_its_mig_devices_not_the_full_gpu() -> None:
    gpu = with_mig(h100(0), [("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2)])
    plain = h100(1)
    devs = by_name(build_slices(inventory([gpu, plain]), settings()))
    assert gpu_device_name(gpu) not in devs
    assert gpu_device_name(plain) in devs
    migs = [d for d in devs.values() if d["attributes"]["type"] == {"string": "mig"}]
    assert len(migs) == 3
    three = devs[f"{gpu_device_name(gpu)}-mig-3g-40gb-4"]
    assert three["attributes"]["uuid"] == {"string": gpu.mig_devices[0].uuid}
    assert three["attributes"]["parentUUID"] == {"string": gpu.uuid}
    assert three["attributes"]["profile"] == {"string": "3g.40gb"}
    # The parent's bus id, as NVIDIA's driver publishes it on MIG devices (selectors keep one GPU's MIG devices).
    assert three["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": gpu.pci_bus_id}
    assert three["attributes"]["resource.kubernetes.io/pcieRoot"] == {"string": gpu.pcie_root}
    assert three["capacity"] == {
        "memory": {"value": "40192Mi"},
        "multiprocessors": {"value": "60"},
        "copyEngines": {"value": "3"},
        "decoders": {"value": "3"},
        "encoders": {"value": "0"},
        "jpegEngines": {"value": "3"},
        "ofaEngines": {"value": "0"},
        # NVIDIA's memorySlice<i>: the memory slices 4..7 this placement covers.
        **{f"memorySlice{i}": {"value": "1"} for i in range(4, 8)},
    }
    assert three["attributes"]["resource.kubernetes.io/numaNode"] == three["attributes"]["numaNode"]
    # Order inside a GPU follows placement, not creation order.
    order = [d["name"] for d in devices(build_slices(inventory([gpu]), settings()))]
    assert order == [mig_device_name(gpu, m) for m in sorted(gpu.mig_devices, key=lambda m: m.placement.start)]


def test_mig_enabled_gpu_without_instances_publishes_nothing_for_it() -> None:
    gpu = replace(h100(0), mig_enabled=True)
    s = build_slices(inventory([gpu]), settings())
    assert devices(s) == []
    assert s[0]["spec"]["pool"]["resourceSliceCount"] == 1
    structurally_valid(s)


def test_attribute_count_stays_within_limit() -> None:
    gpu = replace(h100(0), fabric_cluster_uuid="c", fabric_clique_id=1)
    for part in (False, True):
        for dev in devices(build_slices(inventory([gpu, with_mig(h100(1), [("1g.10gb", 0)])]), settings(partitionable=part))):
            assert len(dev["attributes"]) + len(dev.get("capacity", {})) <= 32
            for key in dev["attributes"]:
                local = key.split("/")[-1]
                assert re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", local) and len(local) <= 32


# --- partitionable ---------------------------------------------------------------------------


@pytest.mark.slow
def test_partitionable_counter_sets_and_devices() -> None:
    gpus = [h100(0), h100(1), t4(0)]
    s = build_slices(inventory(gpus), settings(partitionable=True))
    counter_slices = [x for x in s if "sharedCounters" in x["spec"]]
    device_slices = [x for x in s if "devices" in x["spec"]]
    assert counter_slices and device_slices
    # 1.35: counters and devices never share a slice; counter slices come first.
    assert all("devices" not in x["spec"] for x in counter_slices)
    assert s.index(counter_slices[-1]) < s.index(device_slices[0])
    sets = {c["name"]: c["counters"] for x in counter_slices for c in x["spec"]["sharedCounters"]}
    assert set(sets) == {counter_set_name(gpus[0]), counter_set_name(gpus[1])}  # no set for the T4
    counters = sets[counter_set_name(gpus[0])]
    assert counters["memory"] == {"value": "81559Mi"}
    assert counters["compute-slices"] == {"value": "7"}
    assert counters["multiprocessors"] == {"value": "132"}
    assert counters["ofa-engines"] == {"value": "1"}
    assert "encoders" not in counters  # zero totals are not published
    assert [k for k in counters if k.startswith("memory-slice-")] == [f"memory-slice-{i}" for i in range(8)]
    for name in counters:
        assert DNS_LABEL.match(name)

    devs = by_name(s)
    placements = sum(len(p.placements) for p in H100_PROFILES)
    assert len(devs) == 2 * (1 + placements) + 1
    full = devs[gpu_device_name(gpus[0])]
    assert full["consumesCounters"] == [{"counterSet": counter_set_name(gpus[0]), "counters": counters}]
    t4dev = devs[gpu_device_name(gpus[2])]
    assert "consumesCounters" not in t4dev

    p = devs[f"{gpu_device_name(gpus[0])}-mig-3g-40gb-4"]
    assert p["attributes"]["type"] == {"string": "mig"}
    assert "uuid" not in p["attributes"]  # a placement has no MIG device (yet)
    (consumption,) = p["consumesCounters"]
    assert consumption["counterSet"] == counter_set_name(gpus[0])
    assert consumption["counters"] == {
        "compute-slices": {"value": "3"},
        "copy-engines": {"value": "3"},
        "decoders": {"value": "3"},
        "jpeg-engines": {"value": "3"},
        "memory": {"value": "40192Mi"},
        "memory-slice-4": {"value": "1"},
        "memory-slice-5": {"value": "1"},
        "memory-slice-6": {"value": "1"},
        "memory-slice-7": {"value": "1"},
        "multiprocessors": {"value": "60"},
    }
    structurally_valid(s)


def _value(v: dict[str, str]) -> int:
    text = v["value"]
    return int(text[:-2]) * MIB if text.endswith("Mi") else int(text)


def test_partitionable_counters_admit_every_real_layout_and_exclude_the_full_gpu() -> None:
    gpu = h100(0)
    s = build_slices(inventory([gpu]), settings(partitionable=True))
    totals = {k: _value(v) for k, v in s[0]["spec"]["sharedCounters"][0]["counters"].items()}
    devs = by_name(s)

    def consumed(names: list[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in names:
            for k, v in devs[n]["consumesCounters"][0]["counters"].items():
                out[k] = out.get(k, 0) + _value(v)
        return out

    def fits(names: list[str]) -> bool:
        return all(v <= totals[k] for k, v in consumed(names).items())

    base = gpu_device_name(gpu)
    assert fits([f"{base}-mig-1g-10gb-{i}" for i in range(7)])
    assert fits([f"{base}-mig-3g-40gb-0", f"{base}-mig-3g-40gb-4"])
    assert fits([f"{base}-mig-4g-40gb-0", f"{base}-mig-3g-40gb-4"])
    assert fits([f"{base}-mig-2g-20gb-0", f"{base}-mig-2g-20gb-2", f"{base}-mig-2g-20gb-4", f"{base}-mig-1g-10gb-6"])
    assert fits([base])
    # Overlapping placements, the full GPU with any partition, two +me instances: rejected.
    assert not fits([f"{base}-mig-3g-40gb-0", f"{base}-mig-2g-20gb-2"])
    assert not fits([base, f"{base}-mig-1g-10gb-6"])
    assert not fits([f"{base}-mig-1g-10gb-me-0", f"{base}-mig-1g-10gb-me-1"])


def test_partitionable_gpu_with_existing_mig_devices_keeps_names() -> None:
    gpu = with_mig(h100(0), [("3g.40gb", 4)])
    static = by_name(build_slices(inventory([gpu]), settings()))
    dynamic = by_name(build_slices(inventory([gpu]), settings(partitionable=True)))
    assert set(static) <= set(dynamic)
    # The full GPU is offered in partitionable mode even when MIG mode is on.
    assert gpu_device_name(gpu) in dynamic


# --- limits and splitting --------------------------------------------------------------------


def _many_gpus(n: int) -> list[Gpu]:
    return [replace(t4(i), uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000", pci_bus_id=f"0000:{i // 32:02x}:{i % 32:02x}.0") for i in range(n)]


@pytest.mark.slow
def test_more_than_128_devices_split_into_slices() -> None:
    s = build_slices(inventory(_many_gpus(300)), settings(generation=4))
    assert [len(x["spec"]["devices"]) for x in s] == [128, 128, 44]
    assert {x["spec"]["pool"]["resourceSliceCount"] for x in s} == {3}
    assert {x["spec"]["pool"]["generation"] for x in s} == {4}
    assert [x["metadata"]["name"] for x in s] == [f"node-a-gpu.nvidia.com-{i}" for i in range(3)]
    assert len({d["name"] for d in devices(s)}) == 300
    structurally_valid(s)


def test_taints_limit_slices_to_64_devices() -> None:
    gpus = _many_gpus(130)
    gpus[77] = replace(gpus[77], health=Health(xids=(79,)))
    s = build_slices(inventory(gpus), settings())
    assert [len(x["spec"]["devices"]) for x in s] == [64, 64, 2]
    assert all(x["spec"]["pool"]["resourceSliceCount"] == 3 for x in s)


@pytest.mark.slow
def test_partitionable_splits_counter_sets_by_eight_and_devices_by_64() -> None:
    gpus = [replace(h100(i), pci_bus_id=f"0000:{i + 1:02x}:00.0") for i in range(10)]
    s = build_slices(inventory(gpus), settings(partitionable=True))
    shared = [len(x["spec"]["sharedCounters"]) for x in s if "sharedCounters" in x["spec"]]
    assert shared == [8, 2]
    per_gpu = 1 + sum(len(p.placements) for p in H100_PROFILES)
    sizes = [len(x["spec"]["devices"]) for x in s if "devices" in x["spec"]]
    assert all(n <= 64 for n in sizes) and sum(sizes) == 10 * per_gpu
    assert all(x["spec"]["pool"]["resourceSliceCount"] == len(s) for x in s)
    structurally_valid(s)


def test_device_order_follows_pci_address() -> None:
    gpus = [h100(i, bus=b) for i, b in enumerate((0x90, 0x10, 0x50))]
    names = [d["name"] for d in devices(build_slices(inventory(gpus), settings()))]
    assert names == [gpu_device_name(gpus[1]), gpu_device_name(gpus[2]), gpu_device_name(gpus[0])]


def test_duplicate_device_names_are_rejected() -> None:
    a = h100(0)
    b = replace(h100(1), uuid=a.uuid.upper())
    with pytest.raises(SliceBuildError, match="unique in the pool"):
        build_slices(inventory([a, b]), settings())


# --- health ----------------------------------------------------------------------------------


def test_critical_xid_taints_no_schedule() -> None:
    gpu = replace(h100(0), health=Health(xids=(79,)))
    (dev,) = devices(build_slices(inventory([gpu]), settings()))
    assert dev["taints"] == [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]


@pytest.mark.parametrize("xid", sorted(APPLICATION_XIDS))
def test_application_xids_taint_with_effect_none(xid: int) -> None:
    gpu = replace(h100(0), health=Health(xids=(xid,)))
    (dev,) = devices(build_slices(inventory([gpu]), settings()))
    assert dev["taints"] == [{"key": "gpu.nvidia.com/xid", "value": str(xid), "effect": "None"}]


def test_fault_outranks_later_application_error() -> None:
    gpu = replace(h100(0), health=Health(xids=(48, 13)))
    (dev,) = devices(build_slices(inventory([gpu]), settings()))
    assert dev["taints"] == [{"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoSchedule"}]


def test_lost_gpu_and_custom_driver_name() -> None:
    gpu = replace(h100(0), health=Health(lost=True))
    (dev,) = devices(build_slices(inventory([gpu]), settings(driver_name="gpu.example.com")))
    assert dev["taints"] == [{"key": "gpu.example.com/gpu-lost", "effect": "NoSchedule"}]


def test_mig_devices_and_placements_inherit_parent_health() -> None:
    gpu = replace(with_mig(h100(0), [("3g.40gb", 0), ("3g.40gb", 4)]), health=Health(xids=(94,)))
    for part in (False, True):
        for dev in devices(build_slices(inventory([gpu]), settings(partitionable=part))):
            assert dev["taints"] == [{"key": "gpu.nvidia.com/xid", "value": "94", "effect": "NoSchedule"}]


def _sick_mig(health: Health, parent: Health = Health()) -> Gpu:
    """An H100 with two 3g.40gb MIG devices, the first (placement 0) carrying `health` of its own."""
    gpu = replace(with_mig(h100(0), [("3g.40gb", 0), ("3g.40gb", 4)]), health=parent)
    first, second = gpu.mig_devices
    return replace(gpu, mig_devices=(replace(first, health=health), second))


@pytest.mark.parametrize("partitionable", [False, True])
def test_mig_own_xid_taints_only_that_mig_device(partitionable: bool) -> None:
    gpu = _sick_mig(Health(xids=(94,)))
    first, second = (mig_device_name(gpu, m) for m in gpu.mig_devices)
    devs = by_name(build_slices(inventory([gpu]), settings(partitionable=partitionable)))
    assert devs[first]["taints"] == [{"key": "gpu.nvidia.com/xid", "value": "94", "effect": "NoSchedule"}]
    untainted = [d for name, d in devs.items() if name != first]
    assert second in devs and untainted and all("taints" not in d for d in untainted)
    # The parent's own health is untouched: in partitionable mode the full GPU stays untainted.
    if partitionable:
        assert "taints" not in devs[gpu_device_name(gpu)]


@pytest.mark.parametrize("partitionable", [False, True])
def test_parent_fault_taints_every_mig_device_even_with_own_application_xid(partitionable: bool) -> None:
    gpu = _sick_mig(Health(xids=(13,)), parent=Health(xids=(48,), lost=True))
    for dev in devices(build_slices(inventory([gpu]), settings(partitionable=partitionable))):
        assert {(t["key"], t.get("value"), t["effect"]) for t in dev["taints"]} == {
            ("gpu.nvidia.com/gpu-lost", None, "NoSchedule"),
            ("gpu.nvidia.com/xid", "48", "NoSchedule"),
        }, dev["name"]


def test_mig_application_xid_is_informational_on_that_device_only() -> None:
    gpu = _sick_mig(Health(xids=(31,)))
    first, second = (mig_device_name(gpu, m) for m in gpu.mig_devices)
    devs = by_name(build_slices(inventory([gpu]), settings()))
    assert devs[first]["taints"] == [{"key": "gpu.nvidia.com/xid", "value": "31", "effect": "None"}]
    assert "taints" not in devs[second]


def test_mig_own_fault_is_shown_over_parent_application_xid_and_parent_fault_over_own_application_xid() -> None:
    own_fault = _sick_mig(Health(xids=(94,)), parent=Health(xids=(13,)))
    devs = by_name(build_slices(inventory([own_fault]), settings()))
    first, second = (mig_device_name(own_fault, m) for m in own_fault.mig_devices)
    assert devs[first]["taints"] == [{"key": "gpu.nvidia.com/xid", "value": "94", "effect": "NoSchedule"}]
    assert devs[second]["taints"] == [{"key": "gpu.nvidia.com/xid", "value": "13", "effect": "None"}]
    # Both faulted: the device's own Xid is the one published.
    both = _sick_mig(Health(xids=(94,)), parent=Health(xids=(48,)))
    devs = by_name(build_slices(inventory([both]), settings()))
    assert devs[first]["taints"] == [{"key": "gpu.nvidia.com/xid", "value": "94", "effect": "NoSchedule"}]
    assert devs[second]["taints"] == [{"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoSchedule"}]


def test_mig_health_combines_parent_and_own() -> None:
    gpu = _sick_mig(Health(xids=(31,)), parent=Health(xids=(13,)))
    first, second = gpu.mig_devices
    assert mig_health(gpu, first) == Health(xids=(13, 31))
    assert mig_health(gpu, second) == gpu.health
    assert mig_health(gpu, None) == gpu.health
    assert mig_health(gpu, first).healthy
    assert not mig_health(replace(gpu, health=Health(lost=True)), first).healthy


@pytest.mark.slow
def test_mig_taints_keep_slices_structurally_valid() -> None:
    gpu = _sick_mig(Health(xids=(94,)), parent=Health(xids=(13,)))
    for part in (False, True):
        slices = build_slices(inventory([gpu]), settings(partitionable=part))
        # Every device sits on the faulted GPU, so the schema check below covers a taint on each of them.
        assert devices(slices) and all(d.get("taints") for d in devices(slices))
        structurally_valid(slices)  # raises kubernetes_validate.ValidationError on a schema violation


def test_recovery_removes_taints() -> None:
    sick = replace(h100(0), health=Health(xids=(79,), lost=True))
    well = replace(sick, health=Health())
    assert "taints" in devices(build_slices(inventory([sick]), settings()))[0]
    assert "taints" not in devices(build_slices(inventory([well]), settings()))[0]
    assert build_slices(inventory([well]), settings()) == build_slices(inventory([h100(0)]), settings())


def test_extra_taints_from_ledger() -> None:
    gpu = replace(h100(0), health=Health(xids=(79,)))
    name = gpu_device_name(gpu)
    extra = {name: [{"key": "gpu.nvidia.com/device-plugin", "value": "in-use", "effect": "NoSchedule"},
                    {"key": "gpu.nvidia.com/xid", "value": "1", "effect": "NoSchedule"}]}
    (dev,) = devices(build_slices(inventory([gpu]), settings(extra_taints=extra)))
    # Health wins over an extra taint with the same key and effect.
    assert dev["taints"] == [
        {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"},
        {"key": "gpu.nvidia.com/device-plugin", "value": "in-use", "effect": "NoSchedule"},
    ]


@pytest.mark.slow
def test_tainted_slices_are_structurally_valid() -> None:
    gpus = [replace(h100(0), health=Health(xids=(13,))), replace(h100(1), health=Health(lost=True, xids=(79,)))]
    for part in (False, True):
        slices = build_slices(inventory(gpus), settings(partitionable=part))
        # Both GPUs are faulted, so the schema check below covers a taint on every device.
        assert devices(slices) and all(d.get("taints") for d in devices(slices))
        structurally_valid(slices)  # raises kubernetes_validate.ValidationError on a schema violation


# --- static split and ownership --------------------------------------------------------------


def test_reserved_gpus_are_left_out() -> None:
    gpus = [h100(0), with_mig(h100(1), [("7g.80gb", 0)]), h100(2)]
    reserved = frozenset({gpus[1].uuid, gpus[2].uuid})
    for part in (False, True):
        s = build_slices(inventory(gpus), settings(reserved_uuids=reserved, partitionable=part))
        uuids = {d["attributes"].get("uuid", {}).get("string") for d in devices(s)}
        parents = {d["attributes"].get("parentUUID", {}).get("string") for d in devices(s)}
        assert gpus[1].uuid not in uuids | parents and gpus[2].uuid not in uuids | parents
        assert gpu_device_name(gpus[0]) in by_name(s)
        sets = [c["name"] for x in s for c in x["spec"].get("sharedCounters", [])]
        assert sets == ([counter_set_name(gpus[0])] if part else [])


def test_owner_reference_to_node() -> None:
    s = build_slices(inventory([h100(0)]), settings(node_uid="1234-5678"))
    assert s[0]["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "1234-5678", "controller": True}
    ]
    assert "ownerReferences" not in build_slices(inventory([h100(0)]), settings())[0]["metadata"]


def test_empty_inventory_publishes_one_empty_slice() -> None:
    s = build_slices(inventory([]), settings())
    assert len(s) == 1 and s[0]["spec"]["devices"] == []
    structurally_valid(s)


# --- Kubernetes validation -------------------------------------------------------------------


def _all_shapes() -> list[list[dict[str, Any]]]:
    gpus = [
        replace(h100(0), health=Health(xids=(79,))),
        with_mig(h100(1), [("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb+me", 6)]),
        t4(0),
    ]
    return [build_slices(inventory(gpus), settings(partitionable=p)) for p in (False, True)] + [
        build_slices(inventory(_many_gpus(140)), settings())
    ]


def test_slices_pass_project_validation() -> None:
    for slices in _all_shapes():
        for s in slices:
            errors = validation.validate_object(s)
            assert errors == [], [str(e) for e in errors]


# --- docs/attributes.md ----------------------------------------------------------------------

DOC = Path(__file__).resolve().parent.parent / "docs" / "attributes.md"


def _doc_selectors() -> list[str]:
    # Every backquoted expression that reads `device.` in the attribute docs (their tables and the selectors at
    # a glance), except the `<name>` placeholders and the prose's `device.attributes[...]`.
    return [m for m in re.findall(r"`([^`]+)`", DOC.read_text()) if "device." in m and "<" not in m and "..." not in m]


def test_every_documented_selector_compiles_and_matches_a_published_device() -> None:
    gpus = [
        replace(h100(0), fabric_cluster_uuid="5a2b8c3d-0000-1111-2222-333344445555", fabric_clique_id=7, addressing_mode="ATS"),
        with_mig(h100(1), [("3g.40gb", 0), ("1g.10gb+me", 6)]),
    ]
    published = devices(build_slices(inventory(gpus + [t4(0)]), settings()))
    published += devices(build_slices(inventory([h100(2)]), settings(shared_capacity=True)))
    published += devices(build_slices(inventory(gpus), settings(partitionable=True)))
    views = [DeviceView.from_slice_device("gpu.nvidia.com", d) for d in published]
    env = CelEnvironment()
    selectors = _doc_selectors()
    assert len(selectors) >= 25
    for expr in selectors:
        selector = env.compile(expr)
        # Safe on every kind of device (no runtime error), and useful (matches at least one).
        assert any([selector.matches(v) for v in views]), expr  # noqa: C419 (a list: every device is evaluated)


def test_every_published_attribute_and_capacity_is_documented() -> None:
    documented = set(re.findall(r"^\| `([^`]+)` \|", DOC.read_text(), re.M))
    gpus = [replace(h100(0), fabric_cluster_uuid="c", fabric_clique_id=7, addressing_mode="HMM"), with_mig(h100(1), [("3g.40gb", 0)]), t4(0)]
    for part, shared in ((False, False), (True, False), (False, True)):
        for d in devices(build_slices(inventory(gpus), settings(partitionable=part, shared_capacity=shared))):
            names = {re.sub(r"^memorySlice\d+$", "memorySlice<i>", n) for n in [*d["attributes"], *d.get("capacity", {})]}
            assert names <= documented, d["name"]


# --- shipped simulator profiles ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("profile", shipped_profiles())
@pytest.mark.parametrize("partitionable", [False, True])
def test_every_shipped_profile_builds_valid_slices(profile: str, partitionable: bool) -> None:
    inv = discover(load_backend(f"sim:{profile}", node="sim-node"), "sim-node")
    assert inv.gpus, f"profile {profile} has no GPUs"
    s = build_slices(inv, settings(node_name="sim-node", partitionable=partitionable))
    structurally_valid(s)
    names = [d["name"] for d in devices(s)]
    assert len(names) == len(set(names))
    assert all(DNS_LABEL.match(n) for n in names)
    for x in s:
        errors = validation.validate_object(x)
        assert errors == [], [str(e) for e in errors]


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["dgx-a100", "dgx-a100-mig", "dgx-h100"])
def test_dynamic_mig_on_ampere_only_as_the_mig_mode_already_is(profile: str) -> None:
    """Ampere cannot switch MIG mode without a GPU reset: with MIG off only the whole GPU is offered, with MIG on
    only placements; Hopper offers both, excluding each other through counters."""
    inv = discover(load_backend(f"sim:{profile}", node="n"), "n")
    slices = build_slices(inv, settings(partitionable=True))
    structurally_valid(slices)
    names = {d["name"] for d in devices(slices)}
    for gpu in inv.gpus:
        full = gpu_device_name(gpu)
        placements = {n for n in names if n.startswith(f"{full}-mig-")}
        if gpu.architecture == "Ampere" and not gpu.mig_enabled:
            assert full in names and not placements, gpu.uuid
        elif gpu.architecture == "Ampere":
            assert full not in names and placements, gpu.uuid
        elif gpu.mig_capable:
            assert full in names and placements, gpu.uuid


def test_memory_slices_only_within_the_attribute_and_capacity_limit() -> None:
    """A 7g placement (8 memory slices) on a GPU with every optional attribute would pass Kubernetes' 32 attributes
    and capacities: then none of its memorySlice<i> are published, and the slice stays valid."""
    rich = replace(h100(0), fabric_cluster_uuid="c", fabric_clique_id=7, addressing_mode="HMM", nvlink_domain="d")
    for gpu in (with_mig(h100(1), [("7g.80gb", 0)]), with_mig(rich, [("7g.80gb", 0)])):
        (dev,) = [d for d in devices(build_slices(inventory([gpu]), settings())) if "-mig-" in d["name"]]
        slices = [c for c in dev["capacity"] if c.startswith("memorySlice")]
        assert len(dev["attributes"]) + len(dev["capacity"]) <= 32
        assert slices in ([], [f"memorySlice{i}" for i in range(8)])
    # The plain H100 has room for all eight.
    (plain,) = [d for d in devices(build_slices(inventory([with_mig(h100(1), [("7g.80gb", 0)])]), settings()))
                if "-mig-" in d["name"]]
    assert sum(c.startswith("memorySlice") for c in plain["capacity"]) == 8
