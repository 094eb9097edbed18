"""Every `gpu-dra bench` subcommand runs end to end at a tiny size and prints the figures it promises, so that none
can rot unnoticed between the runs that measure them (their figures are in docs/benchmarks.md)."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import pytest

from bench.command import BENCHMARKS
from cli.main import main


def _positive(doc: dict[str, Any], *keys: str) -> None:
    for key in keys:
        assert isinstance(doc[key], int | float) and doc[key] > 0, (key, doc.get(key))


def _allocate(doc: dict[str, Any]) -> None:
    _positive(doc, "claimsPerSecond", "cpuMsPerClaim", "p99Ms", "peakRssMiB")
    assert doc["scenarios"]["a"]["allocated"] == 4 and len(doc["placementDigest"]) == 64


def _cel(doc: dict[str, Any]) -> None:
    _positive(doc, "evalsPerSecond", "evalsPerSecondShared", "p99Ms", "peakRssMiB")
    assert doc["devices"] == 20 and doc["evaluations"] == 20 * doc["selectors"] and 0 < doc["matches"] < doc["evaluations"]


def _differential(doc: dict[str, Any]) -> None:
    assert doc["scenarios"] == 2 and doc["pods"] >= 4 and doc["unexplained"] == 0
    assert doc["agreed"] + doc["knownDifferences"] == doc["pods"]


def _kubeapi(doc: dict[str, Any]) -> None:
    assert doc["calls"] == 5 and set(doc["shapes"]) == {"getPod", "putClaimStatus", "postEvent"}
    for figures in doc["shapes"].values():
        _positive(figures, "officialCpuUsPerCall", "kubeapiCpuUsPerCall")


def _memory(doc: dict[str, Any]) -> None:
    # Each side in a fresh process: every object of the tiny cluster reaches the controller's informers, and the
    # agent sees its own node's claims.
    assert (doc["nodes"], doc["pods"]) == (3, 6) and doc["controller"]["objects"]["Pod"] == 6
    assert doc["agent"]["ownClaims"] == 2 and doc["agent"]["pages"] >= 1
    _positive(doc["controller"], "baseMiB")
    _positive(doc, "peakRssMiB")


def _prepare(doc: dict[str, Any]) -> None:
    # 12 claims of 1-8 of 8 exclusive GPUs: each is prepared and unprepared once, never two on one GPU.
    assert doc["claims"] == 12 and 1 <= doc["devicesPerClaimMean"] <= 8 and doc["preparedAtOnceMean"] >= 1
    _positive(doc, "claimsPerSecond", "p50Ms", "p99Ms", "unprepareP50Ms", "unprepareP99Ms", "peakRssMiB")


def _schedule(doc: dict[str, Any]) -> None:
    assert (doc["nodes"], doc["pods"]) == (1, 2) and doc["apiCallsPerPod"]["POST pods/binding"] == 1.0
    _positive(doc, "podsPerSecond", "cpuMsPerPod", "p99Ms", "peakRssMiB")
    # The server's CPU is read from /proc in clock ticks (10 ms): two pods may cost it less than one tick. Its being
    # counted at all is checked at a size that costs several (test_controller_bench_schedule).
    assert isinstance(doc["serverCpuMsPerPod"], float) and doc["serverCpuMsPerPod"] >= 0
    assert len(doc["placementDigest"]) == 64


def _serving(doc: dict[str, Any]) -> None:
    for op in ("get", "put", "create"):
        _positive(doc[op], "perSecond", "p50Ms", "p99Ms")
        _positive(doc["asAdmin"][op], "perSecond", "p50Ms", "p99Ms")
    assert set(doc["serviceAccountCostPercent"]) == {"get", "put", "create"}
    _positive(doc["event32Watchers"], "eventsPerSecond", "p99Ms")


def _store(doc: dict[str, Any]) -> None:
    assert doc["writes"] == 16
    for mode in ("durable", "memory"):
        for writers in (1, 4, 16):
            _positive(doc[mode][f"writers{writers}"], "perSecond", "p99Ms")
    assert doc["durable"]["writers1"]["commits"] >= 1


CASES = {
    "allocate": (["--scenario", "a", "--nodes", "2", "--devices", "2"], _allocate, ()),
    "cel": (["--size", "20"], _cel, ()),
    # Real Kubernetes (sim/upstream) in a network namespace of its own: root and Go.
    "differential": (["--size", "2"], _differential, (
        pytest.mark.upstream, pytest.mark.slow, pytest.mark.process,
        pytest.mark.skipif(os.geteuid() != 0 or shutil.which("go") is None,
                           reason="the upstream control plane needs root and Go to build Kubernetes"))),
    "kubeapi": (["--size", "5"], _kubeapi, (pytest.mark.process,)),  # the API server runs in a child process
    "memory": (["--nodes", "3", "--pods", "6"], _memory, (pytest.mark.process,)),
    "prepare": (["--size", "12"], _prepare, (pytest.mark.slow,)),
    "schedule": (["--nodes", "1", "--pods", "2"], _schedule, (pytest.mark.process,)),
    "serving": (["--size", "8"], _serving, (pytest.mark.process,)),
    "store": (["--size", "16"], _store, (pytest.mark.slow,)),
}


def test_every_benchmark_has_a_smoke_run() -> None:
    assert set(CASES) == set(BENCHMARKS)


@pytest.mark.parametrize("name", [pytest.param(name, marks=CASES[name][2]) for name in sorted(CASES)])
def test_benchmark_runs_at_a_tiny_size(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv, check, _ = CASES[name]
    assert main(["bench", name, *argv, "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["benchmark"] == name
    check(doc)


def test_size_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "prepare", "--size", "0"])
    assert "--size: 0: must be at least 1" in capsys.readouterr().err
