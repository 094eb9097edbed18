"""The allocator snapshot kept current from informer deltas: store change sets, incremental claim updates that
place exactly like a rebuilt snapshot, rebuilds on structural changes, and the embedded scheduler using it pod
by pod (expansion right before placement, no re-read after binding, no snapshot rebuild per pass)."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from controller.allocator import parse_claim
from controller.cel import CelEnvironment
from controller.informer import Store
from controller.scoring import Placement, Placer
from controller.snapshots import LiveSnapshot, build_snapshot
from controller.view import View
from controller_helpers import claims_of, create_all, gpu_class, gpu_slice, manager, node, pod, roles, template
from gpudra.features import Features

DRIVER = "gpu.nvidia.com"


def _obj(kind: str, name: str, rv: int, **body: Any) -> dict[str, Any]:
    meta = {"name": name, "resourceVersion": str(rv), "uid": f"uid-{name}"}
    if kind == "ResourceClaim":
        meta["namespace"] = "default"
    return {"kind": kind, "metadata": meta, **body}


def test_store_change_sets_start_full_and_collect_each_change_once() -> None:
    store = Store("Node")
    store.upsert(_obj("Node", "a", 1))
    tracker = store.track()
    assert store.drain(tracker) == {"a"}
    assert store.drain(tracker) == set()
    store.upsert(_obj("Node", "b", 2))
    store.upsert(_obj("Node", "a", 3))
    store.upsert(_obj("Node", "a", 3))  # same version: no change
    assert store.drain(tracker) == {"a", "b"}
    store.remove(_obj("Node", "b", 4))
    store.replace([_obj("Node", "a", 3), _obj("Node", "c", 5)], "5")
    assert store.drain(tracker) == {"b", "c"}


def _slice(node_name: str, count: int, split: bool) -> dict[str, Any]:
    return gpu_slice(node_name, [(f"gpu-{g}", f"{node_name}-{g * 2 // count if split else 0}") for g in range(count)])


def _claim(name: str, count: int, rv: int, allocation: dict[str, Any] | None = None) -> dict[str, Any]:
    obj = _obj("ResourceClaim", name, rv, spec={"devices": {"requests": [
        {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": count}}]}})
    if allocation is not None:
        obj["status"] = {"allocation": allocation}
    return obj


def _stores(slices: list[dict[str, Any]]) -> dict[str, Store]:
    stores = {kind: Store(kind) for kind in ("ResourceSlice", "DeviceClass", "Node", "ResourceClaim")}
    for i, s in enumerate(slices):
        s["metadata"]["resourceVersion"] = str(i + 1)
        stores["ResourceSlice"].upsert(s)
    cls = gpu_class()
    cls["metadata"]["resourceVersion"] = "1"
    stores["DeviceClass"].upsert(cls)
    return stores


@pytest.mark.slow
def test_incremental_updates_place_like_a_rebuilt_snapshot() -> None:
    rng = random.Random(7)
    slices = [_slice(f"n{i:02d}", rng.choice([4, 8]), rng.random() < 0.4) for i in range(12)]
    stores = _stores(slices)
    live = LiveSnapshot(stores, Features(), CelEnvironment())
    claims = stores["ResourceClaim"]
    rv = 100
    held: list[dict[str, Any]] = []
    for step in range(40):
        rv += 1
        if held and rng.random() < 0.3:
            # Another writer releases a claim (deallocated), or deletes it.
            gone = held.pop(rng.randrange(len(held)))
            if rng.random() < 0.5:
                claims.upsert(_claim(gone["metadata"]["name"], 1, rv))
            else:
                claims.remove(gone)
        count = rng.choice([1, 2, 4])
        wanted = parse_claim(_claim(f"c{step}", count, rv))
        snapshot, placer = live.current()
        got = placer.place([wanted])
        view = View(claims=claims.by_key(), slices=stores["ResourceSlice"].by_key(), classes=stores["DeviceClass"].by_key())
        fresh, _ = build_snapshot(view, view.allocated_claims())
        want = Placer(fresh, Features(), CelEnvironment()).place([wanted])
        assert type(got) is type(want)
        if not isinstance(got, Placement) or not isinstance(want, Placement):
            continue
        assert (got.node, got.allocations) == (want.node, want.allocations), f"step {step}"
        stored = _claim(f"c{step}", count, rv, got.allocations[0])
        if rng.random() < 0.5:
            live.commit([wanted.key], got.allocations, got.node)  # our own write: committed at once...
        claims.upsert(stored)  # ...and the watch brings it back (a no-op then), or only the watch sees it
        held.append(stored)
    assert live.rebuilds == 1


def test_a_new_slice_rebuilds_the_snapshot() -> None:
    stores = _stores([_slice("a", 2, False)])
    live = LiveSnapshot(stores, Features(), CelEnvironment())
    _, placer = live.current()
    four = parse_claim(_claim("four", 4, 1))
    assert not isinstance(placer.place([four]), Placement)
    bigger = _slice("b", 4, False)
    bigger["metadata"]["resourceVersion"] = "9"
    stores["ResourceSlice"].upsert(bigger)
    _, placer = live.current()
    placed = placer.place([four])
    assert isinstance(placed, Placement) and placed.node == "b"
    assert live.rebuilds == 2


def test_scheduler_expands_and_binds_pod_by_pod_without_rebuilding(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [gpu_class(), template("one", 1)])
    for n in ("n1", "n2"):
        create_all(api, [node(n), gpu_slice(n, [(f"gpu-{g}", f"{n}-nvl") for g in range(2)])])
    m = manager(api)
    m.step()
    create_all(api, [pod(f"p{i}", templates={"gpu": "one"}) for i in range(3)])
    report = m.step()
    assert report.claims_created == 3 and report.pods_bound == 3
    # Binpack, pod by pod: p0 and p1 fill one node before p2 goes to the other.
    nodes = [api.get("Pod", f"p{i}", "default")["spec"]["nodeName"] for i in range(3)]
    assert nodes[0] == nodes[1] != nodes[2]
    assert all((c.get("status") or {}).get("allocation") for c in claims_of(api).values())
    # The next pass must not place the bound pods again, even before the cache shows them bound.
    again = m.reconcile_once()
    assert again.pods_bound == 0 and again.claims_created == 0
    assert roles(m).live.rebuilds == 1


def test_generated_claims_index_follows_adds_and_discards() -> None:
    from controller.claims import GeneratedClaims

    def generated(name: str, owner: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "default", "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
                             "ownerReferences": [{"kind": "Pod", "name": "p", "uid": owner, "controller": True}]}}

    owner_pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u1"}}
    index = GeneratedClaims([generated("p-gpu-aaaaa", "u1"), generated("p-gpu-bbbbb", "u1")])
    assert index.find(owner_pod, "gpu")["metadata"]["name"] == "p-gpu-aaaaa"  # type: ignore[index]
    index.discard("default/p-gpu-bbbbb")  # not the one held: nothing changes
    assert index.find(owner_pod, "gpu")["metadata"]["name"] == "p-gpu-aaaaa"  # type: ignore[index]
    index.discard("default/p-gpu-aaaaa")
    assert index.find(owner_pod, "gpu") is None
    index.add(generated("p-gpu-ccccc", "u1"))
    assert index.find(owner_pod, "gpu")["metadata"]["name"] == "p-gpu-ccccc"  # type: ignore[index]


def test_bound_pods_are_not_rescanned_for_expansion_every_pass(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [gpu_class(), template("one", 1), node("n1"), gpu_slice("n1", [("gpu-0", "x"), ("gpu-1", "x")])])
    m = manager(api)
    m.config = replace(m.config, resync_period=3600.0)  # no periodic full look during the test, however slow
    create_all(api, [pod("p0", templates={"gpu": "one"})])
    assert m.step().pods_bound == 1
    seen: list[int] = []
    expand = roles(m).claims.expand_templates

    def spy(pods: Any, *args: Any, **kwargs: Any) -> Any:
        pods = list(pods)
        seen.append(len(pods))
        return expand(pods, *args, **kwargs)

    roles(m).claims.expand_templates = spy  # type: ignore[method-assign]
    m.resync()
    m.reconcile_once()  # the bound pod changed (nodeName): looked at once
    m.reconcile_once()  # nothing changed: nobody to look at
    assert seen == [1, 0]


def test_a_node_cordoned_between_passes_is_not_used(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [gpu_class(), template("one", 1)])
    for n in ("n1", "n2"):
        create_all(api, [node(n), gpu_slice(n, [(f"gpu-{g}", f"{n}-nvl") for g in range(2)])])
    m = manager(api)
    create_all(api, [pod("p0", templates={"gpu": "one"})])
    m.step()
    first = api.get("Pod", "p0", "default")["spec"]["nodeName"]
    cordoned = api.get("Node", first)
    cordoned["spec"]["unschedulable"] = True
    api.replace("Node", cordoned)
    create_all(api, [pod("p1", templates={"gpu": "one"})])
    m.step()
    second = api.get("Pod", "p1", "default")["spec"]["nodeName"]
    assert second != first  # binpack would have picked the fuller node had it not been cordoned


def test_a_device_taint_rule_added_later_rebuilds_the_snapshot(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [gpu_class(), template("one", 1), template("two", 2)])
    for n in ("n1", "n2"):
        create_all(api, [node(n), gpu_slice(n, [(f"gpu-{g}", f"{n}-nvl") for g in range(4)])])
    m = manager(api)
    create_all(api, [pod("p0", templates={"gpu": "one"})])
    m.step()  # the snapshot exists before the rule does
    assert api.get("Pod", "p0", "default")["spec"].get("nodeName") == "n1"
    api.create("DeviceTaintRule", {"metadata": {"name": "drain-n1"}, "spec": {
        "deviceSelector": {"pool": "n1"}, "taint": {"key": "example.com/drain", "effect": "NoSchedule"}}})
    create_all(api, [pod("p", templates={"gpu": "two"})])
    m.step()
    assert api.get("Pod", "p", "default")["spec"].get("nodeName") == "n2"  # binpack would pick n1 without the rule
    assert roles(m).live.rebuilds == 2
