"""Resource health in pod status (KEP-4680), as a 1.36+ kubelet writes it from the driver's health stream: the pure
rules, and end to end over the node agent's real sockets with the kubelet simulator against the embedded server,
read back with kubectl."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.inventory import Health
from driver.slices import gpu_device_name
from sim.kubelet.dra import HealthUpdate, KubeletDialect, PreparedDevice
from sim.kubelet.podhealth import HealthCache, allocated_resources_status
from sim.kubelet.pods import NodeKubelet
from tests.plugin_helpers import DRIVER, NODE, create_allocated_claim, short_tmp, start_agent

GPU0 = PreparedDevice(("gpu",), "pool", "gpu-0", ("k8s.gpu.nvidia.com/claim=uid-gpu-0",), None)
GPU1 = PreparedDevice(("gpu",), "pool", "gpu-1", (), None)


def _pod(containers: list[dict[str, Any]]) -> dict[str, Any]:
    return {"spec": {"resourceClaims": [{"name": "gpus", "resourceClaimName": "train-gpus"},
                                        {"name": "tmpl", "resourceClaimTemplateName": "t"}],
                     "containers": containers},
            "status": {"resourceClaimStatuses": [{"name": "tmpl", "resourceClaimName": "job-tmpl-x7k2"}]}}


def test_status_per_container_claim_and_request() -> None:
    pod = _pod([{"name": "main", "resources": {"claims": [{"name": "gpus"}, {"name": "tmpl", "request": "big"}]}},
                {"name": "sidecar"}])
    health = {("pool", "gpu-0"): ("Unhealthy", "Xid 48: double-bit ECC error"), ("pool", "gpu-1"): ("Healthy", "")}
    out = allocated_resources_status(pod, {"train-gpus": [GPU0, GPU1], "job-tmpl-x7k2": [GPU1]}, DRIVER,
                                     lambda p, d: health[(p, d)])
    assert out == {"main": [
        {"name": "claim:gpus", "resources": [
            {"resourceID": "k8s.gpu.nvidia.com/claim=uid-gpu-0", "health": "Unhealthy",
             "message": "Xid 48: double-bit ECC error"},
            {"resourceID": f"{DRIVER}/pool/gpu-1", "health": "Healthy"}]},
        {"name": "claim:tmpl/big", "resources": [{"resourceID": f"{DRIVER}/pool/gpu-1", "health": "Healthy"}]},
    ]}
    no_messages = allocated_resources_status(pod, {"train-gpus": [GPU0]}, DRIVER, lambda p, d: health[(p, d)], False)
    assert no_messages["main"][0]["resources"][0] == {"resourceID": "k8s.gpu.nvidia.com/claim=uid-gpu-0",
                                                      "health": "Unhealthy"}


def test_claims_without_devices_are_left_out() -> None:
    pod = _pod([{"name": "main", "resources": {"claims": [{"name": "gpus"}]}}])
    assert allocated_resources_status(pod, {}, DRIVER, lambda p, d: ("Healthy", "")) == {}


def test_health_cache_timeouts_and_unknown() -> None:
    cache = HealthCache(KubeletDialect.for_version("1.37"))
    cache.update(HealthUpdate((("pool", "a", "HEALTHY"), ("pool", "b", "UNHEALTHY")), ("", "lost"), (0, 90)), now=100.0)
    assert cache.get("pool", "a", now=129.0) == ("Healthy", "")
    assert cache.get("pool", "a", now=131.0) == ("Unknown", "")  # 30 s default
    assert cache.get("pool", "b", now=180.0) == ("Unhealthy", "lost")  # its own 90 s timeout
    assert cache.get("pool", "never", now=100.0) == ("Unknown", "")
    cache.clear()
    assert cache.get("pool", "b", now=100.0) == ("Unknown", "")
    old = HealthCache(KubeletDialect.for_version("1.34"))  # per-device timeouts arrived in 1.35
    old.update(HealthUpdate((("pool", "b", "UNHEALTHY"),), ("",), (90,)), now=100.0)
    assert old.get("pool", "b", now=140.0) == ("Unknown", "")


def _wait(condition, what: str, timeout: float = 60.0) -> Any:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def work() -> Iterator[Path]:
    with short_tmp() as path:
        yield path


def _running_pod_with_claim(api: Any, agent: Any) -> tuple[str, str]:
    devices = [gpu_device_name(g) for g in agent.inventory().gpus]
    claim = create_allocated_claim(api, "train-gpus", [("gpu", devices[0])])
    api.create("Node", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    pod = api.create("Pod", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": "default"},
                             "spec": {"nodeName": NODE, "resourceClaims": [{"name": "gpus", "resourceClaimName": "train-gpus"}],
                                      "containers": [{"name": "main", "image": "cuda",
                                                      "resources": {"claims": [{"name": "gpus"}]}}]}},
                     namespace="default")
    claim["status"]["reservedFor"] = [{"resource": "pods", "name": "train", "uid": pod["metadata"]["uid"]}]
    api.replace_status("ResourceClaim", claim)
    return devices[0], pod["metadata"]["uid"]


def _status(api: Any) -> list[dict[str, Any]]:
    pod = api.get("Pod", "train", namespace="default")
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return statuses[0].get("allocatedResourcesStatus") if statuses else None  # type: ignore[return-value]


@pytest.mark.process
@pytest.mark.parametrize("version", ["1.37", "1.36"])
def test_unhealthy_gpu_shows_in_pod_status(work: Path, apiserver, version: str) -> None:  # type: ignore[no-untyped-def]
    api = apiserver.api
    agent = start_agent(work, api)
    kubelet = NodeKubelet(api, NODE, work / "kubelet", DRIVER, kubernetes_version=version)
    try:
        kubelet.register_plugin(timeout=60)
        kubelet.start()
        device, _ = _running_pod_with_claim(api, agent)
        healthy = _wait(lambda: _status(api), "allocatedResourcesStatus")
        assert healthy[0]["name"] == "claim:gpus"
        (resource,) = healthy[0]["resources"]
        assert resource["health"] == "Healthy" and resource["resourceID"].startswith("k8s.gpu.nvidia.com/")
        uuid = next(g.uuid for g in agent.inventory().gpus if gpu_device_name(g) == device)
        agent._on_health(uuid, Health(xids=(48,)))
        unhealthy = _wait(lambda: (s := _status(api)) and s[0]["resources"][0]["health"] == "Unhealthy" and s,
                          "Unhealthy in pod status")
        assert "48" in unhealthy[0]["resources"][0]["message"]
        # kubectl reads it back (its `describe` does not print allocatedResourcesStatus in any release, up to
        # the 1.37 sources; `get -o jsonpath` does).
        kubectl = shutil.which("kubectl")
        if kubectl is not None:
            path = "{.status.containerStatuses[0].allocatedResourcesStatus[0].resources[0].health}"
            out = subprocess.run([kubectl, "--server", apiserver.url, "get", "pod", "train", "-n", "default",
                                  "-o", f"jsonpath={path}"], capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            assert out.stdout == "Unhealthy"
    finally:
        kubelet.stop()
        agent.stop()


@pytest.mark.slow
def test_kubelet_1_35_writes_no_health(work: Path, apiserver) -> None:  # type: ignore[no-untyped-def]
    api = apiserver.api
    agent = start_agent(work, api)
    kubelet = NodeKubelet(api, NODE, work / "kubelet", DRIVER, kubernetes_version="1.35")
    try:
        kubelet.register_plugin(timeout=60)
        kubelet.start()
        _running_pod_with_claim(api, agent)
        _wait(lambda: (api.get("Pod", "train", namespace="default").get("status") or {}).get("phase") == "Running",
              "Running")
        time.sleep(1.0)  # a few reporter ticks would have passed
        assert _status(api) is None
        assert not kubelet.health.enabled
    finally:
        kubelet.stop()
        agent.stop()
