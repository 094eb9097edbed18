"""Rediscovery: a MIG layout changed outside the agent is republished; a driver change makes the agent exit."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from driver import miginstances
from driver.discovery import discover
from driver.inventory import Inventory
from driver.nvml import load_backend
from driver.plugin.agent import AgentSettings, NodeAgent
from driver.prepare import ClaimNotFound
from driver.rediscovery import Rediscoverer
from driver.slices import mig_device_name
from tests.plugin_helpers import short_tmp

NODE = "node-r"
DEADLINE = 30.0


def _wait(what: str, condition: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + DEADLINE
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return value


def _no_claims(namespace: str, name: str) -> dict[str, Any]:
    raise ClaimNotFound(f"{namespace}/{name}")


class Wrapped:
    """An NVML backend whose driver version (or a failure) a test can change, everything else forwarded."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self.version: str | None = None
        self.error: Exception | None = None

    def nvmlSystemGetDriverVersion(self) -> str:
        if self.error is not None:
            raise self.error
        return self.version or self._nvml.nvmlSystemGetDriverVersion()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nvml, name)


@pytest.fixture
def agent_on() -> Iterator[Callable[..., tuple[NodeAgent, Wrapped]]]:
    made: list[NodeAgent] = []
    with short_tmp() as tmp:
        def make(profile: str = "a30-4", driver_root: Path | None = None) -> tuple[NodeAgent, Wrapped]:
            nvml = Wrapped(load_backend(f"sim:{profile}", node=NODE))
            (tmp / "boot_id").write_text("boot-1\n")
            settings = AgentSettings(node_name=NODE, driver_name="gpu.nvidia.com", kubelet_dir=tmp / "kubelet",
                                     cdi_dir=tmp / "cdi", boot_id_path=tmp / "boot_id", rediscover_interval_s=0.05,
                                     driver_root=driver_root)
            agent = NodeAgent(settings, nvml=nvml, inventory=discover(nvml, NODE), get_claim=_no_claims)
            agent.start()
            made.append(agent)
            return agent, nvml

        yield make
        for agent in made:
            agent.stop()


def test_a_mig_layout_changed_outside_the_agent_is_republished(agent_on: Callable[..., tuple[NodeAgent, Wrapped]]) -> None:
    agent, nvml = agent_on()
    gpu = agent.inventory().gpus[0]
    gone = next(m for m in gpu.mig_devices if m.profile == "1g.6gb")
    name = mig_device_name(gpu, gone)
    profile = next(p for p in gpu.mig_profiles if p.name == gone.profile)

    def published() -> set[str]:
        return {d["name"] for s in agent.desired_slices() for d in s["spec"].get("devices", [])}

    assert name in published()
    # As mig-parted would: through NVML, not through the agent.
    assert miginstances.destroy(nvml, gpu.uuid, profile.profile_id, gone.placement.start)
    _wait("the destroyed MIG device to leave the slices", lambda: name not in published())
    assert agent._publish_changed.is_set()
    created = miginstances.create(nvml, gpu.uuid, profile.profile_id, gone.placement.start, gone.placement.size)
    _wait("the recreated MIG device to be published", lambda: name in published())
    assert any(m.uuid == created.uuid for m in agent.inventory().gpus[0].mig_devices)
    assert not agent.exit_requested.is_set()


def test_a_driver_version_change_makes_the_agent_exit(agent_on: Callable[..., tuple[NodeAgent, Wrapped]]) -> None:
    agent, nvml = agent_on()
    nvml.version = "590.10.01"
    _wait("the agent to ask to exit", agent.exit_requested.is_set)
    assert agent.rediscoverer is not None and "590.10.01" in (agent.rediscoverer.driver_changed or "")


def test_nvml_refusing_the_loaded_library_makes_the_agent_exit(agent_on: Callable[..., tuple[NodeAgent, Wrapped]]) -> None:
    agent, nvml = agent_on()
    nvml.error = pynvml.NVMLError(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    _wait("the agent to ask to exit", agent.exit_requested.is_set)


def test_a_failed_walk_keeps_the_inventory_and_retries() -> None:
    inventory = discover(load_backend("sim:t4-1", node=NODE), NODE)
    calls: list[str] = []

    def walk() -> Inventory:
        calls.append("walk")
        if len(calls) == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return inventory

    changed: list[Inventory] = []
    r = Rediscoverer(walk, lambda: inventory, changed.append, lambda reason: calls.append(reason))
    r.check()
    r.check()
    assert calls == ["walk", "walk"] and changed == [] and r.driver_changed is None


def test_a_new_driver_in_the_driver_root_makes_the_agent_exit(agent_on: Callable[..., tuple[NodeAgent, Wrapped]],
                                                              tmp_path: Path) -> None:
    """A driver-container upgrade without a reboot: libnvidia-ml.so.1 in the root now names another file."""
    lib = tmp_path / "root/usr/lib64"
    lib.mkdir(parents=True)
    for version in ("580.95.05", "590.10.01"):
        (lib / f"libnvidia-ml.so.{version}").write_text("x")
    os.symlink("libnvidia-ml.so.580.95.05", lib / "libnvidia-ml.so.1")
    agent, _ = agent_on(driver_root=tmp_path / "root")
    time.sleep(0.2)
    assert not agent.exit_requested.is_set()
    (lib / "libnvidia-ml.so.1").unlink()
    os.symlink("libnvidia-ml.so.590.10.01", lib / "libnvidia-ml.so.1")
    _wait("the agent to ask to exit", agent.exit_requested.is_set)
    assert "libnvidia-ml.so.590.10.01" in (agent.rediscoverer.driver_changed or "")  # type: ignore[union-attr]
