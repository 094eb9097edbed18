"""Legacy (`nvidia.com/gpu` device plugin) and DRA workloads on one simulated node never share a GPU.

In-process: a NodeAgent (DRA prepare) and the device plugin shim on one checkpoint ledger, the kubelet device
manager simulator on the device plugin side. Across a process restart: `gpu-dra plugin --device-plugin` as a
subprocess against the embedded API server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from driver.checkpoint import Ledger
from driver.deviceplugin import HEALTHY, UNHEALTHY, DevicePluginShim, start_device_plugin
from sim.kubelet.devicemanager import DeviceManagerError, DeviceManagerSim
from driver.discovery import discover
from driver.inventory import Gpu
from sim.kubelet.dra import ClaimInfo, KubeletError, KubeletSim
from driver.nvml import load_backend
from driver.plugin.agent import AgentSettings, NodeAgent, kubeapi_claim_getter
from driver.prepare import ClaimNotFound, ClaimRef
from driver.publisher import SlicePublisher
from driver.slices import gpu_device_name
from gpudra.kubeletapi.deviceplugin.v1beta1 import api_pb2 as pb
from gpudra.kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from tests.plugin_helpers import DRIVER, NODE, create_allocated_claim, short_tmp, stop_process

RESOURCE = "nvidia.com/gpu"
TAINT = {"key": f"{DRIVER}/device-plugin", "effect": "NoSchedule"}
REPO = Path(__file__).resolve().parent.parent


class Claims:
    """ResourceClaims as the API server would return them, kept in memory."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}

    def add(self, name: str, uid: str, gpus: list[Gpu]) -> ClaimRef:
        self.objects[("ns", name)] = {
            "metadata": {"namespace": "ns", "name": name, "uid": uid},
            "spec": {},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": gpu_device_name(g)} for g in gpus
            ]}}},
        }
        return ClaimRef(uid=uid, namespace="ns", name=name)

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        try:
            return self.objects[(namespace, name)]
        except KeyError:
            raise ClaimNotFound(f"{namespace}/{name}") from None


@dataclass
class Node:
    tmp: Path
    agent: NodeAgent
    shim: DevicePluginShim
    sim: DeviceManagerSim
    claims: Claims
    gpus: tuple[Gpu, ...]


def _node(tmp: Path, *, profile: str = "l40s-4", reserved: frozenset[str] = frozenset(), api: Any = None) -> Node:
    nvml = load_backend(f"sim:{profile}", node=NODE)
    inventory = discover(nvml, NODE)
    (tmp / "boot").write_text("b1\n")
    claims = Claims()
    agent = NodeAgent(
        AgentSettings(node_name=NODE, driver_name=DRIVER, kubelet_dir=tmp / "kubelet", cdi_dir=tmp / "cdi",
                      reserved_uuids=reserved, watch_seconds=0.05, boot_id_path=tmp / "boot"),
        nvml=nvml, inventory=inventory, get_claim=claims.get if api is None else kubeapi_claim_getter(api),
        publisher=SlicePublisher(api, DRIVER, NODE, backoff_seconds=0.05) if api is not None else None,
    )
    agent.start()
    sim = DeviceManagerSim(tmp / "kubelet")
    sim.start()
    shim = start_device_plugin(agent, api=api)
    return Node(tmp, agent, shim, sim, claims, inventory.gpus)


def _stop(node: Node) -> None:
    node.shim.stop()
    node.sim.stop()
    node.agent.stop()


@pytest.fixture
def node() -> Iterator[Node]:
    with short_tmp() as tmp:
        n = _node(tmp)
        try:
            yield n
        finally:
            _stop(n)


def _allocate(node: Node, ids: list[str]) -> Any:
    """One device plugin Allocate for these exact GPUs, as the kubelet sends it."""
    with grpc.insecure_channel(f"unix://{node.shim.settings.socket}") as channel:
        return pb_grpc.DevicePluginStub(channel).Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]), timeout=30
        )


def _kinds(ledger: Mapping[str, list[str]]) -> dict[str, set[str]]:
    return {u: {h.split(":", 1)[0] for h in hs} for u, hs in ledger.items()}


def test_dra_prepared_gpu_is_unhealthy_and_refused_to_the_device_plugin(node: Node) -> None:
    g0 = node.gpus[0]
    node.sim.wait_for(lambda s: len(s.devices(RESOURCE)) == 4, timeout=30)
    ref = node.claims.add("train", "uid-train", [g0])
    assert node.agent.preparer.prepare([ref])[ref.uid].error == ""
    node.shim.refresh()
    node.sim.wait_for(lambda s: s.health(RESOURCE)[g0.uuid] == UNHEALTHY, timeout=30)
    with pytest.raises(DeviceManagerError, match="requested 4 nvidia.com/gpu, available 3"):
        node.sim.allocate("pod-1", "main", RESOURCE, 4)
    with pytest.raises(grpc.RpcError) as err:
        _allocate(node, [g0.uuid, node.gpus[1].uuid])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"GPU {g0.uuid} is prepared for ResourceClaim ns/train (uid uid-train) through DRA" in err.value.details()
    assert _kinds(node.agent.checkpoint.state.ledger) == {g0.uuid: {"dra"}}  # the refused Allocate held nothing
    # Unprepare gives the GPU back to the device plugin.
    assert node.agent.preparer.unprepare([ref]) == {ref.uid: ""}
    node.shim.refresh()
    node.sim.wait_for(lambda s: s.health(RESOURCE)[g0.uuid] == HEALTHY, timeout=30)
    assert len(node.sim.allocate("pod-1", "main", RESOURCE, 4).device_ids) == 4


def test_device_plugin_gpu_is_tainted_and_refused_to_dra(node: Node) -> None:
    node.sim.wait_for(lambda s: len(s.devices(RESOURCE)) == 4, timeout=30)
    got = node.sim.allocate("pod-1", "main", RESOURCE, 1)
    held = next(g for g in node.gpus if g.uuid == got.device_ids[0])
    slices = node.agent.desired_slices()
    devices = {d["name"]: d for s in slices for d in s["spec"]["devices"]}
    assert devices[gpu_device_name(held)]["taints"] == [TAINT]
    assert all("taints" not in d for name, d in devices.items() if name != gpu_device_name(held))
    ref = node.claims.add("late", "uid-late", [held])
    error = node.agent.preparer.prepare([ref])[ref.uid].error
    assert "ResourceClaim ns/late (uid uid-late)" in error and f"{held.uuid} is held by deviceplugin:" in error
    assert node.agent.checkpoint.claim(ref.uid) is None


def test_concurrent_prepares_and_allocates_never_share_a_gpu(node: Node) -> None:
    """Each round: a DRA claim per GPU and device plugin Allocates of disjoint GPU pairs (the kubelet never asks
    for one device twice), all released at once by a barrier; whoever wins, no GPU ends up with both."""
    gpus = node.gpus
    n = len(gpus)
    for round_ in range(6):
        refs = [node.claims.add(f"c{round_}-{i}", f"u{round_}-{i}", [gpus[i]]) for i in range(n)]
        order = [gpus[(round_ + k) % n].uuid for k in range(n)]
        pairs = [order[k : k + 2] for k in range(0, n, 2)]
        barrier = threading.Barrier(len(refs) + len(pairs))
        dra: dict[str, str] = {}
        dp: dict[int, str] = {}

        def prepare(ref: ClaimRef) -> None:
            barrier.wait()  # noqa: B023 (the threads are joined within this iteration)
            dra[ref.uid] = node.agent.preparer.prepare([ref])[ref.uid].error  # noqa: B023

        def allocate(i: int, ids: list[str]) -> None:
            barrier.wait()  # noqa: B023
            try:
                _allocate(node, ids)
                dp[i] = ""  # noqa: B023
            except grpc.RpcError as exc:
                dp[i] = exc.details() or "error"  # noqa: B023

        threads = [threading.Thread(target=prepare, args=(r,)) for r in refs]
        threads += [threading.Thread(target=allocate, args=(i, ids)) for i, ids in enumerate(pairs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        ledger = node.agent.checkpoint.state.ledger
        assert all(len(k) == 1 for k in _kinds(ledger).values()), ledger  # never DRA and device plugin at once
        dp_holders = {h for hs in ledger.values() for h in hs if h.startswith("deviceplugin:")}
        assert len(dp_holders) == sum(1 for e in dp.values() if not e)
        for i, ids in enumerate(pairs):
            if dp[i]:
                assert "through DRA" in dp[i]
            else:
                assert all(any(h.startswith("deviceplugin:") for h in ledger[u]) for u in ids)
        for i, ref in enumerate(refs):
            if dra[ref.uid]:
                assert "is held by deviceplugin:" in dra[ref.uid]
            else:
                assert ledger[gpus[i].uuid] == [Ledger.dra_holder(ref.uid)]
        assert any(not e for e in dra.values()) or any(not e for e in dp.values())
        # Clean up for the next round: DRA unprepares, the device plugin holds are released.
        node.agent.preparer.unprepare(refs)
        for holder in dp_holders:
            node.shim.ledger.release(holder)
        assert node.agent.checkpoint.state.ledger == {}


def test_static_split_serves_only_reserved_gpus() -> None:
    with short_tmp() as tmp:
        inventory = discover(load_backend("sim:l40s-4", node=NODE), NODE)
        reserved = frozenset(g.uuid for g in inventory.gpus[:2])
        node = _node(tmp, reserved=reserved)
        try:
            node.sim.wait_for(lambda s: len(s.devices(RESOURCE)) == 2, timeout=30)
            assert set(node.sim.devices(RESOURCE)) == reserved
            published = {d["name"] for s in node.agent.desired_slices() for d in s["spec"]["devices"]}
            assert published == {gpu_device_name(g) for g in inventory.gpus[2:]}
            ref = node.claims.add("c", "uid-c", [inventory.gpus[0]])
            assert "reserved for the device plugin" in node.agent.preparer.prepare([ref])[ref.uid].error
            got = node.sim.allocate("pod-1", "main", RESOURCE, 2)
            assert set(got.device_ids) == reserved
        finally:
            _stop(node)


def test_finished_pod_in_the_api_releases_and_republishes(apiserver) -> None:  # type: ignore[no-untyped-def]
    api = apiserver.api
    with short_tmp() as tmp:
        node = _node(tmp, api=api)
        kubelet = KubeletSim(tmp / "kubelet")
        try:
            kubelet.wait_for_plugin(DRIVER, timeout=60)  # the DRA registration starts the slice publisher
            node.sim.wait_for(lambda s: len(s.devices(RESOURCE)) == 4, timeout=30)
            pod = api.create("Pod", {"metadata": {"name": "legacy", "namespace": "default"}, "spec": {
                "nodeName": NODE, "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {RESOURCE: "1"}}}]}})
            got = node.sim.allocate(pod["metadata"]["uid"], "main", RESOURCE, 1)
            held = next(g for g in node.gpus if g.uuid == got.device_ids[0])
            _wait_for_taints(api, {gpu_device_name(held)})
            node.shim.refresh(check_pods=True)
            assert held.uuid in node.agent.checkpoint.state.ledger  # the pod runs: kept
            pod["status"] = {"phase": "Succeeded"}
            api.replace_status("Pod", pod)
            node.shim.refresh(check_pods=True)
            assert node.agent.checkpoint.state.ledger == {}
            _wait_for_taints(api, set())
            create_allocated_claim(api, "now-dra", [("gpu", gpu_device_name(held))])
            claim = api.get("ResourceClaim", "now-dra", namespace="default")
            info = ClaimInfo("default", claim["metadata"]["uid"], "now-dra")
            assert kubelet.plugins[DRIVER].prepare([info])[info.uid][0].device_name == gpu_device_name(held)
        finally:
            kubelet.close()
            _stop(node)


def test_allocated_claim_withholds_its_gpu_until_deallocated(apiserver) -> None:  # type: ignore[no-untyped-def]
    """Between the scheduler's allocation and NodePrepareResources the GPU is already withheld from legacy pods."""
    api = apiserver.api
    with short_tmp() as tmp:
        node = _node(tmp, api=api)
        try:
            g0, g1 = node.gpus[0], node.gpus[1]
            node.sim.wait_for(lambda s: set(s.health(RESOURCE).values()) == {HEALTHY} and len(s.health(RESOURCE)) == 4, timeout=30)
            # another driver's claim, and one of ours for another node's pool, withhold nothing
            create_allocated_claim(api, "elsewhere", [("gpu", gpu_device_name(g1))], pool="node-b")
            claim = create_allocated_claim(api, "pending", [("gpu", gpu_device_name(g0))])
            node.sim.wait_for(lambda s: s.health(RESOURCE)[g0.uuid] == UNHEALTHY, timeout=30)
            assert node.sim.health(RESOURCE)[g1.uuid] == HEALTHY
            assert node.agent.checkpoint.state.ledger == {}  # allocated only: the ledger holds nothing yet
            with pytest.raises(grpc.RpcError) as refused:
                _allocate(node, [g0.uuid])
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert f"GPU {g0.uuid} is allocated to ResourceClaim default/pending (uid {claim['metadata']['uid']})" in (
                refused.value.details() or ""
            )
            assert node.agent.checkpoint.state.ledger == {}
            with pytest.raises(DeviceManagerError, match="requested 4 nvidia.com/gpu, available 3"):
                node.sim.allocate("pod-1", "main", RESOURCE, 4)
            current = api.get("ResourceClaim", "pending", namespace="default")
            current["status"] = {}
            api.replace_status("ResourceClaim", current)
            node.sim.wait_for(lambda s: s.health(RESOURCE)[g0.uuid] == HEALTHY, timeout=30)
            _allocate(node, [g0.uuid])
            assert [h.split(":", 1)[0] for h in node.agent.checkpoint.state.ledger[g0.uuid]] == ["deviceplugin"]
        finally:
            _stop(node)


def _tainted(api: Any) -> set[str]:
    items, _ = api.list("ResourceSlice", field_selector=f"spec.nodeName={NODE}")
    return {d["name"] for s in items for d in s["spec"].get("devices", []) if TAINT["key"] in {t["key"] for t in d.get("taints", [])}}


def _wait_for_taints(api: Any, names: set[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while _tainted(api) != names:
        if time.monotonic() > deadline:
            raise AssertionError(f"tainted devices {_tainted(api)}, expected {names}")
        time.sleep(0.05)


@pytest.mark.process
def test_ledger_survives_a_node_agent_restart(apiserver) -> None:  # type: ignore[no-untyped-def]
    """`gpu-dra plugin --device-plugin` killed with SIGKILL and started again: its device plugin holds stay."""
    api = apiserver.api
    with short_tmp() as tmp:
        sim = DeviceManagerSim(tmp / "kubelet")
        sim.start()
        kubelet = KubeletSim(tmp / "kubelet")
        gpus = discover(load_backend("sim:l40s-4", node=NODE), NODE).gpus
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        cmd = [sys.executable, "-m", "cli.main", "plugin", "--node", NODE, "--nvml", "sim:l40s-4", "--device-plugin",
               "--kubeconfig", str(apiserver.kubeconfig), "--kubelet-dir", str(tmp / "kubelet"),
               "--cdi-dir", str(tmp / "cdi"), "--log-level", "WARNING"]
        log = open(tmp / "plugin.log", "ab")  # noqa: SIM115 (both agents write to it; closed in finally)
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
        try:
            sim.wait_for(lambda s: len(s.devices(RESOURCE)) == 4, timeout=60)
            kubelet.wait_for_plugin(DRIVER, timeout=60)
            pod = api.create("Pod", {"metadata": {"name": "legacy", "namespace": "default"}, "spec": {
                "nodeName": NODE, "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {RESOURCE: "2"}}}]}})
            got = sim.allocate(pod["metadata"]["uid"], "main", RESOURCE, 2)
            held = {g.uuid: g for g in gpus if g.uuid in got.device_ids}
            _wait_for_taints(api, {gpu_device_name(g) for g in held.values()})

            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
            sim.wait_for(lambda s: s.registrations == 2 and len(s.devices(RESOURCE)) == 4, timeout=60)
            kubelet.restart()
            kubelet.wait_for_plugin(DRIVER, timeout=60)

            # The holds came back from the checkpoint: DRA cannot prepare a held GPU, the slices stay tainted.
            _wait_for_taints(api, {gpu_device_name(g) for g in held.values()})
            victim = next(iter(held.values()))
            create_allocated_claim(api, "grab", [("gpu", gpu_device_name(victim))])
            claim = api.get("ResourceClaim", "grab", namespace="default")
            with pytest.raises(KubeletError, match=f"{victim.uuid} is held by deviceplugin:"):
                kubelet.plugins[DRIVER].prepare([ClaimInfo("default", claim["metadata"]["uid"], "grab")])
            # A free GPU still goes to DRA, and the device plugin then reports it Unhealthy.
            free = next(g for g in gpus if g.uuid not in held)
            create_allocated_claim(api, "ok", [("gpu", gpu_device_name(free))])
            claim = api.get("ResourceClaim", "ok", namespace="default")
            kubelet.plugins[DRIVER].prepare([ClaimInfo("default", claim["metadata"]["uid"], "ok")])
            sim.wait_for(lambda s: s.health(RESOURCE).get(free.uuid) == UNHEALTHY, timeout=30)
            assert [u for u, h in sim.health(RESOURCE).items() if h == HEALTHY and u not in held] != []
        finally:
            try:
                stop_process(proc)
            finally:
                log.close()
            kubelet.close()
            sim.stop()
