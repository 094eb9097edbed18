"""Helpers for the plugin tests: allocated ResourceClaims in the embedded API server, and an in-process agent."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from driver.discovery import discover
from driver.nvml import load_backend
from driver.plugin.agent import AgentSettings, NodeAgent, kubeapi_claim_getter, kubeapi_claim_lister
from driver.publisher import SlicePublisher
from gpudra.kubeapi import KubeApi

DRIVER = "gpu.nvidia.com"
NODE = "node-a"


@contextmanager
def short_tmp() -> Iterator[Path]:
    """A short temporary dir: unix socket paths must fit 107 bytes, pytest's tmp_path often does not."""
    path = Path(tempfile.mkdtemp(prefix="gd-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def stop_process(proc: subprocess.Popen[Any], timeout: float = 30.0) -> int:
    """SIGTERM, then SIGKILL if it does not exit in time: a failing test must not leave a process behind."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    return proc.returncode


def create_allocated_claim(
    api: KubeApi, name: str, devices: list[tuple[str, str]], *, pool: str = NODE, namespace: str = "default",
    config: list[dict[str, Any]] | None = None, allocate: bool = True,
) -> dict[str, Any]:
    """A ResourceClaim with one exact request per device and, unless `allocate` is False, its allocation."""
    requests = sorted({r.split("/")[0] for r, _ in devices}) or ["gpu"]
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {"name": r, "exactly": {"deviceClassName": "gpu.nvidia.com", "count": sum(1 for q, _ in devices if q == r) or 1}}
                    for r in requests
                ]
            }
        },
    }
    created = api.create("ResourceClaim", claim, namespace=namespace)
    if not allocate:
        return created
    created["status"] = {
        "allocation": {
            "devices": {
                "results": [{"request": r, "driver": DRIVER, "pool": pool, "device": d} for r, d in devices],
                "config": config or [],
            },
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}]},
        }
    }
    return api.replace_status("ResourceClaim", created)


def start_agent(
    tmp: Path, api: KubeApi, *, profile: str = "dgx-h100", publish: bool = True, watch_seconds: float = 0.05,
    partitionable: bool = False, instance: str = "",
) -> NodeAgent:
    nvml = load_backend(f"sim:{profile}", node=NODE)
    inventory = discover(nvml, NODE)
    boot = tmp / "boot_id"
    if not boot.exists():
        boot.write_text("boot-1\n")
    settings = AgentSettings(
        node_name=NODE, driver_name=DRIVER, kubelet_dir=tmp / "kubelet", cdi_dir=tmp / "cdi", watch_seconds=watch_seconds,
        boot_id_path=boot, partitionable=partitionable, instance=instance,
    )
    agent = NodeAgent(
        settings, nvml=nvml, inventory=inventory, get_claim=kubeapi_claim_getter(api),
        publisher=SlicePublisher(api, DRIVER, NODE, backoff_seconds=0.05) if publish else None,
        list_claims=kubeapi_claim_lister(api),
    )
    agent.start()
    return agent
