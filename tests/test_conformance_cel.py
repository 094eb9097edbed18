"""Kubernetes' CEL selector test table (k8s.io/dynamic-resource-allocation/cel/compile_test.go), run through
`gpu-dra cel EXPR --device FILE -o json`: match results, compile errors and runtime errors by their upstream text.

Every case runs with 1.37's environments (the default); the `includes` cases of KEP-5491 also pin the releases
without it, and the list-type attribute cases run as upstream's do. Not transcribed: the per-case worst-case cost
figures (the CLI reports results, not costs; `includes`' cost of 48 is checked by test_includes_cost, the limit by
"expensive")."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cli.main import main

DRA = "dra.example.com"


@dataclass(frozen=True)
class CelCase:
    name: str
    expression: str
    match: bool | None = None  # None: an error is expected
    compile_error: str = ""
    match_error: str = ""
    driver: str = ""
    attributes: dict[str, Any] = field(default_factory=dict)
    capacity: dict[str, Any] = field(default_factory=dict)
    allow_multiple: bool | None = None
    strict: bool = False
    version: str = "1.37"  # --kubernetes-version
    features: tuple[str, ...] = ()  # --feature


def b(v: bool) -> dict[str, Any]:
    return {"bool": v}


def s(v: str) -> dict[str, Any]:
    return {"string": v}


def q(v: str) -> dict[str, Any]:
    return {"value": v}


def expensive_attributes() -> dict[str, Any]:
    return {f"{DRA}/" + "x" * (32 - len(f"-{i}")) + f"-{i}": s("abc") for i in range(32)}


NESTED = ("[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(x, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(y, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z, "
          "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z2, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z3, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z4, "
          "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z5, int('1'.find('[0-9]*')) < 100)))))))")
ALL = """
device.capacity["dra.example.com"].quantity.isGreaterThan(quantity("1Ki")) &&
device.attributes["dra.example.com"].bool &&
device.attributes["dra.example.com"].int > 0 &&
device.attributes["dra.example.com"].string == "fish" &&
device.attributes["dra.example.com"].version.isGreaterThan(semver("0.0.1")) &&
device.capacity["dra.example.com"]["quantity"].isGreaterThan(quantity("1Ki")) &&
device.attributes["dra.example.com"]["bool"] &&
device.attributes["dra.example.com"]["int"] > 0 &&
device.attributes["dra.example.com"]["string"] == "fish" &&
device.attributes["dra.example.com"]["version"].isGreaterThan(semver("0.0.1"))
"""
ATTR = f'device.attributes["{DRA}"]'

CASES = [
    CelCase("true", "true", True),
    CelCase("false", "false", False),
    CelCase("syntax-error", "?!", compile_error="Syntax error"),
    CelCase("type-error", "1", compile_error="must evaluate to bool or the unknown type, not int"),
    CelCase("runtime-error-lookup-identifier", 'device.attributes["no-such-domain"].noSuchAttr.isGreaterThan(quantity("0"))',
            match_error="no such key: noSuchAttr"),
    CelCase("runtime-error-lookup-map", 'device.attributes["no-such-domain"]["noSuchAttr"].isGreaterThan(quantity("0"))',
            match_error="no such key: noSuchAttr"),
    CelCase("domain-check-negative", '"no-such-domain" in device.attributes', False),
    CelCase("domain-check-positive", '"dra.example.com" in device.attributes', True, attributes={f"{DRA}/something": b(True)}),
    CelCase("empty-driver-name", 'device.driver == ""', True),
    CelCase("real-driver-name", 'device.driver == "dra.example.com"', True, driver=DRA),
    CelCase("driver-name-qualifier", f"{ATTR}.name", True, driver=DRA, attributes={"name": b(True)}),
    CelCase("driver-name-qualifier-map-lookup", f'{ATTR}["name"]', True, driver=DRA, attributes={"name": b(True)}),
    CelCase("bind", f"cel.bind(dra, {ATTR}, dra.name)", True, driver=DRA, attributes={"name": b(True)}),
    CelCase("qualified-attribute-name", 'device.attributes["other.example.com"].name', True, driver=DRA,
            attributes={"other.example.com/name": b(True)}),
    CelCase("bool", f"{ATTR}.name", True, driver=DRA, attributes={"name": b(True)}),
    CelCase("int", f"{ATTR}.name > 0", True, driver=DRA, attributes={"name": {"int": 1}}),
    CelCase("string", f'{ATTR}.name == "fish"', True, driver=DRA, attributes={"name": s("fish")}),
    CelCase("version", f'{ATTR}.name.isGreaterThan(semver("0.0.1"))', True, driver=DRA, attributes={"name": {"version": "1.0.0"}}),
    CelCase("version_v", f'{ATTR}.name.isGreaterThan(semver("v0.0.1", true)) && isSemver("v1.0.0", true)', True, driver=DRA,
            attributes={"name": {"version": "1.0.0"}}),
    CelCase("quantity", f'device.capacity["{DRA}"].name.isGreaterThan(quantity("1Ki"))', True, driver=DRA, capacity={"name": q("1Mi")}),
    CelCase("check-positive", f'"name" in device.capacity["{DRA}"] && device.capacity["{DRA}"].name.isGreaterThan(quantity("1Ki"))',
            True, driver=DRA, capacity={"name": q("1Mi")}),
    CelCase("check-negative", f'!("name" in device.capacity["{DRA}"]) || device.capacity["{DRA}"].name.isGreaterThan(quantity("1Ki"))', True),
    CelCase("all", ALL, True, driver=DRA, attributes={"bool": b(True), "int": {"int": 1}, "string": s("fish"), "version": {"version": "1.0.0"}},
            capacity={"quantity": q("1Mi")}),
    CelCase("many", f"{ATTR}.a && {ATTR}.b && {ATTR}.c", True, driver=DRA, attributes={"a": b(True), "b": b(True), "c": b(True)}),
    CelCase("check_attribute_domains", 'device.attributes.exists_one(x, x == "dra.example.com")', True, driver=DRA,
            attributes={"services": s("some_example_value")}),
    CelCase("check_attribute_ids", f'{ATTR}.exists_one(x, x == "services")', True, driver=DRA, attributes={"services": s("some_example_value")}),
    CelCase("split_attribute", f'{ATTR}.services.split("example").size() >= 2', True, driver=DRA, attributes={"services": s("some_example_value")}),
    CelCase("regexp_attribute", f'{ATTR}.services.matches("[^a]?sym")', True, driver=DRA, attributes={"services": s("asymetric")}),
    CelCase("check_capacity_domains", 'device.capacity.exists_one(x, x == "dra.example.com")', True, driver=DRA, capacity={"memory": q("1Mi")}),
    CelCase("check_capacity_ids", f'device.capacity["{DRA}"].exists_one(x, x == "memory")', True, driver=DRA, capacity={"memory": q("1Mi")}),
    CelCase("expensive", NESTED, driver=DRA, attributes=expensive_attributes(), match_error="actual cost limit exceeded"),
    CelCase("allow_multiple_allocations", "device.allowMultipleAllocations == true", True, driver=DRA, allow_multiple=True),
    CelCase("allow_multiple_allocations_default", "device.allowMultipleAllocations == false", True, driver=DRA),
    CelCase("allow_multiple_allocations_false", "device.allowMultipleAllocations == false", True, driver=DRA, allow_multiple=False),
    CelCase("allow_multiple_allocations_disabled", "device.allowMultipleAllocations == false", driver=DRA, strict=True,
            compile_error="undefined field 'allowMultipleAllocations'"),
    CelCase("macro-exists-on-int", f"{ATTR}.name.exists(x, x > 0)", driver=DRA, attributes={"name": {"int": 1}},
            match_error="expected iterable type"),
    CelCase("macro-exists-on-bool", f"{ATTR}.name.exists(x, x == true)", driver=DRA, attributes={"name": b(True)},
            match_error="expected iterable type"),
    CelCase("macro-exists-on-string", f'{ATTR}.name.exists(x, x == "fish")', driver=DRA, attributes={"name": s("fish")},
            match_error="expected iterable type"),
    # KEP-5491's `includes` on scalar attributes: in 1.37's stored-expressions environment whatever the gate.
    CelCase("includes-function-on-bool-scalar-positive", f"{ATTR}.name.includes(true)", True, driver=DRA, attributes={"name": b(True)}),
    CelCase("includes-function-on-bool-scalar-negative", f"{ATTR}.name.includes(true)", False, driver=DRA, attributes={"name": b(False)}),
    CelCase("includes-function-on-int-scalar-positive", f"{ATTR}.name.includes(1)", True, driver=DRA, attributes={"name": {"int": 1}}),
    CelCase("includes-function-on-int-scalar-negative", f"{ATTR}.name.includes(1)", False, driver=DRA, attributes={"name": {"int": 2}}),
    CelCase("includes-function-on-string-scalar-positive", f'{ATTR}.name.includes("fish")', True, driver=DRA, attributes={"name": s("fish")}),
    CelCase("includes-function-on-string-scalar-negative", f'{ATTR}.name.includes("bird")', False, driver=DRA, attributes={"name": s("fish")}),
    CelCase("includes-function-on-semver-scalar-positive", f'{ATTR}.name.includes(semver("1.0.0"))', True, driver=DRA,
            attributes={"name": {"version": "1.0.0"}}),
    CelCase("includes-function-on-semver-scalar-negative", f'{ATTR}.name.includes(semver("2.0.0"))', False, driver=DRA,
            attributes={"name": {"version": "1.0.0"}}),
    CelCase("includes-function-compilation-error", f'{ATTR}.attr.includes("fish")', driver=DRA, strict=True,
            compile_error="undeclared reference to 'includes'"),
    CelCase("includes-function-compilation-and-eval-success", f'{ATTR}.attr.includes("fish")', True, driver=DRA, strict=True,
            attributes={"attr": s("fish")}, features=("DRAListTypeAttributes",)),
    CelCase("includes-function-before-1.37", f'{ATTR}.name.includes(1)', driver=DRA, attributes={"name": {"int": 1}},
            version="1.36", compile_error="undeclared reference to 'includes'"),
    # List-type attributes (KEP-5491): lists reach CEL as lists, `includes` tests membership.
    CelCase("list-result-type-causes-match-error", f"{ATTR}.names", driver=DRA, attributes={"names": {"strings": ["fish", "bird"]}},
            match_error="CEL result of type list could not be converted to bool"),
    CelCase("includes-function-can-evaluate", f'{ATTR}.name.includes("fish")', True, driver=DRA,
            attributes={"name": {"strings": ["fish", "bird"]}}),
    *(CelCase(f"list-of-{kind}", f"{ATTR}.names.size() == 2", True, driver=DRA, attributes={"names": {field_: values}})
      for kind, field_, values in (("bool", "bools", [True, False]), ("int", "ints", [1, 2]),
                                   ("string", "strings", ["fish", "bird"]), ("semver", "versions", ["1.0.0", "2.0.0"]))),
    CelCase("macro-on-list-of-int", f"{ATTR}.names.exists(x, x > 0)", True, driver=DRA, attributes={"names": {"ints": [1, 2]}}),
    CelCase("macro-on-list-of-string", f'{ATTR}.names.all(x, x != "")', True, driver=DRA,
            attributes={"names": {"strings": ["fish", "bird"]}}),
    CelCase("macro-on-list-of-semver", f'{ATTR}.names.all(x, x.isGreaterThan(semver("0.0.1")))', True, driver=DRA,
            attributes={"names": {"versions": ["1.0.0", "2.0.0"]}}),
    CelCase("includes-function-on-bool-list-positive", f"{ATTR}.name.includes(true)", True, driver=DRA, attributes={"name": {"bools": [True, False]}}),
    CelCase("includes-function-on-bool-list-negative", f"{ATTR}.name.includes(false)", False, driver=DRA, attributes={"name": {"bools": [True, True]}}),
    CelCase("includes-function-on-int-list-positive", f"{ATTR}.name.includes(1)", True, driver=DRA, attributes={"name": {"ints": [1, 2]}}),
    CelCase("includes-function-on-int-list-negative", f"{ATTR}.name.includes(3)", False, driver=DRA, attributes={"name": {"ints": [1, 2]}}),
    CelCase("includes-function-on-string-list-positive", f'{ATTR}.name.includes("fish")', True, driver=DRA,
            attributes={"name": {"strings": ["fish", "bird"]}}),
    CelCase("includes-function-on-string-list-negative", f'{ATTR}.name.includes("cat")', False, driver=DRA,
            attributes={"name": {"strings": ["fish", "bird"]}}),
    CelCase("includes-function-on-semver-list-positive", f'{ATTR}.name.includes(semver("1.0.0"))', True, driver=DRA,
            attributes={"name": {"versions": ["1.0.0", "2.0.0"]}}),
    CelCase("includes-function-on-semver-list-negative", f'{ATTR}.name.includes(semver("3.0.0"))', False, driver=DRA,
            attributes={"name": {"versions": ["1.0.0", "2.0.0"]}}),
    CelCase("includes-function-on-very-long-list-positive", f'{ATTR}.name.includes("value-48")', False, driver=DRA,
            attributes={"name": {"strings": [f"value-{i}" for i in range(48)]}}),
    CelCase("includes-function-on-very-long-list-runtime-error", f'{ATTR}.name.includes("value-49")', driver=DRA,
            attributes={"name": {"strings": [f"value-{i}" for i in range(49)]}},
            match_error="'includes' function cannot be applied to lists longer than 48 values"),
    CelCase("macro-exists-on-version", f'{ATTR}.name.exists(x, x.isGreaterThan(semver("0.0.1")))', driver=DRA,
            attributes={"name": {"version": "1.0.0"}}, match_error="expected iterable type"),
]


def run_cel(case: CelCase, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    device: dict[str, Any] = {"name": "dev", "driver": case.driver, "attributes": case.attributes, "capacity": case.capacity}
    if case.allow_multiple is not None:
        device["allowMultipleAllocations"] = case.allow_multiple
    path = tmp_path / "device.json"
    path.write_text(json.dumps(device))
    flags = ["--kubernetes-version", case.version, *(a for f in case.features for a in ("--feature", f))]
    rc = main(["cel", case.expression, "--device", str(path), *(["--strict"] if case.strict else []), *flags, "-o", "json"])
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_upstream_cel_case(case: CelCase, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = run_cel(case, tmp_path, capsys)
    if case.compile_error:
        assert rc == 1 and doc["compileError"] and case.compile_error in doc["compileError"], doc
        return
    assert doc["compileError"] is None, doc
    [result] = doc["results"]
    if case.match_error:
        assert rc == 1 and case.match_error in result.get("error", ""), doc
    else:
        assert rc == 0 and result.get("match") is case.match and "error" not in result, doc


def test_includes_cost() -> None:
    """Kubernetes' draCostEstimator: `includes` costs the longest list attribute, 48 (4 + 48 for an attribute)."""
    from controller.cel import CelEnvironment

    assert CelEnvironment().estimate_cost(f"{ATTR}.name.includes(1)") == 4 + 48
