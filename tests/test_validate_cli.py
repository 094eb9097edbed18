"""`gpu-dra validate` end to end through the CLI dispatcher, and manifest loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import main
from gpudra.manifests import InputError, load_objects

VALID = """\
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: gpu.nvidia.com
spec:
  selectors:
  - cel:
      expression: device.driver == "gpu.nvidia.com"
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: one-gpu
  namespace: default
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
---
"""

INVALID_LIST = {
    "apiVersion": "v1",
    "kind": "List",
    "items": [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "s"},
            "spec": {"driver": "gpu.nvidia.com", "pool": {"name": "n", "generation": 0, "resourceSliceCount": 1}},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": -1}}]}},
        },
    ],
}


def run_json(capsys: pytest.CaptureFixture[str], *files: str) -> tuple[int, dict]:
    args = ["validate", "-o", "json"]
    for f in files:
        args += ["-f", f]
    code = main(args)
    return code, json.loads(capsys.readouterr().out)


def test_all_valid_exits_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text(VALID)
    code, out = run_json(capsys, str(path))
    assert code == 0
    assert out == {
        "results": [
            {"object": "DeviceClass/gpu.nvidia.com", "valid": True, "checked": True, "errors": []},
            {"object": "ResourceClaim/default/one-gpu", "valid": True, "checked": True, "errors": []},
        ]
    }


def test_invalid_list_exits_one_with_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ok, bad = tmp_path / "ok.yaml", tmp_path / "bad.json"
    ok.write_text(VALID)
    bad.write_text(json.dumps(INVALID_LIST))
    code, out = run_json(capsys, str(ok), str(bad))
    assert code == 1
    assert [r["object"] for r in out["results"]] == [
        "DeviceClass/gpu.nvidia.com",
        "ResourceClaim/default/one-gpu",
        "ResourceSlice/s",
        "ResourceClaim/ns/c",
    ]
    assert out["results"][2] == {
        "object": "ResourceSlice/s",
        "valid": False,
        "checked": True,
        "errors": ["spec: Required value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"],
    }
    assert out["results"][3]["errors"] == [
        "spec.devices.requests[0].exactly.count: Invalid value: -1: must be greater than zero"
    ]


def test_cel_and_opaque_hooks_are_wired(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": {
            "selectors": [{"cel": {"expression": "device.driver == 1"}}],
            "config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"apiVersion": "nope", "kind": "GpuConfig"}}}],
        },
    }
    path = tmp_path / "class.json"
    path.write_text(json.dumps(doc))
    code, out = run_json(capsys, str(path))
    assert code == 1
    errs = out["results"][0]["errors"]
    assert len(errs) == 2
    assert errs[0].startswith('spec.selectors[0].cel.expression: Invalid value: "device.driver == 1": compilation failed')
    assert errs[1].startswith("spec.config[0].opaque.parameters.apiVersion: ")


def test_text_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(INVALID_LIST))
    assert main(["validate", "-f", str(path)]) == 1
    text = capsys.readouterr().out
    assert "ResourceClaim/ns/c: invalid\n  spec.devices.requests[0].exactly.count: Invalid value: -1: must be greater than zero" in text
    assert text.rstrip().endswith("2 object(s) checked, 2 invalid, 0 not checked")


def test_objects_outside_resource_k8s_io_are_reported_not_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mixed.yaml"
    path.write_text(VALID + "---\napiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: default}\n"
                    "---\napiVersion: resource.k8s.io/v1alpha3\nkind: DeviceClass\nmetadata: {name: old}\n")
    code, out = run_json(capsys, str(path))
    assert code == 1  # the v1alpha3 object is ours to check and is refused: no current release serves it
    by_object = {r["object"]: r for r in out["results"]}
    assert by_object["Pod/default/p"] == {"object": "Pod/default/p", "valid": True, "checked": False, "errors": []}
    assert by_object["DeviceClass/old"]["checked"] and not by_object["DeviceClass/old"]["valid"]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "no such file"),
        ("a: [unclosed", "not valid YAML or JSON"),
        ("- just\n- a list\n", "expected a Kubernetes object (a mapping), got str"),
        ("kind: List\nitems: 5\n", "`items` of a List must be a list"),
    ],
)
def test_unreadable_input_exits_two(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, expected: str
) -> None:
    path = tmp_path / "input.yaml"
    if content is not None:
        path.write_text(content)
    assert main(["validate", "-f", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and expected in err


def test_load_objects_flattens_lists_and_skips_empty_documents(tmp_path: Path) -> None:
    a = tmp_path / "a.yaml"
    a.write_text("---\nkind: A\n---\n---\nkind: List\nitems:\n- kind: B\n- kind: C\n")
    b = tmp_path / "b.json"
    b.write_text(json.dumps([{"kind": "D"}, {"kind": "ConfigMapList", "items": [{"kind": "E"}]}]))
    assert [o["kind"] for o in load_objects([a, str(b)])] == ["A", "B", "C", "D", "E"]
    # a directory stands for its manifests in name order, like kubectl -f DIR
    (tmp_path / "notes.txt").write_text("not a manifest")
    assert [o["kind"] for o in load_objects([tmp_path])] == ["A", "B", "C", "D", "E"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="a directory with no .json, .yaml or .yml files"):
        load_objects([empty])


UNKNOWN = """\
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: gpu.nvidia.com
spec:
  selectorz: []
---
apiVersion: v1
kind: Pod
metadata:
  name: p
spec:
  containers: []
  bogus: 1
"""


def test_unknown_fields_are_warnings_or_errors_with_strict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "unknown.yaml"
    path.write_text(UNKNOWN)
    code, out = run_json(capsys, str(path))
    assert code == 0
    assert [r.get("warnings") for r in out["results"]] == [['spec.selectorz: unknown field "spec.selectorz"'],
                                                           ['spec.bogus: unknown field "spec.bogus"']]
    code = main(["validate", "--strict", "-o", "json", "-f", str(path)])
    out = json.loads(capsys.readouterr().out)
    assert code == 1
    assert [(r["valid"], r["errors"]) for r in out["results"]] == [
        (False, ['spec.selectorz: unknown field "spec.selectorz"']), (False, ['spec.bogus: unknown field "spec.bogus"'])]
