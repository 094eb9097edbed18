"""Through a GPU Operator driver upgrade (driver.driverupgrade): the agent releases NVML when the driver manager
pauses its eviction label or the upgrade controller restarts the driver pod, and comes back (exits, for its
DaemonSet to start it on the new driver) once the labels are clear and the new driver is there."""

from __future__ import annotations

import argparse
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from driver.discovery import discover
from driver.driverupgrade import (
    DEFAULT_EVICTION_LABEL, UPGRADE_STATE_LABEL, NodeUpgradeWatch, UpgradeGate, release_reason,
)
from driver.health import HealthMonitor
from driver.nvml import load_backend
from driver.plugin.agent import AgentSettings, NodeAgent, kubeapi_claim_getter
from driver.plugin.healthcheck import nvml_probe
from sim.nvml.faults import CallFault, write_faults
from tests.plugin_helpers import DRIVER, NODE, short_tmp

LABEL = DEFAULT_EVICTION_LABEL


@pytest.mark.parametrize("labels,released", [
    ({}, False),
    ({LABEL: "true"}, False),
    ({LABEL: "paused-for-driver-upgrade"}, True),
    ({LABEL: "custom_paused-for-driver-upgrade"}, True),  # the manager appends to values other than "true"
    ({UPGRADE_STATE_LABEL: "drain-required"}, False),
    ({UPGRADE_STATE_LABEL: "pod-restart-required"}, True),
    ({UPGRADE_STATE_LABEL: "validation-required"}, False),
    ({UPGRADE_STATE_LABEL: "upgrade-done"}, False),
])
def test_release_reason(labels: dict[str, str], released: bool) -> None:
    assert (release_reason(labels, LABEL) is not None) is released
    assert release_reason({LABEL: "paused-for-driver-upgrade"}, None) is None  # no eviction label configured


@pytest.fixture
def work() -> Iterator[Path]:
    with short_tmp() as path:
        yield path


def _health_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name in ("gpu-health", "rediscovery")]


def test_nvml_is_released_for_the_driver_manager_and_the_agent_comes_back_on_the_new_driver(
        work: Path, apiserver: Any) -> None:
    api = apiserver.api
    faults = work / "faults.json"
    write_faults(faults)
    nvml = load_backend(f"sim:dgx-h100?faults={faults}", node=NODE)
    (work / "boot_id").write_text("boot-1\n")
    settings = AgentSettings(node_name=NODE, driver_name=DRIVER, kubelet_dir=work / "kubelet", cdi_dir=work / "cdi",
                             watch_seconds=0.05, boot_id_path=work / "boot_id", rediscover_interval_s=60.0)
    agent = NodeAgent(settings, nvml=nvml, inventory=discover(nvml, NODE), get_claim=kubeapi_claim_getter(api),
                      monitor_factory=lambda n, inv, cb: HealthMonitor(n, inv, cb, wait_timeout_ms=50))
    agent.start()
    api.create("Node", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    gate = UpgradeGate(release=agent.release_nvml, resume=agent.restart_on_new_driver, driver_ready=agent.driver_ready)
    watch = NodeUpgradeWatch(api, NODE, LABEL, gate)
    probe = nvml_probe(nvml, lambda: agent.nvml_released)

    def label(value: str) -> None:
        api.patch("Node", NODE, {"metadata": {"labels": {LABEL: value}}})
        assert watch.check()

    try:
        assert watch.check()
        # The label is offered to the driver manager (NODE_LABEL_FOR_GPU_POD_EVICTION) with the value it pauses.
        assert api.get("Node", NODE)["metadata"]["labels"][LABEL] == "true"
        assert agent.nvml_released is None and sorted(_health_threads()) == ["gpu-health", "rediscovery"]
        nvml.nvmlDeviceGetCount()

        # The driver manager pauses it before unloading the modules: the agent lets go of NVML at once.
        label("paused-for-driver-upgrade")
        assert agent.nvml_released is not None and LABEL in agent.nvml_released
        assert _health_threads() == []  # the monitor's event set is freed with it
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            nvml.nvmlDeviceGetCount()  # every nvmlInit the agent made is matched by a shutdown: nothing is held
        probe.run(1.0)  # the liveness probe does not restart the agent into the unload

        # The manager puts the label back before the new driver is loaded: the agent waits for it.
        write_faults(faults, fail_calls=[CallFault("nvmlInit", "DRIVER_NOT_LOADED")])
        label("true")
        assert not agent.exit_requested.is_set() and agent.nvml_released is not None
        # The new driver is loaded: the agent exits so that its DaemonSet starts it on the new driver.
        write_faults(faults)
        assert watch.check()
        assert agent.exit_requested.is_set()
    finally:
        agent.stop()


def test_the_plugin_command_wires_the_watch() -> None:
    from driver.commands import plugin

    parser = argparse.ArgumentParser()
    plugin.register(parser)
    args = parser.parse_args(["--node", NODE, "--nvml", "real"])
    assert args.driver_upgrade_label == LABEL and args.driver_upgrade_poll_seconds == 5.0

    class Agent:
        release_nvml = restart_on_new_driver = driver_ready = staticmethod(lambda *a: None)

    assert isinstance(plugin._driver_upgrade_watch(object(), Agent(), args), NodeUpgradeWatch)
    off = parser.parse_args(["--node", NODE, "--nvml", "real", "--driver-upgrade-poll-seconds", "0"])
    assert plugin._driver_upgrade_watch(object(), Agent(), off) is None
