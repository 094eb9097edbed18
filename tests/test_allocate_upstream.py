"""Our allocator against kube-scheduler 1.37's DRA allocator (k8s.io/dynamic-resource-allocation/structured,
built from its Go module by sim/upstream/drabench.py), claim by claim on the same objects:
`gpu-dra bench allocate --kubernetes upstream`."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.allocate import Size
from bench.allocate_upstream import compare
from tests.upstream_helpers import REQUIRED_ENV

ROOT = Path(__file__).resolve().parent.parent


def _drabench() -> str:
    if shutil.which("go") is None:
        if os.environ.get(REQUIRED_ENV) == "required":
            pytest.fail(f"{REQUIRED_ENV}=required but go is not installed", pytrace=False)
        pytest.skip("go is not installed (kube-scheduler's allocator is built from its Go module)")
    from sim.upstream.drabench import binary

    return str(binary())


@pytest.mark.upstream
@pytest.mark.process
@pytest.mark.parametrize("scenario", ["a", "b"])
def test_kube_schedulers_allocator_agrees_claim_by_claim(scenario: str) -> None:
    from bench.allocate_upstream import measure

    result = measure(scenario, 3, Size(30, 8), _drabench())
    agreement = result["agreement"]
    assert agreement["agreementPercent"] == 100.0, agreement["examples"]
    assert agreement["claims"] == result["claims"] > 0 and agreement["sameDevices"] > 0
    kube = result["kubeScheduler"]
    assert kube["allocated"] == result["ours"]["allocated"] and kube["cpuMsPerClaim"] > 0
    assert "DRAPrioritizedList" in kube["features"] and "DRADeviceTaints" in kube["features"]


@pytest.mark.upstream
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
    assert doc["cpuRatio"]["b"] == b["cpuRatio"]


def test_a_difference_is_reported_with_both_answers() -> None:
    ours = [("ns/c0", "n1", [{"devices": {"results": [{"pool": "n1", "device": "gpu-0"}]}}]),
            ("ns/c1", None, []),
            ("ns/c2", "n1", [{"devices": {"results": [{"pool": "n1", "device": "gpu-1"}]}}])]
    theirs = [{"node": "n1", "devices": ["n1/gpu-0"]}, {"devices": [], "error": "cannot allocate all claims"},
              {"node": "n1", "devices": ["n1/gpu-2"]}]
    result = compare(ours, theirs)
    assert (result["agree"], result["sameDevices"], result["unplacedInBoth"], result["disagree"]) == (2, 1, 1, 1)
    assert result["examples"] == [{"claim": "ns/c2", "ours": {"node": "n1", "devices": ["n1/gpu-1"]},
                                   "kubeScheduler": {"node": "n1", "devices": ["n1/gpu-2"], "error": ""}}]


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
