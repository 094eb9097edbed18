"""`gpu-dra plugin` as a process, wired as the manifests run it: per-pod sockets, the grpc health service, and
the coexistence guard (a Node advertising nvidia.com/gpu from another device plugin gets no slices until the
resource is gone)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc

import pytest

from driver.nodeguard import CONDITION_TYPE
from gpudra.kubeletapi.grpchealth.v1 import api_pb2 as health_pb
from gpudra.kubeletapi.grpchealth.v1 import api_pb2_grpc as health_grpc
from sim.kubelet.dra import KubeletSim
from tests.plugin_helpers import DRIVER, NODE, short_tmp, stop_process

REPO = Path(__file__).resolve().parent.parent
POD_UID = "3f1c0d2e-5555-4a6b-8c7d-000000000042"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(cond, what: str, timeout: float = 60.0) -> Any:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _serving(port: int) -> bool:
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            status = health_grpc.HealthStub(ch).Check(health_pb.HealthCheckRequest(), timeout=10).status
    except grpc.RpcError:
        return False
    return bool(status == health_pb.HealthCheckResponse.SERVING)


@pytest.mark.process
def test_plugin_process_guard_health_and_pod_sockets(apiserver: Any) -> None:
    api = apiserver.api
    api.create("Node", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    api.patch("Node", NODE, {"status": {"capacity": {"nvidia.com/gpu": "4"}, "allocatable": {"nvidia.com/gpu": "4"},
                                        "conditions": [{"type": "Ready", "status": "True"}]}}, subresource="status")
    port = _free_port()
    with short_tmp() as work:
        env = {**os.environ, "PYTHONPATH": str(REPO), "POD_UID": POD_UID}
        with open(work / "plugin.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "plugin", "--node", NODE, "--nvml", "sim:v100-4",
                 "--kubeconfig", str(apiserver.kubeconfig), "--kubelet-dir", str(work / "kubelet"),
                 "--cdi-dir", str(work / "cdi"), "--healthcheck-port", str(port), "--node-resync-seconds", "1"],
                env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log,
            )
        kubelet = KubeletSim(work / "kubelet")
        try:
            plugin = kubelet.wait_for_plugin(DRIVER, timeout=60)
            assert plugin.endpoint == str(work / "kubelet" / "plugins" / DRIVER / f"dra-{POD_UID}.sock")
            assert (work / "kubelet" / "plugins_registry" / f"{DRIVER}-{POD_UID}-reg.sock").is_socket()
            _wait(lambda: _serving(port), "health SERVING")
            cond = _wait(lambda: next((c for c in api.get("Node", NODE)["status"].get("conditions", [])
                                       if c["type"] == CONDITION_TYPE), None), "conflict condition")
            assert cond["status"] == "True"
            time.sleep(2)
            assert [s for s in api.list("ResourceSlice")[0] if s["spec"]["nodeName"] == NODE] == []
            # The other device plugin is removed from the node: the agent publishes.
            api.patch("Node", NODE, {"status": {"capacity": {"nvidia.com/gpu": "0"}, "allocatable": {"nvidia.com/gpu": "0"}}},
                      subresource="status")
            _wait(lambda: [s for s in api.list("ResourceSlice")[0] if s["spec"]["nodeName"] == NODE], "slices")
        finally:
            kubelet.close()
            assert stop_process(proc) == 0, (work / "plugin.log").read_text()[-3000:]
        # Its own sockets went with it.
        assert not list((work / "kubelet" / "plugins_registry").glob("*.sock"))
