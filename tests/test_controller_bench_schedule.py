"""`gpu-dra bench schedule` on a small shape: it places every pod and its verification catches a double allocation."""

from __future__ import annotations

from typing import Any

import pytest

from bench.podload import pod_object
from bench.schedule import BenchFailed, Shape, measure, verify
from controller_helpers import create_all, gpu_class, node, sim_slices, template
from gpudra.kubeapi import KubeApi


@pytest.mark.process
def test_small_run_binds_every_pod_and_reports_figures() -> None:
    doc = measure(3, Shape(nodes=3, pods=8, timeout=60.0))
    assert doc["benchmark"] == "schedule" and doc["pods"] == 8 and doc["nodes"] == 3
    assert doc["gpusRequested"] <= doc["gpus"] == 24
    assert doc["podsPerSecond"] > 0 and 0 < doc["p50Ms"] <= doc["p99Ms"] <= doc["maxMs"]
    assert doc["controllerPasses"] >= 1


def test_more_gpus_than_the_cluster_has_is_refused() -> None:
    with pytest.raises(BenchFailed, match="more than the 8"):
        measure(1, Shape(nodes=1, pods=40))


def _allocated(api: KubeApi, claim_name: str, pod_name: str, device: str) -> None:
    pod_obj = api.get("Pod", pod_name, "default")
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": claim_name, "namespace": "default",
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod_name,
                                              "uid": pod_obj["metadata"]["uid"], "controller": True}]},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}
    created = api.create("ResourceClaim", body)
    created["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpus", "driver": "gpu.nvidia.com", "pool": "n1", "device": device}]}}}
    api.replace_status("ResourceClaim", created)
    api.bind_pod("default", pod_name, "n1")


def test_verify_reports_a_device_allocated_twice(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [gpu_class(), node("n1"), *sim_slices("n1"), template("gpu-1")])
    create_all(api, [pod_object("pod-a", 1), pod_object("pod-b", 1)])
    device = sim_slices("n1")[0]["spec"]["devices"][0]["name"]
    _allocated(api, "a", "pod-a", device)
    _allocated(api, "b", "pod-b", device)
    with pytest.raises(BenchFailed, match=f"gpu.nvidia.com/n1/{device} allocated twice"):
        verify(api, {"pod-a": 1, "pod-b": 1})


@pytest.mark.process
def test_run_reports_cpu_calls_digest_and_honours_rate(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse
    import json

    from bench.schedule import run

    args = argparse.Namespace(seed=3, nodes=2, pods=6, rate=30.0, output="json")
    assert run(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["nodes"], doc["pods"], doc["rate"]) == (2, 6, 30.0)
    assert doc["seconds"] >= 5 / 30.0  # the last pod was created 5/30 s after the first
    assert doc["cpuMsPerPod"] > 0 and doc["serverCpuMsPerPod"] > 0 and doc["serverPeakRssMiB"] > 0
    assert doc["apiCallsPerPod"]["POST pods/binding"] == 1.0 and "GET pods" not in doc["apiCallsPerPod"]
    # Claims are created with their finalizer: no separate update adds it.
    assert "PUT resourceclaims" not in doc["apiCallsPerPod"] and doc["apiCallsPerPod"]["PUT resourceclaims/status"] == 1.0
    assert len(doc["placementDigest"]) == 64 and doc["snapshotRebuilds"] >= 1
    # The same seed and shape place the same way.
    again = measure(3, Shape(nodes=2, pods=6, timeout=60.0))
    assert again["placementDigest"] == doc["placementDigest"]


def test_bad_sizes_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from bench.schedule import run

    assert run(argparse.Namespace(seed=1, nodes=0, pods=None, rate=None, output="json")) == 2
    assert "--nodes and --pods must be at least 1" in capsys.readouterr().err


@pytest.mark.process
def test_embedded_scheduler_placements_are_pinned() -> None:
    # Recorded with `bench schedule --nodes 10 --pods 40` on the scheduler that relisted claims and rebuilt the
    # snapshot every pass and expanded every pod's templates before binding any (commit 88fda9d); the 100 x 400
    # default shape gives 65e113a9... on both.
    doc = measure(1, Shape(nodes=10, pods=40, timeout=120.0))
    assert doc["placementDigest"] == "51a47c94f2f068ce7aef3a7cfe804cd380d8cfa1510f8fa6d745fee2822ac388"
