"""The node agent's Node checks: another device plugin advertising nvidia.com/gpu withholds the DRA slices (Event +
Node condition) unless allowed; GFD's labels written and refreshed only where GFD does not run."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from driver.nodeguard import CONDITION_TYPE, EVENT_REASON, GFD_MARKER_LABEL, GuardSettings, NodeGuard, advertised, decide
from driver.plugin.agent import NodeAgent
from sim.kubelet.dra import KubeletSim
from tests.plugin_helpers import DRIVER, NODE, short_tmp, start_agent


READY = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}


def _node(allocatable: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    res = {"cpu": "8", "memory": "64Gi", "pods": "110", **(allocatable or {})}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": labels or {}},
            "status": {"capacity": dict(res), "allocatable": dict(res), "conditions": [dict(READY)]}}


def test_decide() -> None:
    s = GuardSettings(node_name=NODE)
    assert advertised(_node({"nvidia.com/gpu": "8"}), "nvidia.com/gpu") == 8
    assert advertised(_node(), "nvidia.com/gpu") == 0
    assert decide(_node(), s) is None
    assert decide(_node({"nvidia.com/gpu": "0"}), s) is None
    conflict = decide(_node({"nvidia.com/gpu": "8"}), s)
    assert conflict is not None and conflict.count == 8 and not conflict.allowed
    assert "withholds its ResourceSlices" in conflict.message(s) and "--allow-device-plugin-coexistence" in conflict.message(s)
    # Our own shim's count is ours.
    assert decide(_node({"nvidia.com/gpu": "8"}), replace(s, shim_enabled=True)) is None
    allowed = decide(_node({"nvidia.com/gpu": "8"}), replace(s, allow_coexistence=True))
    assert allowed is not None and allowed.allowed


@pytest.fixture
def running(apiserver) -> Iterator[tuple[NodeAgent, Any, KubeletSim]]:  # type: ignore[no-untyped-def]
    with short_tmp() as tmp:
        agent = start_agent(tmp, apiserver.api)
        kubelet = KubeletSim(tmp / "kubelet")
        try:
            kubelet.wait_for_plugin(DRIVER, timeout=60)
            yield agent, apiserver.api, kubelet
        finally:
            kubelet.close()
            agent.stop()


def _slices(api: Any) -> list[dict[str, Any]]:
    return [s for s in api.list("ResourceSlice")[0] if s["spec"]["nodeName"] == NODE]


def _wait(cond, what: str, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _condition(api: Any) -> dict[str, Any] | None:
    node = api.get("Node", NODE)
    return next((c for c in (node.get("status") or {}).get("conditions") or [] if c["type"] == CONDITION_TYPE), None)


def test_foreign_device_plugin_withholds_slices_loudly(running) -> None:  # type: ignore[no-untyped-def]
    agent, api, _ = running
    api.create("Node", _node())
    guard = NodeGuard(api, GuardSettings(node_name=NODE), withhold=agent.withhold, inventory=agent.inventory)
    assert guard.check()
    _wait(lambda: len(_slices(api)) > 0, "slices published")
    assert _condition(api)["status"] == "False"  # type: ignore[index]

    # The GPU Operator's device plugin registers: the kubelet posts nvidia.com/gpu.
    api.patch("Node", NODE, {"status": {"allocatable": {"nvidia.com/gpu": "8"}, "capacity": {"nvidia.com/gpu": "8"}}},
              subresource="status")
    assert guard.check()
    assert agent.withheld is not None
    _wait(lambda: _slices(api) == [], "slices withdrawn")
    cond = _condition(api)
    assert cond is not None and cond["status"] == "True" and cond["reason"] == EVENT_REASON
    assert "advertises 8 nvidia.com/gpu" in cond["message"]
    events = [e for e in api.list("Event", namespace="default")[0] if e["reason"] == EVENT_REASON]
    assert len(events) == 1 and events[0]["type"] == "Warning" and events[0]["involvedObject"]["name"] == NODE
    guard.check()  # no new Event while nothing changes
    assert len([e for e in api.list("Event", namespace="default")[0] if e["reason"] == EVENT_REASON]) == 1

    # The kubelet's own conditions stay; a status write that replaced the list is repaired at the next check.
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in api.get("Node", NODE)["status"]["conditions"])
    api.patch("Node", NODE, {"status": {"conditions": [READY]}}, subresource="status")
    assert _condition(api) is None
    guard.check()
    assert _condition(api)["status"] == "True"  # type: ignore[index]
    assert len([e for e in api.list("Event", namespace="default")[0] if e["reason"] == EVENT_REASON]) == 1

    # The other plugin goes away: published again, condition cleared.
    api.patch("Node", NODE, {"status": {"allocatable": {"nvidia.com/gpu": "0"}, "capacity": {"nvidia.com/gpu": "0"}}},
              subresource="status")
    assert guard.check()
    _wait(lambda: len(_slices(api)) > 0, "slices published again")
    assert _condition(api)["status"] == "False"  # type: ignore[index]


def test_coexistence_allowed_publishes_and_reports(running) -> None:  # type: ignore[no-untyped-def]
    agent, api, _ = running
    api.create("Node", _node())
    api.patch("Node", NODE, {"status": {"allocatable": {"nvidia.com/gpu": "8"}}}, subresource="status")
    guard = NodeGuard(api, GuardSettings(node_name=NODE, allow_coexistence=True), withhold=agent.withhold,
                      inventory=agent.inventory)
    assert guard.check() and agent.withheld is None
    _wait(lambda: len(_slices(api)) > 0, "slices published")
    cond = _condition(api)
    assert cond is not None and cond["status"] == "True" and cond["reason"] == "CoexistenceAllowed"


def test_labels_refreshed_and_left_to_gfd(running) -> None:  # type: ignore[no-untyped-def]
    agent, api, _ = running
    api.create("Node", _node())
    guard = NodeGuard(api, GuardSettings(node_name=NODE, node_labels=True), withhold=agent.withhold,
                      inventory=agent.inventory)
    assert guard.check()
    labels = api.get("Node", NODE)["metadata"]["labels"]
    assert labels["nvidia.com/gpu.count"] == "8" and labels["nvidia.com/gpu.product"].startswith("NVIDIA-H100")
    # Someone changes a label: refreshed at the next check.
    api.patch("Node", NODE, {"metadata": {"labels": {"nvidia.com/gpu.count": "3"}}})
    guard.check()
    assert api.get("Node", NODE)["metadata"]["labels"]["nvidia.com/gpu.count"] == "8"
    # GFD runs on the node: its values stand.
    api.patch("Node", NODE, {"metadata": {"labels": {GFD_MARKER_LABEL: "1733000000", "nvidia.com/gpu.count": "7"}}})
    guard.check()
    assert api.get("Node", NODE)["metadata"]["labels"]["nvidia.com/gpu.count"] == "7"


def test_labels_off_by_default(running) -> None:  # type: ignore[no-untyped-def]
    agent, api, _ = running
    api.create("Node", _node())
    NodeGuard(api, GuardSettings(node_name=NODE), withhold=agent.withhold, inventory=agent.inventory).check()
    assert not any(k.startswith("nvidia.com/") for k in api.get("Node", NODE)["metadata"]["labels"])


def test_missing_nvidia_uvm_is_a_node_condition_and_an_event(apiserver) -> None:  # type: ignore[no-untyped-def]
    """CUDA lacks /dev/nvidia-uvm on a node whose module could not be loaded: the Node condition
    GpuDraNvidiaUvmMissing says why, a Warning Event when it begins (once), both beside the conflict condition in
    one status write; a module loaded later clears it at the next check."""
    from driver.nodeguard import UVM_CONDITION_TYPE, UVM_EVENT_REASON

    api = apiserver.api
    api.create("Node", _node())
    why: list[str | None] = ["CUDA will lack /dev/nvidia-uvm: the nvidia-uvm module is not loaded (no nvidia-uvm in "
                             "/proc/devices); `chroot /driver-root /usr/bin/nvidia-modprobe -u -c=0` exited with status 1"]
    withheld: list[str | None] = []
    guard = NodeGuard(api, GuardSettings(node_name=NODE), withhold=withheld.append, inventory=lambda: None,  # type: ignore[arg-type, return-value]
                      uvm_missing=lambda: why[0])

    def uvm() -> dict[str, Any] | None:
        conditions = api.get("Node", NODE)["status"]["conditions"]
        return next((c for c in conditions if c["type"] == UVM_CONDITION_TYPE), None)

    def events() -> list[dict[str, Any]]:
        return [e for e in api.list("Event", namespace="default")[0] if e["reason"] == UVM_EVENT_REASON]

    assert guard.check()
    cond = uvm()
    assert cond is not None and cond["status"] == "True" and cond["reason"] == "NvidiaUvmNotLoaded"
    assert cond["message"] == why[0] and _condition(api)["status"] == "False"  # type: ignore[index]
    (event,) = events()
    assert event["type"] == "Warning" and event["message"].startswith("CUDA will lack /dev/nvidia-uvm: ")
    assert event["involvedObject"]["name"] == NODE
    guard.check()
    assert len(events()) == 1  # no new Event while nothing changes
    why[0] = None  # loaded by someone else (a driver container, the admin)
    guard.check()
    cond = uvm()
    assert cond is not None and cond["status"] == "False" and cond["reason"] == "NvidiaUvmLoaded"
    assert any(c["type"] == "Ready" for c in api.get("Node", NODE)["status"]["conditions"])
    assert withheld[-1] is None
