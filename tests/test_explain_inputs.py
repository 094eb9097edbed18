"""`gpu-dra explain` on what users dump from a cluster: running pods, their generated claims, claims no pod uses,
and `allocationMode: All` (each case here was once explained wrongly)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli.main import main
from controller.cel import CelEnvironment
from controller.offline import Session
from tests.alloc_fixtures import allocation, claim, device, klass, request, slice_

GPU = "gpu.nvidia.com"
CEL = CelEnvironment()


def cluster(gpus: int = 1, node: str = "n1") -> list[dict[str, Any]]:
    return [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}},
            klass("gpu", selectors=[f'device.driver == "{GPU}"']),
            slice_(f"{node}-gpu", node, node, [device(f"gpu-{i}") for i in range(gpus)], driver=GPU)]


def template() -> dict[str, Any]:
    return {"kind": "ResourceClaimTemplate", "metadata": {"name": "one", "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [request("gpu", cls="gpu")]}}}}


def pod(name: str, *, uid: str = "", node: str = "", phase: str = "", claim_name: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                           "spec": {"containers": [{"name": "c", "image": "i"}],
                                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one"}]}}
    if uid:
        out["metadata"]["uid"] = uid
    if node:
        out["spec"]["nodeName"] = node
    status: dict[str, Any] = {}
    if phase:
        status["phase"] = phase
    if claim_name:
        status["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": claim_name}]
    if status:
        out["status"] = status
    return out


def generated(name: str, pod_name: str, pod_uid: str, alloc: dict[str, Any] | None = None) -> dict[str, Any]:
    """A claim the resourceclaim controller made (random suffix, owned by the pod, pod-claim-name annotation)."""
    out = claim(name, requests=[request("gpu", cls="gpu")], allocation=alloc)
    out["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "gpu"}
    out["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid,
                                           "controller": True, "blockOwnerDeletion": True}]
    return out


def explain(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return Session(objs, cel_env=CEL).explain_all()


def test_a_running_pod_uses_its_own_claim_and_is_not_reported() -> None:
    held = generated("trainer-gpu-x7k2p", "trainer", "u-1", allocation("n1", ("n1", "gpu-0"), driver=GPU, request_name="gpu"))
    running = pod("trainer", uid="u-1", node="n1", phase="Running", claim_name="trainer-gpu-x7k2p")
    units = explain([*cluster(), template(), held, running])
    # Before: its claim was made again from the template and "fit on 0 of 1 nodes", its own claim holding the GPU.
    assert units == []
    # A pending pod beside it sees the GPU held by the running pod's claim.
    (waiting,) = explain([*cluster(), template(), held, running, pod("next")])
    assert waiting["owner"] == "Pod default/next" and waiting["fits"] == []
    assert "in use by default/trainer-gpu-x7k2p" in waiting["summary"]


def test_a_running_pod_whose_claim_is_not_in_the_input_is_not_reallocated() -> None:
    running = pod("trainer", uid="u-1", node="n1", phase="Running", claim_name="trainer-gpu-x7k2p")
    assert explain([*cluster(), template(), running]) == []
    done = pod("old", uid="u-2", node="n1", phase="Succeeded")
    assert explain([*cluster(), template(), done]) == []


def test_a_pending_pod_and_its_generated_claim_are_reported_once() -> None:
    by_status = pod("infer", uid="u-3", claim_name="infer-gpu-9qz4d")
    units = explain([*cluster(), template(), generated("infer-gpu-9qz4d", "infer", "u-3"), by_status])
    assert [(u["owner"], u["claims"]) for u in units] == [("Pod default/infer", ["default/infer-gpu-9qz4d"])]
    assert units[0]["fits"] == ["n1"]
    # Not yet in the pod's status (the controller crashed between create and status update): found by its owner.
    by_owner = pod("infer", uid="u-3")
    units = explain([*cluster(), template(), generated("infer-gpu-9qz4d", "infer", "u-3"), by_owner])
    assert [(u["owner"], u["claims"]) for u in units] == [("Pod default/infer", ["default/infer-gpu-9qz4d"])]


def test_a_claim_no_pod_references_is_not_placed() -> None:
    lone = claim("lonely", requests=[request("gpu", cls="gpu")])
    units = explain([*cluster(), lone, template(), pod("p")])
    # The pod gets the one GPU (the lone claim, first in the input, took it before); the claim is reported last, unplaced.
    assert [(u["owner"], u["fits"]) for u in units] == [("Pod default/p", ["n1"]), ("ResourceClaim default/lonely", [])]
    assert units[1]["unreferenced"] is True and "node" not in units[1]
    assert units[1]["summary"].startswith("no pod references this claim, so no scheduler allocates it until one does; "
                                          "it would fit on 0 of 1 nodes")
    units = explain([*cluster(), lone])
    assert units[0]["fits"] == ["n1"] and "placed" not in units[0]["summary"]


def test_allocation_mode_all_needs_every_matching_device(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    everything = claim("all", requests=[request("gpu", cls="gpu", allocationMode="All")])
    held = claim("held", requests=[request("gpu", cls="gpu")],
                 allocation=allocation("n1", ("n1", "gpu-3"), driver=GPU, request_name="gpu"))
    objs = [*cluster(gpus=4), everything, held, pod_using("all")]
    (unit,) = explain(objs)
    (reason,) = unit["nodes"]
    assert reason["code"] == "in-use"
    assert reason["message"] == ("request gpu of claim default/all needs all 4 matching devices; usable: 3 of 4 matching: "
                                 "1 in use by default/held")
    path = tmp_path / "in.yaml"
    path.write_text(yaml.safe_dump_all([{"apiVersion": "resource.k8s.io/v1", **o} for o in objs]))
    assert main(["explain", "-f", str(path), "-o", "json"]) == 1
    assert json.loads(capsys.readouterr().out)["units"][0]["nodes"][0]["message"] == reason["message"]


def pod_using(claim_name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "user", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "i"}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}]}}


def test_a_bound_pod_not_yet_running_uses_its_recorded_claim_and_a_hand_pinned_pod_is_still_placed() -> None:
    # Bound, containers starting (phase Pending), claim recorded but not in the input: it holds it in the cluster.
    starting = pod("trainer", uid="u-1", node="n1", phase="Pending", claim_name="trainer-gpu-x7k2p")
    assert explain([*cluster(), template(), starting]) == []
    # Written by hand with spec.nodeName and no status: its claim is made from the template and placed there.
    (pinned,) = explain([*cluster(), template(), pod("pinned", node="n1")])
    assert pinned["claims"] == ["default/pinned-gpu"] and pinned["fits"] == ["n1"]
