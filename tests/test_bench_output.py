"""Every benchmark prints one result object in the same shape, as JSON, YAML or a table of the same keys."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import yaml

from bench.command import BENCHMARKS
from bench.report import render
from cli.main import main

REPO = Path(__file__).resolve().parent.parent


def test_render_is_one_object_with_the_same_keys_in_every_format() -> None:
    doc = {"benchmark": "x", "claimsPerSecond": 10.5, "p99Ms": 1.25, "scenarios": {"a": {"nodes": 3}}, "list": [1, 2]}
    assert json.loads(render(doc, "json")) == doc
    assert yaml.safe_load(render(doc, "yaml")) == doc
    rows = dict(line.split(None, 1) for line in render(doc, "table").splitlines())
    assert rows == {"benchmark": "x", "claimsPerSecond": "10.5", "p99Ms": "1.25", "scenarios.a.nodes": "3",
                    "list": "[1, 2]"}


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_every_benchmark_prints_through_the_one_report(name: str) -> None:
    module, _, func = BENCHMARKS[name].partition(":")
    tree = ast.parse((REPO / (module.replace(".", "/") + ".py")).read_text())
    entry = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == (func or "run"))
    calls = [n.func.id for n in ast.walk(entry) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    assert "emit" in calls
    # Nothing else goes to stdout from the entry point: messages about bad flags go to stderr.
    for node in ast.walk(entry):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            assert any(k.arg == "file" for k in node.keywords), ast.unparse(node)


def test_help_lists_every_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in BENCHMARKS)


@pytest.mark.slow
def test_allocate_prints_the_same_figures_in_each_format(capsys: pytest.CaptureFixture[str]) -> None:
    docs = {}
    for output in ("json", "yaml", "table"):
        assert main(["bench", "allocate", "--scenario", "a", "--nodes", "4", "--devices", "2", "-o", output]) == 0
        docs[output] = capsys.readouterr().out
    as_json = json.loads(docs["json"])
    as_yaml = yaml.safe_load(docs["yaml"])
    table = dict(line.split(None, 1) for line in docs["table"].splitlines())
    assert as_json["benchmark"] == as_yaml["benchmark"] == table["benchmark"] == "allocate"
    # Timing figures differ run to run; the shape and the deterministic outcome do not.
    assert set(as_json) == set(as_yaml)
    assert {k for k in table if "." not in k} == set(as_json) - {"scenarios"}
    for doc in (as_json, as_yaml):
        assert doc["scenarios"]["a"]["allocated"] == 8 and {"claimsPerSecond", "p50Ms", "p99Ms", "peakRssMiB"} <= set(doc)
    assert as_json["placementDigest"] == as_yaml["placementDigest"] == table["placementDigest"]
    assert table["scenarios.a.allocated"] == "8"


def test_bad_flag_value_is_reported_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "allocate", "--nodes", "0"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "--nodes 0: must be at least 1" in captured.err


def test_allocate_runs_several_sizes_in_one_process_and_prints_the_scale_curve(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "allocate", "--scenario", "a", "--devices", "2", "--nodes", "3,6", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    curve = doc["curve"]["a"]
    assert [(r["nodes"], r["claims"]) for r in curve] == [(3, 6), (6, 12)]
    assert doc["scenarios"]["a"]["nodes"] == 6 and doc["placementDigest"] == curve[-1]["placementDigest"]
    assert doc["cpuMsPerClaimGrowth"]["a"] == round(curve[-1]["cpuMsPerClaim"] / curve[0]["cpuMsPerClaim"], 2)


@pytest.mark.parametrize(("argv", "message"), [
    (["bench", "allocate", "--nodes", "10,x"], "expected a whole number of nodes, or several separated by commas"),
    (["bench", "allocate", "--nodes", "10,0"], "--nodes 0: must be at least 1"),
    (["bench", "schedule", "--nodes", "10,20"], "--nodes 10,20: schedule takes one cluster size"),
])
def test_bad_node_sizes_are_refused(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse refuses a malformed value itself
        code = int(exit_.code or 0)
    assert code == 2 and message in capsys.readouterr().err


def test_memory_bench_measures_both_sides(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "memory", "--nodes", "20", "--pods", "200", "--seed", "3", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["benchmark"] == "memory" and (doc["nodes"], doc["pods"], doc["seed"]) == (20, 200, 3)
    assert doc["controller"]["objects"] == {"Node": 20, "ResourceSlice": 20, "DeviceClass": 2, "Pod": 200,
                                            "ResourceClaim": 200}
    # Pods are spread round-robin over the nodes: the agent of the first node keeps its 10 claims.
    assert doc["agent"]["ownClaims"] == 10
    for side in ("controller", "agent"):
        assert doc[side]["peakMiB"] >= doc[side]["steadyMiB"] >= 0 and doc[side]["baseMiB"] > 0
    assert doc["controller"]["steadyMiB"] > 0
    assert doc["peakRssMiB"] >= doc["controller"]["baseMiB"]
