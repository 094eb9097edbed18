"""Stale-claim cleanup: prepared claims that no pod here can use any more (deleted, deallocated, reserved for
nobody) are unprepared by the agent itself, without the kubelet's NodeUnprepareResources; claims prepared ahead
under binding conditions are remembered in the checkpoint across agent restarts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.binder import MigBinder
from driver.staleclaims import StaleClaimSweeper, stale_reason
from sim.kubelet.dra import ClaimInfo, KubeletSim
from tests.plugin_helpers import DRIVER, NODE, create_allocated_claim, short_tmp, start_agent


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    with short_tmp() as path:
        yield path


def _reserved(api: Any, name: str, device: str) -> tuple[dict[str, Any], ClaimInfo]:
    claim = create_allocated_claim(api, name, [("gpu", device)])
    claim["status"]["reservedFor"] = [{"resource": "pods", "name": f"pod-{name}", "uid": f"uid-pod-{name}"}]
    claim = api.replace_status("ResourceClaim", claim)
    return claim, ClaimInfo("default", claim["metadata"]["uid"], name)


def _sweeper(api: Any, agent: Any) -> StaleClaimSweeper:
    return StaleClaimSweeper(lambda ns, n: api.try_get("ResourceClaim", n, namespace=ns), agent.preparer, DRIVER, NODE)


def test_stale_reason() -> None:
    claim = {"metadata": {"uid": "u"}, "status": {"allocation": {"devices": {"results": [
        {"driver": DRIVER, "pool": NODE, "device": "d", "request": "r"}]}}, "reservedFor": [{"name": "p"}]}}
    assert stale_reason(claim, "u", DRIVER, NODE) == ""
    assert stale_reason(None, "u", DRIVER, NODE) == "deleted from the API"
    assert "another UID" in stale_reason(claim, "v", DRIVER, NODE)
    assert stale_reason({**claim, "status": {"reservedFor": [{"name": "p"}]}}, "u", DRIVER, NODE) == "no longer allocated"
    assert "pool other" in stale_reason(claim, "u", DRIVER, "other")
    assert stale_reason({**claim, "status": {**claim["status"], "reservedFor": []}}, "u", DRIVER, NODE) == "reserved for no pod"


def test_deleted_claim_is_cleaned_up_without_unprepare(tmp_path: Path, apiserver) -> None:  # type: ignore[no-untyped-def]
    api = apiserver.api
    agent = start_agent(tmp_path, api, publish=False)
    kubelet = KubeletSim(tmp_path / "kubelet")
    try:
        plugin = kubelet.wait_for_plugin(DRIVER, timeout=60)
        names = [d["name"] for s in agent.desired_slices() for d in s["spec"]["devices"]]
        gone, gone_info = _reserved(api, "gone", names[0])
        done, done_info = _reserved(api, "done", names[1])
        live, live_info = _reserved(api, "live", names[2])
        plugin.prepare([gone_info, done_info, live_info])
        specs = {p.name for p in (tmp_path / "cdi").iterdir()}
        assert any(gone_info.uid in n for n in specs)
        # A force-deleted pod: its claim is deleted and the kubelet never calls NodeUnprepareResources.
        api.delete("ResourceClaim", "gone", namespace="default")
        # Another pod finished: its claim is reserved for nobody, but the kubelet lost its state.
        done["status"]["reservedFor"] = []
        api.replace_status("ResourceClaim", done)

        sweeper = _sweeper(api, agent)
        first = sweeper.sweep_once()
        assert sorted(first.suspected) == ["default/done", "default/gone"] and first.unprepared == []
        assert {gone_info.uid, done_info.uid, live_info.uid} <= set(agent.checkpoint.state.claims)
        second = sweeper.sweep_once()
        assert sorted(second.unprepared) == ["default/done", "default/gone"]
        assert set(agent.checkpoint.state.claims) == {live_info.uid}
        left = {p.name for p in (tmp_path / "cdi").iterdir()}
        assert not any(gone_info.uid in n or done_info.uid in n for n in left)
        assert any(live_info.uid in n for n in left)
        # The devices are free again: a new claim gets the deleted claim's GPU.
        _, again = _reserved(api, "again", names[0])
        assert plugin.prepare([again])[again.uid][0].device_name == names[0]
    finally:
        kubelet.close()
        agent.stop()


def test_api_failure_unprepares_nothing(tmp_path: Path, apiserver) -> None:  # type: ignore[no-untyped-def]
    api = apiserver.api
    agent = start_agent(tmp_path, api, publish=False)
    kubelet = KubeletSim(tmp_path / "kubelet")
    try:
        plugin = kubelet.wait_for_plugin(DRIVER, timeout=60)
        name = next(d["name"] for s in agent.desired_slices() for d in s["spec"]["devices"])
        _, info = _reserved(api, "c", name)
        plugin.prepare([info])

        def failing(ns: str, n: str) -> Any:
            raise ConnectionError("API server away")

        sweeper = StaleClaimSweeper(failing, agent.preparer, DRIVER, NODE)
        for _ in range(3):
            assert sweeper.sweep_once().unprepared == []
        assert info.uid in agent.checkpoint.state.claims
    finally:
        kubelet.close()
        agent.stop()


def test_claim_prepared_ahead_is_released_after_an_agent_restart(tmp_path: Path, apiserver) -> None:  # type: ignore[no-untyped-def]
    api = apiserver.api
    agent = start_agent(tmp_path, api, publish=False)
    name = next(d["name"] for s in agent.desired_slices() for d in s["spec"]["devices"])
    claim, info = _reserved(api, "ahead", name)
    from driver.prepare import ClaimRef

    ref = ClaimRef(uid=info.uid, namespace="default", name="ahead")
    assert not agent.preparer.prepare([ref])[info.uid].error
    agent.preparer.mark_prepared_ahead(info.uid)
    agent.stop()
    # The agent restarts; the binding then fails (the scheduler deallocates the claim).
    agent = start_agent(tmp_path, api, publish=False)
    try:
        binder = MigBinder(api, agent.preparer, DRIVER, NODE)
        assert info.uid in binder._ahead
        claim = api.get("ResourceClaim", "ahead", namespace="default")
        claim["status"] = {}
        binder.handle(api.replace_status("ResourceClaim", claim))
        assert info.uid not in agent.checkpoint.state.claims
    finally:
        agent.stop()
