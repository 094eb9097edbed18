"""The v1beta1 twins of NVIDIA's quickstart specs (its `demo/specs/quickstart/v1beta1`): the same shapes in
resource.k8s.io/v1beta1, where a request carries deviceClassName, selectors and count flat instead of under
`exactly`. Each validates, allocates on the matching simulated node and is prepared with its sharing setting;
the API server admits them at v1beta1 and refuses the VFIO/IMEX ones with the reason."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import RESOURCE_BETAS

from tests.plugin_helpers import short_tmp
from tests.test_nvidia_quickstart import (

    GPU_TEST1, GPU_TEST2, GPU_TEST3, GPU_TEST4, GPU_TEST5, GPU_TEST7, GPU_TEST8, GPU_TEST_MPS, GPU_TEST_VFIO_CONFIG,
    GPU_TEST_VFIOPCI, HELM_CLASSES, IMEX_TEST1, SimNode,
)

# resource.k8s.io's beta versions are served only when --runtime-config enables them, as in kube-apiserver 1.37.
pytestmark = pytest.mark.apiserver_options(runtime_config=RESOURCE_BETAS)


def v1beta1(text: str) -> str:
    """The v1beta1 twin of a v1 spec: resource.k8s.io objects at v1beta1, requests' `exactly` fields flat."""
    out = []
    for obj in yaml.safe_load_all(text):
        if not obj:
            continue
        if obj.get("apiVersion") == "resource.k8s.io/v1":
            obj["apiVersion"] = "resource.k8s.io/v1beta1"
            spec = obj.get("spec") or {}
            devices = (spec.get("spec") or {}).get("devices") if obj["kind"] == "ResourceClaimTemplate" else spec.get("devices")
            for request in (devices or {}).get("requests") or []:
                request.update(request.pop("exactly", {}))
        out.append(yaml.safe_dump(obj))
    return "---\n".join(out)


@pytest.fixture
def tmp() -> Iterator[Path]:
    with short_tmp() as path:
        yield path


def test_twin_is_v1beta1_shaped() -> None:
    (template,) = [o for o in yaml.safe_load_all(v1beta1(GPU_TEST8)) if o["kind"] == "ResourceClaimTemplate"]
    assert template["apiVersion"] == "resource.k8s.io/v1beta1"
    assert template["spec"]["spec"]["devices"]["requests"] == [{"name": "gpu", "deviceClassName": "gpu.nvidia.com", "count": 2}]


@pytest.mark.parametrize(
    "spec,profile,claims",
    [
        (GPU_TEST1, "dgx-a100-40gb", 2), (GPU_TEST2, "dgx-a100-40gb", 1), (GPU_TEST3, "dgx-a100-40gb", 1),
        (GPU_TEST4, "dgx-a100-40gb", 4), (GPU_TEST5, "dgx-a100-40gb", 1), (GPU_TEST7, "dgx-a100-40gb", 2),
        (GPU_TEST8, "dgx-a100-40gb", 1), (GPU_TEST_MPS, "dgx-h100", 1),
    ],
    ids=["gpu-test1", "gpu-test2", "gpu-test3", "gpu-test4", "gpu-test5", "gpu-test7", "gpu-test8", "gpu-test-mps"],
)
@pytest.mark.slow
def test_v1beta1_twins_validate_allocate_and_prepare(
    tmp: Path, capsys: pytest.CaptureFixture[str], spec: str, profile: str, claims: int,
) -> None:
    node = SimNode(tmp, profile)
    classes = yaml.safe_dump_all([{**o, "apiVersion": "resource.k8s.io/v1beta1"} for o in yaml.safe_load_all(HELM_CLASSES) if o])
    results = _allocate_twin(tmp, capsys, node, classes + "\n---\n" + v1beta1(spec))
    assert len(results) == claims
    node.prepare(results)
    if spec is GPU_TEST5:
        (ts_gpu,) = node.uuid_of(results[0], "ts-gpu")
        assert node.nvml.get_timeslice(ts_gpu) == 3
    if spec in (GPU_TEST5, GPU_TEST_MPS):
        daemon = node.mps("uid-0")
        assert daemon is not None and daemon.running and daemon.active_thread_percentage == 50


def _allocate_twin(tmp: Path, capsys: pytest.CaptureFixture[str], node: SimNode, text: str) -> list[dict[str, Any]]:
    from cli.main import main

    path = tmp / "spec.yaml"
    path.write_text(text)
    assert main(["validate", "-f", str(path), "-o", "json"]) == 0, capsys.readouterr().out
    capsys.readouterr()
    rc = main(["allocate", "-f", str(path), node.slices_file(tmp), "-o", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and all(r["outcome"] == "allocated" for r in doc["results"]), doc
    return doc["results"]


def _post(url: str, body: Any) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _create(url: str, obj: dict[str, Any]) -> tuple[int, Any]:
    kind = obj["kind"]
    plural = {"ResourceClaim": "resourceclaims", "ResourceClaimTemplate": "resourceclaimtemplates", "DeviceClass": "deviceclasses"}[kind]
    ns = obj["metadata"].get("namespace")
    where = f"/namespaces/{ns}" if ns else ""
    return _post(f"{url}/apis/resource.k8s.io/v1beta1{where}/{plural}", obj)


def test_v1beta1_twins_admitted(apiserver: Any) -> None:
    for obj in [o for o in yaml.safe_load_all(HELM_CLASSES) if o]:
        status, body = _create(apiserver.url, {**obj, "apiVersion": "resource.k8s.io/v1beta1"})
        assert status == 201, body
    for spec in (GPU_TEST3, GPU_TEST4, GPU_TEST5, GPU_TEST8, GPU_TEST_MPS):
        objects = [o for o in yaml.safe_load_all(v1beta1(spec)) if o]
        apiserver.api.create("Namespace", objects[0])
        for obj in objects:
            if obj["kind"] in ("ResourceClaim", "ResourceClaimTemplate"):
                status, body = _create(apiserver.url, obj)
                assert status == 201, body


@pytest.mark.parametrize(
    "spec,expected",
    [
        (IMEX_TEST1, "the IMEX channel class of NVIDIA's driver before ComputeDomains"),
        (GPU_TEST_VFIOPCI, "gpu-dra does not support VFIO passthrough"),
        (GPU_TEST_VFIO_CONFIG, "kind: VfioDeviceConfig is not supported"),
    ],
    ids=["imex-test1", "gpu-test-vfiopci", "gpu-test-vfio-config"],
)
def test_v1beta1_imex_and_vfio_twins_refused(
    apiserver: Any, tmp: Path, capsys: pytest.CaptureFixture[str], spec: str, expected: str,
) -> None:
    from cli.main import main

    twin = v1beta1(spec)
    path = tmp / "spec.yaml"
    path.write_text(twin)
    assert main(["validate", "-f", str(path), "-o", "json"]) == 1
    errors = [e for r in json.loads(capsys.readouterr().out)["results"] for e in r["errors"]]
    assert any(expected in e for e in errors), errors
    objects = [o for o in yaml.safe_load_all(twin) if o]
    apiserver.api.create("Namespace", objects[0])
    for obj in objects[1:]:
        status, body = _create(apiserver.url, obj)
        assert status == 422 and expected in body["message"], body
