"""Selector results shared between devices by the values the expression reads (controller/cel/footprint.py)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from controller.cel import CelEnvironment, CelRuntimeError, DeviceView

DRIVER = "dra.example.com"


def device(name: str, attributes: dict[str, Any] | None = None, memory: str = "80Gi") -> DeviceView:
    return DeviceView.from_slice_device(DRIVER, {"name": name, "attributes": attributes or {},
                                                 "capacity": {"memory": {"value": memory}}})


@pytest.mark.parametrize("expr, paths", [
    (f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"',
     (("attributes", DRIVER, "type"), ("driver",))),
    (f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0', (("capacity", DRIVER, "memory"),)),
    ('has(device.attributes["d"].x) && device.attributes.d["y"] == 1', (("attributes", "d", "x"), ("attributes", "d", "y"))),
    ('device.attributes["d"].xs.exists(v, v > device.attributes["d"].y)', (("attributes", "d", "xs"), ("attributes", "d", "y"))),
    ("device.allowMultipleAllocations", (("allowMultipleAllocations",),)),
])
def test_footprint_lists_the_paths_read(expr: str, paths: tuple[tuple[str, ...], ...]) -> None:
    footprint = CelEnvironment().compile(expr)._footprint
    assert footprint is not None and footprint.paths == paths


@pytest.mark.parametrize("expr", [
    "has(device.attributes.d)",  # a domain's presence
    '"x" in device.attributes["d"]',  # a whole id map
    "size(device.attributes) > 0",
    'device.attributes["d"].exists(k, k == "x")',
    'device.attributes[?"d"].orValue({}).size() > 0',  # optional access
    '[1].exists(device, device == 1)',  # a local named device
    'cel.bind(device, 1, device == 1)',
])
def test_expression_reading_more_than_fixed_paths_has_no_footprint(expr: str) -> None:
    assert CelEnvironment().compile(expr)._footprint is None


def test_devices_with_equal_values_share_a_result_and_others_do_not() -> None:
    sel = CelEnvironment().compile('device.attributes["d"].model == "a" && device.attributes["d"].n == 1')
    same = [device(f"dev-{i}", {"d/model": {"string": "a"}, "d/n": {"int": 1}, "d/index": {"int": i}}) for i in range(3)]
    assert [sel.matches(d) for d in same] == [True, True, True]
    assert len(sel._results._messages) == 1  # one evaluation answered all three
    # A bool is not the int it equals in Python: its own key, and CEL's answer for it (no match).
    assert sel.matches(device("b", {"d/model": {"string": "a"}, "d/n": {"bool": True}})) is False
    assert sel.matches(device("c", {"d/model": {"string": "b"}, "d/n": {"int": 1}})) is False
    assert len(sel._results._messages) == 3


def test_semver_build_metadata_shares_and_quantities_compare_by_value() -> None:
    env = CelEnvironment()
    sel = env.compile('device.attributes["d"].v.isGreaterThan(semver("1.0.0")) && '
                      'device.capacity["dra.example.com"].memory.isGreaterThan(quantity("1Gi"))')
    assert sel.matches(device("a", {"d/v": {"version": "1.2.3+one"}}, memory="2Gi")) is True
    assert sel.matches(device("b", {"d/v": {"version": "1.2.3+two"}}, memory="2048Mi")) is True
    assert len(sel._results._messages) == 1
    assert sel.matches(device("c", {"d/v": {"version": "1.2.3-rc.1"}}, memory="2Gi")) is True
    assert sel.matches(device("d", {"d/v": {"version": "0.9.0"}}, memory="2Gi")) is False


def test_errors_are_not_shared_each_device_is_evaluated() -> None:
    sel = CelEnvironment().compile('device.attributes["d"].missing == 1 || device.attributes["d"].n == 2')
    for name in ("a", "b"):
        with pytest.raises(CelRuntimeError, match="no such key"):
            sel.matches(device(name, {"d/n": {"int": 1}}))
    assert len(sel._results._messages) == 0
    # `||` absorbs the error when the other side is true: a result like any other.
    assert sel.matches(device("c", {"d/n": {"int": 2}})) is True


FOOTPRINT_EXPRESSIONS = [
    'device.attributes["d"].model == "a" && device.attributes["d"].n >= 1',
    'has(device.attributes["d"].n) ? device.attributes["d"].n == 1 : device.attributes["d"].model.startsWith("b")',
    'device.attributes["d"].v.isGreaterThan(semver("1.0.0"))',
    f'device.capacity["{DRIVER}"].memory.compareTo(quantity("1Gi")) >= 0 || device.attributes["d"].flag',
    'device.attributes["d"].tags.exists(t, t == "x")',
    f'device.driver == "{DRIVER}" && !device.allowMultipleAllocations',
    'device.attributes["e"].n == 1',  # a domain most devices lack
]


def _random_device(rng: random.Random, i: int) -> dict[str, Any]:
    pool: dict[str, Any] = {
        "d/model": {"string": rng.choice("ab")},
        "d/n": rng.choice([{"int": 1}, {"int": 2}, {"bool": True}, {"string": "1"}]),
        "d/v": {"version": rng.choice(["1.2.3", "1.2.3+build", "0.9.0", "1.0.0-rc.1"])},
        "d/flag": {"bool": rng.random() < 0.5},
        "d/tags": {"strings": rng.sample(["x", "y", "z"], rng.randrange(0, 3))},
        "e/n": {"int": rng.randrange(2)},
        "d/index": {"int": i},  # read by no expression: must not split results
    }
    attributes = {k: v for k, v in pool.items() if rng.random() < 0.8}
    return {"name": f"dev-{i}", "attributes": attributes, "allowMultipleAllocations": rng.random() < 0.2,
            "capacity": {"memory": {"value": rng.choice(["1Gi", "1024Mi", "512Mi", "2Gi"])}}}


def _outcome(selector: Any, view: DeviceView) -> tuple[str, Any]:
    try:
        return ("ok", selector.matches(view))
    except CelRuntimeError as err:
        return ("error", str(err))


@pytest.mark.parametrize("seed", range(3))
def test_shared_results_equal_evaluating_every_device(seed: int) -> None:
    rng = random.Random(seed)
    devices = [_random_device(rng, i) for i in range(200)]
    shared = CelEnvironment()
    plain = CelEnvironment()
    for expr in FOOTPRINT_EXPRESSIONS:
        selector = shared.compile(expr)
        assert selector._footprint is not None, expr
        reference = plain.compile(expr)
        reference._footprint = None  # evaluates every device
        got = [_outcome(selector, DeviceView.from_slice_device(DRIVER, d)) for d in devices]
        want = [_outcome(reference, DeviceView.from_slice_device(DRIVER, d)) for d in devices]
        assert got == want, expr
        assert 0 < len(selector._results._messages) < len(devices) / 2, expr  # shared, yet not one answer


def test_environment_without_sharing_evaluates_every_device() -> None:
    env = CelEnvironment(share_results=False)
    sel = env.compile('device.attributes["d"].model == "a"')
    assert sel._footprint is None
    assert [sel.matches(device(f"dev-{i}", {"d/model": {"string": "a"}})) for i in range(3)] == [True] * 3
    assert len(sel._results._messages) == 0
