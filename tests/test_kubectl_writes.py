"""kubectl 1.37's day-two writes against the embedded control plane keep every field (strategic merge patch,
defaulting, conversion): apply of an edited file, set image, edit, patch with directives, label through v1beta1."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

import yaml

from conftest import RESOURCE_BETAS
from tests.test_kubectl import KUBECTL, kubectl

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")

DEPLOYMENT = {
    "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "default"},
    "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
             "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                 "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                 "containers": [
                     {"name": "app", "image": "busybox:1.36", "command": ["sh", "-c", "sleep 3600"],
                      "env": [{"name": "A", "value": "1"}],
                      "ports": [{"containerPort": 8080}],
                      "resources": {"requests": {"cpu": "100m"}, "claims": [{"name": "gpu"}]}},
                     {"name": "side", "image": "busybox:1.36"}]}}}}


def _apply(server: Any, tmp_path: Path, doc: dict[str, Any]) -> None:
    path = tmp_path / "doc.yaml"
    path.write_text(yaml.safe_dump(doc))
    kubectl(server, "apply", "-f", str(path))


def _get(server: Any, *what: str) -> dict[str, Any]:
    return json.loads(kubectl(server, "get", *what, "-o", "json").stdout)  # type: ignore[no-any-return]


def _containers(server: Any) -> list[dict[str, Any]]:
    return _get(server, "deployment", "web")["spec"]["template"]["spec"]["containers"]  # type: ignore[no-any-return]


@pytest.mark.process
def test_apply_of_an_edited_deployment_keeps_every_field(apiserver: Any, tmp_path: Path) -> None:
    _apply(apiserver, tmp_path, DEPLOYMENT)
    edited = json.loads(json.dumps(DEPLOYMENT))
    app = edited["spec"]["template"]["spec"]["containers"][0]
    app["image"] = "busybox:1.37"
    app["env"].append({"name": "B", "value": "2"})
    edited["spec"]["template"]["spec"]["containers"].reverse()  # sent as $setElementOrder/containers
    _apply(apiserver, tmp_path, edited)
    containers = _containers(apiserver)
    assert [c["name"] for c in containers] == ["side", "app"]
    app = containers[1]
    assert app["image"] == "busybox:1.37"
    assert app["command"] == ["sh", "-c", "sleep 3600"]
    assert app["resources"] == {"requests": {"cpu": "100m"}, "claims": [{"name": "gpu"}]}
    assert app["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    assert app["ports"] == [{"containerPort": 8080, "protocol": "TCP"}]
    spec = _get(apiserver, "deployment", "web")["spec"]["template"]["spec"]
    assert spec["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    # Removing a field from the file removes it from the object (the 3-way patch sends null for it).
    del edited["spec"]["template"]["spec"]["containers"][1]["env"]
    _apply(apiserver, tmp_path, edited)
    assert "env" not in _containers(apiserver)[1]
    assert _containers(apiserver)[1]["command"] == ["sh", "-c", "sleep 3600"]


@pytest.mark.process
def test_set_image_keeps_every_field(apiserver: Any, tmp_path: Path) -> None:
    _apply(apiserver, tmp_path, DEPLOYMENT)
    before = _containers(apiserver)
    kubectl(apiserver, "set", "image", "deployment/web", "app=busybox:1.38")
    after = _containers(apiserver)
    assert after[0] == {**before[0], "image": "busybox:1.38"}
    assert after[1] == before[1]


@pytest.mark.process
def test_edit_keeps_every_field(apiserver: Any, tmp_path: Path) -> None:
    _apply(apiserver, tmp_path, DEPLOYMENT)
    editor = tmp_path / "editor.py"
    editor.write_text("import sys\np = sys.argv[1]\ntext = open(p).read()\n"
                      "open(p, 'w').write(text.replace('replicas: 1', 'replicas: 3', 1))\n")
    script = tmp_path / "editor.sh"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {editor} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    before = _containers(apiserver)
    os.environ["KUBE_EDITOR"] = str(script)
    try:
        kubectl(apiserver, "edit", "deployment/web")
    finally:
        del os.environ["KUBE_EDITOR"]
    assert _get(apiserver, "deployment", "web")["spec"]["replicas"] == 3
    assert _containers(apiserver) == before


@pytest.mark.process
def test_strategic_patch_with_directives(apiserver: Any, tmp_path: Path) -> None:
    _apply(apiserver, tmp_path, DEPLOYMENT)
    kubectl(apiserver, "patch", "deployment", "web", "-p", json.dumps(
        {"spec": {"template": {"spec": {"containers": [{"name": "side", "$patch": "delete"},
                                                       {"name": "app", "env": [{"name": "C", "value": "3"}]}]}}}}))
    containers = _containers(apiserver)
    assert [c["name"] for c in containers] == ["app"]
    assert sorted(e["name"] for e in containers[0]["env"]) == ["A", "C"]
    assert containers[0]["command"] == ["sh", "-c", "sleep 3600"]
    kubectl(apiserver, "patch", "deployment", "web", "-p", json.dumps(
        {"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}))
    assert _get(apiserver, "deployment", "web")["spec"]["strategy"] == {"type": "Recreate"}
    kubectl(apiserver, "patch", "deployment", "web", "-p", json.dumps(
        {"spec": {"template": {"spec": {"containers": [{"name": "only", "image": "x:1"}, {"$patch": "replace"}]}}}}))
    assert [c["name"] for c in _containers(apiserver)] == ["only"]


@pytest.mark.process
@pytest.mark.apiserver_options(runtime_config=RESOURCE_BETAS)
def test_label_through_v1beta1_of_a_template_created_through_v1(apiserver: Any, tmp_path: Path) -> None:
    _apply(apiserver, tmp_path, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}})
    kubectl(apiserver, "label", "resourceclaimtemplates.v1beta1.resource.k8s.io", "one-gpu", "team=a")
    stored = _get(apiserver, "resourceclaimtemplates.v1.resource.k8s.io", "one-gpu")
    assert stored["metadata"]["labels"] == {"team": "a"}
    assert stored["spec"]["spec"]["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}
    beta = _get(apiserver, "resourceclaimtemplates.v1beta1.resource.k8s.io", "one-gpu")
    assert beta["spec"]["spec"]["devices"]["requests"][0]["count"] == 1


@pytest.mark.process
@pytest.mark.apiserver_options(runtime_config=RESOURCE_BETAS)
def test_a_v1beta1_spec_applied_over_the_same_v1_object_is_accepted(apiserver: Any, tmp_path: Path) -> None:
    """NVIDIA's v1beta1 specs applied over v1 ones: the same template in another version is no change of spec
    (defaulting makes them equal); a real change is refused, the spec being immutable."""
    v1 = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
          "metadata": {"name": "t", "namespace": "default"},
          "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}}
    _apply(apiserver, tmp_path, v1)
    beta = {**v1, "apiVersion": "resource.k8s.io/v1beta1",
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu.nvidia.com"}]}}}}
    _apply(apiserver, tmp_path, beta)
    beta["spec"]["spec"]["devices"]["requests"][0]["count"] = 2
    path = tmp_path / "changed.yaml"
    path.write_text(yaml.safe_dump(beta))
    changed = kubectl(apiserver, "apply", "-f", str(path), check=False)
    assert changed.returncode == 1 and "field is immutable" in changed.stderr
