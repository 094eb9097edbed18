"""The evaluation fast path keeps CEL semantics: literal folding, integer quantity order, shared memos and arenas."""

from __future__ import annotations

import pytest

from controller.cel import CelEnvironment, CelRuntimeError, DeviceView
from controller.cel.fold import fold_literals
from controller.cel.messages import build_message_types
from controller.cel.values import compare_quantity_messages, quantity_to_message
from gpudra.quantity import Quantity

DRIVER = "dra.example.com"


@pytest.fixture(scope="module")
def env() -> CelEnvironment:
    return CelEnvironment()


def device(name: str = "dev", version: str = "1.2.3-rc.1", memory: str = "1Gi") -> DeviceView:
    return DeviceView.from_slice_device(DRIVER, {"name": name, "attributes": {"driver": {"version": version}},
                                                 "capacity": {"memory": {"value": memory}}})


def _runtime_serialized(env: CelEnvironment, expr: str) -> bytes:
    return env._runtime.compile(expr, disable_check=True).serialize()


@pytest.mark.parametrize("expr", [
    'quantity("1Gi") == quantity("1024Mi")',
    'semver("1.2.3") == semver("1.2.3+build")',
    'semver("v1.2", true) == semver("1.2.0")',
    'isQuantity("1Gi") && !isQuantity("1.5.5")',
    'isSemver("1.0.0") && !isSemver("1.0") && isSemver("v1", true)',
])
def test_literal_calls_are_folded_and_keep_their_value(env: CelEnvironment, expr: str) -> None:
    assert fold_literals(_runtime_serialized(env, expr), env._types) is not None
    assert env.compile(expr).matches(device()) is True


def test_expression_without_literal_calls_is_not_rewritten(env: CelEnvironment) -> None:
    expr = 'device.capacity["dra.example.com"].memory.isInteger()'
    assert fold_literals(_runtime_serialized(env, expr), env._types) is None


def test_invalid_literal_still_fails_at_evaluation_only_where_reached(env: CelEnvironment) -> None:
    with pytest.raises(CelRuntimeError, match="quantities must match the regular expression"):
        env.compile('quantity("bad") == quantity("1")').matches(device())
    with pytest.raises(CelRuntimeError, match="No Major.Minor.Patch elements found"):
        env.compile('semver("1.0") == semver("1.0.0")').matches(device())
    assert env.compile('false && quantity("bad") == quantity("1")').matches(device()) is False


@pytest.mark.parametrize("expr, memory, expected", [
    ('device.capacity["dra.example.com"].memory.compareTo(quantity("40Gi")) >= 0', "80Gi", True),
    ('device.capacity["dra.example.com"].memory.compareTo(quantity("40Gi")) >= 0', "24Gi", False),
    ('device.capacity["dra.example.com"].memory.isGreaterThan(quantity("1G"))', "1Gi", True),
    ('device.capacity["dra.example.com"].memory == quantity("1.5")', "1500m", True),
    ('device.capacity["dra.example.com"].memory.isLessThan(quantity("0"))', "-1m", True),
])
def test_folded_quantities_compare_with_device_values(env: CelEnvironment, expr: str, memory: str,
                                                       expected: bool) -> None:
    assert env.compile(expr).matches(device(memory=memory)) is expected


_VALUES = ["0", "0m", "1", "-1", "1m", "-1m", "1500m", "1.5", "1Gi", "1024Mi", "1G", "80Gi", "1e3", "1k",
           "123456789012345678901234567890", "-2E", "999n", "1n"]


@pytest.mark.parametrize("left", _VALUES)
def test_integer_quantity_order_matches_exact_order(left: str) -> None:
    types = build_message_types()
    a = Quantity.parse(left)
    for right in _VALUES:
        b = Quantity.parse(right)
        got = compare_quantity_messages(quantity_to_message(a, types.Quantity), quantity_to_message(b, types.Quantity))
        assert got == a.cmp(b), (left, right)


def test_devices_sharing_values_and_arenas_evaluate_independently() -> None:
    env = CelEnvironment()
    selector = env.compile('device.attributes["dra.example.com"].driver.isGreaterThan(semver("2.0.0")) && '
                           'device.capacity["dra.example.com"].memory.compareTo(quantity("40Gi")) >= 0')
    # More devices than one arena group, with repeated versions and capacities so the value memos are shared.
    views = [device(f"dev-{i}", ("1.0.0", "3.0.0")[i % 2], ("24Gi", "80Gi")[(i // 2) % 2]) for i in range(200)]
    assert [selector.matches(v) for v in views] == [i % 2 == 1 and (i // 2) % 2 == 1 for i in range(200)]
    # Re-evaluation reuses each view's cached activation and gives the same answers.
    assert [selector.matches(v) for v in reversed(views)] == [i % 2 == 1 and (i // 2) % 2 == 1
                                                               for i in reversed(range(200))]
