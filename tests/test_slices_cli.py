"""`gpu-dra slices`: discovery over the simulator, printed as a kind: List."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from driver.discovery import discover
from driver.nvml import load_backend
from driver.slices import SliceSettings, build_slices
from cli.main import main

PROFILES_DIR = Path(__file__).resolve().parent.parent / "sim" / "nvml" / "profiles"


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["slices", *args])
    out, err = capsys.readouterr()
    return code, out, err


def all_devices(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [d for s in doc["items"] for d in s["spec"].get("devices", [])]


def test_json_output_is_a_list_of_the_nodes_slices(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "--nvml", "sim:dgx-h100", "--node", "worker-1", "-o", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["apiVersion"] == "v1" and doc["kind"] == "List"
    expected = build_slices(discover(load_backend("sim:dgx-h100", node="worker-1"), "worker-1"), SliceSettings(node_name="worker-1"))
    assert doc["items"] == expected
    assert len(all_devices(doc)) == 8
    for s in doc["items"]:
        assert s["spec"]["nodeName"] == "worker-1" and s["spec"]["pool"]["name"] == "worker-1"
        kubernetes_validate.validate(s, "1.35.0", strict=True)


def test_yaml_is_the_default_and_matches_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out_yaml, _ = run_cli(capsys, "--nvml", "sim:h100-mig", "--node", "n1")
    assert code == 0
    code, out_json, _ = run_cli(capsys, "--nvml", "sim:h100-mig", "--node", "n1", "-o", "json")
    assert code == 0
    assert yaml.safe_load(out_yaml) == json.loads(out_json)


def test_mig_profile_publishes_mig_devices(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--nvml", "sim:h100-mig", "--node", "n1", "-o", "json")
    assert code == 0
    inv = discover(load_backend("sim:h100-mig", node="n1"), "n1")
    devices = all_devices(json.loads(out))
    migs = [d for d in devices if d["attributes"]["type"]["string"] == "mig"]
    assert len(migs) == sum(len(g.mig_devices) for g in inv.gpus if g.mig_enabled) > 0
    assert len(devices) - len(migs) == sum(1 for g in inv.gpus if not g.mig_enabled)


def test_partitionable_and_driver_name(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys, "--nvml", "sim:dgx-h100", "--node", "n1", "--partitionable", "--driver-name", "gpu.example.com", "-o", "json"
    )
    assert code == 0
    doc = json.loads(out)
    assert {s["spec"]["driver"] for s in doc["items"]} == {"gpu.example.com"}
    counter_sets = [c for s in doc["items"] for c in s["spec"].get("sharedCounters", [])]
    assert len(counter_sets) == 8
    assert all(len(s["spec"].get("devices", [])) <= 64 for s in doc["items"])
    assert all(s["metadata"]["name"].startswith("n1-gpu.example.com-") for s in doc["items"])


def test_profile_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    profile = tmp_path / "my-node.yaml"
    profile.write_text((PROFILES_DIR / "t4-1.yaml").read_text())
    code, out, err = run_cli(capsys, "--nvml", f"sim:{profile}", "--node", "n1", "-o", "json")
    assert code == 0, err
    (device,) = all_devices(json.loads(out))
    assert device["attributes"]["productName"]["string"] == "Tesla T4"


def test_unknown_profile_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "--nvml", "sim:no-such-profile", "--node", "n1")
    assert code == 2 and out == ""
    assert "sim:no-such-profile" in err and "dgx-h100" in err  # names the value and what is accepted


def test_invalid_node_name_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "--nvml", "sim:t4-1", "--node", "Bad_Node")
    assert code == 2 and out == ""
    assert "node_name 'Bad_Node'" in err and "DNS subdomain" in err


def test_invalid_driver_name_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "--nvml", "sim:t4-1", "--node", "n1", "--driver-name", "Not A Driver")
    assert code == 2
    assert "driver_name 'Not A Driver'" in err
