"""The NVML simulator speaks pynvml: same function names, ctypes structs and NVMLError subclasses."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import pynvml
import pytest

from driver.nvml import load_backend, sysfs_pcie_root
from driver.nvmlapi import NvmlUnavailable
from sim.nvml import ProfileError
from sim.nvml.faults import CallFault, FAULTS_ENV, append_xid, read_faults, write_faults
from sim.nvml.profile import load_profile, shipped_profiles
from sim.nvml.simulator import SimulatedNvml

PROFILES_DIR = Path(__file__).resolve().parent.parent / "sim" / "nvml" / "profiles"


def _sim(name: str = "dgx-a100-mig", faults: Path | None = None) -> SimulatedNvml:
    sim = SimulatedNvml(load_profile(name), faults_path=faults)
    sim.nvmlInit()
    return sim


def test_return_types_are_pynvml_structs() -> None:
    sim = _sim()
    h = sim.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(h, pynvml.c_nvmlDevice_t)
    pci = sim.nvmlDeviceGetPciInfo(h)
    assert isinstance(pci, pynvml.nvmlPciInfo_t)
    # pynvml structs hand char arrays back as str
    assert pci.busId == "00000000:07:00.0" and pci.busIdLegacy == "0000:07:00.0"
    assert (pci.domain, pci.bus, pci.device, pci.pciDeviceId) == (0, 7, 0, 0x20B210DE)
    mem = sim.nvmlDeviceGetMemoryInfo(h)
    assert isinstance(mem, pynvml.c_nvmlMemory_t) and mem.total == 81920 * 1024 * 1024
    assert isinstance(sim.nvmlDeviceGetMemoryInfo(h, pynvml.nvmlMemory_v2), pynvml.c_nvmlMemory_v2_t)
    info = sim.nvmlDeviceGetGpuInstanceProfileInfo(h, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    assert isinstance(info, pynvml.c_nvmlGpuInstanceProfileInfo_v2_t)
    assert (info.id, info.name, info.multiprocessorCount, info.memorySizeMB) == (9, "MIG 3g.40gb", 42, 40192)
    assert isinstance(sim.nvmlDeviceGetGpuInstanceProfileInfo(h, 0, 1), pynvml.c_nvmlGpuInstanceProfileInfo_t)
    assert sim.nvmlDeviceGetCudaComputeCapability(h) == (8, 0)
    assert sim.nvmlDeviceGetArchitecture(h) == pynvml.NVML_DEVICE_ARCH_AMPERE
    assert sim.nvmlDeviceGetBrand(h) == pynvml.NVML_BRAND_NVIDIA
    assert sim.nvmlDeviceGetMigMode(h) == [1, 1]
    assert isinstance(sim.nvmlDeviceGetAttributes(h), pynvml.c_nvmlDeviceAttributes)
    assert sim.nvmlSystemGetDriverVersion() == "580.95.05"
    assert sim.nvmlSystemGetCudaDriverVersion_v2() == 13000


def test_mig_device_handles() -> None:
    sim = _sim()
    parent = sim.nvmlDeviceGetHandleByIndex(1)
    assert sim.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
    mig = sim.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)
    assert isinstance(mig, pynvml.c_nvmlDevice_t)
    assert sim.nvmlDeviceIsMigDeviceHandle(mig).value == 1
    assert sim.nvmlDeviceGetUUID(mig).startswith("MIG-")
    assert sim.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    gi_id = sim.nvmlDeviceGetGpuInstanceId(mig)
    assert sim.nvmlDeviceGetComputeInstanceId(mig) == 0
    back = sim.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    assert ctypes.cast(back, ctypes.c_void_p).value == ctypes.cast(parent, ctypes.c_void_p).value
    gi = sim.nvmlDeviceGetGpuInstanceById(parent, gi_id)
    assert isinstance(gi, pynvml.c_nvmlGpuInstance_t)
    gi_info = sim.nvmlGpuInstanceGetInfo(gi)
    assert isinstance(gi_info, pynvml.c_nvmlGpuInstanceInfo_t)
    assert (gi_info.profileId, gi_info.placement.start, gi_info.placement.size) == (9, 4, 4)
    attrs = sim.nvmlDeviceGetAttributes(mig)
    assert (attrs.multiprocessorCount, attrs.gpuInstanceSliceCount, attrs.memorySizeMB) == (42, 3, 40192)
    with pytest.raises(pynvml.NVMLError_NotFound):
        sim.nvmlDeviceGetMigDeviceHandleByIndex(parent, 2)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetGpuInstanceId(parent)


def test_placements_follow_the_c_calling_convention() -> None:
    sim = _sim("dgx-h100")
    h = sim.nvmlDeviceGetHandleByIndex(0)
    count = ctypes.c_uint(0)
    assert sim.nvmlDeviceGetGpuInstancePossiblePlacements(h, 15, None, ctypes.byref(count)) == pynvml.NVML_SUCCESS
    assert count.value == 4
    small = (pynvml.c_nvmlGpuInstancePlacement_t * 2)()
    short = ctypes.c_uint(2)
    with pytest.raises(pynvml.NVMLError_InsufficientSize):
        sim.nvmlDeviceGetGpuInstancePossiblePlacements(h, 15, small, ctypes.byref(short))
    assert short.value == 4
    array = (pynvml.c_nvmlGpuInstancePlacement_t * 4)()
    sim.nvmlDeviceGetGpuInstancePossiblePlacements(h, 15, array, ctypes.pointer(count))
    assert [(p.start, p.size) for p in array] == [(0, 2), (2, 2), (4, 2), (6, 2)]
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetGpuInstancePossiblePlacements(h, 42, None, ctypes.byref(count))


def test_errors_are_pynvml_subclasses() -> None:
    sim = SimulatedNvml(load_profile("l40s-4"))
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.nvmlDeviceGetCount()
    sim.nvmlInit()
    h = sim.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetMigMode(h)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetNvLinkState(h, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(pynvml.c_nvmlGpuFabricInfoV_t()))
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetHandleByIndex(4)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetUUID(ctypes.cast(ctypes.c_void_p(0x1234), pynvml.c_nvmlDevice_t))
    with pytest.raises(pynvml.NVMLError_NotFound):
        sim.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    es = sim.nvmlEventSetCreate()
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait(es, 0)
    sim.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.nvmlDeviceGetCount()


def test_fabric_info_fills_the_callers_struct() -> None:
    sim = _sim("gb200-nvl")
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    assert sim.nvmlDeviceGetGpuFabricInfoV(sim.nvmlDeviceGetHandleByIndex(0), ctypes.byref(info)) == pynvml.NVML_SUCCESS
    assert info.state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED and info.cliqueId == 32766
    assert bytes(info.clusterUuid).hex() == "5c1f5a3e0b7d4e619d2a7c3b8e4f1a20"
    h100 = _sim("dgx-h100")
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    h100.nvmlDeviceGetGpuFabricInfoV(h100.nvmlDeviceGetHandleByIndex(0), ctypes.byref(info))
    assert info.state == pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED


def test_nvlink_queries() -> None:
    sim = _sim("dgx-a100")
    h = sim.nvmlDeviceGetHandleByIndex(0)
    assert sim.nvmlDeviceGetNvLinkState(h, 11) == pynvml.NVML_FEATURE_ENABLED
    assert sim.nvmlDeviceGetNvLinkRemoteDeviceType(h, 0) == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
    assert isinstance(sim.nvmlDeviceGetNvLinkRemotePciInfo(h, 0), pynvml.nvmlPciInfo_t)
    assert sim.nvmlDeviceGetNvLinkVersion(h, 0) == 3
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetNvLinkState(h, 12)


def test_fault_injection_in_process() -> None:
    sim = _sim("dgx-h100")
    h0, h1 = sim.nvmlDeviceGetHandleByIndex(0), sim.nvmlDeviceGetHandleByIndex(1)
    u0 = sim.nvmlDeviceGetUUID(h0)
    sim.fail_call("nvmlDeviceGetNumaNodeId", uuid=u0, error="UNKNOWN")
    with pytest.raises(pynvml.NVMLError_Unknown):
        sim.nvmlDeviceGetNumaNodeId(h0)
    assert sim.nvmlDeviceGetNumaNodeId(h1) == 0
    sim.fail_call("nvmlDeviceGetName")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetName(h1)
    es = sim.nvmlEventSetCreate()
    sim.nvmlDeviceRegisterEvents(h0, pynvml.nvmlEventTypeXidCriticalError, es)
    sim.inject_xid(u0, 48)
    data = sim.nvmlEventSetWait_v2(es, 0)
    assert isinstance(data, pynvml.c_nvmlEventData_t)
    assert (data.eventType, data.eventData, data.gpuInstanceId) == (pynvml.nvmlEventTypeXidCriticalError, 48, 0xFFFFFFFF)
    assert ctypes.cast(data.device, ctypes.c_void_p).value == ctypes.cast(h0, ctypes.c_void_p).value
    sim.mark_lost(u0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        sim.nvmlDeviceGetMemoryInfo(h0)
    assert sim.nvmlEventSetWait(es, 0).eventData == 79
    sim.clear()
    assert sim.nvmlDeviceGetName(h0) == "NVIDIA H100 80GB HBM3"
    assert sim.nvmlDeviceGetNumaNodeId(h0) == 0
    with pytest.raises(ValueError, match="nvmlNoSuchThing"):
        sim.fail_call("nvmlNoSuchThing")
    with pytest.raises(ValueError, match="GPU-nope"):
        sim.inject_xid("GPU-nope", 48)


def test_events_only_reach_registered_sets() -> None:
    sim = _sim("t4-1")
    h = sim.nvmlDeviceGetHandleByIndex(0)
    es = sim.nvmlEventSetCreate()
    sim.inject_xid(sim.nvmlDeviceGetUUID(h), 48)  # before registration: not delivered
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait(es, 0)
    sim.nvmlEventSetFree(es)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlEventSetWait(es, 0)


def test_faults_file_from_another_process(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    sim = _sim("dgx-h100", faults=path)
    h0, h1 = sim.nvmlDeviceGetHandleByIndex(0), sim.nvmlDeviceGetHandleByIndex(1)
    u0, u1 = sim.nvmlDeviceGetUUID(h0), sim.nvmlDeviceGetUUID(h1)
    es = sim.nvmlEventSetCreate()
    sim.nvmlDeviceRegisterEvents(h0, pynvml.nvmlEventTypeXidCriticalError, es)
    write_faults(path, xids=[(u0, 94)], fail_calls=[CallFault("nvmlDeviceGetNumaNodeId", "NOT_SUPPORTED", u1)])
    assert sim.nvmlEventSetWait(es, 0).eventData == 94
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetNumaNodeId(h1)
    append_xid(path, u0, 64)
    assert [x.xid for x in read_faults(path).xids] == [94, 64]
    assert sim.nvmlEventSetWait(es, 0).eventData == 64  # the first entry is not delivered again
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait(es, 0)
    path.write_text("{not json")
    assert sim.nvmlDeviceGetCount() == 8  # a bad file keeps the last good state
    assert sim.faults_error is not None and "not valid JSON" in sim.faults_error
    write_faults(path, lost=[u1])
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        sim.nvmlDeviceGetUUID(h1)
    write_faults(path)
    assert sim.nvmlDeviceGetUUID(h1) == u1
    assert json.loads(path.read_text()) == {"xids": [], "lost": [], "failCalls": []}


def test_faults_file_validation(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_text(json.dumps({"xids": [{"uuid": "GPU-x"}]}))
    with pytest.raises(ValueError, match=r"xids\.0"):
        read_faults(path)
    path.write_text(json.dumps({"failCalls": [{"function": "nvmlInit", "error": "BOGUS"}]}))
    with pytest.raises(ValueError, match=r"failCalls\.0.*NOT_SUPPORTED"):
        read_faults(path)
    path.write_text(json.dumps({"lots": []}))
    with pytest.raises(ValueError, match="unknown field"):
        read_faults(path)
    assert read_faults(tmp_path / "missing.json").xids == ()


def test_load_backend_specs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    faults = tmp_path / "faults.json"
    sim = load_backend(f"sim:t4-1?faults={faults}")
    assert isinstance(sim, SimulatedNvml) and sim.nvmlDeviceGetCount() == 1
    uuid = sim.nvmlDeviceGetUUID(sim.nvmlDeviceGetHandleByIndex(0))
    write_faults(faults, lost=[uuid])
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        sim.nvmlDeviceGetName(sim.nvmlDeviceGetHandleByIndex(0))
    monkeypatch.setenv(FAULTS_ENV, str(faults))
    via_env = load_backend("sim:t4-1")
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        via_env.nvmlDeviceGetName(via_env.nvmlDeviceGetHandleByIndex(0))
    file_sim = load_backend(f"sim:{PROFILES_DIR / 'l40s-4.yaml'}")
    assert file_sim.nvmlDeviceGetCount() == 4
    with pytest.raises(NvmlUnavailable, match="faults=/path"):
        load_backend("sim:t4-1?fault=x")
    with pytest.raises(NvmlUnavailable, match="accepted: real"):
        load_backend("simulated")
    with pytest.raises(ProfileError, match="unknown simulator profile"):
        load_backend("sim:dgx-z100")


def test_real_backend_fails_cleanly_without_a_driver() -> None:
    try:
        nvml = load_backend("real")
    except NvmlUnavailable as exc:
        assert "sim:dgx-h100" in str(exc) and "NVIDIA driver" in str(exc)
    else:  # a machine with a GPU: the real backend works
        assert nvml.nvmlDeviceGetCount() >= 0


def test_sysfs_pcie_root(tmp_path: Path) -> None:
    devices = tmp_path / "bus" / "pci" / "devices"
    real = tmp_path / "devices" / "pci0000:15" / "0000:15:01.0" / "0000:1b:00.0"
    real.mkdir(parents=True)
    devices.mkdir(parents=True)
    (devices / "0000:1b:00.0").symlink_to(real)
    assert sysfs_pcie_root("0000:1B:00.0", devices) == "pci0000:15"
    assert sysfs_pcie_root("0000:99:00.0", devices) is None


def _bad_profile(tmp_path: Path, edit: str, old: str, new: str) -> str:
    text = (PROFILES_DIR / f"{edit}.yaml").read_text()
    assert old in text
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    message = str(info.value)
    assert str(path) in message
    return message


def test_bad_profiles_name_the_field(tmp_path: Path) -> None:
    msg = _bad_profile(tmp_path, "dgx-a100", "memoryMiB: 81920", "memoryMib: 81920")
    assert "models.a100-sxm4-80gb.memoryMiB: Field required" in msg
    assert "models.a100-sxm4-80gb.memoryMib: Extra inputs are not permitted" in msg
    msg = _bad_profile(tmp_path, "dgx-a100", "architecture: AMPERE", "architecture: AMPHIBIAN")
    assert "models.a100-sxm4-80gb.architecture" in msg and "HOPPER" in msg
    msg = _bad_profile(tmp_path, "dgx-a100-mig", "- {profile: 3g.40gb, start: 4}", "- {profile: 3g.40gb, start: 2}")
    assert "gpus.1.migDevices.1.start: 2 is not a placement of 3g.40gb" in msg
    msg = _bad_profile(tmp_path, "dgx-a100-mig", "- {profile: 3g.40gb, start: 4}", "- {profile: 4g.40gb, start: 0}")
    assert "gpus.1.migDevices.1" in msg and "overlaps" in msg
    msg = _bad_profile(tmp_path, "l40s-4", "pciBusId: '0000:17:00.0'", "pciBusId: '17:00.0'")
    assert "gpus.0.pciBusId" in msg
    msg = _bad_profile(tmp_path, "t4-1", "model: t4,", "model: t5,")
    assert "gpus.0.model: unknown model 't5'" in msg
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n")
    with pytest.raises(ProfileError, match="expected a mapping"):
        load_profile(str(path))
    with pytest.raises(ProfileError, match="cannot read profile"):
        load_profile(str(tmp_path / "absent.yaml"))


def test_dynamic_mig_lifecycle() -> None:
    sim = _sim("dgx-h100")
    h = sim.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_InvalidState):
        sim.nvmlDeviceCreateGpuInstance(h, 9)
    sim.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_ENABLE)
    assert sim.nvmlDeviceGetMigMode(h) == [1, 1]
    gi = sim.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, pynvml.c_nvmlGpuInstancePlacement_t(4, 4))
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        sim.nvmlDeviceCreateGpuInstanceWithPlacement(h, 0, pynvml.c_nvmlGpuInstancePlacement_t(0, 8))  # overlaps the 3g
    assert sim.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 9) == 1
    with pytest.raises(pynvml.NVMLError_NotFound):
        sim.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)  # no compute instance yet
    ci_info = sim.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, 0)
    ci = sim.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
    assert sim.nvmlComputeInstanceGetInfo(ci).profileId == pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE
    mig = sim.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    assert sim.nvmlDeviceGetName(mig).endswith("MIG 3g.40gb")
    with pytest.raises(pynvml.NVMLError_InUse):
        sim.nvmlGpuInstanceDestroy(gi)
    sim.nvmlComputeInstanceDestroy(ci)
    sim.nvmlGpuInstanceDestroy(gi)
    assert sim.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 9) == 2


def test_compute_mode_hooks() -> None:
    sim = _sim("t4-1")
    h = sim.nvmlDeviceGetHandleByUUID(sim.nvmlDeviceGetUUID(sim.nvmlDeviceGetHandleByIndex(0)))
    sim.nvmlDeviceSetComputeMode(h, pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    assert sim.nvmlDeviceGetComputeMode(h) == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceSetComputeMode(h, 7)


@pytest.mark.slow
def test_every_shipped_profile_loads() -> None:
    for name in shipped_profiles():
        profile = load_profile(name)
        assert profile.name == name
        assert profile.driver_version == "580.95.05" and profile.cuda_driver_version == 13000


# ---- node identity: nodes running one profile never share GPU identities ----------------------------------


def _identities(profile: str, node: str | None) -> tuple[list[str], list[str], set[str | None]]:
    from driver.discovery import discover
    from driver.slices import gpu_device_name, mig_device_name

    inv = discover(load_backend(f"sim:{profile}", node=node), node or "n")
    uuids = [g.uuid for g in inv.gpus] + [m.uuid for g in inv.gpus for m in g.mig_devices]
    names = [gpu_device_name(g) for g in inv.gpus] + [mig_device_name(g, m) for g in inv.gpus for m in g.mig_devices]
    return uuids, names, {g.nvlink_domain for g in inv.gpus}


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["dgx-a100", "dgx-a100-mig"])
def test_two_nodes_of_one_profile_have_disjoint_identities(profile: str) -> None:
    uuids_1, names_1, domains_1 = _identities(profile, "a100-1")
    uuids_2, names_2, domains_2 = _identities(profile, "a100-2")
    assert len(uuids_1) == len(uuids_2) == len(set(uuids_1)) > 0
    assert not set(uuids_1) & set(uuids_2)
    assert not set(names_1) & set(names_2)
    assert domains_1 != {None} and not domains_1 & domains_2
    assert all(u.startswith(("GPU-", "MIG-")) for u in uuids_1 + uuids_2)
    # the profile's PCI layout is a per-machine fact and stays as written
    sims = [load_backend(f"sim:{profile}", node=n) for n in ("a100-1", "a100-2")]
    buses = [[s.nvmlDeviceGetPciInfo(s.nvmlDeviceGetHandleByIndex(i)).busId for i in range(s.nvmlDeviceGetCount())] for s in sims]
    assert buses[0] == buses[1]


@pytest.mark.slow
def test_node_identity_is_stable_and_absent_without_a_node() -> None:
    assert _identities("dgx-a100-mig", "a100-1") == _identities("dgx-a100-mig", "a100-1")
    verbatim, _, _ = _identities("dgx-a100", None)
    assert verbatim[: len(load_profile("dgx-a100").gpus)] == [g.uuid for g in load_profile("dgx-a100").gpus]
    assert not set(verbatim) & set(_identities("dgx-a100", "a100-1")[0])


def test_node_uuids_keep_formats_and_explicit_mig_uuids() -> None:
    from sim.nvml.profile import node_uuid, profile_for_node

    base = load_profile("dgx-a100-mig")
    gpu0 = base.gpus[0]
    explicit = "MIG-11111111-2222-3333-4444-555555555555"
    migs = (gpu0.mig_devices[0].model_copy(update={"uuid": explicit}),) + gpu0.mig_devices[1:]
    profile = base.model_copy(update={"gpus": (gpu0.model_copy(update={"mig_devices": migs}),) + base.gpus[1:]})
    mine = profile_for_node(profile, "node-x")
    assert mine.gpus[0].uuid == node_uuid("node-x", gpu0.uuid) != gpu0.uuid
    assert mine.gpus[0].mig_devices[0].uuid == node_uuid("node-x", explicit) != explicit
    pattern = r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
    import re

    assert all(re.fullmatch(pattern, g.uuid) for g in mine.gpus)
    assert re.fullmatch(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", mine.gpus[0].mig_devices[0].uuid)
    sim = SimulatedNvml(profile, node="node-x")
    sim.nvmlInit()
    mig = sim.nvmlDeviceGetMigDeviceHandleByIndex(sim.nvmlDeviceGetHandleByIndex(0), 0)
    assert sim.nvmlDeviceGetUUID(mig) == node_uuid("node-x", explicit)
    with pytest.raises(ValueError, match="node name is empty"):
        profile_for_node(profile, "")


def test_fabric_membership_stays_shared_across_nodes() -> None:
    from driver.discovery import discover

    domains = [{g.nvlink_domain for g in discover(load_backend("sim:gb200-nvl", node=n), n).gpus} for n in ("tray-1", "tray-2")]
    # one multi-node NVLink fabric: the cluster UUID + clique id, which the nodes of the fabric share
    assert domains[0] == domains[1] and len(domains[0]) == 1 and None not in domains[0]


def test_faults_name_the_nodes_own_uuids(tmp_path: Path) -> None:
    from driver.discovery import discover

    faults = tmp_path / "faults.json"
    sim = load_backend(f"sim:dgx-a100?faults={faults}", node="a100-2")
    gpus = discover(sim, "a100-2").gpus
    es = sim.nvmlEventSetCreate()
    for i in range(sim.nvmlDeviceGetCount()):
        sim.nvmlDeviceRegisterEvents(sim.nvmlDeviceGetHandleByIndex(i), pynvml.nvmlEventTypeXidCriticalError, es)
    # the profile's own UUID is not a GPU of this node: no event
    append_xid(faults, load_profile("dgx-a100").gpus[1].uuid, 48)
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait_v2(es, 0)
    append_xid(faults, gpus[1].uuid, 48)
    event = sim.nvmlEventSetWait_v2(es, 0)
    assert (sim.nvmlDeviceGetUUID(event.device), event.eventData) == (gpus[1].uuid, 48)
    sim.mark_lost(gpus[2].uuid)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        sim.nvmlDeviceGetMemoryInfo(sim.nvmlDeviceGetHandleByIndex(2))
    with pytest.raises(ValueError, match="no GPU or MIG device"):
        sim.inject_xid(load_profile("dgx-a100").gpus[0].uuid, 13)
