"""Gang pre-allocation: all-or-nothing, spread over nodes, NVLink domains, timeout release."""

from __future__ import annotations

from typing import Any

from controller.objects import DELETE_PROTECTION_FINALIZER
from controller_helpers import (
    FakeWall,
    claim,
    claims_of,
    create_all,
    devices_of,
    gpu_class,
    gpu_slice,
    manager,
    node,
    node_of,
    pod,
)


def _gang(name: str, size: int, count: int, gpus: int) -> list[dict[str, Any]]:
    labels = {"gpu.nvidia.com/gang": name, "gpu.nvidia.com/gang-size": str(size)}
    return [claim(f"{name}-{i}", gpus, labels=labels) for i in range(count)]


def _four_gpu_nodes(api: Any, *names: str, clique: tuple[str, int] | None = None) -> None:
    for n in names:
        create_all(api, [node(n), gpu_slice(n, [(f"g{i}", f"{n}-nvl") for i in range(4)], clique=clique)])


def test_gang_waits_until_all_claims_exist(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [gpu_class()])
    _four_gpu_nodes(api, "node-a", "node-b")
    create_all(api, _gang("job", 3, 2, 2))
    m = manager(api, embedded=False)
    report = m.step()
    assert report.gangs.by_gang == {"default/job": "waiting"}
    assert all("allocation" not in (c.get("status") or {}) for c in claims_of(api).values())
    assert "2 of 3 claims exist" in claims_of(api)["job-0"]["metadata"]["annotations"]["gpu.nvidia.com/explanation"]

    create_all(api, _gang("job", 3, 3, 2)[2:])
    report = m.step()
    assert report.gangs.by_gang == {"default/job": "allocated"}
    claims = claims_of(api)
    assert all(len(devices_of(c)) == 2 for c in claims.values())
    assert all(DELETE_PROTECTION_FINALIZER in c["metadata"]["finalizers"] for c in claims.values())
    # 3 x 2 GPUs do not fit on one 4-GPU node: the gang spans both, and no device is used twice.
    assert {node_of(c) for c in claims.values()} == {"node-a", "node-b"}
    picked = [(node_of(c), d) for c in claims.values() for d in devices_of(c)]
    assert len(set(picked)) == 6
    assert all("gpu.nvidia.com/explanation" not in (c["metadata"].get("annotations") or {}) for c in claims.values())


def test_gang_that_does_not_fit_allocates_nothing_and_blocks_nothing(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [gpu_class()])
    _four_gpu_nodes(api, "node-a", "node-b")
    create_all(api, [*_gang("huge", 3, 3, 4), claim("solo", 4), pod("solo-pod", claims={"gpu": "solo"})])
    m = manager(api)
    report = m.step()
    assert report.gangs.by_gang == {"default/huge": "unschedulable"}
    claims = claims_of(api)
    assert all(not devices_of(claims[f"huge-{i}"]) for i in range(3))
    assert "do not fit together" in claims["huge-0"]["metadata"]["annotations"]["gpu.nvidia.com/explanation"]
    # The ordinary pod is placed: the failed gang held no device.
    assert report.pods_bound == 1 and len(devices_of(claims["solo"])) == 4


def test_gang_prefers_nodes_of_one_nvlink_clique(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [gpu_class()])
    _four_gpu_nodes(api, "lone")
    _four_gpu_nodes(api, "rack-1", "rack-2", clique=("cluster-x", 7))
    create_all(api, _gang("linked", 2, 2, 3))  # 2 x 3 GPUs: two nodes needed
    report = manager(api, embedded=False).step()
    assert report.gangs.by_gang == {"default/linked": "allocated"}
    assert {node_of(c) for c in claims_of(api).values()} == {"rack-1", "rack-2"}


def test_gang_released_after_timeout_when_no_pod_arrives_and_reallocated_for_a_pod(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [gpu_class()])
    _four_gpu_nodes(api, "node-a")
    create_all(api, _gang("idle", 2, 2, 1))
    wall = FakeWall()
    m = manager(api, wall=wall, gang_timeout=60)
    assert m.step().gangs.by_gang == {"default/idle": "allocated"}
    wall.advance(30)
    assert m.step().gangs.by_gang == {"default/idle": "allocated"}
    wall.advance(31)
    assert m.step().gangs.by_gang == {"default/idle": "released"}
    claims = claims_of(api)
    for c in claims.values():
        assert not devices_of(c)
        assert DELETE_PROTECTION_FINALIZER not in (c["metadata"].get("finalizers") or [])
        assert "gpu.nvidia.com/gang-released-at" in c["metadata"]["annotations"]
    assert m.step().gangs.by_gang == {"default/idle": "released"}  # not re-allocated while nobody wants it

    create_all(api, [pod("worker-0", claims={"gpu": "idle-0"}), pod("worker-1", claims={"gpu": "idle-1"})])
    report = m.step()
    assert report.pods_bound == 2
    assert m.step().gangs.by_gang == {"default/idle": "bound"}
    wall.advance(3600)
    assert m.step().gangs.by_gang == {"default/idle": "bound"}  # reserved: never released
    assert all(devices_of(c) for c in claims_of(api).values())


def test_gang_pods_land_where_the_gang_was_allocated(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [gpu_class()])
    _four_gpu_nodes(api, "node-a", "node-b")
    create_all(api, _gang("ring", 2, 2, 3))
    m = manager(api)
    m.step()
    create_all(api, [pod("r0", claims={"gpu": "ring-0"}), pod("r1", claims={"gpu": "ring-1"})])
    assert m.step().pods_bound == 2
    claims = claims_of(api)
    assert api.get("Pod", "r0", "default")["spec"]["nodeName"] == node_of(claims["ring-0"])
    assert api.get("Pod", "r1", "default")["spec"]["nodeName"] == node_of(claims["ring-1"])


def test_claims_without_gang_labels_are_never_touched_in_cluster_mode(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [gpu_class()])
    _four_gpu_nodes(api, "node-a")
    create_all(api, [claim("plain", 1), claim("half", 1, labels={"gpu.nvidia.com/gang": "x"})])
    before = claims_of(api)
    manager(api, embedded=False).step()
    after = claims_of(api)
    for name in ("plain", "half"):
        assert after[name]["metadata"]["resourceVersion"] == before[name]["metadata"]["resourceVersion"]


def test_invalid_gang_size_is_explained_and_not_allocated(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [gpu_class()])
    _four_gpu_nodes(api, "node-a")
    create_all(api, [claim("bad-0", 1, labels={"gpu.nvidia.com/gang": "bad", "gpu.nvidia.com/gang-size": "two"})])
    report = manager(api, embedded=False).step()
    assert report.gangs.by_gang == {"default/bad": "unschedulable"}
    c = claims_of(api)["bad-0"]
    assert not devices_of(c)
    assert "label gpu.nvidia.com/gang-size: 'two' is not a positive integer" in c["metadata"]["annotations"]["gpu.nvidia.com/explanation"]


def _finish_pods(api: Any, *names: str) -> None:
    for name in names:
        p = api.get("Pod", name, "default")
        p["status"] = {**(p.get("status") or {}), "phase": "Succeeded"}
        api.replace_status("Pod", p)


def _deallocate_as_the_claim_controller(api: Any, *names: str) -> None:
    """What kube-controller-manager's resourceclaim controller does once a used claim's consumers are gone:
    empty reservedFor and clear the allocation (structured parameters), in one status update."""
    for name in names:
        c = api.get("ResourceClaim", name, "default")
        c["status"] = {}
        api.replace_status("ResourceClaim", c)


def test_finished_gang_is_not_allocated_again_after_the_claim_controller_deallocates_it(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [gpu_class()])
    _four_gpu_nodes(api, "node-a")
    create_all(api, _gang("done", 2, 2, 2))
    wall = FakeWall()
    m = manager(api, embedded=False, wall=wall, gang_timeout=600)
    assert m.step().gangs.by_gang == {"default/done": "allocated"}
    create_all(api, [pod("d0", claims={"gpu": "done-0"}), pod("d1", claims={"gpu": "done-1"})])
    # kube-scheduler reserves the claims for the pods and binds them.
    for i in (0, 1):
        c = api.get("ResourceClaim", f"done-{i}", "default")
        p = api.get("Pod", f"d{i}", "default")
        c["status"]["reservedFor"] = [{"resource": "pods", "name": f"d{i}", "uid": p["metadata"]["uid"]}]
        api.replace_status("ResourceClaim", c)
    assert m.step().gangs.by_gang == {"default/done": "bound"}

    # One pod finishes first: its claim is deallocated while the other still runs. Not allocated again.
    _finish_pods(api, "d0")
    _deallocate_as_the_claim_controller(api, "done-0")
    assert m.step().gangs.by_gang == {"default/done": "released"}
    assert not devices_of(claims_of(api)["done-0"]) and devices_of(claims_of(api)["done-1"])

    _finish_pods(api, "d1")
    _deallocate_as_the_claim_controller(api, "done-1")
    for _ in range(3):
        wall.advance(30)
        assert m.step().gangs.by_gang == {"default/done": "released"}
    claims = claims_of(api)
    assert all(not devices_of(c) for c in claims.values())
    assert all("gpu.nvidia.com/gang-released-at" in c["metadata"]["annotations"] for c in claims.values())

    # A new run of the job (a live pod referencing a member) gets the gang allocated again.
    create_all(api, [pod("d0-retry", claims={"gpu": "done-0"})])
    assert m.step().gangs.by_gang == {"default/done": "allocated"}
    assert all(len(devices_of(c)) == 2 for c in claims_of(api).values())


def test_finished_gang_in_embedded_mode_stays_released(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [gpu_class()])
    _four_gpu_nodes(api, "node-a")
    create_all(api, _gang("emb", 2, 2, 1))
    m = manager(api)
    m.step()
    create_all(api, [pod("e0", claims={"gpu": "emb-0"}), pod("e1", claims={"gpu": "emb-1"})])
    assert m.step().pods_bound == 2
    _finish_pods(api, "e0", "e1")
    states = [m.step().gangs.by_gang["default/emb"] for _ in range(4)]
    assert states[-1] == "released"
    assert all(not devices_of(c) for c in claims_of(api).values())


def test_gang_allocation_that_lost_a_race_with_the_scheduler_is_undone(apiserver: Any) -> None:
    """kube-scheduler wrote (at PreBind) an allocation it had made in memory before it saw ours: same device."""
    api = apiserver.api
    create_all(api, [gpu_class()])
    _four_gpu_nodes(api, "node-a")
    create_all(api, [*_gang("race", 2, 2, 1), claim("solo", 1), pod("solo-pod", claims={"gpu": "solo"})])
    m = manager(api, embedded=False)
    assert m.step().gangs.by_gang == {"default/race": "allocated"}
    taken = api.get("ResourceClaim", "race-0", "default")["status"]["allocation"]["devices"]["results"][0]
    solo = api.get("ResourceClaim", "solo", "default")
    solo_pod = api.get("Pod", "solo-pod", "default")
    solo["status"] = {
        "allocation": {"devices": {"results": [{**taken, "request": "gpus"}]}, "nodeSelector": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}},
        "reservedFor": [{"resource": "pods", "name": "solo-pod", "uid": solo_pod["metadata"]["uid"]}],
    }
    api.replace_status("ResourceClaim", solo)
    assert m.step().gangs.by_gang == {"default/race": "unschedulable"}  # undone: the scheduler's claim is in use
    assert all(not devices_of(c) for n, c in claims_of(api).items() if n.startswith("race-"))
    assert m.step().gangs.by_gang == {"default/race": "allocated"}  # planned again around the taken device
    claims = claims_of(api)
    # Whatever the gang holds now, it is never a device the scheduler's claim holds.
    held = {d for c in ("race-0", "race-1") for d in devices_of(claims[c])}
    assert taken["device"] not in held
    assert devices_of(claims["solo"]) == [taken["device"]]


def test_gang_pods_are_admitted_to_scheduling_only_after_the_allocation_settled(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [gpu_class()])
    _four_gpu_nodes(api, "node-a")
    create_all(api, _gang("gated", 2, 2, 1))
    gated = []
    for i in (0, 1):
        p = pod(f"g{i}", claims={"gpu": f"gated-{i}"})
        p["spec"]["schedulingGates"] = [{"name": "gpu.nvidia.com/gang"}, {"name": "example.com/quota"}]
        gated.append(p)
    create_all(api, gated)
    wall = FakeWall()
    m = manager(api, embedded=False, wall=wall)
    assert m.step().gangs.by_gang == {"default/gated": "allocated"}

    def gates(name: str) -> list[str]:
        return [g["name"] for g in api.get("Pod", name, "default")["spec"].get("schedulingGates") or []]

    assert gates("g0") == ["gpu.nvidia.com/gang", "example.com/quota"]  # not settled yet
    wall.advance(m.gangs.settle_seconds + 1)
    m.step()
    assert gates("g0") == gates("g1") == ["example.com/quota"]  # ours lifted, the other gate kept
