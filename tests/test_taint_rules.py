"""DeviceTaintRules: which devices a rule taints, and what that does to allocation and explanations, offline
(`gpu-dra allocate` / `explain`, in any served version) and in the embedded controller's view."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli.main import main
from controller.taintrules import RULE_KEY, apply_taint_rules
from controller.view import View
from tests.alloc_fixtures import device, klass, request, slice_

GPU = "gpu.nvidia.com"


def rule(name: str, selector: dict[str, str] | None, key: str = "example.com/maintenance",
         effect: str = "NoSchedule") -> dict[str, Any]:
    spec: dict[str, Any] = {"taint": {"key": key, "value": "true", "effect": effect}}
    if selector is not None:
        spec["deviceSelector"] = selector
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule", "metadata": {"name": name}, "spec": spec}


def cluster() -> list[dict[str, Any]]:
    return [klass("gpu", selectors=[f'device.driver == "{GPU}"']),
            slice_("n1-gpu", "n1", "n1", [device("gpu-0"), device("gpu-1")], driver=GPU),
            slice_("n2-gpu", "n2", "n2", [device("gpu-0")], driver=GPU)]


def claim(name: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "ResourceClaim", "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [request("gpu", cls="gpu", **extra)]}}}


def write(tmp_path: Path, objs: list[dict[str, Any]]) -> str:
    for o in objs:
        o.setdefault("apiVersion", "resource.k8s.io/v1")
    path = tmp_path / "in.yaml"
    path.write_text(yaml.safe_dump_all(objs))
    return str(path)


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    rc = main([*argv, "-o", "json"])
    return rc, json.loads(capsys.readouterr().out)


def _taints(slices: list[Any]) -> dict[tuple[str, str], list[str]]:
    return {(s["spec"]["pool"]["name"], d["name"]): [t["key"] for t in d.get("taints") or []]
            for s in slices for d in s["spec"]["devices"]}


# ----- which devices ----------------------------------------------------------------------------------------------


def test_a_rule_taints_the_devices_its_selector_matches() -> None:
    slices = cluster()[1:]
    assert _taints(apply_taint_rules(slices, [rule("pool", {"pool": "n1"})])) == {
        ("n1", "gpu-0"): ["example.com/maintenance"], ("n1", "gpu-1"): ["example.com/maintenance"],
        ("n2", "gpu-0"): []}
    assert _taints(apply_taint_rules(slices, [rule("one", {"driver": GPU, "pool": "n2", "device": "gpu-0"})])) == {
        ("n1", "gpu-0"): [], ("n1", "gpu-1"): [], ("n2", "gpu-0"): ["example.com/maintenance"]}
    assert _taints(apply_taint_rules(slices, [rule("other", {"driver": "other.example.com"})])) == {
        ("n1", "gpu-0"): [], ("n1", "gpu-1"): [], ("n2", "gpu-0"): []}
    # The empty selector matches every device; no selector matches none.
    assert all(_taints(apply_taint_rules(slices, [rule("all", {})])).values())
    assert not any(_taints(apply_taint_rules(slices, [rule("none", None)])).values())
    tainted = apply_taint_rules(slices, [rule("pool", {"pool": "n1"})])[0]["spec"]["devices"][0]["taints"][0]
    assert tainted[RULE_KEY] == "pool" and tainted["effect"] == "NoSchedule"
    assert "taints" not in slices[0]["spec"]["devices"][0]  # the inputs are untouched


def test_the_embedded_controllers_view_applies_rules() -> None:
    slices = {s["metadata"]["name"]: s for s in cluster()[1:]}
    view = View(slices=slices, taint_rules={"r": rule("r", {"pool": "n2"})})
    assert _taints(view.sorted_slices())[("n2", "gpu-0")] == ["example.com/maintenance"]


# ----- allocation and explanation -----------------------------------------------------------------------------


def test_allocation_avoids_devices_a_rule_taints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, [*cluster(), rule("drain-n1", {"pool": "n1"}), claim("c")])
    rc, doc = run_json(capsys, "allocate", "-f", path)
    assert rc == 0 and [(r["claim"], r["node"]) for r in doc["results"]] == [("default/c", "n2")]


def test_a_toleration_lets_the_claim_use_tainted_devices(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tolerant = claim("c", tolerations=[{"key": "example.com/maintenance", "operator": "Exists"}])
    path = write(tmp_path, [*cluster(), rule("drain-all", {}), tolerant])
    rc, doc = run_json(capsys, "allocate", "-f", path)
    assert rc == 0 and doc["results"][0]["outcome"] == "allocated"


def test_effect_none_does_not_keep_claims_off(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, [*cluster(), rule("notice", {}, effect="None"), claim("c")])
    rc, doc = run_json(capsys, "allocate", "-f", path)
    assert rc == 0 and doc["results"][0]["outcome"] == "allocated"


def test_explain_names_the_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, [*cluster(), rule("drain-all", {}), claim("c")])
    rc, doc = run_json(capsys, "allocate", "-f", path)
    assert rc == 1 and doc["results"][0]["outcome"] == "unschedulable"
    main(["explain", "-f", path, "-o", "table"])
    text = capsys.readouterr().out
    assert "tainted (taint not tolerated)" in text
    assert "example.com/maintenance=true:NoSchedule from DeviceTaintRule drain-all" in text


def test_an_invalid_rule_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, [*cluster(), rule("bad", {}, effect="Sometimes"), claim("c")])
    # allocate judges specs as kube-scheduler would (a warning, and a taint it does not know keeps nothing off) ...
    assert main(["allocate", "-f", path, "-o", "json"]) == 0
    assert 'DeviceTaintRule/bad: spec.taint.effect: Unsupported value: "Sometimes"' in capsys.readouterr().err
    # ... while validate refuses it as the API server would.
    assert main(["validate", "-f", path]) == 1
    assert 'spec.taint.effect: Unsupported value: "Sometimes"' in capsys.readouterr().out


# ----- older versions offline --------------------------------------------------------------------------------


def test_allocate_reads_v1beta1_and_writes_v1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old_slice = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceSlice", "metadata": {"name": "n1-gpu"},
                 "spec": {"driver": GPU, "nodeName": "n1", "pool": {"name": "n1", "generation": 1,
                                                                     "resourceSliceCount": 1},
                          "devices": [{"name": "gpu-0", "basic": {"attributes": {"model": {"string": "A100"}}}}]}}
    old_class = {"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceClass", "metadata": {"name": "gpu"},
                 "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{GPU}"'}}]}}
    old_claim = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim",
                 "metadata": {"name": "c", "namespace": "default"},
                 "spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu", "selectors": [
                     {"cel": {"expression": f'device.attributes["{GPU}"].model == "A100"'}}]}]}}}
    path = write(tmp_path, [old_slice, old_class, old_claim])
    rc, doc = run_json(capsys, "allocate", "-f", path)
    assert rc == 0
    result = doc["results"][0]["allocation"]["devices"]["results"][0]
    assert (result["request"], result["pool"], result["device"]) == ("gpu", "n1", "gpu-0")
    main(["validate", "-f", path, "-o", "json"])
    assert all(r["valid"] for r in json.loads(capsys.readouterr().out)["results"])


def test_rule_status_conditions_are_validated_as_metav1_conditions() -> None:
    from gpudra.validation import validate_object

    good = {"type": "EvictionInProgress", "status": "False", "reason": "NoEffect", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}
    obj = {**rule("r", {}), "status": {"conditions": [good]}}
    assert validate_object(obj) == []
    bad = {**rule("r", {}), "status": {"conditions": [good, {**good, "status": "Maybe", "reason": "no spaces",
                                                                  "lastTransitionTime": None}]}}
    assert [str(e) for e in validate_object(bad)] == [
        'status.conditions[1].type: Duplicate value: "EvictionInProgress"',
        'status.conditions[1].status: Unsupported value: "Maybe": supported values: "False", "True", "Unknown"',
        "status.conditions[1].lastTransitionTime: Required value: must be set",
        'status.conditions[1].reason: Invalid value: "no spaces": a condition reason must start with alphabetic '
        "character, optionally followed by a string of alphanumeric characters or '_,:', and must end with an "
        "alphanumeric character or '_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName',  or 'ReasonA,ReasonB',  or "
        "'ReasonA:ReasonB', regex used for validation is '[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?')"]
    many = {**rule("r", {}), "status": {"conditions": [{**good, "type": f"T{i}"} for i in range(9)]}}
    assert [str(e) for e in validate_object(many)] == ["status.conditions: Too many: 9: must have at most 8 items"]
