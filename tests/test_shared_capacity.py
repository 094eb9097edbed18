"""Sharing GPUs by capacity (`--shared-capacity`, DRAConsumableCapacity): the slices, Kubernetes' allocator
semantics (two claims fit on one GPU, a third does not), and prepare enforcing each claim's part through the
GPU's one MPS daemon and per-client limits."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli.main import main
from driver.cdi import SPEC_PREFIX
from driver.prepare import ClaimRef
from driver.sharing import COMPUTE_MODE_DEFAULT, COMPUTE_MODE_EXCLUSIVE_PROCESS, shared_mps_dirs
from driver.slices import SliceSettings, build_slices
from driver.discovery import discover
from driver.nvml import load_backend
from gpudra.validation import validate_object
from tests.plugin_helpers import short_tmp
from tests.test_nvidia_quickstart import HELM_CLASSES, NODE, SimNode

DRIVER = "gpu.nvidia.com"


@pytest.fixture
def tmp() -> Iterator[Path]:
    with short_tmp() as path:
        yield path


def _claim(name: str, memory: str, share: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "capacity": {"requests": {"memory": memory, "computeShare": share}},
        }}]}},
    }


def test_shared_gpu_is_published_with_consumable_capacity() -> None:
    inv = discover(load_backend("sim:t4-1", node=NODE), NODE)
    (slice_,) = build_slices(inv, SliceSettings(node_name=NODE, driver_name=DRIVER, shared_capacity=True))
    (device,) = slice_["spec"]["devices"]
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"] == {
        "memory": {"value": "15Gi", "requestPolicy": {"default": "15Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}},
        "computeShare": {"value": "100", "requestPolicy": {"default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}}},
    }
    assert validate_object(slice_) == []
    with pytest.raises(ValueError, match="exclude each other"):
        SliceSettings(node_name=NODE, shared_capacity=True, partitionable=True)


def _spec_env(cdi_dir: Path, uid: str) -> dict[str, str]:
    spec = json.loads((cdi_dir / f"{SPEC_PREFIX}{uid}.json").read_text())
    env = [e for d in spec["devices"] for e in d["containerEdits"].get("env", [])]
    return dict(e.split("=", 1) for e in env if e.startswith("CUDA_MPS_"))


def test_two_claims_share_a_gpu_a_third_is_refused_and_mps_limits_each(tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = SimNode(tmp, "t4-1")  # one T4, 15Gi
    slices = build_slices(discover(node.nvml, NODE), SliceSettings(node_name=NODE, driver_name=DRIVER, shared_capacity=True))
    claims = [_claim("a", "8Gi", "50"), _claim("b", "6Gi", "40"), _claim("c", "4Gi", "10")]
    path = tmp / "in.yaml"
    path.write_text(HELM_CLASSES + "\n---\n" + yaml.safe_dump_all([*slices, *claims]))
    rc = main(["allocate", "-f", str(path), "--feature", "DRAConsumableCapacity", "-o", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1
    a, b, c = doc["results"]
    assert (a["outcome"], b["outcome"], c["outcome"]) == ("allocated", "allocated", "unschedulable")
    (ra,), (rb,) = a["allocation"]["devices"]["results"], b["allocation"]["devices"]["results"]
    assert ra["device"] == rb["device"] and ra["shareID"] != rb["shareID"]
    assert (ra["consumedCapacity"], rb["consumedCapacity"]) == (
        {"memory": "8Gi", "computeShare": "50"}, {"memory": "6Gi", "computeShare": "40"},
    )
    assert c["message"].endswith("usable: 0 of 1 matching: 1 whose capacity is used up by other claims "
                                 "[memory: 14Gi of 15Gi in use, 4Gi requested]"), c["message"]

    # Prepare: one MPS daemon for the GPU, each claim's containers limited to its part.
    refs = node.prepare([a, b])
    (gpu,) = node.uuid_of(a)
    daemon = node.nvml.mps_daemon(shared_mps_dirs(tmp / "mps", gpu))
    assert daemon is not None and daemon.running and daemon.starts == 1 and list(daemon.device_uuids) == [gpu]
    assert daemon.active_thread_percentage is None and dict(daemon.pinned_limits) == {}  # no daemon-wide defaults
    handle = node.nvml.nvmlDeviceGetHandleByUUID(gpu)
    assert node.nvml.nvmlDeviceGetComputeMode(handle) == COMPUTE_MODE_EXCLUSIVE_PROCESS
    pipe = str(shared_mps_dirs(tmp / "mps", gpu).pipe)
    for ref, (pct, mib) in zip(refs.values(), [("50", "8192M"), ("40", "6144M")]):
        assert _spec_env(tmp / "cdi", ref.uid) == {
            "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": pct, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={mib}",
        }
        spec = json.loads((tmp / "cdi" / f"{SPEC_PREFIX}{ref.uid}.json").read_text())
        assert pipe in json.dumps(spec)  # the shared daemon's pipe directory is what the containers mount

    # The daemon outlives the first claim and goes with the last.
    first, second = refs.values()
    assert node.preparer.unprepare([first]) == {first.uid: ""}
    assert node.nvml.mps_daemon(shared_mps_dirs(tmp / "mps", gpu)).running
    assert node.nvml.nvmlDeviceGetComputeMode(handle) == COMPUTE_MODE_EXCLUSIVE_PROCESS
    assert node.preparer.unprepare([second]) == {second.uid: ""}
    assert not node.nvml.mps_daemon(shared_mps_dirs(tmp / "mps", gpu)).running
    assert node.nvml.nvmlDeviceGetComputeMode(handle) == COMPUTE_MODE_DEFAULT


def test_shared_daemon_survives_restarts_and_a_rolled_back_claim(tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = SimNode(tmp, "t4-1")
    slices = build_slices(discover(node.nvml, NODE), SliceSettings(node_name=NODE, driver_name=DRIVER, shared_capacity=True))
    path = tmp / "in.yaml"
    path.write_text(HELM_CLASSES + "\n---\n" + yaml.safe_dump_all([*slices, _claim("a", "8Gi", "50"), _claim("b", "6Gi", "40")]))
    assert main(["allocate", "-f", str(path), "--feature", "DRAConsumableCapacity", "-o", "json"]) == 0
    a, b = json.loads(capsys.readouterr().out)["results"]
    node.prepare([a])
    (gpu,) = node.uuid_of(a)
    dirs = shared_mps_dirs(tmp / "mps", gpu)
    # A second claim whose prepare dies after its spec was written: rolled back, the first claim's daemon stays.
    node.crash_at = "cdi-written"
    ns, name = b["claim"].split("/")
    node.claims[(ns, name)] = {"metadata": {"namespace": ns, "name": name, "uid": "uid-b"}, "status": {"allocation": b["allocation"]}}
    ref_b = ClaimRef("uid-b", ns, name)
    assert "crash at cdi-written" in node.preparer.prepare([ref_b])["uid-b"].error
    node.crash_at = None
    node.restart()
    assert node.preparer.checkpoint.claim("uid-b") is None and node.start_report.problems == []
    daemon = node.nvml.mps_daemon(dirs)
    assert daemon is not None and daemon.running and daemon.starts == 1
    # The daemon dies with the agent down: the restarted agent starts it again for the claim that uses it.
    node.nvml.kill_mps(dirs)
    node.restart()
    assert node.start_report.mps_restarted == ["uid-0"]
    assert node.nvml.mps_daemon(dirs).running and node.nvml.mps_daemon(dirs).starts == 2
