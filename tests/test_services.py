"""Services and EndpointSlices as a 1.37 cluster keeps them: cluster IPs and node ports allocated (free, in range,
kept across updates that omit them), headless and ExternalName Services, the `kubernetes` Service, kubectl's
columns, and the EndpointSlice controller's view of the selected pods."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gpudra.kubeapi import ApiError
from sim.cluster import endpointslices
from tests.cluster_helpers import node_and_workload_controllers
from tests.conftest import RunningApiServer

KUBECTL = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "kubectl")


def _svc(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default"},
            "spec": {"selector": {"app": name}, "ports": [{"port": 80}], **spec}}


def test_cluster_ips_and_node_ports_are_allocated_and_kept(apiserver: RunningApiServer) -> None:
    api = apiserver.api
    kubernetes = api.get("Service", "kubernetes", namespace="default")
    assert kubernetes["spec"]["clusterIP"] == "10.96.0.1" and kubernetes["spec"]["ports"][0]["port"] == 443
    web = api.create("Service", _svc("web"), namespace="default")
    spec = web["spec"]
    assert (spec["type"], spec["clusterIP"], spec["clusterIPs"], spec["ipFamilies"], spec["sessionAffinity"]) == (
        "ClusterIP", "10.96.0.2", ["10.96.0.2"], ["IPv4"], "None")
    assert spec["ports"] == [{"port": 80, "protocol": "TCP", "targetPort": 80}]
    node_port = api.create("Service", _svc("np", type="NodePort"), namespace="default")
    assert node_port["spec"]["ports"][0]["nodePort"] == 30000 and node_port["spec"]["clusterIP"] == "10.96.0.3"
    headless = api.create("Service", _svc("db", clusterIP="None"), namespace="default")
    assert headless["spec"]["clusterIPs"] == ["None"]
    external = api.create("Service", {"metadata": {"name": "ext", "namespace": "default"},
                                      "spec": {"type": "ExternalName", "externalName": "example.com"}}, namespace="default")
    assert "clusterIP" not in external["spec"]
    with pytest.raises(ApiError) as taken:
        api.create("Service", _svc("copy", clusterIP="10.96.0.2"), namespace="default")
    assert taken.value.status == 422 and "provided IP is already allocated" in str(taken.value)
    with pytest.raises(ApiError) as outside:
        api.create("Service", _svc("far", clusterIP="192.168.0.1"), namespace="default")
    assert "The range of valid IPs is 10.96.0.0/16" in str(outside.value)
    # An update that omits the allocated values keeps them (kubectl apply of the same manifest); a change is refused.
    again = api.replace("Service", {**_svc("web"), "metadata": {**web["metadata"]}})
    assert again["spec"]["clusterIP"] == "10.96.0.2"
    changed = {**again, "spec": {**again["spec"], "clusterIP": "10.96.0.9", "clusterIPs": ["10.96.0.9"]}}
    with pytest.raises(ApiError) as moved:
        api.replace("Service", changed)
    assert moved.value.status == 422 and "may not change once set" in str(moved.value)


@pytest.mark.process
def test_kubectl_shows_services_as_on_a_cluster(apiserver: RunningApiServer) -> None:
    if not Path(KUBECTL).exists():
        pytest.skip("kubectl is installed by `make install-test`")
    apiserver.api.create("Service", _svc("lb", type="LoadBalancer"), namespace="default")
    rows = subprocess.run([KUBECTL, "--kubeconfig", str(apiserver.kubeconfig), "-n", "default", "get", "svc"],
                          capture_output=True, text=True, timeout=60).stdout.splitlines()
    assert rows[0].split() == ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"]
    table = {r.split()[0]: r.split()[1:5] for r in rows[1:]}
    assert table["kubernetes"] == ["ClusterIP", "10.96.0.1", "<none>", "443/TCP"]
    assert table["lb"] == ["LoadBalancer", "10.96.0.2", "<pending>", "80:30000/TCP"]  # no cloud provider here


def test_endpoint_slices_follow_the_selected_pods() -> None:
    def pod(name: str, ready: bool, *, ip: str | None = "10.244.1.5", deleting: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "namespace": "default", "uid": f"u-{name}", "labels": {"app": "web"}}
        if deleting:
            meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
        status: dict[str, Any] = {"phase": "Running",
                                  "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
        if ip:
            status["podIP"] = ip
        return {"metadata": meta, "spec": {"nodeName": "n1", "containers": [
            {"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]}, "status": status}

    svc = {"metadata": {"name": "web", "namespace": "default", "uid": "s1"},
           "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http",
                                                           "protocol": "TCP"}]}}
    pods = [pod("a", True, ip="10.244.1.5"), pod("b", False, ip="10.244.1.6"), pod("c", True, ip=None),
            pod("d", True, ip="10.244.1.7", deleting=True)]
    (made,) = endpointslices.plan([svc], [], pods).create
    assert made["metadata"]["generateName"] == "web-" and made["metadata"]["labels"][endpointslices.SERVICE_NAME] == "web"
    assert made["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]  # the named target port resolved
    assert [(e["addresses"][0], e["conditions"]) for e in made["endpoints"]] == [
        ("10.244.1.5", {"ready": True, "serving": True, "terminating": False}),
        ("10.244.1.6", {"ready": False, "serving": False, "terminating": False}),
        ("10.244.1.7", {"ready": False, "serving": True, "terminating": True})]
    stored = {**made, "metadata": {**made["metadata"], "name": "web-abcde"}}
    assert endpointslices.plan([svc], [stored], pods).update == []
    (refreshed,) = endpointslices.plan([svc], [stored], pods[:1]).update
    assert len(refreshed["endpoints"]) == 1 and refreshed["metadata"]["name"] == "web-abcde"


@pytest.mark.process
def test_a_services_endpoints_are_its_ready_pods(apiserver: RunningApiServer) -> None:
    if not Path(KUBECTL).exists():
        pytest.skip("kubectl is installed by `make install-test`")
    api = apiserver.api
    api.create("Node", {"metadata": {"name": "n1"}})
    with node_and_workload_controllers(api, "n1"):
        api.create("Deployment", {"metadata": {"name": "web", "namespace": "default"}, "spec": {
            "replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]}}}}, namespace="default")
        api.create("Service", {**_svc("web"), "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}},
                   namespace="default")
        deadline = time.monotonic() + 60
        while True:
            slices = api.list("EndpointSlice", namespace="default", label_selector="kubernetes.io/service-name=web")[0]
            ready = [e for s in slices for e in s.get("endpoints") or [] if e["conditions"]["ready"]]
            if len(ready) == 2:
                break
            assert time.monotonic() < deadline, slices
            time.sleep(0.2)
        ips = sorted(p["status"]["podIP"] for p in api.list("Pod", namespace="default")[0])
        assert sorted(e["addresses"][0] for e in ready) == ips and slices[0]["ports"][0]["port"] == 8080
        described = subprocess.run([KUBECTL, "--kubeconfig", str(apiserver.kubeconfig), "-n", "default", "describe",
                                    "svc", "web"], capture_output=True, text=True, timeout=60).stdout
        line = next(row for row in described.splitlines() if row.startswith("Endpoints:"))
        assert sorted(line.split(None, 1)[1].split(",")) == sorted(f"{ip}:8080" for ip in ips), described
