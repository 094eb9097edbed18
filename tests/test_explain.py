"""Explanations of why claims do not fit, per node and summarised."""

from __future__ import annotations

from controller.allocator import ClusterSnapshot, parse_claim
from controller.cel import CelEnvironment
from controller.diagnosis import Diagnoser, NodeReason, explain, summarize
from tests.alloc_fixtures import DRIVER, allocation, claim, device, klass, node, request, slice_

CEL = CelEnvironment()


def explainer(slices: list[dict], classes: list[dict] | None = None, allocated: list[dict] | None = None) -> Diagnoser:
    return Diagnoser(ClusterSnapshot(slices, classes or [klass()], allocated or []), cel_env=CEL)


def test_selector_false_names_class_selector() -> None:
    cls = klass(selectors=[f'device.attributes["{DRIVER}"].model == "h100"'])
    ex = explainer([slice_("s", "n1", "p", [device("d0", {"model": "a100"})])], [cls])
    r = ex.explain_node("n1", [parse_claim(claim())])
    assert r.code == "selector"
    assert r.message == 'no device matches selector #0 of class class-a: model "a100" == "h100" is false on 1 device'


def test_in_use_names_the_holder() -> None:
    held = claim("old", allocation=allocation("n1", ("p", "d0")))
    ex = explainer([slice_("s", "n1", "p", [device("d0")])], allocated=[held])
    r = ex.explain_node("n1", [parse_claim(claim())])
    assert r.code == "in-use" and "in use by default/old" in r.message and r.details["inUseBy"] == {"default/old": 1}


def test_constraint_mismatch_counts_largest_group() -> None:
    devs = [device(f"d{i}", {"nvlinkDomain": "a" if i < 3 else "b"}) for i in range(5)]
    ex = explainer([slice_("s", "n1", "p", devs)])
    c = claim(requests=[request(count=4)], constraints=[{"matchAttribute": f"{DRIVER}/nvlinkDomain"}])
    r = ex.explain_node("n1", [parse_claim(c)])
    assert r.code == "constraint" and r.message == f"only 3 of 4 free devices share {DRIVER}/nvlinkDomain"


def test_pool_incomplete_and_no_devices() -> None:
    ex = explainer([slice_("s", "n1", "p", [device("d0")], count=2)])
    assert ex.explain_node("n1", [parse_claim(claim())]).code == "pool-incomplete"
    ex = Diagnoser(ClusterSnapshot([], [klass()], [], [node("n1")]), cel_env=CEL)
    assert ex.explain_node("n1", [parse_claim(claim())]).code == "no-devices"


def test_fits_and_fatal_error() -> None:
    ex = explainer([slice_("s", "n1", "p", [device("d0")])])
    assert ex.explain_node("n1", [parse_claim(claim())]).code == "fits"
    err = ex.explain_node("n1", [parse_claim(claim(requests=[request(cls="missing")]))])
    assert err.code == "error" and "could not retrieve device class missing" in err.message


def test_summary_groups_nodes_by_reason() -> None:
    reasons = [NodeReason(f"n{i}", "selector", "no device matches selector #0 of class gpu") for i in range(3)]
    reasons += [NodeReason("m", "constraint", "only 3 of 4 free devices share x"), NodeReason("ok", "fits", "fits")]
    assert summarize(reasons) == "3 nodes: no device matches selector #0 of class gpu; 1 node: only 3 of 4 free devices share x"


def test_explain_over_many_nodes() -> None:
    slices = [slice_(f"s{i}", f"n{i}", f"p{i}", [device("d0")]) for i in range(4)]
    held = [claim(f"h{i}", allocation=allocation(f"n{i}", (f"p{i}", "d0"))) for i in range(3)]
    snap = ClusterSnapshot(slices, [klass()], held)
    reasons = explain(snap, [parse_claim(claim())], cel_env=CEL)
    assert [r.code for r in reasons] == ["in-use", "in-use", "in-use", "fits"]
