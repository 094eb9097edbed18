"""`allocate` and `explain` agree with each other and with the cluster: shared claims allocated once, workload
controllers expanded into the pods they name, gangs placed all-or-nothing before pods (as the gang controller)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli.main import main
from controller.expand import SAFE_ALPHABET, ExpandError, expand, pod_template_hash
from driver.discovery import discover
from driver.nvml import load_backend
from driver.slices import SliceSettings, build_slices
from sim.demo.cluster import NODES, node_object
from tests.alloc_fixtures import claim, device, klass, request, slice_

GPU = "gpu.nvidia.com"
ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, objs: list[dict[str, Any]]) -> str:
    for o in objs:
        o.setdefault("apiVersion", "resource.k8s.io/v1" if o["kind"] in ("ResourceClaim", "ResourceClaimTemplate",
                                                                         "ResourceSlice", "DeviceClass") else "v1")
    path = tmp_path / "in.yaml"
    path.write_text(yaml.safe_dump_all(objs))
    return str(path)


def small_cluster() -> list[dict[str, Any]]:
    cls = klass("gpu", selectors=[f'device.driver == "{GPU}"'])
    s1 = slice_("n1-gpu", "n1", "n1", [device("gpu-0"), device("gpu-1")], driver=GPU)
    s2 = slice_("n2-gpu", "n2", "n2", [device("gpu-0")], driver=GPU)
    return [cls, s1, s2]


def template(name: str = "one", count: int = 1) -> dict[str, Any]:
    return {"kind": "ResourceClaimTemplate", "metadata": {"name": name, "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [request("gpu", cls="gpu", count=count)]}}}}


def pod_spec(entry: dict[str, str]) -> dict[str, Any]:
    return {"containers": [{"name": "c", "image": "i"}], "resourceClaims": [{"name": "gpu", **entry}]}


def pod(name: str, entry: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": {**pod_spec(entry), **spec}}


def both(capsys: pytest.CaptureFixture[str], path: str) -> tuple[int, list[dict[str, Any]], int, list[dict[str, Any]]]:
    rc_a = main(["allocate", "-f", path, "-o", "json"])
    results = json.loads(capsys.readouterr().out)["results"]
    rc_e = main(["explain", "-f", path, "-o", "json"])
    units = json.loads(capsys.readouterr().out)["units"]
    return rc_a, results, rc_e, units


def assert_agree(results: list[dict[str, Any]], units: list[dict[str, Any]]) -> None:
    """Every claim explain says fits is allocated by allocate, and every claim that does not, is not."""
    outcome = {r["claim"]: r["outcome"] for r in results}
    for unit in units:
        for key in unit["claims"]:
            assert (outcome[key] == "allocated") == bool(unit.get("fits")), (unit["owner"], key, outcome[key], unit)


def test_claim_shared_by_two_pods_is_allocated_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shared = claim("shared", requests=[request("gpu", cls="gpu")])
    objs = [*small_cluster(), shared, template(),
            pod("a", {"resourceClaimName": "shared"}), pod("b", {"resourceClaimName": "shared"}),
            pod("c", {"resourceClaimTemplateName": "one"}), pod("d", {"resourceClaimTemplateName": "one"})]
    rc_a, results, rc_e, units = both(capsys, write(tmp_path, objs))
    assert rc_a == 0 and rc_e == 0
    # one result for the shared claim; three GPUs serve three claims (a fourth would have been refused)
    assert [(r["claim"], r["outcome"]) for r in results] == [
        ("default/shared", "allocated"), ("default/c-gpu", "allocated"), ("default/d-gpu", "allocated")]
    devices = [(r["node"], d["device"]) for r in results for d in r["allocation"]["devices"]["results"]]
    assert len(set(devices)) == 3
    assert [u["owner"] for u in units] == ["Pod default/a", "Pod default/b", "Pod default/c", "Pod default/d"]
    assert units[1]["claims"] == []  # b uses a's allocation
    assert_agree(results, units)


def test_pod_sharing_a_claim_follows_its_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shared = claim("shared", requests=[request("gpu", cls="gpu")])
    two = template("two", count=2)
    # a places the shared claim on n2 (binpack: the fuller fit); b's own 2-GPU claim could only go to n1, but b
    # must run where its shared claim is: it cannot be placed.
    objs = [*small_cluster(), shared, two,
            pod("a", {"resourceClaimName": "shared"}, nodeSelector={}),
            {"kind": "Pod", "metadata": {"name": "b", "namespace": "default"},
             "spec": {"containers": [{"name": "c", "image": "i"}],
                      "resourceClaims": [{"name": "s", "resourceClaimName": "shared"},
                                         {"name": "gpus", "resourceClaimTemplateName": "two"}]}}]
    rc_a, results, _, units = both(capsys, write(tmp_path, objs))
    by = {r["claim"]: r for r in results}
    assert by["default/shared"]["node"] == "n2"
    assert by["default/b-gpus"]["outcome"] == "unschedulable" and rc_a == 1
    assert_agree(results, units)


def test_workload_controllers_expand_into_named_pods() -> None:
    tmpl = {"metadata": {"labels": {"app": "x"}}, "spec": pod_spec({"resourceClaimTemplateName": "one"})}
    objs = [
        {"kind": "Deployment", "metadata": {"name": "web", "namespace": "prod"}, "spec": {"replicas": 2, "template": tmpl}},
        {"kind": "ReplicaSet", "metadata": {"name": "rs"}, "spec": {"template": tmpl}},
        {"kind": "StatefulSet", "metadata": {"name": "db"}, "spec": {"replicas": 2, "template": tmpl}},
        {"kind": "Job", "metadata": {"name": "train"}, "spec": {"parallelism": 3, "completions": 2, "template": tmpl}},
        {"kind": "Job", "metadata": {"name": "idx"}, "spec": {"parallelism": 2, "completionMode": "Indexed", "template": tmpl}},
        {"kind": "CronJob", "metadata": {"name": "nightly", "creationTimestamp": "2026-01-01T00:00:00Z"},
         "spec": {"schedule": "0 0 * * *", "jobTemplate": {"spec": {"template": tmpl}}}},
        {"kind": "Deployment", "metadata": {"name": "off"}, "spec": {"replicas": 0, "template": tmpl}},
    ]
    pods = expand(objs)
    names = [p["metadata"]["name"] for p in pods]
    h = pod_template_hash(tmpl)
    assert all(c in SAFE_ALPHABET for c in h)

    def suffixed(name: str, base: str) -> bool:
        rest = name[len(base) + 1:]
        return name.startswith(base + "-") and len(rest) == 5 and all(c in SAFE_ALPHABET for c in rest)

    assert suffixed(names[0], f"web-{h}") and suffixed(names[1], f"web-{h}") and names[0] != names[1]
    assert pods[0]["metadata"]["namespace"] == "prod" and pods[0]["metadata"]["labels"] == {"app": "x", "pod-template-hash": h}
    assert suffixed(names[2], "rs")
    assert names[3:5] == ["db-0", "db-1"]
    assert [suffixed(n, "train") for n in names[5:7]] == [True, True] and len(names) == 10
    assert suffixed(names[7], "idx-0") and suffixed(names[8], "idx-1")
    assert suffixed(names[9], f"nightly-{1767225600 // 60}")
    assert pods[3]["metadata"]["ownerReferences"][0]["kind"] == "StatefulSet"
    assert expand(objs) == pods  # deterministic
    with pytest.raises(ExpandError, match=r"StatefulSet/default/bad: spec.replicas: -1"):
        expand([{"kind": "StatefulSet", "metadata": {"name": "bad"}, "spec": {"replicas": -1, "template": tmpl}}])


def test_allocate_places_workload_pods(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tmpl = {"spec": pod_spec({"resourceClaimTemplateName": "one"})}
    objs = [*small_cluster(), template(),
            {"kind": "StatefulSet", "metadata": {"name": "db", "namespace": "default"}, "spec": {"replicas": 2, "template": tmpl}},
            {"kind": "Job", "metadata": {"name": "j", "namespace": "default"}, "spec": {"parallelism": 2, "template": tmpl}}]
    rc_a, results, rc_e, units = both(capsys, write(tmp_path, objs))
    assert [r["claim"] for r in results][:2] == ["default/db-0-gpu", "default/db-1-gpu"]
    assert [r["outcome"] for r in results] == ["allocated", "allocated", "allocated", "unschedulable"]
    assert rc_a == 1 and rc_e == 1
    assert_agree(results, units)
    assert main(["allocate", "-f", write(tmp_path, [{"kind": "Job", "metadata": {"name": "x"}, "spec": {}}])]) == 2
    assert "Job/default/x: spec.template.spec: required" in capsys.readouterr().err


def gang_claim(name: str, gang: str, size: int, count: int) -> dict[str, Any]:
    c = claim(name, requests=[request("gpus", cls="gpu", count=count)])
    c["metadata"]["labels"] = {f"{GPU}/gang": gang, f"{GPU}/gang-size": str(size)}
    return c


def test_gang_is_all_or_nothing_and_explain_agrees(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 3 GPUs: a gang of two 2-GPU claims cannot fit; the gang holds nothing, so the pod after it gets a GPU.
    objs = [*small_cluster(), template(), gang_claim("g-0", "big", 2, 2), gang_claim("g-1", "big", 2, 2),
            pod("w0", {"resourceClaimName": "g-0"}), pod("solo", {"resourceClaimTemplateName": "one"})]
    rc_a, results, rc_e, units = both(capsys, write(tmp_path, objs))
    by = {r["claim"]: r for r in results}
    assert by["default/g-0"]["outcome"] == by["default/g-1"]["outcome"] == "unschedulable"
    assert "gang default/big: its 2 unallocated claims do not fit together" in by["default/g-0"]["message"]
    assert by["default/solo-gpu"]["outcome"] == "allocated"
    assert rc_a == 1 and rc_e == 1
    assert units[0]["owner"] == "Gang default/big" and units[0]["fits"] == []
    assert_agree(results, units)

    # one GPU less needed: the gang fits on n1 (one node preferred), the pod referencing it follows, solo gets n2
    objs = [*small_cluster(), template(), gang_claim("g-0", "big", 2, 1), gang_claim("g-1", "big", 2, 1),
            pod("w0", {"resourceClaimName": "g-0"}), pod("solo", {"resourceClaimTemplateName": "one"})]
    rc_a, results, rc_e, units = both(capsys, write(tmp_path, objs))
    assert [(r["claim"], r["outcome"], r["node"]) for r in results] == [
        ("default/g-0", "allocated", "n1"), ("default/g-1", "allocated", "n1"), ("default/solo-gpu", "allocated", "n2")]
    assert rc_a == 0 and rc_e == 0
    assert_agree(results, units)


def test_incomplete_gang_waits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    objs = [*small_cluster(), gang_claim("g-0", "big", 3, 1)]
    rc_a, results, _, units = both(capsys, write(tmp_path, objs))
    assert rc_a == 1
    assert results[0]["message"] == "gang default/big: 1 of 3 claims exist; allocation waits for all of them"
    assert_agree(results, units)


def demo_slices() -> list[dict[str, Any]]:
    out = []
    for spec in NODES:
        inventory = discover(load_backend(f"sim:{spec.profile}", node=spec.name), spec.name)
        out += build_slices(inventory, SliceSettings(driver_name=GPU, node_name=spec.name))
        out.append(node_object(spec.name))
    return out


@pytest.mark.slow
def test_demo_examples_allocate_and_explain_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The examples as one input, as `kubectl apply -f manifests/examples/` gives them to the cluster: the gang is
    placed first (both A100 nodes), so the two A100 trainings do not fit; explain says the same."""
    slices = tmp_path / "slices.yaml"
    slices.write_text(yaml.safe_dump_all(demo_slices()))
    args = ["-f", str(slices), "-f", str(ROOT / "manifests" / "base" / "deviceclasses.yaml"),
            "-f", str(ROOT / "manifests" / "examples")]
    assert main(["allocate", *args, "-o", "json"]) == 1
    results = json.loads(capsys.readouterr().out)["results"]
    assert main(["explain", *args, "-o", "json"]) == 1
    units = json.loads(capsys.readouterr().out)["units"]
    by = {r["claim"].split("/")[1]: r for r in results}
    assert by["gang-worker-0-gpus"]["outcome"] == by["gang-worker-1-gpus"]["outcome"] == "allocated"
    assert {by["gang-worker-0-gpus"]["node"], by["gang-worker-1-gpus"]["node"]} == {"a100-1", "a100-2"}
    assert by["train-llama-gpus"]["outcome"] == by["train-bert-gpus"]["outcome"] == "unschedulable"
    assert by["inference-shared-gpu"]["outcome"] == "allocated"
    assert by["h100-full-node-gpus"]["outcome"] == "unschedulable"
    assert_agree(results, units)


def test_invalid_pool_is_an_error_and_typos_get_suggestions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cls = klass("gpu", selectors=[f'device.driver == "{GPU}"'])
    dup = [slice_(f"s{i}", "n1", "n1", [device("gpu-0", {"productName": "T4"})], driver=GPU, count=2) for i in (1, 2)]
    plain = claim("c", requests=[request("gpu", cls="gpu")])
    path = write(tmp_path, [cls, *dup, plain])
    for extra in ([], ["--node", "n1"]):
        assert main(["allocate", "-f", path, *extra, "-o", "json"]) == 1
        (result,) = json.loads(capsys.readouterr().out)["results"]
        assert result["outcome"] == "error" and "duplicate device name gpu-0" in result["message"]

    ok = slice_("s1", "n1", "n1", [device("gpu-0", {"productName": "T4"})], driver=GPU)
    typo = claim("typo", requests=[request("gpu", cls="gpu", selectors=[
        {"cel": {"expression": f'device.attributes["{GPU}"].prodcutName == "T4"'}}])])
    noclass = claim("noclass", requests=[request("gpu", cls="gpus")])
    path = write(tmp_path, [cls, ok, typo, noclass])
    rc_a, results, rc_e, units = both(capsys, path)
    assert rc_a == 1 and rc_e == 1
    assert results[0]["outcome"] == "error"
    assert "CEL runtime error: no such key: prodcutName" in results[0]["message"]  # Kubernetes' text first
    assert results[0]["message"].endswith(f"; did you mean productName? (device gpu-0 has attributes {GPU}: productName)")
    assert results[1]["message"].endswith(
        'deviceclass.resource.k8s.io "gpus" not found; did you mean gpu? (DeviceClasses: gpu)')
    assert "did you mean productName?" in units[0]["summary"]
    assert_agree(results, units)


def pod_group(name: str, min_count: int) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "metadata": {"name": name, "namespace": "default"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}}}


def group_pod(name: str, group: str, template_name: str) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {**pod_spec({"resourceClaimTemplateName": template_name}), "schedulingGroup": {"podGroupName": group}}}


def test_pod_group_gang_is_all_or_nothing_like_the_controller(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # two pods of 2 GPUs each in a gang of minCount 2: 4 GPUs needed, 3 exist; the gang holds nothing, so the
    # standalone pod after it still gets a GPU
    objs = [*small_cluster(), template(), template("two", count=2), pod_group("pretrain", 2),
            group_pod("w0", "pretrain", "two"), group_pod("w1", "pretrain", "two"), pod("solo", {"resourceClaimTemplateName": "one"})]
    rc_a, results, rc_e, units = both(capsys, write(tmp_path, objs))
    by = {r["claim"]: r for r in results}
    assert by["default/w0-gpu"]["outcome"] == by["default/w1-gpu"]["outcome"] == "unschedulable"
    assert "gang default/podgroup/pretrain" in by["default/w0-gpu"]["message"]
    assert by["default/solo-gpu"]["outcome"] == "allocated" and rc_a == 1 and rc_e == 1
    assert_agree(results, units)
    # one GPU each: the gang fits, both on n1 (one node first)
    objs = [*small_cluster(), template(), pod_group("pretrain", 2),
            group_pod("w0", "pretrain", "one"), group_pod("w1", "pretrain", "one")]
    rc_a, results, rc_e, units = both(capsys, write(tmp_path, objs))
    assert [(r["claim"], r["outcome"], r["node"]) for r in results] == [
        ("default/w0-gpu", "allocated", "n1"), ("default/w1-gpu", "allocated", "n1")]
    assert rc_a == 0 and rc_e == 0
    assert_agree(results, units)


def test_pod_group_short_of_min_count_waits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    objs = [*small_cluster(), template(), pod_group("pretrain", 3), group_pod("w0", "pretrain", "one"),
            group_pod("lost", "missing-group", "one")]
    rc_a, results, _, units = both(capsys, write(tmp_path, objs))
    by = {r["claim"]: r for r in results}
    assert rc_a == 1
    assert by["default/w0-gpu"]["message"].startswith("pod group default/pretrain: 1 of minCount 3 pods exist")
    assert by["default/lost-gpu"]["message"].startswith('waiting for PodGroup "missing-group"')
    assert_agree(results, units)
