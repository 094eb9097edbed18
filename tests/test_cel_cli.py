"""`gpu-dra cel`: device files, slice files, output and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import main

DEVICE = """\
driver: gpu.nvidia.com
attributes:
  productName: {string: H100}
  index: {int: 0}
  driverVersion: {version: 550.54.15}
capacity:
  memory: {value: 80Gi}
"""

SLICE = """\
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: node-a-gpu}
spec:
  driver: gpu.nvidia.com
  nodeName: node-a
  pool: {name: node-a, generation: 1, resourceSliceCount: 1}
  devices:
  - name: gpu-0
    attributes: {productName: {string: H100}}
    capacity: {memory: {value: 80Gi}}
  - name: gpu-1
    attributes: {productName: {string: L4}}
    capacity: {memory: {value: 24Gi}}
---
apiVersion: v1
kind: Node
metadata: {name: node-a}
"""


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = main(["cel", *argv, "-o", "json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture
def device_file(tmp_path: Path) -> str:
    path = tmp_path / "h100.yaml"
    path.write_text(DEVICE)
    return str(path)


@pytest.fixture
def slice_file(tmp_path: Path) -> str:
    path = tmp_path / "slices.yaml"
    path.write_text(SLICE)
    return str(path)


def test_device_file_match(capsys: pytest.CaptureFixture[str], device_file: str) -> None:
    code, out = run_json(capsys, 'device.attributes["gpu.nvidia.com"].productName == "H100"', "--device", device_file)
    assert code == 0
    assert out == {"compileError": None, "results": [{"device": "h100.yaml", "match": True}]}


def test_slices_every_device(capsys: pytest.CaptureFixture[str], slice_file: str) -> None:
    expr = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) > 0'
    code, out = run_json(capsys, expr, "-f", slice_file)
    assert code == 0
    assert out["results"] == [{"device": "gpu.nvidia.com/node-a/gpu-0", "match": True},
                              {"device": "gpu.nvidia.com/node-a/gpu-1", "match": False}]


def test_compile_error_exit_1(capsys: pytest.CaptureFixture[str], device_file: str) -> None:
    code, out = run_json(capsys, "device.driver", "--device", device_file)
    assert code == 1
    assert out["compileError"] == "must evaluate to bool or the unknown type, not string"
    assert out["results"] == []


def test_runtime_error_exit_1(capsys: pytest.CaptureFixture[str], device_file: str) -> None:
    code, out = run_json(capsys, 'device.attributes["gpu.nvidia.com"].missing == 1', "--device", device_file)
    assert code == 1
    assert out["results"] == [{"device": "h100.yaml", "error": "no such key: missing"}]


@pytest.mark.parametrize(("expression", "meant"), [
    ('device.attributes["gpu.nvidia.com"].model == "H100"', "did you mean productName?"),  # by meaning
    ('device.attributes["gpu.nvidia.com"].prodcutName == "H100"', "did you mean productName?"),  # by spelling
    ('device.attributes["gpu.nvidia.com"].memory == 80', 'did you mean device.capacity["gpu.nvidia.com"].memory?'),
])
def test_runtime_error_suggests_what_was_meant(capsys: pytest.CaptureFixture[str], device_file: str,
                                               expression: str, meant: str) -> None:
    code, out = run_json(capsys, expression, "--device", device_file)
    assert code == 1
    (result,) = out["results"]
    assert result["error"].startswith("no such key: ") and result["hint"] == meant


def test_strict_rejects_gated_field(capsys: pytest.CaptureFixture[str], device_file: str) -> None:
    code, out = run_json(capsys, "device.allowMultipleAllocations", "--device", device_file, "--strict")
    assert code == 1
    assert "allowMultipleAllocations" in out["compileError"]
    code, out = run_json(capsys, "device.allowMultipleAllocations", "--device", device_file)
    assert code == 0 and out["results"][0]["match"] is False


def test_unreadable_input_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["cel", "true", "--device", str(tmp_path / "absent.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("driver: gpu.nvidia.com\nattributes:\n  a: {int: x}\n")
    assert main(["cel", "true", "--device", str(bad)]) == 2
    assert "attributes[a].int: must be an integer" in capsys.readouterr().err


def test_no_slices_exit_2(capsys: pytest.CaptureFixture[str], device_file: str) -> None:
    assert main(["cel", "true", "-f", device_file]) == 2
    assert "no ResourceSlice devices" in capsys.readouterr().err


def test_table_output(capsys: pytest.CaptureFixture[str], slice_file: str) -> None:
    assert main(["cel", 'device.attributes["gpu.nvidia.com"].productName == "L4"', "-f", slice_file]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["DEVICE", "RESULT"]
    assert lines[1].split() == ["gpu.nvidia.com/node-a/gpu-0", "no", "match"]
    assert lines[2].split() == ["gpu.nvidia.com/node-a/gpu-1", "match"]


def test_options_before_the_expression(capsys: pytest.CaptureFixture[str], slice_file: str, tmp_path: Path) -> None:
    expr = 'device.attributes["gpu.nvidia.com"].productName == "L4"'
    assert main(["cel", "-f", slice_file, expr, "-o", "json"]) == 0
    after = json.loads(capsys.readouterr().out)
    assert main(["cel", expr, "-f", slice_file, "-o", "json"]) == 0
    assert after == json.loads(capsys.readouterr().out)
    assert [r["match"] for r in after["results"]] == [False, True]
    # Two slice files and the expression last: the files stay files.
    other = tmp_path / "more.yaml"
    other.write_text(SLICE)
    assert main(["cel", "-o", "json", "-f", slice_file, str(other), expr]) == 0
    assert len(json.loads(capsys.readouterr().out)["results"]) == 4


def test_no_expression_is_a_usage_error(capsys: pytest.CaptureFixture[str], slice_file: str) -> None:
    # The last word of -f is a file that exists: not taken for an expression.
    assert main(["cel", "-f", slice_file, slice_file]) == 2
    assert "the following arguments are required: EXPRESSION" in capsys.readouterr().err
    assert main(["cel", "-f", slice_file]) == 2
    assert "the following arguments are required: EXPRESSION" in capsys.readouterr().err
