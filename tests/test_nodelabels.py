"""GPU Feature Discovery labels: the values for shipped hardware, and `gpu-dra plugin --node-labels` setting them
on its Node through the API server (a real process, the official client, the embedded control plane)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from driver.discovery import discover
from driver.nodelabels import arch_family, gfd_labels, label_patch, sanitise
from driver.nvml import load_backend
from tests.plugin_helpers import NODE, short_tmp, stop_process

REPO = Path(__file__).resolve().parent.parent


def _labels(profile: str) -> dict[str, str]:
    return gfd_labels(discover(load_backend(f"sim:{profile}"), NODE))


def test_a100_40gb_labels_as_gfd_writes_them() -> None:
    assert _labels("dgx-a100-40gb") == {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.memory": "40960",
        "nvidia.com/gpu.family": "ampere",
        "nvidia.com/gpu.compute.major": "8",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mps.capable": "false",
        "nvidia.com/cuda.driver.major": "580",
        "nvidia.com/cuda.driver.minor": "95",
        "nvidia.com/cuda.driver.rev": "05",
        "nvidia.com/cuda.driver-version.major": "580",
        "nvidia.com/cuda.driver-version.minor": "95",
        "nvidia.com/cuda.driver-version.revision": "05",
        "nvidia.com/cuda.driver-version.full": "580.95.05",
        "nvidia.com/cuda.runtime.major": "13",
        "nvidia.com/cuda.runtime.minor": "0",
        "nvidia.com/cuda.runtime-version.major": "13",
        "nvidia.com/cuda.runtime-version.minor": "0",
        "nvidia.com/cuda.runtime-version.full": "13.0",
    }


@pytest.mark.parametrize(
    "profile,product,family,mig",
    [
        ("dgx-h100", "NVIDIA-H100-80GB-HBM3", "hopper", "true"),
        ("l40s-4", "NVIDIA-L40S", "ada-lovelace", "false"),
        ("v100-4", "Tesla-V100-SXM2-32GB", "volta", "false"),
        ("t4-1", "Tesla-T4", "turing", "false"),
        ("gb200-nvl", "NVIDIA-GB200", "blackwell", "false"),
    ],
)
def test_product_family_and_mig_capability(profile: str, product: str, family: str, mig: str) -> None:
    labels = _labels(profile)
    assert (labels["nvidia.com/gpu.product"], labels["nvidia.com/gpu.family"], labels["nvidia.com/mig.capable"]) == (
        product, family, mig,
    )


def test_helpers() -> None:
    assert sanitise("NVIDIA A100-SXM4-40GB (rev/a)") == "NVIDIA-A100-SXM4-40GB-reva"
    assert [arch_family(*cc) for cc in [(6, 1), (7, 0), (7, 5), (8, 6), (8, 9), (9, 0), (12, 0), (4, 0)]] == [
        "pascal", "volta", "turing", "ampere", "ada-lovelace", "hopper", "blackwell", "undefined",
    ]
    # Only what differs is patched; labels of others stay as they are.
    assert label_patch({"a": "1", "nvidia.com/gpu.count": "8"}, {"nvidia.com/gpu.count": "8"}) is None
    assert label_patch({"a": "1"}, {"nvidia.com/gpu.count": "8"}) == {"metadata": {"labels": {"nvidia.com/gpu.count": "8"}}}


def _wait(predicate: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


@pytest.mark.process
def test_plugin_sets_labels_on_its_node(apiserver: Any) -> None:
    apiserver.api.create("Node", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"team": "ml"}}})
    with short_tmp() as work:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with open(work / "plugin.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "plugin", "--node", NODE, "--nvml", "sim:dgx-a100-40gb",
                 "--kubeconfig", str(apiserver.kubeconfig), "--kubelet-dir", str(work / "kubelet"),
                 "--cdi-dir", str(work / "cdi"), "--node-labels", "--log-level", "WARNING"],
                env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log,
            )
        try:
            labels = _wait(lambda: (found := apiserver.api.get("Node", NODE)["metadata"].get("labels", {})).get("nvidia.com/gpu.count") and found)
        finally:
            stop_process(proc)
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB" and labels["nvidia.com/mig.capable"] == "true"
        assert labels["team"] == "ml"  # labels the agent does not own are kept
