"""Every shipped manifest passes Kubernetes' published schema (strict) and our own validation rules,
and every kustomization builds."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from cli.main import main as gpu_dra
from gpudra.manifests import load_objects

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "manifests"
# kind's own config and kustomizations are not Kubernetes API objects.
NOT_API_OBJECTS = {"cluster.yaml", "kustomization.yaml"}
SCHEMA_VERSION = "1.37.0"
# Kinds served from the CRDs in manifests/compute-domains (NVIDIA's ComputeDomain API).
CUSTOM_API_VERSIONS = {"resource.nvidia.com/v1beta1"}


def manifest_files() -> list[Path]:
    return sorted(p for p in MANIFESTS.rglob("*.yaml") if p.name not in NOT_API_OBJECTS)


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(MANIFESTS)))
def test_manifest_passes_kubernetes_schema_strict(path: Path) -> None:
    objects = load_objects([str(path)])
    assert objects, f"{path} holds no objects"
    for obj in objects:
        if obj.get("apiVersion") in CUSTOM_API_VERSIONS:
            continue  # kubernetes-validate knows built-in kinds only; gpu-dra validate checks these with their CRD
        kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(MANIFESTS)))
def test_manifest_passes_gpu_dra_validate(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = gpu_dra(["validate", "-f", str(path), "-o", "json"])
    out = capsys.readouterr().out
    assert code == 0, out


def test_every_kustomization_lists_existing_files() -> None:
    kustomizations = sorted(MANIFESTS.rglob("kustomization.yaml"))
    assert len(kustomizations) >= 4
    for k in kustomizations:
        doc = yaml.safe_load(k.read_text())
        assert doc["kind"] == "Kustomization"
        for res in doc.get("resources", []):
            assert (k.parent / res).exists(), f"{k}: resource {res} does not exist"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
@pytest.mark.parametrize("overlay", ["", "extended-resource", "device-plugin", "kind/overlay", "shared-capacity"])
def test_kustomization_builds(overlay: str) -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(MANIFESTS / overlay)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    objects = [o for o in yaml.safe_load_all(out) if o]
    kinds = {o["kind"] for o in objects}
    assert {"DaemonSet", "Deployment", "DeviceClass", "ClusterRole", "ValidatingAdmissionPolicy"} <= kinds
    agent = next(o for o in objects if o["kind"] == "DaemonSet")
    args = agent["spec"]["template"]["spec"]["containers"][0]["args"]
    # The shim and the extended-resource class must never both own nvidia.com/gpu.
    has_extended_class = any(o["kind"] == "DeviceClass" and o["spec"].get("extendedResourceName") for o in objects)
    assert has_extended_class == (overlay == "extended-resource")
    # The shim is opt-in: only the overlays that ask for it (never beside the extended-resource class).
    assert ("--device-plugin" in args) == (overlay in ("device-plugin", "kind/overlay"))
    # GFD labels are on everywhere, with the RBAC to patch the agent's Node; sharing by capacity only in its overlay.
    assert "--node-labels" in args and ("--shared-capacity" in args) == (overlay == "shared-capacity")
    role = next(o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "gpu-dra-node-agent")
    assert any("nodes" in r["resources"] and "patch" in r["verbs"] for r in role["rules"])
    if has_extended_class:
        (cls,) = [o for o in objects if o["kind"] == "DeviceClass" and o["spec"].get("extendedResourceName")]
        assert (cls["metadata"]["name"], cls["spec"]["extendedResourceName"]) == ("gpu.nvidia.com", "nvidia.com/gpu")
    for obj in objects:
        kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)
