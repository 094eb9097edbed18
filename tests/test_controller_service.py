"""The controller as a service: metrics endpoint, cluster-mode explanations, the command and SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from controller.explanation_writer import REASON_UNSCHEDULABLE
from gpudra.logfmt import LogfmtFormatter, format_fields
from controller.metrics import sample_value
from controller_helpers import claims_of, create_all, devices_of, events_for, gpu_class, gpu_slice, manager, node, pod, template, claim

ROOT = Path(__file__).resolve().parents[1]


def test_metrics_endpoint_exposes_the_counters(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [gpu_class(), node("node-a"), gpu_slice("node-a", [("g0", "nvl"), ("g1", "nvl")]),
                     template("one", 1), pod("fits", templates={"gpu": "one"}),
                     template("three", 3), pod("too-big", templates={"gpu": "three"}),
                     claim("g-0", 1, labels={"gpu.nvidia.com/gang": "g", "gpu.nvidia.com/gang-size": "2"})])
    m = manager(api, metrics_port=0)
    m.start()
    try:
        assert m.wait_synced(10)
        m.step()
        port = m.metrics_port
        assert port
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    finally:
        m.stop()
    assert sample_value(text, "gpudra_controller_allocations_total", {"path": "scheduler"}) == 1
    assert sample_value(text, "gpudra_controller_pod_bindings_total", {"kind": "dra"}) == 1
    assert sample_value(text, "gpudra_controller_allocation_failures_total", {"reason": "unschedulable"}) >= 1
    assert sample_value(text, "gpudra_controller_claims_created_total") == 2
    assert sample_value(text, "gpudra_controller_gangs", {"state": "waiting"}) == 1
    assert sample_value(text, "gpudra_controller_leader") == 1
    assert sample_value(text, "gpudra_controller_reconcile_seconds_count", {"concern": "scheduler"}) >= 1


def test_cluster_mode_explains_pending_pods_without_allocating(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [gpu_class(), node("node-a"), gpu_slice("node-a", [("g0", "nvl"), ("g1", "nvl")]),
                     claim("small", 1), pod("ok", claims={"gpu": "small"}),
                     claim("large", 3), pod("waiting", claims={"gpu": "large"})])
    report = manager(api, embedded=False).step()
    assert report.pods_unschedulable == 1
    (event,) = [e for e in events_for(api, "waiting") if e["reason"] == REASON_UNSCHEDULABLE]
    assert event["message"].startswith("0/1 nodes are available: 1 node: ")
    claims = claims_of(api)
    assert claims["large"]["metadata"]["annotations"]["gpu.nvidia.com/explanation"] == event["message"]
    # kube-scheduler allocates in a real cluster: the controller neither allocates nor binds.
    assert not devices_of(claims["small"]) and not devices_of(claims["large"])
    assert not events_for(api, "ok")
    assert not api.get("Pod", "ok", "default")["spec"].get("nodeName")


def test_cluster_mode_explains_extended_resource_pods_through_the_claim_kube_scheduler_would_make(apiserver: Any) -> None:
    api = apiserver.api
    backed = {**gpu_class(), "spec": {**gpu_class()["spec"], "extendedResourceName": "nvidia.com/gpu"}}
    create_all(api, [backed, node("node-a"), gpu_slice("node-a", [("g0", "nvl"), ("g1", "nvl")]),
                     pod("fits", gpus=2), pod("too-many", gpus=3)])
    assert manager(api, embedded=False).step().pods_unschedulable == 1
    (event,) = [e for e in events_for(api, "too-many") if e["reason"] == REASON_UNSCHEDULABLE]
    assert event["message"] == (
        "nvidia.com/gpu: 3 (container main) is served by DeviceClass gpu.nvidia.com, through the claim "
        "kube-scheduler makes for the pod (too-many-extended-resources-...): 0/1 nodes are available: 1 node: request "
        "container-0-request-0 of claim default/too-many-extended-resources needs 3 devices; the node has only 2 "
        "matching devices in all")
    assert not events_for(api, "fits") and not claims_of(api)  # kube-scheduler makes the claim, not us


def test_an_extended_resource_a_device_plugin_serves_is_left_to_kube_schedulers_fit(apiserver: Any) -> None:
    api = apiserver.api
    backed = {**gpu_class(), "spec": {**gpu_class()["spec"], "extendedResourceName": "nvidia.com/gpu"}}
    create_all(api, [backed, node("node-a"), node("legacy", gpus=1), gpu_slice("node-a", [("g0", "nvl")]),
                     pod("too-many", gpus=3)])
    assert manager(api, embedded=False).step().pods_unschedulable == 0
    assert not events_for(api, "too-many")


def test_logs_are_key_value() -> None:
    import logging

    record = logging.LogRecord("gpudra.controller", logging.INFO, __file__, 1, "pod bound", None, None)
    record.pod = "default/p"
    record.message_with_space = "two words"
    line = LogfmtFormatter().format(record)
    assert " level=info logger=gpudra.controller msg=\"pod bound\" pod=default/p message_with_space=\"two words\"" in line
    assert format_fields({"a": 'say "hi"'}) == 'a="say \\"hi\\""'


@pytest.mark.process
def test_command_runs_and_releases_the_lease_on_sigterm(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [gpu_class(), node("node-a"), gpu_slice("node-a", [("g0", "nvl")]),
                     template("one", 1), pod("p", templates={"gpu": "one"})])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "controller", "--kubeconfig", str(apiserver.kubeconfig), "--embedded",
         "--identity", "cmd", "--lease-duration", "15", "--renew-deadline", "10", "--retry-period", "0.2"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not api.get("Pod", "p", "default")["spec"].get("nodeName"):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the controller did not bind the pod"
            time.sleep(0.05)
        assert api.get("Lease", "gpu-dra-controller", "kube-system")["spec"]["holderIdentity"] == "cmd"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert api.get("Lease", "gpu-dra-controller", "kube-system")["spec"]["holderIdentity"] == ""
    assert "msg=\"pod bound\"" in stderr and "node=node-a" in stderr
    assert "msg=\"lease released\"" in stderr


@pytest.mark.process
def test_command_rejects_bad_timings_with_the_flag_names() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "controller", "--lease-duration", "5", "--renew-deadline", "10"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert "--lease-duration (5.0) must be greater than --renew-deadline (10.0)" in result.stderr
