"""Device binding conditions (KEP-5007) for on-demand MIG: the rules both sides share, the embedded scheduler's
PreBind wait, and end to end: a pod is bound only once the node agent has created its MIG instance."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from controller import bindingconditions as cbc
from controller_helpers import create_all, events_for, manager, node
from driver.discovery import discover
from driver.nvml import load_backend
from driver.plugin.agent import AgentSettings, NodeAgent, kubeapi_claim_getter
from gpudra import bindingconditions as bc
from gpudra.kubeapi import Conflict
from gpudra.timestamps import rfc3339
from tests.plugin_helpers import DRIVER, NODE, short_tmp

READY, FAILED = f"{DRIVER}/mig-ready", f"{DRIVER}/mig-failed"


def _claim(status_devices: list[dict[str, Any]] | None = None, stamp: str | None = None) -> dict[str, Any]:
    result = {"request": "mig", "driver": DRIVER, "pool": NODE, "device": "gpu-x-mig-3g40gb-0",
              "bindingConditions": [READY], "bindingFailureConditions": [FAILED]}
    alloc: dict[str, Any] = {"devices": {"results": [result, {"request": "gpu", "driver": DRIVER, "pool": NODE,
                                                              "device": "gpu-y"}]}}
    if stamp:
        alloc["allocationTimestamp"] = stamp
    status: dict[str, Any] = {"allocation": alloc}
    if status_devices is not None:
        status["devices"] = status_devices
    return {"metadata": {"name": "c", "namespace": "default"}, "status": status}


def _entry(*conditions: tuple[str, str], share: str | None = None) -> dict[str, Any]:
    e: dict[str, Any] = {"driver": DRIVER, "pool": NODE, "device": "gpu-x-mig-3g40gb-0",
                         "conditions": [{"type": t, "status": s} for t, s in conditions]}
    if share:
        e["shareID"] = share
    return e


def test_binding_state_follows_the_scheduler() -> None:
    assert bc.binding_state(_claim()).state == bc.PENDING  # no status entry yet
    assert bc.binding_state(_claim([_entry((READY, "False"))])).state == bc.PENDING
    assert bc.binding_state(_claim([_entry((READY, "True"))])).state == bc.READY
    assert bc.binding_state(_claim([_entry((READY, "True"), share="s-1")])).state == bc.READY  # shareID not compared
    failed = bc.binding_state(_claim([_entry((READY, "True"), (FAILED, "True"))]))
    assert failed.state == bc.FAILED and FAILED in failed.message  # a failure wins over readiness
    plain = {"status": {"allocation": {"devices": {"results": [{"driver": DRIVER, "pool": NODE, "device": "d"}]}}}}
    assert bc.binding_state(plain).state == bc.READY


def test_scheduler_verdict_wait_bind_retry_and_timeout() -> None:
    now = datetime(2026, 8, 1, 12, 0, tzinfo=timezone.utc)
    stamp = (now - timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert cbc.verdict([_claim(stamp=stamp)], now=now).action == cbc.WAIT
    assert cbc.verdict([_claim([_entry((READY, "True"))], stamp)], now=now).action == cbc.BIND
    failed = cbc.verdict([_claim([_entry((FAILED, "True"))], stamp)], now=now)
    assert failed.action == cbc.RETRY and len(failed.release) == 1
    late = cbc.verdict([_claim(stamp=stamp)], now=now, timeout_seconds=10)
    assert late.action == cbc.RETRY and "within 10 s" in late.message


def test_every_allocation_is_stamped_as_kube_scheduler_does() -> None:
    # kube-scheduler 1.37 stamps an allocated claim that has no timestamp in PreBind, which an API server refuses
    # (the allocation is immutable): an allocation written without one never lets its pod bind on a real cluster.
    waiting = cbc.stamp(_claim()["status"]["allocation"], "2026-08-01T12:00:00Z")
    assert waiting["allocationTimestamp"] == "2026-08-01T12:00:00Z"
    plain = {"devices": {"results": [{"driver": DRIVER, "pool": NODE, "device": "d"}]}}
    assert cbc.stamp(plain, "2026-08-01T12:00:00Z") == {**plain, "allocationTimestamp": "2026-08-01T12:00:00Z"}
    kept = {**plain, "allocationTimestamp": "2026-07-01T00:00:00Z"}
    assert cbc.stamp(kept, "2026-08-01T12:00:00Z") == kept


@pytest.fixture
def work() -> Iterator[Path]:
    with short_tmp() as path:
        yield path


def _agent(work: Path, api: Any) -> NodeAgent:
    nvml = load_backend("sim:dgx-h100", node=NODE)
    (work / "boot_id").write_text("boot-1\n")
    settings = AgentSettings(node_name=NODE, driver_name=DRIVER, kubelet_dir=work / "kubelet", cdi_dir=work / "cdi",
                             watch_seconds=0.05, boot_id_path=work / "boot_id", partitionable=True,
                             binding_conditions=True)
    agent = NodeAgent(settings, nvml=nvml, inventory=discover(nvml, NODE), get_claim=kubeapi_claim_getter(api),
                      binding_api=api)
    agent.start()
    return agent


def _mig_objects() -> list[dict[str, Any]]:
    cls = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "mig.nvidia.com"},
           "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}" && '
                                                         f'device.attributes["{DRIVER}"].type == "mig"'}}]}}
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "mig-3g", "namespace": "default"},
             "spec": {"devices": {"requests": [{"name": "mig", "exactly": {
                 "deviceClassName": "mig.nvidia.com",
                 "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].profile == "3g.40gb"'}}]}}]}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "infer", "namespace": "default"},
           "spec": {"resourceClaims": [{"name": "mig", "resourceClaimName": "mig-3g"}],
                    "containers": [{"name": "main", "image": "cuda", "resources": {"claims": [{"name": "mig"}]}}]}}
    return [cls, claim, pod]


def _wait(condition: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _migs(agent: NodeAgent) -> list[tuple[str, str]]:
    return [(g.uuid, m.profile) for g in agent.inventory().gpus for m in g.mig_devices]


@pytest.mark.slow
def test_pod_binds_only_after_the_node_agent_created_the_mig_instance(work: Path, apiserver: Any) -> None:
    api = apiserver.api
    agent = _agent(work, api)
    try:
        slices = agent.desired_slices()
        placements = [d for s in slices for d in s["spec"].get("devices", []) if "-mig-" in d["name"]]
        assert placements and all(d["bindingConditions"] == [READY] and d["bindingFailureConditions"] == [FAILED]
                                  for d in placements)
        create_all(api, [node(NODE), *slices, *_mig_objects()])
        assert _migs(agent) == []
        ctl = manager(api)
        ctl.step()
        claim = api.get("ResourceClaim", "mig-3g", "default")
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["bindingConditions"] == [READY] and claim["status"]["allocation"]["allocationTimestamp"]
        assert [r["name"] for r in claim["status"]["reservedFor"]] == ["infer"]
        pod = api.get("Pod", "infer", "default")
        assert not pod["spec"].get("nodeName")  # allocated and reserved, not bound: PreBind waits
        assert any(e["reason"] == cbc.EVENT_PENDING for e in events_for(api, "infer"))

        ready = _wait(lambda: bc.binding_state(api.get("ResourceClaim", "mig-3g", "default")).state == bc.READY,
                      "the node agent to report the MIG device ready")
        assert ready and [p for _, p in _migs(agent)] == ["3g.40gb"]
        entry = bc.device_status(api.get("ResourceClaim", "mig-3g", "default"), result)
        assert entry is not None and {c["type"]: c["status"] for c in entry["conditions"]} == {READY: "True", FAILED: "False"}
        ctl.step()
        assert api.get("Pod", "infer", "default")["spec"]["nodeName"] == NODE
        # The kubelet's NodePrepareResources finds the claim prepared: same devices, no second instance.
        from driver.prepare import ClaimRef
        uid = api.get("ResourceClaim", "mig-3g", "default")["metadata"]["uid"]
        again = agent.preparer.prepare([ClaimRef(uid=uid, namespace="default", name="mig-3g")])[uid]
        assert not again.error and [d.device_name for d in again.devices] == [result["device"]]
        assert len(_migs(agent)) == 1
    finally:
        agent.stop()


def test_failure_condition_deallocates_and_the_agent_releases_the_instance(work: Path, apiserver: Any) -> None:
    api = apiserver.api
    agent = _agent(work, api)
    try:
        create_all(api, [node(NODE), *agent.desired_slices(), *_mig_objects()])
        ctl = manager(api)
        ctl.step()
        _wait(lambda: _migs(agent), "the MIG instance")
        # Something (an operator, a health check) declares the binding failed before the pod was bound. The node
        # agent writes the same status concurrently (its Ready condition), so this is a read-modify-write that
        # starts over on a conflict, as any client of the API would.
        deadline = time.monotonic() + 60
        while True:
            claim = api.get("ResourceClaim", "mig-3g", "default")
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            entry = {"driver": DRIVER, "pool": NODE, "device": result["device"], "conditions": [
                bc.condition(READY, True, "Ready", "", rfc3339()),
                bc.condition(FAILED, True, "Broken", "instance lost", rfc3339())]}
            claim["status"]["devices"] = [entry]
            try:
                api.replace_status("ResourceClaim", claim)
                break
            except Conflict:
                assert time.monotonic() < deadline, "the claim's status kept changing under the test for 60 s"
        ctl.step()
        after = api.get("ResourceClaim", "mig-3g", "default")
        assert "allocation" not in after["status"] and "devices" not in after["status"]
        assert not api.get("Pod", "infer", "default")["spec"].get("nodeName")
        # The agent unprepares what it prepared ahead: the instance goes away.
        _wait(lambda: not _migs(agent), "the MIG instance destroyed")
    finally:
        agent.stop()


def test_controller_binding_timeout_flag() -> None:
    import argparse

    from controller.commands.controller import config_from_args, register

    parser = argparse.ArgumentParser()
    register(parser)
    assert config_from_args(parser.parse_args([])).binding_timeout == 600.0
    assert config_from_args(parser.parse_args(["--binding-timeout", "60"])).binding_timeout == 60.0
    with pytest.raises(ValueError, match="--binding-timeout"):
        config_from_args(parser.parse_args(["--binding-timeout", "0.5"]))
