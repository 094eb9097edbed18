"""`gpu-dra allocate` / `gpu-dra explain`: the JSON contract and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cli.main import main
from tests.alloc_fixtures import claim, device, klass, request, slice_

GPU = "gpu.nvidia.com"


def write(tmp_path: Path, objs: list[dict], name: str = "in.yaml") -> str:
    for o in objs:
        o.setdefault("apiVersion", "v1" if o["kind"] in ("Pod", "Node") else "resource.k8s.io/v1")
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(objs))
    return str(path)


def cluster() -> list[dict]:
    cls = klass("gpu", selectors=[f'device.driver == "{GPU}"'])
    s1 = slice_("n1-gpu", "n1", "n1", [device("gpu-0", {"nvlinkDomain": "a"}), device("gpu-1", {"nvlinkDomain": "a"})], driver=GPU)
    s2 = slice_("n2-gpu", "n2", "n2", [device("gpu-0", {"nvlinkDomain": "b"})], driver=GPU)
    return [cls, s1, s2]


def template() -> dict:
    return {"kind": "ResourceClaimTemplate", "metadata": {"name": "one", "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [request("gpu", cls="gpu")]}}}}


def pod(name: str) -> dict:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "i"}], "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one"}]}}


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    rc = main([*argv, "-o", "json"])
    return rc, json.loads(capsys.readouterr().out)


def test_pods_and_claims_placed_one_after_another(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    two = claim("two", requests=[request("gpus", cls="gpu", count=2)], constraints=[{"matchAttribute": f"{GPU}/nvlinkDomain"}])
    path = write(tmp_path, [*cluster(), template(), pod("p1"), two])
    rc, doc = run_json(capsys, "allocate", "-f", path)
    assert rc == 0
    assert [(r["claim"], r["outcome"], r["node"]) for r in doc["results"]] == [("default/p1-gpu", "allocated", "n2"),
                                                                              ("default/two", "allocated", "n1")]
    res = doc["results"][1]["allocation"]["devices"]["results"]
    assert [(r["request"], r["driver"], r["pool"], r["device"]) for r in res] == [("gpus", GPU, "n1", "gpu-0"), ("gpus", GPU, "n1", "gpu-1")]


def test_unschedulable_exit_1_with_explanation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, [*cluster(), template(), pod("p1"), pod("p2"), pod("p3"), pod("p4")])
    rc, doc = run_json(capsys, "allocate", "-f", path)
    assert rc == 1
    last = doc["results"][-1]
    assert last["outcome"] == "unschedulable" and last["node"] is None and last["allocation"] is None
    assert "0/2 nodes" in last["message"] and "in use by" in last["message"]


def test_node_flag_allocates_together(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, [*cluster(), claim("a", requests=[request(cls="gpu")]), claim("b", requests=[request(cls="gpu")])])
    rc, doc = run_json(capsys, "allocate", "-f", path, "--node", "n1")
    assert rc == 0 and [r["allocation"]["devices"]["results"][0]["device"] for r in doc["results"]] == ["gpu-0", "gpu-1"]
    rc, doc = run_json(capsys, "allocate", "-f", path, "--node", "n2")
    assert rc == 1 and {r["outcome"] for r in doc["results"]} == {"unschedulable"}


def test_fatal_error_outcome(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, [*cluster(), claim("a", requests=[request(cls="nope")])])
    rc, doc = run_json(capsys, "allocate", "-f", path)
    assert rc == 1 and doc["results"][0]["outcome"] == "error"
    assert "could not retrieve device class nope" in doc["results"][0]["message"]


def test_allocated_claims_hold_devices(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    held = claim("held", requests=[request(cls="gpu")], allocation={"devices": {"results": [
        {"request": "req-0", "driver": GPU, "pool": "n2", "device": "gpu-0"}]}})
    path = write(tmp_path, [*cluster(), held, claim("new", requests=[request(cls="gpu")])])
    rc, doc = run_json(capsys, "allocate", "-f", path)
    assert rc == 0 and [r["claim"] for r in doc["results"]] == ["default/new"] and doc["results"][0]["node"] == "n1"


def test_invalid_input_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [unterminated")
    assert main(["allocate", "-f", str(bad)]) == 2
    invalid = claim("Not_A_Name", requests=[request(cls="gpu")])
    path = write(tmp_path, [*cluster(), invalid], "invalid.yaml")
    assert main(["allocate", "-f", path]) == 2
    assert "ResourceClaim/default/Not_A_Name: metadata.name" in capsys.readouterr().err
    assert main(["allocate", "-f", write(tmp_path, cluster(), "ok.yaml"), "--node", "nope"]) == 2


def test_explain_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    two = claim("two", requests=[request("gpus", cls="gpu", count=2)])
    path = write(tmp_path, [*cluster(), two])
    rc, doc = run_json(capsys, "explain", "-f", path)
    assert rc == 0
    unit = doc["units"][0]
    assert unit["fits"] == ["n1"] and {n["node"]: n["code"] for n in unit["nodes"]} == {"n1": "fits", "n2": "not-enough"}


@pytest.mark.parametrize("command", ["allocate", "explain"])
def test_invalid_opaque_config_is_refused_like_validate_does(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            command: str) -> None:
    config = {"requests": ["gpu"], "opaque": {"driver": GPU, "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "10GB"}}}}}
    path = write(tmp_path, [*cluster(), claim("c1", requests=[request("gpu", cls="gpu")], config=[config])])
    assert main(["validate", "-f", path]) == 1
    validate_out = capsys.readouterr().out
    assert main([command, "-f", path, "-o", "json"]) == 2
    (error,) = json.loads(capsys.readouterr().out)["errors"]
    assert error.startswith("ResourceClaim/default/c1: spec.devices.config[0].opaque.parameters.sharing.mpsConfig."
                            "defaultPinnedDeviceMemoryLimit: invalid quantity '10GB'")
    assert error.split(": ", 1)[1] in validate_out
