"""Node scoring and multi-node placement."""

from __future__ import annotations

from controller.allocator import ClusterSnapshot, parse_claim
from controller.cel import CelEnvironment
from controller.scoring import NoPlacement, Placement, Placer, min_devices
from tests.alloc_fixtures import claim, device, klass, request, slice_

GPU = "gpu.nvidia.com"


def gpus(node: str, layout: list[tuple[str, int]]) -> dict:
    return slice_(node, node, node, [device(f"gpu-{i}", {"nvlinkDomain": d, "numaNode": n}) for i, (d, n) in enumerate(layout)],
                  driver=GPU)


def placer(slices: list[dict], policy: str = "binpack", allocated: list[dict] | None = None) -> Placer:
    return Placer(ClusterSnapshot(slices, [klass()], allocated or []), cel_env=CelEnvironment(), policy=policy)  # type: ignore[arg-type]


def test_binpack_prefers_fuller_node_and_spread_emptier() -> None:
    slices = [gpus("a", [("x", 0)] * 4), gpus("b", [("y", 0)] * 2)]
    c = [parse_claim(claim())]
    assert placer(slices).place(c).node == "b"  # type: ignore[union-attr]
    assert placer(slices, "spread").place(c).node == "a"  # type: ignore[union-attr]


def test_ties_break_by_node_name() -> None:
    slices = [gpus("n2", [("x", 0)] * 2), gpus("n1", [("y", 0)] * 2)]
    assert placer(slices).place([parse_claim(claim())]).node == "n1"  # type: ignore[union-attr]


def test_topology_beats_packing_and_aligned_devices_are_preferred() -> None:
    # "a" packs better (fewer free) but its free GPUs span NUMA nodes; "b" can give two GPUs on one NUMA node.
    a = gpus("a", [("x", 0), ("x", 1), ("x", 1)])
    b = gpus("b", [("y", 0), ("y", 1), ("y", 0), ("y", 1)])
    c = [parse_claim(claim(requests=[request(count=2)]))]
    placed = placer([a, b]).place(c)
    assert isinstance(placed, Placement)
    assert placed.node == "a"  # a: gpu-1, gpu-2 share nvlink x and NUMA 1 (found through the aligned variant)
    assert [r["device"] for r in placed.allocations[0]["devices"]["results"]] == ["gpu-1", "gpu-2"]
    a_split = gpus("a", [("x", 0), ("x", 1), ("z", 1)])
    placed = placer([a_split, b]).place(c)
    assert isinstance(placed, Placement) and placed.node == "b"
    assert [r["device"] for r in placed.allocations[0]["devices"]["results"]] == ["gpu-0", "gpu-2"]


def test_first_available_score_prefers_first_subrequest() -> None:
    req = {"name": "r", "firstAvailable": [{"name": "two", "deviceClassName": "class-a", "count": 2},
                                           {"name": "one", "deviceClassName": "class-a", "count": 1}]}
    slices = [gpus("a", [("x", 0)]), gpus("b", [("y", 0), ("y", 0), ("y", 0)])]
    placed = placer(slices).place([parse_claim(claim(requests=[req]))])
    assert isinstance(placed, Placement) and placed.node == "b"
    assert placed.score[0] == 8


def test_commit_holds_devices_for_next_placement() -> None:
    p = placer([gpus("a", [("x", 0)]), gpus("b", [("y", 0)])])
    first = p.place([parse_claim(claim("c1"))])
    assert isinstance(first, Placement)
    p.commit(["default/c1"], first.allocations, first.node)
    second = p.place([parse_claim(claim("c2"))])
    assert isinstance(second, Placement) and second.node != first.node
    p.commit(["default/c2"], second.allocations, second.node)
    third = p.place([parse_claim(claim("c3"))])
    assert isinstance(third, NoPlacement) and set(third.reasons) == {"a", "b"}


def test_min_devices_ignores_admin_access_and_takes_smallest_subrequest() -> None:
    req = {"name": "r", "firstAvailable": [{"name": "x", "deviceClassName": "c", "count": 4},
                                           {"name": "y", "deviceClassName": "c", "count": 2}]}
    c = parse_claim(claim(requests=[req, request("admin", adminAccess=True, count=3), request("n", count=1)]))
    assert min_devices([c]) == 3
