"""The DRA CEL environment: cases after k8s.io/dynamic-resource-allocation/cel/compile_test.go."""

from __future__ import annotations

import pytest

from controller.cel import (CelCompileError, CelEnvironment, CelRuntimeError, DeviceView, check, selector_error)
from controller.cel.environment import COST_LIMIT

DRIVER = "dra.example.com"


@pytest.fixture(scope="module")
def env() -> CelEnvironment:
    return CelEnvironment()


@pytest.fixture(scope="module")
def strict_env() -> CelEnvironment:
    return CelEnvironment(strict=True)


def device(attributes: dict | None = None, capacity: dict | None = None, allow: bool = False) -> DeviceView:
    return DeviceView.from_slice_device(DRIVER, {"name": "dev", "attributes": attributes or {},
                                                 "capacity": capacity or {}, "allowMultipleAllocations": allow})


def matches(env: CelEnvironment, expr: str, dev: DeviceView | None = None) -> bool:
    return env.compile(expr).matches(dev or device())


@pytest.mark.parametrize("expr, attributes, capacity, expected", [
    ("true", {}, {}, True),
    ("false", {}, {}, False),
    ('device.driver == "dra.example.com"', {}, {}, True),
    ('device.attributes["dra.example.com"].name == "gpu"', {"name": {"string": "gpu"}}, {}, True),
    ('device.attributes["dra.example.com"].count > 1', {"count": {"int": 2}}, {}, True),
    ('device.attributes["dra.example.com"].enabled', {"enabled": {"bool": True}}, {}, True),
    ('device.attributes["other.example.com"].count == 3', {"other.example.com/count": {"int": 3}}, {}, True),
    ('"dra.example.com" in device.attributes', {"x": {"int": 1}}, {}, True),
    ('"unknown.example.com" in device.attributes', {"x": {"int": 1}}, {}, False),
    ('device.attributes["unknown.example.com"].size() == 0', {}, {}, True),
    ('device.capacity["unknown.example.com"].size() == 0', {}, {}, True),
    ('!("x" in device.attributes["unknown.example.com"])', {}, {}, True),
    ('device.attributes["dra.example.com"].?missing.orValue(7) == 7', {}, {}, True),
    ('device.attributes["dra.example.com"].?count.hasValue()', {"count": {"int": 2}}, {}, True),
    ('cel.bind(dra, device.attributes["dra.example.com"], dra.a && dra.b)',
     {"a": {"bool": True}, "b": {"bool": True}}, {}, True),
    ('device.attributes["dra.example.com"].all(k, v, v == 1)', {"a": {"int": 1}, "b": {"int": 1}}, {}, True),
    ('device.attributes["dra.example.com"].exists(k, k == "b")', {"a": {"int": 1}, "b": {"int": 1}}, {}, True),
])
def test_device_values(env: CelEnvironment, expr: str, attributes: dict, capacity: dict, expected: bool) -> None:
    assert matches(env, expr, device(attributes, capacity)) is expected


@pytest.mark.parametrize("expr", [
    'device.capacity["dra.example.com"].memory.compareTo(quantity("1Gi")) == 0',
    'device.capacity["dra.example.com"].memory == quantity("1073741824")',
    'device.capacity["dra.example.com"].memory.isGreaterThan(quantity("1G"))',
    'device.capacity["dra.example.com"].memory.isLessThan(quantity("2Gi"))',
    'device.capacity["dra.example.com"].memory.add(quantity("1Gi")) == quantity("2Gi")',
    'device.capacity["dra.example.com"].memory.sub(1).compareTo(quantity("1Gi")) == -1',
    'device.capacity["dra.example.com"].memory.add(1).asInteger() == 1073741825',
    'device.capacity["dra.example.com"].memory.isInteger()',
    'device.capacity["dra.example.com"].memory.asApproximateFloat() == 1073741824.0',
    'sign(quantity("-1")) == -1 && sign(quantity("0")) == 0 && sign(quantity("5m")) == 1',
    'isQuantity("10Gi") && !isQuantity("10 Gi")',
    'quantity("1.5").compareTo(quantity("1500m")) == 0',
    'quantity("1.5") != quantity("1.6")',
    '!quantity("1.5").isInteger()',
])
def test_quantity_library(env: CelEnvironment, expr: str) -> None:
    assert matches(env, expr, device(capacity={"memory": {"value": "1Gi"}})) is True


@pytest.mark.parametrize("expr", [
    'device.attributes["dra.example.com"].driver.isGreaterThan(semver("1.0.0"))',
    'device.attributes["dra.example.com"].driver.isLessThan(semver("1.2.4"))',
    'device.attributes["dra.example.com"].driver.compareTo(semver("1.2.3")) == 0',
    'device.attributes["dra.example.com"].driver == semver("1.2.3+build.5")',
    'device.attributes["dra.example.com"].driver.major() == 1',
    'device.attributes["dra.example.com"].driver.minor() == 2',
    'device.attributes["dra.example.com"].driver.patch() == 3',
    'semver("1.0.0-alpha").isLessThan(semver("1.0.0-alpha.1"))',
    'semver("1.0.0-rc.1").isLessThan(semver("1.0.0"))',
    'semver("v1.2", true) == semver("1.2.0")',
    'isSemver("1.2.3") && !isSemver("1.2") && isSemver("v1.2", true)',
])
def test_semver_library(env: CelEnvironment, expr: str) -> None:
    assert matches(env, expr, device({"driver": {"version": "1.2.3"}})) is True


@pytest.mark.parametrize("expr", [
    '"gpu-0".startsWith("gpu") && "gpu-0".endsWith("-0") && "gpu-0".contains("u-")',
    '"GPU".lowerAscii() == "gpu" && "gpu".upperAscii() == "GPU"',
    '"a,b,c".split(",").size() == 3 && ["a", "b"].join("-") == "a-b"',
    '"  x ".trim() == "x" && "abc".substring(1) == "bc" && "abc".charAt(1) == "b"',
    '"abc".replace("b", "x") == "axc" && "abc".indexOf("c") == 2',
    '"abc".matches("^a.c$")',
    '"abc123".find("[0-9]+") == "123" && "abc".find("[0-9]") == ""',
    '"a1b2c3".findAll("[0-9]") == ["1", "2", "3"] && "a1b2c3".findAll("[0-9]", 2) == ["1", "2"]',
    '[1, 2, 3].isSorted() && ![3, 1].isSorted()',
    '[1, 2, 3].sum() == 6 && [1, 5, 3].max() == 5 && [4, 2].min() == 2',
    'sets.contains([1, 2, 3], [2]) && sets.intersects([1], [1, 5]) && sets.equivalent([1, 2], [2, 1])',
    '[1, 2, 3].map(x, x * 2) == [2, 4, 6] && [1, 2, 3].filter(x, x > 1).size() == 2',
    'optional.of(1).value() == 1 && !optional.none().hasValue()',
    'cel.bind(x, 3, x * x) == 9',
    '{"a": 1}.exists(k, v, k == "a" && v == 1)',
])
def test_extensions(env: CelEnvironment, expr: str) -> None:
    assert matches(env, expr) is True


def test_missing_key_is_runtime_error(env: CelEnvironment) -> None:
    with pytest.raises(CelRuntimeError, match="^no such key: missing$"):
        matches(env, 'device.attributes["dra.example.com"].missing', device({"x": {"int": 1}}))


def test_non_bool_result_is_compile_error(env: CelEnvironment) -> None:
    with pytest.raises(CelCompileError, match="^must evaluate to bool or the unknown type, not int$"):
        env.compile("1")
    with pytest.raises(CelCompileError, match="not string$"):
        env.compile("device.driver")


def test_dyn_non_bool_result_is_runtime_error(env: CelEnvironment) -> None:
    with pytest.raises(CelRuntimeError, match="int could not be converted to bool"):
        matches(env, 'device.attributes["dra.example.com"].count', device({"count": {"int": 1}}))


def test_syntax_error_reads_like_kubernetes(env: CelEnvironment) -> None:
    with pytest.raises(CelCompileError) as err:
        env.compile("1 +")
    assert str(err.value).startswith("compilation failed: ERROR: <input>:1:4: Syntax error:")


def test_type_errors_are_compile_errors(env: CelEnvironment) -> None:
    with pytest.raises(CelCompileError, match="undefined field 'nope'"):
        env.compile("device.nope")
    with pytest.raises(CelCompileError, match="found no matching overload"):
        env.compile('device.driver + 1 == 2')
    with pytest.raises(CelCompileError, match="undeclared reference"):
        env.compile("other == 1")


def test_library_runtime_errors(env: CelEnvironment) -> None:
    with pytest.raises(CelRuntimeError, match="quantities must match the regular expression"):
        matches(env, 'quantity("ten") == quantity("1")')
    with pytest.raises(CelRuntimeError, match="cannot convert value to integer"):
        matches(env, 'quantity("1.5").asInteger() == 1')
    with pytest.raises(CelRuntimeError):
        matches(env, 'semver("1.2") == semver("1.2.0")')


def test_strict_environment_hides_gated_fields(env: CelEnvironment, strict_env: CelEnvironment) -> None:
    assert matches(env, "device.allowMultipleAllocations", device(allow=True)) is True
    with pytest.raises(CelCompileError, match="undefined field 'allowMultipleAllocations'"):
        strict_env.compile("device.allowMultipleAllocations")
    assert check("device.allowMultipleAllocations", strict=True) is not None
    assert check("device.allowMultipleAllocations", strict=False) is None


HOSTILE = ('device.attributes.all(d, device.attributes[d].all(k, device.attributes.all(d2, '
           'device.attributes[d2].all(k2, string(device.attributes[d][k]).contains(string(device.attributes[d2][k2]))))))')


def test_cost_limit(env: CelEnvironment) -> None:
    assert env.estimate_cost('device.driver == "x"') < 100
    assert env.estimate_cost(HOSTILE) > COST_LIMIT
    assert check(HOSTILE, strict=False) == "too complex, exceeds cost limit"
    with pytest.raises(CelRuntimeError, match="^actual cost limit exceeded$"):
        env.compile(HOSTILE).matches(device({"x": {"string": "a"}}))
    # One level of iteration over a device's attributes is cheap.
    assert check('device.attributes["dra.example.com"].all(k, v, string(v).size() < 64)', strict=False) is None


def test_compile_is_cached(env: CelEnvironment) -> None:
    assert env.compile("true || false") is env.compile("true || false")
    with pytest.raises(CelCompileError) as first:
        env.compile("(")
    with pytest.raises(CelCompileError) as second:
        env.compile("(")
    assert first.value is second.value


def test_check_reports_compile_errors() -> None:
    assert check("1", strict=False) == "must evaluate to bool or the unknown type, not int"
    assert check('device.driver == "x"', strict=True) is None


def test_selector_error_texts() -> None:
    assert selector_error("class gpu", 0, CelRuntimeError("no such key: x")) == \
        "class gpu: selector #0: CEL runtime error: no such key: x"
    assert selector_error("claim default/c", 2, CelCompileError("compilation failed: x")) == \
        "claim default/c: selector #2: CEL compile error: compilation failed: x"


def test_device_view_from_slice_device() -> None:
    view = device({"model": {"string": "H100"}, "other.com/x": {"int": 1}, "v": {"version": "1.0.0"}},
                  {"memory": {"value": "80Gi"}})
    assert view.attributes["dra.example.com"]["model"] == "H100"
    assert view.attributes["other.com"]["x"] == 1
    assert view.qualified_attributes["dra.example.com/model"] == "H100"
    assert str(view.qualified_capacity["dra.example.com/memory"]) == "80Gi"


@pytest.mark.parametrize("attributes, message", [
    ({"a": {"int": 1, "bool": True}}, "exactly one of"),
    ({"a": {"version": "1.0"}}, "parse semantic version"),
    ({"a": {"int": "x"}}, "must be an integer"),
])
def test_device_view_rejects_bad_attributes(attributes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        device(attributes)
    assert "device dev of driver dra.example.com: attributes[a]" in str(err.value)


def test_attribute_of_unknown_type_is_invisible() -> None:
    """An attribute setting none of the known value fields comes from a newer API: CEL does not see it."""
    view = device({"a": {}, "b": {"int": 1}})
    assert set(view.attributes["dra.example.com"]) == {"b"}


def test_device_view_rejects_bad_capacity() -> None:
    with pytest.raises(ValueError, match=r"capacity\[memory\].value"):
        device(capacity={"memory": {"value": "lots"}})


def test_device_reused_across_selectors(env: CelEnvironment) -> None:
    dev = device({"a": {"int": 1}})
    assert matches(env, 'device.attributes["dra.example.com"].a == 1', dev)
    assert matches(env, 'device.attributes["other.example.com"].size() == 0', dev)
    assert not matches(env, '"other.example.com" in device.attributes', dev)
