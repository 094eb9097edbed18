"""Two agent pods on one node during a rolling update (maxSurge: 1): per-pod socket names, each pod removes only its
own sockets, and the kubelet keeps a working plugin throughout."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from driver.plugin.server import PluginPaths
from driver.unixsocket import MAX_UNIX_SOCKET_PATH
from sim.kubelet.dra import ClaimInfo, KubeletSim
from tests.plugin_helpers import DRIVER, create_allocated_claim, short_tmp, start_agent

UID_OLD = "0b6d3f7e-1111-4c1e-9a51-000000000001"
UID_NEW = "0b6d3f7e-2222-4c1e-9a51-000000000002"


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    with short_tmp() as path:
        yield path


def _claim(api, name: str, device: str) -> ClaimInfo:  # type: ignore[no-untyped-def]
    c = create_allocated_claim(api, name, [("gpu", device)])
    return ClaimInfo(c["metadata"]["namespace"], c["metadata"]["uid"], c["metadata"]["name"])


def test_per_pod_socket_names(tmp_path: Path) -> None:
    fixed = PluginPaths(tmp_path, DRIVER)
    assert fixed.registration_socket.name == f"{DRIVER}-reg.sock" and fixed.dra_socket.name == "dra.sock"
    paths = PluginPaths(tmp_path, DRIVER, UID_NEW)
    assert paths.registration_socket == tmp_path / "plugins_registry" / f"{DRIVER}-{UID_NEW}-reg.sock"
    assert paths.dra_socket == tmp_path / "plugins" / DRIVER / f"dra-{UID_NEW}.sock"
    # A kubelet dir long enough that the plain name does not fit: the hashed names, still per instance and short.
    deep = tmp_path / ("k" * 20)
    a, b = PluginPaths(deep, DRIVER, UID_OLD), PluginPaths(deep, DRIVER, UID_NEW)
    assert a.registration_socket != b.registration_socket
    for p in (a.registration_socket, b.registration_socket):
        assert UID_OLD not in p.name and len(os.fsencode(str(p))) <= MAX_UNIX_SOCKET_PATH


def test_second_agent_takes_over_without_losing_its_socket(tmp_path: Path, apiserver) -> None:  # type: ignore[no-untyped-def]
    api = apiserver.api
    kubelet = KubeletSim(tmp_path / "kubelet")
    old = start_agent(tmp_path, api, publish=False, instance=UID_OLD)
    new = None
    try:
        first = kubelet.wait_for_plugin(DRIVER, timeout=60)
        assert first.endpoint == str(old.paths.dra_socket)
        devices = [d["name"] for s in old.desired_slices() for d in s["spec"]["devices"]]
        held = _claim(api, "before", devices[0])
        assert kubelet.plugins[DRIVER].prepare([held])[held.uid][0].device_name == devices[0]

        # Surge: the new pod starts while the old one still serves.
        new = start_agent(tmp_path, api, publish=False, instance=UID_NEW)
        kubelet.sync()
        assert [p.endpoint for p in kubelet.instances(DRIVER)] == [str(old.paths.dra_socket), str(new.paths.dra_socket)]
        assert kubelet.plugins[DRIVER].endpoint == str(new.paths.dra_socket)

        old.stop()
        assert not old.paths.dra_socket.exists() and not old.paths.registration_socket.exists()
        assert new.paths.dra_socket.is_socket() and new.paths.registration_socket.is_socket()
        kubelet.sync()
        assert [p.endpoint for p in kubelet.instances(DRIVER)] == [str(new.paths.dra_socket)]
        # The new pod serves the node: a new claim is prepared, and the claim the old pod prepared (one node
        # checkpoint) is unprepared by the new pod.
        later = _claim(api, "after", devices[1])
        assert kubelet.plugins[DRIVER].prepare([later])[later.uid][0].device_name == devices[1]
        kubelet.plugins[DRIVER].unprepare([held])
        assert held.uid not in new.checkpoint.state.claims and later.uid in new.checkpoint.state.claims
    finally:
        if new is not None:
            new.stop()
        old.stop()
        kubelet.close()


def test_stale_sockets_of_dead_instances_are_removed(tmp_path: Path, apiserver) -> None:  # type: ignore[no-untyped-def]
    paths = PluginPaths(tmp_path / "kubelet", DRIVER, UID_OLD)
    paths.registry_dir.mkdir(parents=True)
    paths.plugin_dir.mkdir(parents=True)
    # A pod killed without cleanup leaves sockets nobody listens on.
    for p in (paths.registration_socket, paths.dra_socket):
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(p))
    unrelated = paths.registry_dir / "other.example.com-reg.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(unrelated))
    agent = start_agent(tmp_path, apiserver.api, publish=False, instance=UID_NEW)
    try:
        assert not paths.registration_socket.exists() and not paths.dra_socket.exists()
        assert unrelated.exists() and agent.paths.dra_socket.is_socket()
    finally:
        agent.stop()



def _bound(path: Path, *, listening: bool) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    if listening:
        s.listen()
    return s


def test_sockets_of_a_pod_killed_after_this_one_started_are_swept(tmp_path: Path, apiserver) -> None:  # type: ignore[no-untyped-def]
    """The surge of a rolling update: the new pod starts while the old one serves, then the old one is killed
    (its grace period ran out) and leaves its sockets. The new pod's periodic sweep removes them once they were
    dead at two sweeps in a row; a pod that listens is kept, and so are the new pod's own sockets."""
    agent = start_agent(tmp_path, apiserver.api, publish=False, instance=UID_NEW)
    old = PluginPaths(tmp_path / "kubelet", DRIVER, UID_OLD)
    live = PluginPaths(tmp_path / "kubelet", DRIVER, "0b6d3f7e-3333-4c1e-9a51-000000000003")
    held = [_bound(p, listening=False) for p in (old.registration_socket, old.dra_socket)]  # killed: nobody accepts
    held += [_bound(p, listening=True) for p in (live.registration_socket, live.dra_socket)]
    try:
        plugin = agent.plugin
        assert plugin.sweep_stale_sockets() == []  # seen dead once: a socket between bind and listen looks the same
        assert old.registration_socket.exists()
        assert sorted(plugin.sweep_stale_sockets()) == sorted([old.registration_socket, old.dra_socket])
        assert not old.registration_socket.exists() and not old.dra_socket.exists()
        assert live.registration_socket.is_socket() and live.dra_socket.is_socket()
        assert agent.paths.registration_socket.is_socket() and agent.paths.dra_socket.is_socket()
        # The agent's own watch loop does it unasked (every 30 registration checks).
        for s in held[:2]:
            s.close()
        held[:2] = [_bound(p, listening=False) for p in (old.registration_socket, old.dra_socket)]
        deadline = time.monotonic() + 30
        while old.registration_socket.exists() or old.dra_socket.exists():
            assert time.monotonic() < deadline, "the watch loop did not sweep the dead pod's sockets"
            time.sleep(0.05)
        assert live.registration_socket.is_socket() and agent.paths.registration_socket.is_socket()
    finally:
        agent.stop()
        for s in held:
            s.close()


def _pool(api) -> tuple[set[int], set[str]]:  # type: ignore[no-untyped-def]
    """The pool's generations and the taint keys on its devices."""
    items, _ = api.list("ResourceSlice")
    ours = [s for s in items if s["spec"]["driver"] == DRIVER]
    return ({int(s["spec"]["pool"]["generation"]) for s in ours},
            {t["key"] for s in ours for d in s["spec"]["devices"] for t in d.get("taints") or ()})


def _until(what: str, check, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.slow
def test_only_the_newest_registered_agent_publishes(tmp_path: Path, apiserver) -> None:  # type: ignore[no-untyped-def]
    api = apiserver.api
    kubelet = KubeletSim(tmp_path / "kubelet")
    old = start_agent(tmp_path, api, instance=UID_OLD)
    new = None
    try:
        # The old release publishes other content than the new one (a release adds or changes attributes): here a
        # taint only the old one sets, so each one's writes are told apart.
        device = old.desired_slices()[0]["spec"]["devices"][0]["name"]
        old.extra_taints = lambda: {device: [{"key": "example.com/old-release", "effect": "NoSchedule"}]}
        kubelet.wait_for_plugin(DRIVER, timeout=60)
        _until("the old agent's pool", lambda: _pool(api)[1] == {"example.com/old-release"})

        # Surge: the new pod registers and publishes; the old one stops writing at once, and never answers the
        # new one's writes with its own (before, each republished when it saw the other's: a new generation a round).
        new = start_agent(tmp_path, api, instance=UID_NEW)
        kubelet.sync()
        _until("the new agent's pool", lambda: _pool(api)[1] == set())
        settled = _pool(api)[0]
        assert len(settled) == 1
        old.request_publish()  # what its slice watch does on every write of the other
        time.sleep(1.5)  # many rounds of both publishers (watch_seconds 0.05)
        assert _pool(api) == (settled, set())
        assert new.seat.holder() == new.seat.me

        # The newer pod goes away (a rollout rolled back): the old one publishes again.
        new.stop()
        old.request_publish()
        _until("the old agent publishing again", lambda: _pool(api)[1] == {"example.com/old-release"})
    finally:
        if new is not None:
            new.stop()
        old.stop()
        kubelet.close()
