"""The kubelet plugin over real unix sockets, driven by the kubelet simulator against the embedded API server."""

from __future__ import annotations

import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from driver.inventory import Health
from sim.kubelet.dra import ClaimInfo, KubeletDialect, KubeletError, KubeletSim, Pod, RegistrationFailed, choose_service
from driver.plugin.agent import NodeAgent
from driver.prepare import ClaimRef
from driver.slices import gpu_device_name
from gpudra.kubeletapi.pluginregistration.v1 import api_pb2 as reg_pb
from gpudra.kubeletapi.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from tests.plugin_helpers import DRIVER, NODE, create_allocated_claim, short_tmp, start_agent


def _wait(condition, what: str, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    # Overrides pytest's tmp_path here: its paths are too long for unix sockets.
    with short_tmp() as path:
        yield path


@pytest.fixture
def agent(tmp_path: Path, apiserver) -> Iterator[NodeAgent]:  # type: ignore[no-untyped-def]
    a = start_agent(tmp_path, apiserver.api)
    try:
        yield a
    finally:
        a.stop()


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[KubeletSim]:
    k = KubeletSim(tmp_path / "kubelet")
    try:
        yield k
    finally:
        k.close()


def _devices(agent: NodeAgent) -> list[str]:
    return [d["name"] for s in agent.desired_slices() for d in s["spec"].get("devices", [])]


def _info(claim: dict) -> ClaimInfo:  # type: ignore[type-arg]
    return ClaimInfo(claim["metadata"]["namespace"], claim["metadata"]["uid"], claim["metadata"]["name"])


def test_registration_and_slices_published(agent: NodeAgent, kubelet: KubeletSim, apiserver, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    plugin = kubelet.wait_for_plugin(DRIVER, timeout=60)
    assert plugin.service == "v1.DRAPlugin" and plugin.health_advertised
    assert plugin.endpoint == str(tmp_path / "kubelet" / "plugins" / DRIVER / "dra.sock")
    for sock in (agent.paths.registration_socket, agent.paths.dra_socket):
        assert stat.S_ISSOCK(sock.stat().st_mode) and sock.stat().st_mode & 0o777 == 0o600
    assert agent.paths.plugin_dir.stat().st_mode & 0o777 == 0o700
    assert agent.plugin.registration_status == (True, "")
    _wait(lambda: len(apiserver.api.list("ResourceSlice")[0]) > 0, "slices")
    slices, _ = apiserver.api.list("ResourceSlice")
    assert {s["spec"]["nodeName"] for s in slices} == {NODE}


def test_get_info_wire_answer(agent: NodeAgent) -> None:
    with grpc.insecure_channel(f"unix://{agent.paths.registration_socket}") as ch:
        info = reg_grpc.RegistrationStub(ch).GetInfo(reg_pb.InfoRequest(), timeout=30)
        assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRIVER, str(agent.paths.dra_socket))
        assert list(info.supported_versions) == [
            "v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]
        with pytest.raises(grpc.RpcError) as failed:
            reg_grpc.RegistrationStub(ch).NotifyRegistrationStatus(
                reg_pb.RegistrationStatus(plugin_registered=False, error="kubelet says no"), timeout=30
            )
        assert "kubelet says no" in (failed.value.details() or "")
    assert agent.plugin.registration_status == (False, "kubelet says no")


def test_service_negotiation_rules() -> None:
    assert choose_service(["v1.DRAPlugin", "v1beta1.DRAPlugin"]) == "v1.DRAPlugin"
    assert choose_service(["v1beta1.DRAPlugin", "v1.DRAPlugin"]) == "v1beta1.DRAPlugin"
    with pytest.raises(RegistrationFailed, match="empty list of supported gRPC services"):
        choose_service([])
    with pytest.raises(RegistrationFailed, match="none of services supported by the plugin"):
        choose_service(["v1.DRAPlugin"], known=["v1beta1.DRAPlugin"])


@pytest.mark.parametrize("known", [("v1.DRAPlugin", "v1beta1.DRAPlugin"), ("v1beta1.DRAPlugin",)])
def test_prepare_and_unprepare_per_api_version(agent: NodeAgent, apiserver, tmp_path: Path, known: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    kubelet = KubeletSim(tmp_path / "kubelet", known_services=known)
    try:
        _prepare_and_unprepare(agent, apiserver, tmp_path, kubelet, known)
    finally:
        kubelet.close()


def _prepare_and_unprepare(agent: NodeAgent, apiserver, tmp_path: Path, kubelet: KubeletSim, known: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    plugin = kubelet.wait_for_plugin(DRIVER, timeout=60)
    assert plugin.service == known[0]
    names = _devices(agent)
    c1 = create_allocated_claim(apiserver.api, "c1", [("gpu", names[0])])
    c2 = create_allocated_claim(apiserver.api, "c2", [("a", names[1]), ("b", names[2])])
    pod = Pod("pod-1", [_info(c1), _info(c2)])
    kubelet.prepare_pod(DRIVER, pod)  # one call with both claims
    got = pod.prepared[c2["metadata"]["uid"]]
    assert [(d.request_names, d.pool_name, d.device_name) for d in got] == [(("a",), NODE, names[1]), (("b",), NODE, names[2])]
    assert got[0].cdi_device_ids == (f"k8s.gpu.nvidia.com/claim={c2['metadata']['uid']}-{names[1]}",)
    cdi_files = sorted(p.name for p in (tmp_path / "cdi").iterdir())
    assert cdi_files == sorted(f"k8s.gpu.nvidia.com-claim_{c['metadata']['uid']}.json" for c in (c1, c2))
    # Idempotent: a repeated call (kubelet restart, retry) returns the same devices.
    assert plugin.prepare([_info(c1)])[c1["metadata"]["uid"]] == pod.prepared[c1["metadata"]["uid"]]
    kubelet.unprepare_pod(DRIVER, pod)
    assert list((tmp_path / "cdi").iterdir()) == []
    plugin.unprepare([_info(c1), _info(c2)])  # unprepare twice: not an error


def test_per_claim_errors_fail_the_pod_but_not_the_server(agent: NodeAgent, kubelet: KubeletSim, apiserver) -> None:  # type: ignore[no-untyped-def]
    plugin = kubelet.wait_for_plugin(DRIVER, timeout=60)
    names = _devices(agent)
    good = create_allocated_claim(apiserver.api, "good", [("gpu", names[0])])
    pending = create_allocated_claim(apiserver.api, "pending", [("gpu", names[1])], allocate=False)
    elsewhere = create_allocated_claim(apiserver.api, "elsewhere", [("gpu", names[2])], pool="node-b")
    replaced = ClaimInfo("default", "00000000-0000-0000-0000-00000000dead", "good")
    cases = [
        (_info(pending), "is not allocated"),
        (_info(elsewhere), "allocated from pool(s) node-b, but this node serves pool node-a"),
        (replaced, "got replaced"),
        (ClaimInfo("default", "u-missing", "missing"), "not found in the API server"),
    ]
    for info, expected in cases:
        with pytest.raises(KubeletError) as failed:
            kubelet.prepare_pod(DRIVER, Pod("p", [_info(good), info]))
        assert f"NodePrepareResources failed for ResourceClaim {info.name}" in str(failed.value)
        assert expected in str(failed.value)
    # The good claim of those pods was prepared; the server still answers.
    assert plugin.prepare([_info(good)])[good["metadata"]["uid"]][0].device_name == names[0]


def test_health_stream_follows_changes(agent: NodeAgent, kubelet: KubeletSim) -> None:
    plugin = kubelet.wait_for_plugin(DRIVER, timeout=60)
    updates = []
    got_two = threading.Event()

    def follow() -> None:
        for update in plugin.watch_health():
            updates.append(update)
            if len(updates) == 2:
                got_two.set()
                return

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    _wait(lambda: len(updates) >= 1, "first health message")
    first = updates[0].devices
    assert len(first) == len(_devices(agent)) and {h for _, _, h in first} == {"HEALTHY"}
    gpu = agent.inventory().gpus[0]
    agent._on_health(gpu.uuid, Health(xids=(48,)))  # what the NVML health monitor reports for a DBE
    assert got_two.wait(30)
    unhealthy = [(d, h) for _, d, h in updates[1].devices if h != "HEALTHY"]
    assert len(unhealthy) == 1 and unhealthy[0][1] == "UNHEALTHY"
    assert len(updates[1].devices) == len(first)  # always the full list


@pytest.mark.slow
def test_kubelet_restart_reregisters_and_republishes(agent: NodeAgent, kubelet: KubeletSim, apiserver) -> None:  # type: ignore[no-untyped-def]
    kubelet.wait_for_plugin(DRIVER, timeout=60)
    _wait(lambda: agent.plugin.registrations == 1 and len(apiserver.api.list("ResourceSlice")[0]) > 0, "first publish")
    # A restarting kubelet wipes the node's slices and the plugins_registry dir content.
    for s in apiserver.api.list("ResourceSlice")[0]:
        apiserver.api.delete("ResourceSlice", s["metadata"]["name"])
    agent.paths.registration_socket.unlink()
    kubelet.restart()
    _wait(lambda: agent.paths.registration_socket.exists(), "registration socket served again")
    plugin = kubelet.wait_for_plugin(DRIVER, timeout=60)
    assert plugin.service == "v1.DRAPlugin"
    _wait(lambda: agent.plugin.registrations == 2, "second registration")
    _wait(lambda: len(apiserver.api.list("ResourceSlice")[0]) > 0, "slices published again")


def test_stop_removes_own_sockets(tmp_path: Path, apiserver) -> None:  # type: ignore[no-untyped-def]
    a = start_agent(tmp_path, apiserver.api, publish=False)
    a.stop()
    assert not a.paths.registration_socket.exists() and not a.paths.dra_socket.exists()


# The kubelet's pickHealthService (1.37, pkg/kubelet/cm/dra/plugin TestPickHealthService) and the older releases.
@pytest.mark.parametrize(("version", "supported", "want"), [
    ("1.37", ["v1beta1.DRAPlugin"], ""),
    ("1.37", [], ""),
    ("1.37", ["v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"], "v1alpha1.DRAResourceHealth"),
    ("1.37", ["v1beta1.DRAPlugin", "v1.DRAResourceHealth"], "v1.DRAResourceHealth"),
    ("1.37", ["v1alpha1.DRAResourceHealth", "v1.DRAResourceHealth"], "v1.DRAResourceHealth"),
    ("1.36", ["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"], "v1alpha1.DRAResourceHealth"),
    ("1.36", ["v1.DRAResourceHealth"], ""),
    ("1.34", ["v1alpha1.DRAResourceHealth"], "v1alpha1.DRAResourceHealth"),
])
def test_pick_health_service(version: str, supported: list[str], want: str) -> None:
    assert KubeletDialect.for_version(version).pick_health_service(supported) == want


@pytest.mark.parametrize(("version", "service", "messages"), [
    ("1.37", "v1.DRAResourceHealth", True),
    ("1.36", "v1alpha1.DRAResourceHealth", True),
    ("1.35", "v1alpha1.DRAResourceHealth", False),
])
def test_health_stream_per_kubelet_release(agent: NodeAgent, tmp_path: Path, version: str, service: str,
                                           messages: bool) -> None:
    """Each release's kubelet streams health from the service it picks, over the real socket."""
    kubelet = KubeletSim(tmp_path / "kubelet", kubernetes_version=version)
    try:
        plugin = kubelet.wait_for_plugin(DRIVER, timeout=60)
        assert plugin.health_service == service
        updates = []
        got_two = threading.Event()

        def follow() -> None:
            for update in plugin.watch_health():
                updates.append(update)
                if len(updates) == 2:
                    got_two.set()
                    return

        threading.Thread(target=follow, daemon=True).start()
        _wait(lambda: len(updates) >= 1, "first health message")
        gpu = agent.inventory().gpus[0]
        agent._on_health(gpu.uuid, Health(xids=(48,)))
        assert got_two.wait(30)
        second = updates[1]
        assert second.service == service
        bad = [i for i, (_, _, h) in enumerate(second.devices) if h == "UNHEALTHY"]
        assert len(bad) == 1
        if messages:
            assert "48" in second.messages[bad[0]]
        else:
            assert set(second.messages) == {""}
    finally:
        kubelet.close()


def test_both_health_versions_stream_the_same_devices(agent: NodeAgent) -> None:
    from gpudra.kubeletapi.drahealth.v1 import api_pb2 as v1, api_pb2_grpc as v1_grpc
    from gpudra.kubeletapi.drahealth.v1alpha1 import api_pb2 as v1alpha1, api_pb2_grpc as v1alpha1_grpc

    channel = grpc.insecure_channel(f"unix://{agent.paths.dra_socket}")
    try:
        grpc.channel_ready_future(channel).result(timeout=30)
        first = []
        for pb, stub_mod in ((v1, v1_grpc), (v1alpha1, v1alpha1_grpc)):
            stream = stub_mod.DRAResourceHealthStub(channel).NodeWatchResources(pb.NodeWatchResourcesRequest(), timeout=30)
            response = next(iter(stream))
            stream.cancel()
            first.append([(d.device.pool_name, d.device.device_name, d.health) for d in response.devices])
    finally:
        channel.close()
    assert first[0] == first[1] and len(first[0]) == len(_devices(agent))


def test_health_stream_resends_unchanged_list() -> None:
    """The kubelet reads a device as Unknown 30 s after its last report: the stream repeats the list meanwhile."""
    from driver.plugin.health import DeviceHealthEntry, HealthBoard
    from driver.plugin.server import HEALTH_RESEND_SECONDS, HealthServicer

    assert HEALTH_RESEND_SECONDS < 30
    board = HealthBoard([DeviceHealthEntry("pool", "gpu-0", True)])

    class Context:
        def is_active(self) -> bool:
            return True

    stream = HealthServicer(board, threading.Event(), resend_seconds=0.0).NodeWatchResources(None, Context())
    first, second = next(stream), next(stream)  # the second comes with no change on the board
    assert [d.device.device_name for d in second.devices] == [d.device.device_name for d in first.devices] == ["gpu-0"]
    board.close()


def test_a_restarted_agent_rebuilds_what_a_damaged_checkpoint_lost_from_the_api(tmp_path: Path, apiserver) -> None:  # type: ignore[no-untyped-def]
    """Issue 37: the agent lists the node's claims from the API to rebuild the records a damaged snapshot lost,
    so GPUs held by running pods never look free."""
    api = apiserver.api
    first = start_agent(tmp_path, api, publish=False)
    gpus = [gpu_device_name(g) for g in first.inventory().gpus]
    claims = [create_allocated_claim(api, f"c{i}", [("gpu", name)]) for i, name in enumerate(gpus)]
    refs = [ClaimRef(c["metadata"]["uid"], "default", c["metadata"]["name"]) for c in claims]
    assert all(not r.error for r in first.preparer.prepare(refs).values())
    with first.checkpoint.locked():
        first.checkpoint.compact()
    first.stop()
    snapshot = first.paths.plugin_dir / "checkpoint.json"
    raw = bytearray(snapshot.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    snapshot.write_bytes(bytes(raw))
    second = start_agent(tmp_path, api, publish=False)
    try:
        assert second.load_report.corrupt and second.start_report is not None
        assert sorted(second.start_report.rebuilt) == sorted(r.uid for r in refs)
        assert second.preparer.recovery_pending is None
        held = second.preparer.ledger.held()
        assert sorted(held) == sorted(g.uuid for g in second.inventory().gpus)
        assert sorted(h for holders in held.values() for h in holders) == sorted(f"dra:{r.uid}" for r in refs)
        # Prepared again by the kubelet: the same devices, from the rebuilt records.
        again = second.preparer.prepare(refs[:1])[refs[0].uid]
        assert not again.error and [d.device_name for d in again.devices] == [gpus[0]]
    finally:
        second.stop()


def test_an_agent_that_cannot_rebuild_yet_refuses_and_retries_on_its_own(tmp_path: Path, apiserver,  # type: ignore[no-untyped-def]
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from driver.discovery import discover
    from driver.nvml import load_backend
    from driver.plugin import agent as agent_module
    from driver.plugin.agent import AgentSettings, kubeapi_claim_getter, kubeapi_claim_lister

    api = apiserver.api
    first = start_agent(tmp_path, api, publish=False)
    name = gpu_device_name(first.inventory().gpus[0])
    claim = create_allocated_claim(api, "c0", [("gpu", name)])
    ref = ClaimRef(claim["metadata"]["uid"], "default", "c0")
    assert not first.preparer.prepare([ref])[ref.uid].error
    first.stop()
    (first.paths.plugin_dir / "checkpoint.json").unlink()
    (first.paths.plugin_dir / "checkpoint.journal").write_bytes(b"0" * 64 + b" {damaged}\n")
    api_up = threading.Event()
    real = kubeapi_claim_lister(api)

    def flaky() -> Iterator[dict]:  # type: ignore[type-arg]
        if not api_up.is_set():
            raise ConnectionError("the API server is away")
        return real()  # type: ignore[return-value]

    monkeypatch.setattr(agent_module, "RECOVERY_RETRY_S", 0.05)
    nvml = load_backend("sim:dgx-h100", node=NODE)
    settings = AgentSettings(node_name=NODE, driver_name=DRIVER, kubelet_dir=tmp_path / "kubelet",
                             cdi_dir=tmp_path / "cdi", watch_seconds=0.05, boot_id_path=tmp_path / "boot_id")
    second = NodeAgent(settings, nvml=nvml, inventory=discover(nvml, NODE), get_claim=kubeapi_claim_getter(api),
                       list_claims=flaky)
    second.start()
    try:
        assert second.preparer.recovery_pending is not None and ref.uid in second.preparer.recovery_pending
        assert second.preparer.ledger.held() == {}
        api_up.set()
        _wait(lambda: second.preparer.recovery_pending is None, "the agent to rebuild once the API answers")
        assert second.preparer.ledger.held() == {first.inventory().gpus[0].uuid: (f"dra:{ref.uid}",)}
    finally:
        second.stop()
