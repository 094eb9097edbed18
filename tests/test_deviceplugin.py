"""The device plugin shim on the wire (v1beta1 over real unix sockets, against the kubelet device manager
simulator) and its pure parts: preferred allocation, CDI spec, kubelet checkpoint format, release rule."""

from __future__ import annotations

import time
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest

from driver import cdi, kubeletcheckpoint
from driver.checkpoint import Checkpoint
from driver.deviceplugin import (
    HEALTHY,
    AllocateError,
    LEGACY_SPEC_FILE,
    UNHEALTHY,
    DevicePluginSettings,
    DevicePluginShim,
    PreferenceError,
    allocation_id,
    container_allocate_response,
    extended_resource_name_error,
    legacy_cdi_spec,
    preferred_allocation,
    served_gpus,
    stale_allocations,
)
from sim.kubelet.devicemanager import DeviceManagerError, DeviceManagerSim
from driver.discovery import discover
from driver.inventory import Health, Inventory
from driver.kubeletcheckpoint import KubeletCheckpoint, PodDeviceEntry
from driver.nvml import load_backend
from gpudra.kubeletapi.deviceplugin.v1beta1 import api_pb2 as pb
from gpudra.kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from driver.unixsocket import listening
from tests.plugin_helpers import short_tmp

RESOURCE = "nvidia.com/gpu"
DRIVER = "gpu.nvidia.com"


def inv(profile: str) -> Inventory:
    return discover(load_backend(f"sim:{profile}", node="node-a"), "node-a")


# ---- pure parts ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, ok",
    [
        ("nvidia.com/gpu", True),
        ("example.com/fpga-1", True),
        ("gpu", False),  # native: no domain
        ("kubernetes.io/gpu", False),
        ("requests.nvidia.com/gpu", False),
        ("Nvidia.com/gpu", False),  # the prefix must be a lowercase DNS subdomain
        ("nvidia.com/-gpu", False),
        ("nvidia.com/" + "g" * 64, False),
    ],
)
def test_extended_resource_names(name: str, ok: bool) -> None:
    error = extended_resource_name_error(name)
    assert (error is None) == ok
    if error:
        assert repr(name) in error and "nvidia.com/gpu" in error  # names the value and what is accepted


def test_settings_reject_a_non_extended_resource_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--device-plugin-resource: resource name 'gpu'"):
        DevicePluginSettings(kubelet_dir=tmp_path, cdi_dir=tmp_path, driver_name=DRIVER, resource_name="gpu")


def test_preferred_allocation_is_numa_local_on_an_nvswitch_node() -> None:
    gpus = inv("dgx-h100").gpus
    by = {g.uuid: g for g in gpus}
    numa0 = [g.uuid for g in gpus if g.numa_node == 0]
    numa1 = [g.uuid for g in gpus if g.numa_node == 1]
    # All eight share one NVLink domain: NUMA decides, and ties go to PCI order.
    assert preferred_allocation(by, list(by)[::-1], [], 4) == numa0
    # must_include pulls the set to its NUMA node.
    got = preferred_allocation(by, list(by), [numa1[2]], 3)
    assert got[0] == numa1[2] and set(got) <= set(numa1) and len(got) == 3
    # Only what is available is chosen.
    got = preferred_allocation(by, numa0[:2] + numa1, [], 4)
    assert set(got) == set(numa1)


def test_preferred_allocation_follows_direct_nvlinks_and_numa() -> None:
    gpus = inv("v100-4").gpus
    by = {g.uuid: g for g in gpus}
    links = {
        (a.uuid, b.uuid): sum(1 for link in a.nvlinks if link.remote_pci_bus_id == b.pci_bus_id)
        for a in gpus for b in gpus if a is not b
    }
    pair = preferred_allocation(by, list(by), [], 2)
    assert links[(pair[0], pair[1])] == max(links.values())  # the doubly-linked pair
    # PCIe-only node: NUMA-local pairs.
    l40s = {g.uuid: g for g in inv("l40s-4").gpus}
    ids = list(l40s)
    got = preferred_allocation(l40s, [ids[0], ids[2], ids[3]], [], 2)
    assert {l40s[u].numa_node for u in got} == {1}


def test_preferred_allocation_rejects_bad_requests() -> None:
    by = {g.uuid: g for g in inv("l40s-4").gpus}
    ids = list(by)
    with pytest.raises(PreferenceError, match="GPU-unknown are not GPUs this device plugin serves"):
        preferred_allocation(by, ["GPU-unknown"], [], 1)
    with pytest.raises(PreferenceError, match="allocation_size 5 must be between 1 and the 4"):
        preferred_allocation(by, ids, [], 5)
    with pytest.raises(PreferenceError, match="must_include_deviceIDs .* not in available_deviceIDs"):
        preferred_allocation(by, ids[:2], [ids[3]], 2)


def test_served_gpus_are_the_reserved_ones_or_those_without_mig() -> None:
    inventory = inv("dgx-a100-mig")
    assert [g.uuid for g in served_gpus(inventory, frozenset())] == [g.uuid for g in inventory.gpus if not g.mig_enabled]
    reserved = frozenset({inventory.gpus[0].uuid, inventory.gpus[6].uuid})
    assert {g.uuid for g in served_gpus(inventory, reserved)} == reserved


def test_allocate_response_and_cdi_spec() -> None:
    gpus = inv("l40s-4").gpus[:2]
    spec = legacy_cdi_spec(gpus)
    assert cdi.validate_spec(spec) == []
    assert spec["kind"] == "k8s.gpu.nvidia.com/gpu" and [d["name"] for d in spec["devices"]] == [g.uuid for g in gpus]
    resp = container_allocate_response(gpus, node_exists=lambda path: True)
    assert [c.name for c in resp.cdi_devices] == [f"k8s.gpu.nvidia.com/gpu={g.uuid}" for g in gpus]
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(g.uuid for g in gpus)
    paths = [d.host_path for d in resp.devices]
    assert paths[:2] == [f"/dev/nvidia{g.minor}" for g in gpus] and "/dev/nvidiactl" in paths
    assert all(set(d.permissions) <= set("rwm") for d in resp.devices)
    # On a node without device nodes (a simulated one) only the CDI devices: containerd refuses a DeviceSpec whose
    # host path it cannot stat, as the upstream backend showed on the first legacy pod.
    bare = container_allocate_response(gpus, node_exists=lambda path: False)
    assert list(bare.devices) == [] and [c.name for c in bare.cdi_devices] == [c.name for c in resp.cdi_devices]


def test_legacy_cdi_spec_carries_the_driver_files() -> None:
    gpus = inv("l40s-4").gpus[:1]
    common = {
        "mounts": [{"hostPath": "/usr/lib64/libcuda.so.580.95.05", "containerPath": "/usr/lib64/libcuda.so.580.95.05",
                    "options": ["ro", "nosuid", "nodev", "bind"]}],
        "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook",
                   "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib64"]}],
    }
    spec = legacy_cdi_spec(gpus, common)
    assert cdi.validate_spec(spec) == []
    edits = spec["containerEdits"]
    assert edits["mounts"] == common["mounts"] and edits["hooks"] == common["hooks"]
    assert [n["path"] for n in edits["deviceNodes"]] == ["/dev/nvidiactl"]  # nvidia-uvm not loaded: left out
    loaded = cdi.DeviceNumbers({"nvidia-frontend": 195, "nvidia-uvm": 234})
    typed = legacy_cdi_spec(gpus, common, loaded)["containerEdits"]["deviceNodes"]
    assert [(n["path"], n["major"]) for n in typed] == [("/dev/nvidiactl", 195), ("/dev/nvidia-uvm", 234),
                                                         ("/dev/nvidia-uvm-tools", 234)]
    assert [d.host_path for d in container_allocate_response(gpus, loaded, lambda p: True).devices][1:] == [
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


def test_kubelet_checkpoint_reads_the_kubelet_format() -> None:
    # The shape the kubelet writes (1.21+): NUMA-keyed DeviceIDs, base64 AllocResp, a checksum we do not verify.
    raw = {
        "Data": {
            "PodDeviceEntries": [
                {"PodUID": "p1", "ContainerName": "c", "ResourceName": RESOURCE, "DeviceIDs": {"0": ["GPU-a"], "1": ["GPU-b"]},
                 "AllocResp": "CgA="},
                {"PodUID": "p2", "ContainerName": "c", "ResourceName": "other.com/x", "DeviceIDs": {"-1": ["X"]}, "AllocResp": ""},
            ],
            "RegisteredDevices": {RESOURCE: ["GPU-a", "GPU-b", "GPU-c"]},
        },
        "Checksum": 1234567,
    }
    cp = kubeletcheckpoint.parse(json.dumps(raw).encode())
    assert cp.entries[0].device_ids == {0: ("GPU-a",), 1: ("GPU-b",)}
    assert cp.in_use(RESOURCE) == {"GPU-a": "p1", "GPU-b": "p1"}
    assert cp.in_use(RESOURCE, frozenset({"p2"})) == {}
    assert cp.registered[RESOURCE] == ("GPU-a", "GPU-b", "GPU-c")
    again = kubeletcheckpoint.parse(kubeletcheckpoint.render(cp.entries, cp.registered))
    assert again.entries == cp.entries and again.registered == cp.registered
    with pytest.raises(kubeletcheckpoint.KubeletCheckpointError, match=r"Data.PodDeviceEntries\[0\].PodUID: must be a string"):
        kubeletcheckpoint.parse(b'{"Data": {"PodDeviceEntries": [{"PodUID": 1}]}}')


def test_release_rule() -> None:
    entry = PodDeviceEntry("pod-1", "c", RESOURCE, {0: ("GPU-a",)})
    after = KubeletCheckpoint((entry,), digest="1" * 64)
    used = "deviceplugin:" + allocation_id("0" * 64, "aa")
    pending = "deviceplugin:" + allocation_id("1" * 64, "bb")
    gone = "deviceplugin:" + allocation_id("0" * 64, "cc")
    allocations = {used: frozenset({"GPU-a"}), pending: frozenset({"GPU-b"}), gone: frozenset({"GPU-c"})}
    # GPU-a is listed; GPU-b's Allocate came after the last kubelet write; GPU-c is neither: released.
    assert stale_allocations(allocations, after, RESOURCE, None) == [gone]
    # A finished pod's entry no longer counts.
    assert stale_allocations(allocations, after, RESOURCE, frozenset()) == sorted([used, gone])
    # No kubelet checkpoint yet: holds made without one are pending.
    none_yet = "deviceplugin:" + allocation_id("", "dd")
    assert stale_allocations({none_yet: frozenset({"GPU-d"})}, None, RESOURCE, None) == []


# ---- over the wire ---------------------------------------------------------------------------------------


@dataclass
class Node:
    tmp: Path
    sim: DeviceManagerSim
    shim: DevicePluginShim
    inventory: list[Inventory]
    checkpoint: Checkpoint


@pytest.fixture
def node() -> Iterator[Node]:
    with short_tmp() as tmp:
        sim = DeviceManagerSim(tmp / "kubelet")
        sim.start()
        (tmp / "boot").write_text("b1\n")
        checkpoint, _ = Checkpoint.open(tmp / "kubelet" / "plugins" / DRIVER, boot_id_path=tmp / "boot")
        state = [inv("dgx-h100")]
        shim = DevicePluginShim(
            DevicePluginSettings(kubelet_dir=tmp / "kubelet", cdi_dir=tmp / "cdi", driver_name=DRIVER, watch_seconds=0.05),
            inventory=lambda: state[0], checkpoint=checkpoint,
        )
        shim.start()
        try:
            yield Node(tmp, sim, shim, state, checkpoint)
        finally:
            shim.stop()
            sim.stop()
            checkpoint.close()


def _eight(sim: DeviceManagerSim) -> bool:
    return len(sim.devices(RESOURCE)) == 8


def test_register_and_list_and_watch(node: Node) -> None:
    request = node.sim.register_requests[0]
    assert request.version == "v1beta1" and request.resource_name == RESOURCE
    assert request.endpoint == node.shim.settings.socket.name and "/" not in request.endpoint
    assert request.options.get_preferred_allocation_available and not request.options.pre_start_required
    assert node.shim.settings.socket.parent == node.tmp / "kubelet" / "device-plugins"
    node.sim.wait_for(_eight, timeout=30)
    devices = node.sim.devices(RESOURCE)
    gpus = node.inventory[0].gpus
    assert set(devices) == {g.uuid for g in gpus}
    assert {d.id: d.numa_nodes for d in devices.values()} == {g.uuid: (g.numa_node,) for g in gpus}
    assert all(d.health == HEALTHY for d in devices.values())
    assert (node.tmp / "cdi" / LEGACY_SPEC_FILE).exists()


def test_the_static_cdi_spec_goes_with_the_shim_unless_a_newer_one_took_over(node: Node) -> None:
    spec = node.tmp / "cdi" / LEGACY_SPEC_FILE
    assert spec.exists()
    # A surge: a newer shim binds the socket and writes the spec; the old one's stop leaves both to it.
    newer = DevicePluginShim(
        DevicePluginSettings(kubelet_dir=node.tmp / "kubelet", cdi_dir=node.tmp / "cdi", driver_name=DRIVER,
                             watch_seconds=0.05),
        inventory=lambda: node.inventory[0], checkpoint=node.checkpoint,
    )
    newer.start()
    try:
        node.shim.stop()
        # gRPC unlinks the path it bound when the old server stops; the newer shim serves it again at its next tick.
        deadline = time.monotonic() + 10
        while not listening(newer.settings.socket):
            assert time.monotonic() < deadline, "the newer shim did not serve its socket again"
            time.sleep(0.05)
        assert spec.exists()
    finally:
        newer.stop()
    # The last one going (uninstall) removes what it wrote: no spec is left behind on the node.
    assert not spec.exists() and not listening(newer.settings.socket)


def test_health_change_sends_a_new_full_list(node: Node) -> None:
    node.sim.wait_for(_eight, timeout=30)
    sick = node.inventory[0].gpus[3]
    gpus = list(node.inventory[0].gpus)
    gpus[3] = replace(sick, health=Health(xids=(48,)))
    node.inventory[0] = replace(node.inventory[0], gpus=tuple(gpus))
    node.shim.refresh()
    node.sim.wait_for(lambda s: s.health(RESOURCE).get(sick.uuid) == UNHEALTHY, timeout=30)
    assert sum(1 for h in node.sim.health(RESOURCE).values() if h == HEALTHY) == 7  # still the full list


def test_allocate_through_the_device_manager(node: Node) -> None:
    node.sim.wait_for(_eight, timeout=30)
    got = node.sim.allocate("pod-1", "main", RESOURCE, 4)
    numa0 = [g.uuid for g in node.inventory[0].gpus if g.numa_node == 0]
    assert got.preferred == tuple(numa0) and got.device_ids == tuple(numa0)
    assert [c.name for c in got.response.cdi_devices] == [f"k8s.gpu.nvidia.com/gpu={u}" for u in numa0]
    assert got.response.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(numa0)
    held = node.checkpoint.state.ledger
    assert {u for u, hs in held.items() if any(h.startswith("deviceplugin:") for h in hs)} == set(numa0)
    written = kubeletcheckpoint.read(node.tmp / "kubelet" / "device-plugins")
    assert written is not None and written.in_use(RESOURCE) == dict.fromkeys(numa0, "pod-1")
    assert written.entries[0].device_ids == {0: tuple(numa0)}
    assert pb.ContainerAllocateResponse.FromString(written.entries[0].alloc_resp) == got.response
    # The next pod gets the other NUMA node.
    second = node.sim.allocate("pod-2", "main", RESOURCE, 4)
    assert {g.numa_node for g in node.inventory[0].gpus if g.uuid in second.device_ids} == {1}
    with pytest.raises(DeviceManagerError, match="requested 1 nvidia.com/gpu, available 0"):
        node.sim.allocate("pod-3", "main", RESOURCE, 1)


def test_finished_pod_releases_its_gpus(node: Node) -> None:
    node.sim.wait_for(_eight, timeout=30)
    got = node.sim.allocate("pod-1", "main", RESOURCE, 2)
    node.shim.refresh()
    assert set(node.checkpoint.state.ledger) == set(got.device_ids)  # listed by the kubelet: kept
    node.sim.remove_pod("pod-1")
    node.shim.refresh()
    assert node.checkpoint.state.ledger == {}


def test_raw_wire_paths_and_errors(node: Node) -> None:
    with grpc.insecure_channel(f"unix://{node.shim.settings.socket}") as channel:
        options = channel.unary_unary("/v1beta1.DevicePlugin/GetDevicePluginOptions")(b"", timeout=30)
        assert pb.DevicePluginOptions.FromString(options).get_preferred_allocation_available
        stub = pb_grpc.DevicePluginStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Allocate(pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["GPU-nope"])]), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "container_requests[0].devices_ids: GPU-nope not served by this device plugin" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            stub.GetPreferredAllocation(
                pb.PreferredAllocationRequest(container_requests=[pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=[node.inventory[0].gpus[0].uuid], allocation_size=2)]), timeout=30,
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "allocation_size 2" in err.value.details()
        assert stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=[]), timeout=30) == pb.PreStartContainerResponse()


def test_device_manager_validates_register_like_the_kubelet(node: Node) -> None:
    with grpc.insecure_channel(f"unix://{node.sim.kubelet_socket}") as channel:
        stub = pb_grpc.RegistrationStub(channel)
        for request, message in [
            (pb.RegisterRequest(version="v1alpha", endpoint="x.sock", resource_name=RESOURCE), "version 'v1alpha'"),
            (pb.RegisterRequest(version="v1beta1", endpoint="x.sock", resource_name="gpu"), "native resource name"),
            (pb.RegisterRequest(version="v1beta1", endpoint="../x.sock", resource_name="example.com/x"), "must be a socket file name"),
        ]:
            with pytest.raises(grpc.RpcError) as err:
                stub.Register(request, timeout=15)
            assert message in err.value.details()
    assert node.sim.registrations == 1  # only the shim's own registration was accepted


def test_kubelet_restart_makes_the_shim_register_again(node: Node) -> None:
    node.sim.wait_for(_eight, timeout=30)
    node.sim.allocate("pod-1", "main", RESOURCE, 2)
    node.sim.restart()  # deletes our socket, recreates kubelet.sock, keeps its checkpoint
    # The shim counts a registration once Register returns, just after the kubelet side recorded it.
    node.sim.wait_for(lambda s: s.registrations == 2 and _eight(s) and node.shim.registrations == 2, timeout=30)
    assert node.shim.settings.socket.is_socket()
    # The kubelet's checkpoint survived: the two GPUs are still in use and stay held; six remain allocatable.
    node.shim.refresh()
    assert len(node.checkpoint.state.ledger) == 2
    node.sim.allocate("pod-2", "main", RESOURCE, 6)
    with pytest.raises(DeviceManagerError):
        node.sim.allocate("pod-3", "main", RESOURCE, 1)


def test_plugin_command_rejects_a_bad_resource_name(capsys: pytest.CaptureFixture[str]) -> None:
    from cli.main import main

    code = main(["plugin", "--node", "n1", "--nvml", "sim:t4-1", "--device-plugin", "--device-plugin-resource", "gpu"])
    assert code == 2
    assert "--device-plugin-resource: resource name 'gpu' is a native resource name" in capsys.readouterr().err


# ---- claims allocated but not yet prepared -------------------------------------------------------------------


def _claim(name: str, results: object, uid: str = "u1") -> dict[str, object]:
    return {"metadata": {"namespace": "ns", "name": name, "uid": uid},
            "status": {"allocation": {"devices": {"results": results}}}}


def test_allocated_devices_are_filtered_by_driver_and_pool() -> None:
    from driver.allocatedclaims import claims_by_device, devices_by_claim

    claims = [
        _claim("ours", [{"driver": DRIVER, "pool": "node-a", "device": "gpu-aaa"},
                        {"driver": "other.example.com", "pool": "node-a", "device": "gpu-bbb"},
                        {"driver": DRIVER, "pool": "node-b", "device": "gpu-ccc"}]),
        _claim("also", [{"driver": DRIVER, "pool": "node-a", "device": "gpu-aaa"}], uid="u2"),
        _claim("garbage", "not a list"),
        {"metadata": {"namespace": "ns", "name": "unallocated"}, "status": {}},
        {"metadata": {"namespace": "ns", "name": "no-status"}, "status": None},
    ]
    by_device = claims_by_device(devices_by_claim(claims, DRIVER, "node-a"))
    assert by_device == {"gpu-aaa": ("ResourceClaim ns/also (uid u2)", "ResourceClaim ns/ours (uid u1)")}


def test_allocated_gpu_is_reported_unhealthy_with_the_claim() -> None:
    from driver.deviceplugin import allocated_gpus, device_states
    from driver.slices import gpu_device_name, mig_device_name

    gpus = inv("dgx-a100-mig").gpus
    whole = next(g for g in gpus if not g.mig_enabled)
    migged = next(g for g in gpus if g.mig_devices)
    allocated = allocated_gpus(gpus, {gpu_device_name(whole): ("ResourceClaim ns/a (uid 1)",),
                                      mig_device_name(migged, migged.mig_devices[0]): ("ResourceClaim ns/b (uid 2)",),
                                      "gpu-not-on-this-node": ("ResourceClaim ns/c (uid 3)",)})
    assert allocated == {whole.uuid: ("ResourceClaim ns/a (uid 1)",), migged.uuid: ("ResourceClaim ns/b (uid 2)",)}
    states = {s.id: s for s in device_states(gpus, {}, allocated)}
    assert not states[whole.uuid].healthy and "allocated to DRA ResourceClaim ns/a (uid 1)" in states[whole.uuid].reason
    assert sum(1 for s in states.values() if not s.healthy) == 2


class _FailingApi:
    def __init__(self) -> None:
        self.calls = 0
        self.fail = True

    def list(self, kind: str) -> tuple[list[dict[str, object]], str]:
        self.calls += 1
        if self.fail:
            raise ConnectionError("connection refused")
        return [_claim("ours", [{"driver": DRIVER, "pool": "node-a", "device": "gpu-aaa"}])], "7"

    def list_pages(self, kind: str, limit: int | None = None) -> Iterator[tuple[list[dict[str, object]], str]]:
        yield self.list(kind)


def test_unreachable_api_falls_back_to_the_ledger_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    from driver.allocatedclaims import AllocatedClaims

    api = _FailingApi()
    claims = AllocatedClaims(api, DRIVER, "node-a")
    api.fail = False
    assert claims.resync() and claims.snapshot() == {"gpu-aaa": ("ResourceClaim ns/ours (uid u1)",)}
    api.fail = True
    with caplog.at_level("WARNING", logger="gpu-dra.allocatedclaims"):
        assert not claims.resync() and not claims.resync()
    assert claims.snapshot() == {} and not claims.reachable
    assert sum("claims-unavailable" in r.getMessage() for r in caplog.records) == 1
    api.fail = False
    assert claims.resync() and claims.reachable and claims.snapshot() == {"gpu-aaa": ("ResourceClaim ns/ours (uid u1)",)}


def test_nothing_is_allocated_while_a_damaged_checkpoint_is_not_rebuilt(tmp_path: Path) -> None:
    """Issue 37: GPUs held by DRA claims a damaged checkpoint lost would look free to the device plugin."""
    (tmp_path / "boot").write_text("b1\n")
    checkpoint, _ = Checkpoint.open(tmp_path / "plugin", boot_id_path=tmp_path / "boot")
    pending: list[str | None] = ["the node checkpoint was damaged and 1 prepared claim(s) it lost could not be rebuilt"]
    state = inv("dgx-h100")
    shim = DevicePluginShim(
        DevicePluginSettings(kubelet_dir=tmp_path / "kubelet", cdi_dir=tmp_path / "cdi", driver_name=DRIVER),
        inventory=lambda: state, checkpoint=checkpoint, refusal=lambda: pending[0],
    )
    gpu = state.gpus[0].uuid
    with pytest.raises(AllocateError) as err:
        shim.allocate([[gpu]])
    assert err.value.code == grpc.StatusCode.UNAVAILABLE and "checkpoint was damaged" in str(err.value)
    assert checkpoint.state.ledger == {}
    pending[0] = None
    assert len(shim.allocate([[gpu]])) == 1
    checkpoint.close()
