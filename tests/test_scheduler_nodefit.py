"""The embedded scheduler's node filters as kube-scheduler 1.37 applies them (NodeUnschedulable, TaintToleration,
NodeAffinity, NodePorts, NodeResourcesFit) and its FailedScheduling text."""

from __future__ import annotations

from typing import Any

import pytest

from sim.roles.fiterror import NodeStatus, fit_error
from sim.roles.nodefit import REASON_TAINT, dynamic_rejects
from sim.roles.nodeusage import NodeUsage
from sim.roles.podresources import host_ports, pod_demand
from controller_helpers import create_all, events_for, manager, node


def _pod(name: str, requests: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    if requests:
        container["resources"] = {"requests": requests}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [container], **spec}}


def _failed(api: Any, name: str) -> str:
    (event,) = [e for e in events_for(api, name) if e["reason"] == "FailedScheduling"]
    assert event["type"] == "Warning" and event["source"]["component"] == "default-scheduler"
    return str(event["message"])


def _bound(api: Any, name: str) -> str | None:
    return api.get("Pod", name, "default")["spec"].get("nodeName")


def _four_nodes(api: Any, *, taint_first: bool = True) -> None:
    nodes = [node(f"node-{i}") for i in range(4)]
    if taint_first:
        nodes[0]["spec"]["taints"] = [{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]
    create_all(api, nodes)


# -- what a pod asks for --------------------------------------------------------------------------------


def test_pod_demand_sums_containers_takes_the_init_peak_and_adds_sidecars_and_overhead() -> None:
    pod = {"spec": {
        "initContainers": [
            {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},
            {"name": "setup", "resources": {"requests": {"cpu": "3", "memory": "1Gi"}}},
        ],
        "containers": [
            {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}},
            {"name": "b", "resources": {"limits": {"cpu": "1", "nvidia.com/gpu": "2"}}},  # limits default requests
        ],
        "overhead": {"cpu": "250m"},
    }}
    demand = pod_demand(pod)
    # containers 2 cpu + sidecar 0.5 = 2.5; the setup init container runs beside the sidecar: 3.5 wins; + overhead.
    assert demand.get("cpu") == 3750
    assert demand.get("memory") == 2 << 30
    assert demand.get("nvidia.com/gpu") == 2


def test_pod_level_requests_replace_the_containers_cpu_and_memory() -> None:
    pod = {"spec": {"resources": {"requests": {"cpu": "8"}},
                    "containers": [{"name": "a", "resources": {"requests": {"cpu": "1", "example.com/gpu": "1"}}}]}}
    demand = pod_demand(pod)
    assert (demand.get("cpu"), demand.get("example.com/gpu")) == (8000, 1)


def test_host_ports_conflict_on_the_wildcard_address() -> None:
    first = host_ports({"spec": {"containers": [{"name": "a", "ports": [{"containerPort": 80, "hostPort": 8080}]}]}})
    other_ip = host_ports({"spec": {"containers": [{"name": "a", "ports": [
        {"containerPort": 80, "hostPort": 8080, "hostIP": "10.0.0.1"}]}]}})
    udp = host_ports({"spec": {"containers": [{"name": "a", "ports": [
        {"containerPort": 80, "hostPort": 8080, "protocol": "UDP"}]}]}})
    usage = NodeUsage()
    usage.hold("default/web", "n1", pod_demand({}), first)
    allocatable = {"pods": 110}
    assert dynamic_rejects(pod_demand({}), other_ip, allocatable, usage.load("n1")) is not None
    assert dynamic_rejects(pod_demand({}), udp, allocatable, usage.load("n1")) is None


# -- kube-scheduler's message -----------------------------------------------------------------------------


def test_fit_error_sorts_the_histogram_and_adds_the_post_filter_verdicts() -> None:
    statuses = [NodeStatus((REASON_TAINT,), False)] + [NodeStatus(("Insufficient cpu",), True)] * 3
    assert fit_error(4, statuses, {"spec": {}}) == (
        "0/4 nodes are available: 1 node(s) had untolerated taint(s), 3 Insufficient cpu. no new claims to deallocate, "
        "preemption: 0/4 nodes are available: 1 Preemption is not helpful for scheduling, "
        "3 No preemption victims found for incoming pod.")
    never = {"spec": {"preemptionPolicy": "Never", "resourceClaims": [{"name": "gpu"}]}}
    assert fit_error(1, [NodeStatus(("cannot allocate all claims",), True)], never) == (
        "0/1 nodes are available: 1 cannot allocate all claims. still not schedulable, "
        "not eligible due to preemptionPolicy=Never.")


# -- the embedded scheduler ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("resource", "amount"), [
    ("cpu", "1000"), ("memory", "10Ti"), ("ephemeral-storage", "100Ti"),
    ("nvidia.com/mig-1g.10gb", "1"), ("example.com/gpu", "1"), ("nvidia.com/gpu", "1"),
])
def test_a_pod_asking_more_than_any_node_has_stays_pending(apiserver: Any, resource: str, amount: str) -> None:
    api = apiserver.api
    _four_nodes(api)
    create_all(api, [_pod("greedy", {resource: amount})])
    manager(api).step()
    assert _bound(api, "greedy") is None
    assert _failed(api, "greedy") == (
        f"0/4 nodes are available: 1 node(s) had untolerated taint(s), 3 Insufficient {resource}. "
        "no new claims to deallocate, preemption: 0/4 nodes are available: 1 Preemption is not helpful for scheduling, "
        "3 No preemption victims found for incoming pod.")
    cond = next(c for c in api.get("Pod", "greedy", "default")["status"]["conditions"] if c["type"] == "PodScheduled")
    assert cond["message"] == _failed(api, "greedy")
    (ours,) = [e for e in events_for(api, "greedy") if e["reason"] == "GpuDraUnschedulable"]
    assert f"Insufficient {resource} (requested " in ours["message"]


def test_requests_add_up_on_a_node_until_it_is_full(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [node("only")])
    create_all(api, [_pod("a", {"cpu": "40"}), _pod("b", {"cpu": "20"}), _pod("c", {"cpu": "8"})])
    m = manager(api)
    m.step()
    assert (_bound(api, "a"), _bound(api, "b"), _bound(api, "c")) == ("only", "only", None)
    assert _failed(api, "c").startswith("0/1 nodes are available: 1 Insufficient cpu. ")
    (scheduled,) = [e for e in events_for(api, "a") if e["reason"] == "Scheduled"]
    assert (scheduled["type"], scheduled["source"]["component"]) == ("Normal", "default-scheduler")
    assert scheduled["message"] == "Successfully assigned default/a to only"
    # A pod that finishes gives its share back.
    done = api.get("Pod", "b", "default")
    done["status"]["phase"] = "Succeeded"
    api.replace_status("Pod", done)
    m.step()
    assert _bound(api, "c") == "only"


def test_a_node_runs_at_most_its_allocatable_pods(apiserver: Any) -> None:
    api = apiserver.api
    small = node("small")
    small["status"]["allocatable"]["pods"] = small["status"]["capacity"]["pods"] = "2"
    create_all(api, [small, _pod("p1"), _pod("p2"), _pod("p3")])
    manager(api).step()
    assert sorted(str(_bound(api, p)) for p in ("p1", "p2", "p3")) == ["None", "small", "small"]
    waiting = next(p for p in ("p1", "p2", "p3") if _bound(api, p) is None)
    assert _failed(api, waiting).startswith("0/1 nodes are available: 1 Too many pods. ")


def test_host_ports_are_taken_once_per_node(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [node("n1")])
    ports = [{"name": "main", "image": "busybox", "ports": [{"containerPort": 80, "hostPort": 8080}]}]
    first, second = _pod("web-1"), _pod("web-2")
    first["spec"]["containers"] = second["spec"]["containers"] = ports
    create_all(api, [first, second])
    manager(api).step()
    assert _bound(api, "web-1") == "n1" and _bound(api, "web-2") is None
    assert _failed(api, "web-2").startswith(
        "0/1 nodes are available: 1 node(s) didn't have free ports for the requested pod ports. ")


def test_node_selector_affinity_cordon_and_taints_in_kube_scheduler_words(apiserver: Any) -> None:
    api = apiserver.api
    nodes = [node("cordoned"), node("tainted"), node("plain"), node("labelled", labels={"zone": "a"})]
    nodes[0]["spec"]["unschedulable"] = True
    nodes[1]["spec"]["taints"] = [{"key": "gpu", "value": "busy", "effect": "NoExecute"}]
    create_all(api, nodes)
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}}}
    tolerant = _pod("tolerant", nodeSelector={"kubernetes.io/hostname": "cordoned"},
                    tolerations=[{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}])
    create_all(api, [_pod("picky", affinity=affinity), tolerant])
    manager(api).step()
    assert _failed(api, "picky") == (
        "0/4 nodes are available: 1 node(s) had untolerated taint(s), 1 node(s) were unschedulable, "
        "2 node(s) didn't match Pod's node affinity/selector. no new claims to deallocate, "
        "preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling.")
    # Tolerating the cordon's taint lets a pod onto a cordoned node, as DaemonSet pods do.
    assert _bound(api, "tolerant") == "cordoned"


def test_preferred_node_affinity_is_tried_first_and_never_blocks(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [node("a"), node("b", labels={"disk": "ssd"}), node("c")])
    prefer = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 50, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}]}}
    nowhere = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 50, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["nvme"]}]}}]}}
    create_all(api, [_pod("fast-1", affinity=prefer), _pod("fast-2", affinity=prefer), _pod("any", affinity=nowhere)])
    manager(api).step()
    assert (_bound(api, "fast-1"), _bound(api, "fast-2")) == ("b", "b")
    assert _bound(api, "any") == "a"
