"""Every shipped manifest passes Kubernetes' published schema (strict) and our own validation rules,
and every kustomization builds."""

from __future__ import annotations

import os
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
# Custom resources (cert-manager's, in the webhook overlay; NVIDIA's ComputeDomains, in manifests/compute-domains)
# have no schema in Kubernetes' published one; gpu-dra validate checks ComputeDomains with their CRD.
CRD_GROUPS = ("cert-manager.io/", "resource.nvidia.com/")
IMAGE = "ghcr.io/gpu-dra/gpu-dra"


def manifest_files() -> list[Path]:
    return sorted(p for p in MANIFESTS.rglob("*.yaml") if p.name not in NOT_API_OBJECTS)


@pytest.mark.slow
@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(MANIFESTS)))
def test_manifest_passes_kubernetes_schema_strict(path: Path) -> None:
    objects = load_objects([str(path)])
    assert objects, f"{path} holds no objects"
    for obj in objects:
        if not str(obj.get("apiVersion", "")).startswith(CRD_GROUPS):
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


@pytest.mark.process
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
@pytest.mark.parametrize("overlay", ["", "extended-resource", "device-plugin", "kind/overlay", "testbed",
                                     "testbed-extended-resource", "shared-capacity", "webhook",
                                     "allow-device-plugin-coexistence"])
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
    assert has_extended_class == overlay.endswith("extended-resource")
    # The shim is opt-in: only the overlays that ask for it (never beside the extended-resource class).
    assert ("--device-plugin" in args) == (overlay in ("device-plugin", "kind/overlay", "testbed"))
    # GFD labels are off (GFD owns them on GPU Operator clusters); the RBAC to patch the agent's Node stays for
    # --node-labels; sharing by capacity only in its overlay.
    assert "--node-labels" not in args and ("--shared-capacity" in args) == (overlay == "shared-capacity")
    assert ("--allow-device-plugin-coexistence" in args) == (overlay == "allow-device-plugin-coexistence")
    role = next(o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "gpu-dra-node-agent")
    assert any("nodes" in r["resources"] and "patch" in r["verbs"] for r in role["rules"])
    if has_extended_class:
        (cls,) = [o for o in objects if o["kind"] == "DeviceClass" and o["spec"].get("extendedResourceName")]
        assert (cls["metadata"]["name"], cls["spec"]["extendedResourceName"]) == ("gpu.nvidia.com", "nvidia.com/gpu")
    for obj in objects:
        if not str(obj.get("apiVersion", "")).startswith(CRD_GROUPS):
            kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)


def _containers(objects: list[dict]) -> list[dict]:  # type: ignore[type-arg]
    return [c for o in objects if o["kind"] in ("DaemonSet", "Deployment")
            for c in o["spec"]["template"]["spec"]["containers"]]


@pytest.mark.process
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_one_image_reference_that_kustomize_images_changes_everywhere(tmp_path: Path) -> None:
    """Every container names the one fully qualified image; no env var or flag carries a copy that an `images:`
    entry would miss (the MPS daemon pods take the agent pod's own image)."""
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(MANIFESTS / "webhook", tmp_path)],
        "images": [{"name": IMAGE, "newName": "registry.example.com/mirror/gpu-dra", "digest": "sha256:" + "a" * 64}],
    }))
    out = subprocess.run(["kubectl", "kustomize", str(tmp_path)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    objects = [o for o in yaml.safe_load_all(out) if o]
    containers = _containers(objects)
    assert {c["name"] for c in containers} == {"node-agent", "controller", "webhook"}
    assert {c["image"] for c in containers} == {"registry.example.com/mirror/gpu-dra@sha256:" + "a" * 64}
    text = yaml.safe_dump_all(objects)
    assert "gpu-dra:dev" not in text and IMAGE not in text and "GPU_DRA_IMAGE" not in text
    agent = next(c for c in containers if c["name"] == "node-agent")
    assert "--mps-daemon-image-from-pod" in agent["args"]
    assert {"POD_NAME", "POD_UID", "POD_NAMESPACE"} <= {e["name"] for e in agent["env"]}
    # The IMEX daemon pods of ComputeDomains take the controller's own image (and pull secrets) from its Pod.
    controller = next(c for c in containers if c["name"] == "controller")
    assert "--compute-domain-daemon-image-from-pod" in controller["args"]
    assert {"POD_NAME", "POD_NAMESPACE"} <= {e["name"] for e in controller["env"]}


@pytest.mark.process
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_node_agent_rolls_surge_first_with_grpc_probes() -> None:
    out = subprocess.run(["kubectl", "kustomize", str(MANIFESTS)], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    ds = next(o for o in yaml.safe_load_all(out) if o and o["kind"] == "DaemonSet")
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    (agent,) = ds["spec"]["template"]["spec"]["containers"]
    port = next(int(a.split("=", 1)[1]) for a in agent["args"] if a.startswith("--healthcheck-port="))
    # Startup and liveness ask the `liveness` service, alive while the agent waits for the driver; readiness the
    # whole agent (driver.plugin.healthcheck).
    for probe in ("startupProbe", "livenessProbe"):
        assert agent[probe]["grpc"] == {"port": port, "service": "liveness"}, probe
    assert agent["readinessProbe"]["grpc"] == {"port": port}
    # The driver root is the host's /, the parent of the GPU Operator's /run/nvidia/driver, with propagation.
    volume = next(v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "driver-root")
    mount = next(m for m in agent["volumeMounts"] if m["name"] == "driver-root")
    assert volume["hostPath"]["path"] == "/" and mount["mountPropagation"] == "HostToContainer"
    assert f"--driver-root={mount['mountPath']}" in agent["args"]
    startup = agent["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
    uid = next(e for e in agent["env"] if e["name"] == "POD_UID")
    assert uid["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
