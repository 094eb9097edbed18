"""Our allocator against kube-scheduler 1.37's DRA allocator (k8s.io/dynamic-resource-allocation/structured,
built from its Go module by `sim/upstream/build.sh drabench`), claim by claim on the same objects:
`gpu-dra bench allocate --kubernetes upstream`. Without Go or the built tool the upstream tests skip with the
reason, unless GPU_DRA_UPSTREAM=required (CI), where that fails them."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import pytest

from bench.allocate import Size
from bench.allocate_upstream import compare
from tests.upstream_helpers import REQUIRED_ENV

ROOT = Path(__file__).resolve().parent.parent


def _unavailable(why: str) -> NoReturn:
    if os.environ.get(REQUIRED_ENV) == "required":
        pytest.fail(f"{REQUIRED_ENV}=required but {why}", pytrace=False)
    pytest.skip(why)


def _drabench() -> str:
    if shutil.which("go") is None:
        _unavailable("go is not installed (kube-scheduler's allocator is built from its Go module)")
    from sim.upstream.drabench import BuildError, binary

    try:
        return str(binary())
    except BuildError as exc:  # e.g. no module proxy to fetch the pinned modules from
        _unavailable(f"drabench could not be built: {exc}")


# Marked as the other tests of the upstream backend: they need Go, start processes and take seconds.
@pytest.mark.parametrize("scenario", ["a", "b"])
@pytest.mark.parametrize("seed", [1, 3])
@pytest.mark.upstream
@pytest.mark.slow
@pytest.mark.process
def test_kube_schedulers_allocator_agrees_claim_by_claim(scenario: str, seed: int) -> None:
    from bench.allocate_upstream import measure

    result = measure(scenario, seed, Size(30, 8), _drabench())
    # Both passes: nodes searched by both sides, and kube-scheduler's allocator told our node.
    for pass_ in ("agreement", "agreementGivenNode"):
        agreement = result[pass_]
        assert agreement["agreementPercent"] == 100.0, (pass_, agreement["examples"])
        assert agreement["claims"] == result["claims"] > 0 and agreement["sameDevices"] > 0
        assert agreement["fitAgree"] == agreement["claims"]
    kube = result["kubeScheduler"]
    assert kube["allocated"] == result["ours"]["allocated"] and kube["cpuMsPerClaim"] > 0
    assert kube["givenNode"]["nodesTriedPerClaim"] == 1.0 and kube["nodesTriedPerClaim"] >= 1.0
    assert "DRAPrioritizedList" in kube["features"] and "DRADeviceTaints" in kube["features"]


@pytest.mark.upstream
@pytest.mark.slow
@pytest.mark.process
def test_claims_that_fit_nowhere_fit_nowhere_in_both() -> None:
    from bench.allocate_upstream import measure

    # 4 GPUs a node: an 8-GPU claim fits on no node (and a 4-GPU one only where all four share an NVLink domain),
    # so kube-scheduler's allocator tries every node for those and must find none.
    result = measure("b", 1, Size(20, 4), _drabench())
    for pass_ in ("agreement", "agreementGivenNode"):
        agreement = result[pass_]
        assert agreement["agreementPercent"] == 100.0, (pass_, agreement["examples"])
        assert agreement["unplacedInBoth"] > 0 and agreement["sameDevices"] > 0
    assert result["kubeScheduler"]["givenNode"]["triedOnEveryNode"] == result["agreement"]["unplacedInBoth"]


@pytest.mark.upstream
@pytest.mark.slow
@pytest.mark.process
def test_drabench_reads_a_file_as_it_reads_stdin(tmp_path: Path) -> None:
    from bench.allocate import scenario_b
    from bench.allocate_upstream import _defaulted, kube_features
    from gpudra.features import Features

    scenario = scenario_b(2, Size(4, 8))
    body = json.dumps({"features": kube_features(Features()), "classes": scenario.classes, "slices": scenario.slices,
                       "steps": [{"claim": _defaulted(c), "node": ""} for c in scenario.claims]})
    (tmp_path / "objects.json").write_text(body)
    tool = _drabench()
    piped = subprocess.run([tool], input=body, capture_output=True, text=True, timeout=60, check=True)
    read = subprocess.run([tool, str(tmp_path / "objects.json")], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(piped.stdout)["results"] == json.loads(read.stdout)["results"]
    assert len(json.loads(read.stdout)["results"]) == len(scenario.claims) > 0
    missing = subprocess.run([tool, str(tmp_path / "absent.json")], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "absent.json" in missing.stderr


@pytest.mark.upstream
@pytest.mark.slow
@pytest.mark.process
def test_the_cli_prints_both_sides_and_the_agreement() -> None:
    _drabench()  # built (or found cached) before the CLI runs it
    done = subprocess.run([sys.executable, "-m", "cli", "bench", "allocate", "--kubernetes", "upstream", "--scenario", "b",
                           "--nodes", "12", "-o", "json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["kubernetes"] == "upstream" and doc["agreementPercent"] == 100.0
    b = doc["scenarios"]["b"]
    assert b["nodes"] == 12 and b["ours"]["cpuMsPerClaim"] > 0 and b["kubeScheduler"]["cpuMsPerClaim"] > 0
    assert b["ours"]["claimsPerSecond"] > 0 and b["kubeScheduler"]["claimsPerSecond"] > 0
    assert b["kubeScheduler"]["givenNode"]["cpuMsPerClaim"] > 0
    assert doc["cpuRatio"]["b"] == b["cpuRatio"] > 0 and doc["cpuRatioGivenNode"]["b"] == b["cpuRatioGivenNode"] > 0
    assert doc["cpuMsPerClaim"] == b["ours"]["cpuMsPerClaim"] and doc["claims"] == b["claims"]


def test_a_difference_is_reported_with_both_answers() -> None:
    ours = [("ns/c0", "n1", [{"devices": {"results": [{"pool": "n1", "device": "gpu-0"}]}}]),
            ("ns/c1", None, []),
            ("ns/c2", "n1", [{"devices": {"results": [{"pool": "n1", "device": "gpu-1"}]}}])]
    theirs = [{"node": "n1", "devices": ["n1/gpu-0"]}, {"devices": [], "error": "cannot allocate all claims"},
              {"node": "n1", "devices": ["n1/gpu-2"]}]
    result = compare(ours, theirs)
    assert (result["agree"], result["sameDevices"], result["unplacedInBoth"], result["disagree"]) == (2, 1, 1, 1)
    assert result["fitAgree"] == 3  # c2 fits in both, on other devices
    assert result["examples"] == [{"claim": "ns/c2", "ours": {"node": "n1", "devices": ["n1/gpu-1"]},
                                   "kubeScheduler": {"node": "n1", "devices": ["n1/gpu-2"], "error": ""}}]


def test_another_node_or_a_fit_on_one_side_only_is_a_difference() -> None:
    ours = [("ns/c0", "n1", [{"devices": {"results": [{"pool": "n1", "device": "gpu-0"}]}}]), ("ns/c1", None, [])]
    theirs = [{"node": "n2", "devices": ["n1/gpu-0"]}, {"node": "n2", "devices": ["n2/gpu-0"]}]
    result = compare(ours, theirs)
    assert (result["agree"], result["disagree"], result["fitAgree"]) == (0, 2, 1)
    assert [e["claim"] for e in result["examples"]] == ["ns/c0", "ns/c1"]


@pytest.mark.process
def test_build_names_its_targets() -> None:
    done = subprocess.run(["bash", str(ROOT / "sim/upstream/build.sh"), "kubelet"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 2 and "usage: build.sh [cluster|drabench]" in done.stderr


@pytest.mark.process
def test_one_size_at_a_time_against_upstream() -> None:
    done = subprocess.run([sys.executable, "-m", "cli", "bench", "allocate", "--kubernetes", "upstream",
                           "--nodes", "10,20"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--nodes: one size with --kubernetes upstream" in done.stderr


def test_the_upstream_allocate_is_dispatched_by_the_bench_command() -> None:
    from bench.command import UPSTREAM, register

    parser = argparse.ArgumentParser()
    register(parser)
    args = parser.parse_args(["allocate", "--kubernetes", "upstream"])
    assert args.kubernetes == "upstream" and UPSTREAM[args.benchmark] == "bench.allocate_upstream"
