"""Allocator semantics, with cases transcribed from Kubernetes' structured allocator_test.go."""

from __future__ import annotations

from typing import Any

import pytest

from controller.allocator import AllocationError, Allocator, ClusterSnapshot, Unschedulable
from controller.cel import CelEnvironment
from dataclasses import replace

from gpudra.features import Features
from tests.alloc_fixtures import (
    DRIVER, allocation, claim, device, klass, node, node_selector, picked, request, slice_,
)


def at_1_35(**gates: bool) -> Features:
    """These unit tests pin Kubernetes 1.35 (alpha gates off unless turned on); the 1.36/1.37 defaults and semantics
    are covered by the conformance suite's runs at 1.37 and by test_features.py."""
    return replace(Features.for_version("1.35"), **gates)

NODE = "node-1"
CEL = CelEnvironment()


def run(slices: list[dict[str, Any]], claims: list[dict[str, Any]], classes: list[dict[str, Any]] | None = None,
        allocated: list[dict[str, Any]] | None = None, nodes: list[dict[str, Any]] | None = None,
        features: Features | None = None, on: str = NODE) -> list[dict[str, Any]] | Unschedulable:
    snap = ClusterSnapshot(slices, classes if classes is not None else [klass()], allocated or [],
                           nodes if nodes is not None else [node(NODE, {"region": "west"}), node("node-2", {"region": "east"})])
    return Allocator(snap, features or at_1_35(), CEL).allocate(on, claims)


def simple_slice(n: int = 2, node_name: str = NODE, pool: str = "pool-1", **kw: Any) -> dict[str, Any]:
    return slice_(f"{pool}-slice", node_name, pool, [device(f"device-{i}") for i in range(n)], **kw)


def test_simple_allocation_and_node_selector() -> None:
    out = run([simple_slice()], [claim()])
    assert picked(out) == [[("req-0", "device-0")]]
    assert out[0]["nodeSelector"] == node_selector(NODE)
    assert out[0]["devices"]["results"][0] == {"request": "req-0", "driver": DRIVER, "pool": "pool-1", "device": "device-0"}


def test_other_node_slice_is_not_used() -> None:
    assert run([simple_slice(node_name="node-2")], [claim()]) == Unschedulable("cannot allocate all claims")


def test_multiple_claims_get_distinct_devices_in_order() -> None:
    out = run([simple_slice()], [claim("c1"), claim("c2")])
    assert picked(out) == [[("req-0", "device-0")], [("req-0", "device-1")]]


def test_too_many_claims_is_unschedulable() -> None:
    assert isinstance(run([simple_slice(2)], [claim("c1"), claim("c2"), claim("c3")]), Unschedulable)


def test_allocated_devices_are_in_use() -> None:
    held = claim("old", allocation=allocation(NODE, ("pool-1", "device-0")))
    out = run([simple_slice()], [claim()], allocated=[held])
    assert picked(out) == [[("req-0", "device-1")]]


def test_multiple_requests_and_count() -> None:
    out = run([simple_slice(4)], [claim(requests=[request("a", count=2), request("b")])])
    assert picked(out) == [[("a", "device-0"), ("a", "device-1"), ("b", "device-2")]]


def test_all_mode_takes_every_matching_device() -> None:
    out = run([simple_slice(3)], [claim(requests=[request(allocationMode="All")])])
    assert [d for _, d in picked(out)[0]] == ["device-0", "device-1", "device-2"]


def test_all_mode_fails_when_one_is_in_use() -> None:
    held = claim("old", allocation=allocation(NODE, ("pool-1", "device-1")))
    assert isinstance(run([simple_slice(3)], [claim(requests=[request(allocationMode="All")])], allocated=[held]), Unschedulable)


def test_all_mode_needs_at_least_one_device() -> None:
    out = run([simple_slice(2)], [claim(requests=[request(allocationMode="All", selectors=[{"cel": {"expression": "false"}}])])])
    assert isinstance(out, Unschedulable)


def test_all_mode_with_incomplete_pool_is_fatal() -> None:
    with pytest.raises(AllocationError, match="asks for all devices, but resource pool driver-a/pool-1 is currently being updated"):
        run([simple_slice(2, count=2)], [claim(requests=[request(allocationMode="All")])])


def test_all_mode_constraint_violation_is_fatal() -> None:
    slices = [slice_("s", NODE, "pool-1", [device("d0", {"model": "x"}), device("d1", {"model": "y"})])]
    with pytest.raises(AllocationError, match="cannot add device driver-a/pool-1/d1 because a claim constraint would not be satisfied"):
        run(slices, [claim(requests=[request(allocationMode="All")], constraints=[{"matchAttribute": f"{DRIVER}/model"}])])


def test_first_available_picks_first_fitting_subrequest() -> None:
    req = {"name": "req-0", "firstAvailable": [{"name": "big", "deviceClassName": "class-a", "count": 3},
                                               {"name": "small", "deviceClassName": "class-a", "count": 1}]}
    out = run([simple_slice(2)], [claim(requests=[req])])
    assert picked(out) == [[("req-0/small", "device-0")]]


def test_first_available_backtracks_when_a_later_request_fails() -> None:
    # The first subrequest fits on its own but leaves too little for req-1: backtrack into the second one.
    req = {"name": "req-0", "firstAvailable": [{"name": "two", "deviceClassName": "class-a", "count": 2},
                                               {"name": "one", "deviceClassName": "class-a", "count": 1}]}
    out = run([simple_slice(3)], [claim(requests=[req, request("req-1", count=2)])])
    assert picked(out) == [[("req-0/one", "device-0"), ("req-1", "device-1"), ("req-1", "device-2")]]


def test_first_available_disabled_is_fatal() -> None:
    req = {"name": "req-0", "firstAvailable": [{"name": "one", "deviceClassName": "class-a"}]}
    with pytest.raises(AllocationError, match="has subrequests, but the DRAPrioritizedList feature is disabled"):
        run([simple_slice()], [claim(requests=[req])], features=at_1_35(prioritized_list=False))


def test_match_attribute_across_requests() -> None:
    devs = [device("d0", {"numa": 0}), device("d1", {"numa": 1}), device("d2", {"numa": 1})]
    out = run([slice_("s", NODE, "pool-1", devs)],
              [claim(requests=[request("a"), request("b")], constraints=[{"matchAttribute": f"{DRIVER}/numa"}])])
    # d0 first for a, then b cannot match numa 0: backtrack so that a=d1, b=d2.
    assert picked(out) == [[("a", "d1"), ("b", "d2")]]


def test_match_attribute_scoped_to_requests() -> None:
    devs = [device("d0", {"numa": 0}), device("d1", {"numa": 1}), device("d2", {"numa": 1})]
    out = run([slice_("s", NODE, "pool-1", devs)],
              [claim(requests=[request("a"), request("b"), request("c")],
                     constraints=[{"requests": ["b", "c"], "matchAttribute": f"{DRIVER}/numa"}])])
    assert picked(out) == [[("a", "d0"), ("b", "d1"), ("c", "d2")]]


def test_match_attribute_missing_attribute_fails() -> None:
    out = run([simple_slice(2)], [claim(requests=[request(count=2)], constraints=[{"matchAttribute": f"{DRIVER}/numa"}])])
    assert isinstance(out, Unschedulable)


def test_match_attribute_types_must_agree() -> None:
    devs = [device("d0", {"v": 1}), device("d1", {"v": "1"})]
    out = run([slice_("s", NODE, "pool-1", devs)], [claim(requests=[request(count=2)], constraints=[{"matchAttribute": f"{DRIVER}/v"}])])
    assert isinstance(out, Unschedulable)


def test_distinct_attribute_needs_consumable_capacity_gate() -> None:
    c = claim(requests=[request(count=2)], constraints=[{"distinctAttribute": f"{DRIVER}/numa"}])
    devs = [device("d0", {"numa": 0}), device("d1", {"numa": 0}), device("d2", {"numa": 1})]
    with pytest.raises(AllocationError, match=r"claim default/claim-0, constraint #0: empty constraint"):
        run([slice_("s", NODE, "pool-1", devs)], [c])
    out = run([slice_("s", NODE, "pool-1", devs)], [c], features=at_1_35(consumable_capacity=True))
    assert picked(out) == [[("req-0", "d0"), ("req-0", "d2")]]


def test_missing_class_is_fatal() -> None:
    with pytest.raises(AllocationError, match=r'claim default/claim-0, request req-0: could not retrieve device class class-a: '
                                              r'deviceclass.resource.k8s.io "class-a" not found'):
        run([simple_slice()], [claim()], classes=[])


def test_claim_limit_of_32() -> None:
    with pytest.raises(AllocationError, match="claim default/claim-0: number of requested devices 33 exceeds the claim limit of 32"):
        run([simple_slice(40)], [claim(requests=[request(count=33)])])


def test_first_available_over_limit_falls_back() -> None:
    req = {"name": "r", "firstAvailable": [{"name": "many", "deviceClassName": "class-a", "count": 30},
                                           {"name": "few", "deviceClassName": "class-a", "count": 1}]}
    out = run([simple_slice(40)], [claim(requests=[request("a", count=3), req])])
    assert [r for r, _ in picked(out)[0]] == ["a", "a", "a", "r/few"]


def test_class_selector_and_cel_runtime_error_text() -> None:
    cls = klass(selectors=[f'device.attributes["{DRIVER}"].model == "b"'])
    slices = [slice_("s", NODE, "pool-1", [device("d0", {"model": "a"}), device("d1", {"model": "b"})])]
    assert picked(run(slices, [claim()], classes=[cls])) == [[("req-0", "d1")]]
    bad = klass(selectors=[f'device.attributes["{DRIVER}"].nope == "b"'])
    with pytest.raises(AllocationError, match=r"^class class-a: selector #0: CEL runtime error: no such key: nope"):
        run(slices, [claim()], classes=[bad])


def test_request_selector_error_names_claim() -> None:
    c = claim(requests=[request(selectors=[{"cel": {"expression": "1 + 1"}}])])
    with pytest.raises(AllocationError, match=r"^claim default/claim-0: selector #0: CEL compile error"):
        run([simple_slice()], [c])


def test_generations_newest_wins_and_incomplete_pool_is_skipped() -> None:
    old = slice_("old", NODE, "pool-1", [device("old-0")], generation=1)
    new = slice_("new", NODE, "pool-1", [device("new-0")], generation=2)
    assert picked(run([old, new], [claim()])) == [[("req-0", "new-0")]]
    incomplete = slice_("part", NODE, "pool-1", [device("d0")], count=2)
    assert isinstance(run([incomplete], [claim()]), Unschedulable)


def test_pool_complete_with_slices_of_other_nodes() -> None:
    # Two slices with count 2: only one targets the node, but the pool is complete.
    a = slice_("a", NODE, "pool-1", [device("d0")], count=2)
    b = slice_("b", "node-2", "pool-1", [device("d1")], count=2)
    assert picked(run([a, b], [claim()])) == [[("req-0", "d0")]]


def test_newer_generation_elsewhere_obsoletes_pool() -> None:
    a = slice_("a", NODE, "pool-1", [device("d0")], count=2, generation=1)
    b = slice_("b", "node-2", "pool-1", [device("d1")], count=1, generation=2)
    assert run([a, b], [claim()]) == Unschedulable("cannot allocate all claims")


def test_invalid_pool_reason() -> None:
    dup = slice_("s", NODE, "pool-1", [device("d0"), device("d0")])
    assert run([dup], [claim()]) == Unschedulable("invalid resource pools were encountered")
    good = slice_("g", NODE, "pool-2", [device("x0")])
    assert picked(run([dup, good], [claim()])) == [[("req-0", "x0")]]


def test_all_nodes_and_node_selector_slices() -> None:
    net = slice_("net", None, "net", [device("n0")], allNodes=True)
    out = run([net], [claim()])
    assert "nodeSelector" not in out[0]
    west = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "region", "operator": "In", "values": ["west"]}]}]}
    sel = slice_("sel", None, "sel", [device("s0")], nodeSelector=west)
    out = run([sel], [claim()])
    assert out[0]["nodeSelector"] == {"nodeSelectorTerms": [{"matchExpressions": west["nodeSelectorTerms"][0]["matchExpressions"]}]}
    assert isinstance(run([sel], [claim()], on="node-2"), Unschedulable)


def test_admin_access_ignores_use_and_is_not_marked() -> None:
    held = claim("old", allocation=allocation(NODE, ("pool-1", "device-0"), ("pool-1", "device-1")))
    out = run([simple_slice(2)], [claim(requests=[request(adminAccess=True)])], allocated=[held])
    assert out[0]["devices"]["results"][0] == {"request": "req-0", "driver": DRIVER, "pool": "pool-1", "device": "device-0",
                                               "adminAccess": True}
    with pytest.raises(AllocationError, match="admin access is requested, but the feature is disabled"):
        run([simple_slice(2)], [claim(requests=[request(adminAccess=True)])], features=at_1_35(admin_access=False))


def test_admin_access_allocation_holds_no_devices() -> None:
    admin = claim("admin", allocation={"devices": {"results": [{"request": "req-0", "driver": DRIVER, "pool": "pool-1",
                                                                "device": "device-0", "adminAccess": True}]}})
    assert picked(run([simple_slice(1)], [claim()], allocated=[admin])) == [[("req-0", "device-0")]]


def test_taints_gated_and_tolerations() -> None:
    tainted = slice_("s", NODE, "pool-1", [device("d0", taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}]), device("d1")])
    off = at_1_35()
    assert picked(run([tainted], [claim()], features=off)) == [[("req-0", "d0")]]  # gate off: taints ignored
    on = Features()  # on by default: device taints are GA in Kubernetes 1.37
    assert picked(run([tainted], [claim()], features=on)) == [[("req-0", "d1")]]
    tol = [{"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}]
    out = run([tainted], [claim(requests=[request(tolerations=tol)])], features=on)
    assert out[0]["devices"]["results"][0]["device"] == "d0"
    assert out[0]["devices"]["results"][0]["tolerations"] == tol
    none_effect = slice_("s", NODE, "pool-1", [device("d0", taints=[{"key": "k", "effect": "None"}])])
    assert picked(run([none_effect], [claim()], features=on)) == [[("req-0", "d0")]]


def counter_slices(node_name: str = NODE) -> list[dict[str, Any]]:
    counters = slice_("counters", node_name, "pool-1", [], count=2, sharedCounters=[{"name": "gpu-0", "counters": {"mem": {"value": "8Gi"}}}])
    del counters["spec"]["devices"]
    parts = [device(f"part-{i}", consumesCounters=[{"counterSet": "gpu-0", "counters": {"mem": {"value": "4Gi"}}}]) for i in range(3)]
    return [counters, slice_("devices", node_name, "pool-1", parts, count=2)]


def test_partitionable_counters() -> None:
    on = at_1_35(partitionable_devices=True)
    out = run(counter_slices(), [claim("a"), claim("b")], features=on)
    assert picked(out) == [[("req-0", "part-0")], [("req-0", "part-1")]]
    assert isinstance(run(counter_slices(), [claim("a"), claim("b"), claim("c")], features=on), Unschedulable)
    held = claim("old", allocation=allocation(NODE, ("pool-1", "part-0")))
    assert picked(run(counter_slices(), [claim("a")], allocated=[held], features=on)) == [[("req-0", "part-1")]]
    assert isinstance(run(counter_slices(), [claim("a"), claim("b")], allocated=[held], features=on), Unschedulable)
    # Gate off: the counter slice is skipped, the pool is incomplete.
    assert isinstance(run(counter_slices(), [claim("a")]), Unschedulable)


def test_missing_counter_set_makes_pool_invalid() -> None:
    on = at_1_35(partitionable_devices=True)
    bad = [device("p", consumesCounters=[{"counterSet": "nope", "counters": {"mem": {"value": "1"}}}])]
    assert run([slice_("s", NODE, "pool-1", bad)], [claim()], features=on) == Unschedulable("invalid resource pools were encountered")


def test_consumable_capacity_shared_device() -> None:
    on = at_1_35(consumable_capacity=True)
    shared = device("shared", allowMultipleAllocations=True, capacity={"memory": {"value": "10Gi", "requestPolicy": {
        "default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}}})
    c1 = claim("a", requests=[request(capacity={"requests": {"memory": "1500Mi"}})])
    c2 = claim("b", requests=[request(capacity={"requests": {"memory": "8Gi"}})])
    out = run([slice_("s", NODE, "pool-1", [shared])], [c1, c2], features=on)
    r1, r2 = out[0]["devices"]["results"][0], out[1]["devices"]["results"][0]
    assert r1["consumedCapacity"] == {"memory": "2Gi"} and r2["consumedCapacity"] == {"memory": "8Gi"}
    assert r1["shareID"] != r2["shareID"]
    c3 = claim("c", requests=[request(capacity={"requests": {"memory": "9Gi"}})])
    assert isinstance(run([slice_("s", NODE, "pool-1", [shared])], [c1, c3], features=on), Unschedulable)
    with pytest.raises(AllocationError, match="has capacity requests, but the DRAConsumableCapacity feature is disabled"):
        run([slice_("s", NODE, "pool-1", [shared])], [c1])


def test_consumable_capacity_respects_allocated_shares() -> None:
    on = at_1_35(consumable_capacity=True)
    shared = device("shared", allowMultipleAllocations=True, capacity={"memory": {"value": "10Gi"}})
    held = claim("old", allocation={"devices": {"results": [{"request": "req-0", "driver": DRIVER, "pool": "pool-1", "device": "shared",
                                                              "shareID": "1b2c3d4e-0000-4000-8000-000000000000",
                                                              "consumedCapacity": {"memory": "6Gi"}}]}})
    fits = claim("a", requests=[request(capacity={"requests": {"memory": "4Gi"}})])
    too_big = claim("b", requests=[request(capacity={"requests": {"memory": "5Gi"}})])
    assert isinstance(run([slice_("s", NODE, "pool-1", [shared])], [fits], allocated=[held], features=on), list)
    assert isinstance(run([slice_("s", NODE, "pool-1", [shared])], [too_big], allocated=[held], features=on), Unschedulable)


def test_config_propagation() -> None:
    opaque = lambda n: {"opaque": {"driver": DRIVER, "parameters": {"n": n}}}  # noqa: E731
    classes = [klass("class-a", config=[opaque("class-a")]), klass("class-b", config=[opaque("class-b")])]
    c = claim(requests=[request("r1"), request("r2"), request("r3", cls="class-b")],
              config=[{**opaque("all")}, {"requests": ["r2"], **opaque("r2")}, {"requests": ["nope"], **opaque("x")}])
    out = run([simple_slice(3)], [c], classes=classes)
    assert out[0]["devices"]["config"] == [
        {"source": "FromClass", "requests": ["r1", "r2"], **opaque("class-a")},
        {"source": "FromClass", "requests": ["r3"], **opaque("class-b")},
        {"source": "FromClaim", **opaque("all")},
        {"source": "FromClaim", "requests": ["r2"], **opaque("r2")},
    ]


def test_config_for_chosen_subrequest() -> None:
    opaque = {"opaque": {"driver": DRIVER, "parameters": {}}}
    req = {"name": "r", "firstAvailable": [{"name": "big", "deviceClassName": "class-a", "count": 5},
                                           {"name": "small", "deviceClassName": "class-a"}]}
    c = claim(requests=[req], config=[{"requests": ["r/small"], **opaque}, {"requests": ["r/big"], **opaque}])
    out = run([simple_slice(2)], [c])
    assert out[0]["devices"]["config"] == [{"source": "FromClaim", "requests": ["r/small"], **opaque}]


def test_empty_constraint_is_fatal() -> None:
    with pytest.raises(AllocationError, match="claim default/claim-0, constraint #0: empty constraint"):
        run([simple_slice()], [claim(constraints=[{"requests": ["req-0"]}])])


def test_binding_conditions_need_gates() -> None:
    dev = device("d0", bindingConditions=["ready"], bindingFailureConditions=["failed"])
    assert isinstance(run([slice_("s", NODE, "pool-1", [dev])], [claim()]), Unschedulable)
    on = at_1_35(device_binding_conditions=True)
    out = run([slice_("s", NODE, "pool-1", [dev])], [claim()], features=on)
    assert out[0]["devices"]["results"][0]["bindingConditions"] == ["ready"]


def test_per_device_node_selection_needs_gate() -> None:
    devs = [device("d0", nodeName="node-2"), device("d1", nodeName=NODE)]
    s = slice_("s", None, "pool-1", devs, perDeviceNodeSelection=True)
    assert isinstance(run([s], [claim()]), Unschedulable)
    out = run([s], [claim()], features=at_1_35(partitionable_devices=True))
    assert picked(out) == [[("req-0", "d1")]]
    assert out[0]["nodeSelector"] == node_selector(NODE)


def test_pools_are_searched_by_name_then_slices_by_name() -> None:
    # kube-scheduler 1.37 sorts a pool's slices by name (found by the differential check against it); input
    # order does not count.
    b = slice_("b", NODE, "pool-b", [device("b0")])
    a2 = slice_("a2", NODE, "pool-a", [device("a1")], count=2)
    a1 = slice_("a1", NODE, "pool-a", [device("a0")], count=2)
    assert picked(run([b, a2, a1], [claim(requests=[request(count=3)])])) == [[("req-0", "a0"), ("req-0", "a1"), ("req-0", "b0")]]


def test_failed_search_is_bounded() -> None:
    # 8 needed from two domains of 7 free devices: infeasible; memoised failures keep this fast and finite.
    devs = [device(f"d{i}", {"dom": i // 8}) for i in range(16)]
    held = claim("old", allocation=allocation(NODE, ("pool-1", "d0"), ("pool-1", "d8")))
    out = run([slice_("s", NODE, "pool-1", devs)], [claim(requests=[request(count=8)], constraints=[{"matchAttribute": f"{DRIVER}/dom"}])],
              allocated=[held])
    assert isinstance(out, Unschedulable)


def test_unsupported_allocation_mode_is_fatal() -> None:
    with pytest.raises(AllocationError, match="unsupported count mode Some"):
        run([simple_slice()], [claim(requests=[request(allocationMode="Some")])])


def test_fractional_capacity_range_rounds_in_milli_units_from_1_37() -> None:
    """DRAFractionalCapacityRange (1.37): a range with a fractional step rounds requests up in milli units; before,
    every value is rounded up to an integer first (so 0.25 of a 0.2+0.1k range consumed 1)."""
    from controller.allocator import capacity as cap

    policy = {"default": "200m", "validRange": {"min": "200m", "max": "1", "step": "100m"}}
    device_capacity = {"cores": {"value": "1", "requestPolicy": policy}}
    assert str(cap.consumption(device_capacity, {"cores": "250m"}, fractional=True)["cores"]) == "300m"
    assert str(cap.consumption(device_capacity, {"cores": "250m"}, fractional=False)["cores"]) == "1"
    assert Features.for_version("1.37").fractional_capacity_range
    assert not Features.for_version("1.36").fractional_capacity_range
    # Three 0.3 shares fit in one core with milli arithmetic; with integers each consumes 1.
    assert cap.fits(device_capacity, {"cores": "250m"}, {"cores": cap._q("600m")}, {}, True)
    assert not cap.fits(device_capacity, {"cores": "250m"}, {"cores": cap._q("600m")}, {}, False)
