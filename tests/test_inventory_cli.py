"""`gpu-dra inventory`: the JSON contract, the table, and clean failures."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from cli.main import main

GPU_KEYS = {
    "uuid", "productName", "architecture", "memoryBytes", "cudaComputeCapability", "pciBusID", "pcieRoot", "numaNode",
    "migCapable", "migEnabled", "nvlinkDomain", "migProfiles", "migDevices", "health",
}
PROFILE_KEYS = {
    "name", "count", "memoryBytes", "multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines", "placements",
}


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["inventory", *args, "-o", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(capsys, "--nvml", "sim:dgx-a100-mig", "--node", "gpu-node-1")
    assert doc["node"] == "gpu-node-1" and doc["driverVersion"] == "580.95.05" and doc["skipped"] == []
    assert len(doc["gpus"]) == 8
    gpu = doc["gpus"][1]
    assert set(gpu) >= GPU_KEYS
    assert gpu["productName"] == "NVIDIA A100-SXM4-80GB" and gpu["memoryBytes"] == 81920 * 2**20
    assert gpu["pciBusID"] == "0000:0f:00.0" and gpu["numaNode"] == 3 and gpu["pcieRoot"] == "pci0000:00"
    assert gpu["migCapable"] and gpu["migEnabled"]
    assert gpu["health"] == {"healthy": True, "xids": [], "lost": False}
    assert all(set(p) >= PROFILE_KEYS for p in gpu["migProfiles"])
    three = next(p for p in gpu["migProfiles"] if p["name"] == "3g.40gb")
    assert three["placements"] == [{"start": 0, "size": 4}, {"start": 4, "size": 4}] and three["multiprocessors"] == 42
    assert [(m["profile"], m["placement"]) for m in gpu["migDevices"]] == [
        ("4g.40gb", {"start": 0, "size": 4}),
        ("3g.40gb", {"start": 4, "size": 4}),
    ]
    assert {"uuid", "profile", "placement", "memoryBytes"} <= set(gpu["migDevices"][0])
    assert len({g["nvlinkDomain"] for g in doc["gpus"]}) == 1


def test_pcie_only_node_has_no_domain(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(capsys, "--nvml", "sim:l40s-4", "--node", "n")
    assert [g["nvlinkDomain"] for g in doc["gpus"]] == [None] * 4
    assert all(g["migProfiles"] == [] and not g["migCapable"] for g in doc["gpus"])


def test_default_node_is_hostname(capsys: pytest.CaptureFixture[str]) -> None:
    assert _json(capsys, "--nvml", "sim:t4-1")["node"] == socket.gethostname()


def test_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inventory", "--nvml", "sim:h100-mig", "--node", "n"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "node n  driver 580.95.05  CUDA 13.0  GPUs 8"
    assert "NVIDIA H100 80GB HBM3" in out and "MIG 3g.40gb" in out and "placement 4:2" in out


def test_real_nvml_missing_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["inventory", "--nvml", "real"])
    err = capsys.readouterr().err
    if code == 0:
        pytest.skip("this machine has a working NVIDIA driver")
    assert code == 2
    assert "NVIDIA driver" in err and "--nvml sim:dgx-h100" in err
    assert len(err.strip().splitlines()) == 1


def test_bad_profile_exits_2_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "mine.yaml"
    bad.write_text("name: mine\ndriverVersion: 580.95.05\ncudaDriverVersion: 13000\nmodels: {}\ngpus: [{model: x, uuid: nope, pciBusId: '0000:01:00.0'}]\n")
    assert main(["inventory", "--nvml", f"sim:{bad}"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: gpus.0.uuid" in err


def test_faults_file_shows_up_as_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sim.nvml.faults import write_faults

    uuid = _json(capsys, "--nvml", "sim:dgx-h100", "--node", "n")["gpus"][3]["uuid"]
    faults = tmp_path / "faults.json"
    write_faults(faults, lost=[uuid])
    doc = _json(capsys, "--nvml", f"sim:dgx-h100?faults={faults}", "--node", "n")
    assert len(doc["gpus"]) == 7
    assert [s["device"] for s in doc["skipped"]] == ["index 3"]
