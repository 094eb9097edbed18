"""The upstream backend's pure parts: OCI archives, image names, the components' configuration, the layout."""

from __future__ import annotations

import json
import struct
import tarfile
from pathlib import Path

import pytest
import yaml

from sim.cluster import kubeconfig
from sim.upstream import config, pki
from sim.upstream.images import SpecImagesError, normalise, references_in
from sim.upstream.layout import ClusterLayout, plan_nodes
from sim.upstream.oci import ImageConfig, read_index, write_archive
from sim.upstream.supervisor import node_labels


def _tree(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tool").write_text("#!/bin/sh\necho hi\n")
    (root / "bin" / "tool").chmod(0o755)
    (root / "bin" / "alias").symlink_to("tool")
    (root / "proc").mkdir()
    (root / "proc" / "junk").write_text("a runtime mounts over this")
    return root


def test_an_archive_is_an_oci_layout_naming_the_image(tmp_path: Path) -> None:
    root = _tree(tmp_path / "root")
    archive = tmp_path / "image.tar"
    digest = write_archive(root, ImageConfig(reference="ghcr.io/x/y:v1", cmd=("tool",)), archive)
    index = read_index(archive)
    (entry,) = index["manifests"]  # type: ignore[misc]
    assert entry["digest"] == digest
    assert entry["annotations"] == {"io.containerd.image.name": "ghcr.io/x/y:v1",
                                    "org.opencontainers.image.ref.name": "v1"}
    with tarfile.open(archive) as tar:
        blobs = {m.name.rsplit("/", 1)[-1]: m for m in tar.getmembers() if m.name.startswith("blobs/sha256/")}
        manifest = json.load(tar.extractfile(blobs[digest.removeprefix("sha256:")]))  # type: ignore[arg-type]
        layer_name = manifest["layers"][0]["digest"].removeprefix("sha256:")
        with tarfile.open(fileobj=tar.extractfile(blobs[layer_name])) as layer:
            names = layer.getnames()
            assert layer.getmember("bin/alias").issym() and layer.getmember("bin/tool").mode & 0o111
            assert all(m.mtime == 0 for m in layer.getmembers())
        cfg = json.load(tar.extractfile(blobs[manifest["config"]["digest"].removeprefix("sha256:")]))  # type: ignore[arg-type]
    assert "proc" in names and "proc/junk" not in names
    assert cfg["config"]["Cmd"] == ["tool"] and cfg["rootfs"]["diff_ids"] == [f"sha256:{layer_name}"]


def test_the_same_tree_gives_the_same_digest(tmp_path: Path) -> None:
    root = _tree(tmp_path / "root")
    first = write_archive(root, ImageConfig(reference="a:1"), tmp_path / "1.tar")
    assert write_archive(root, ImageConfig(reference="a:1"), tmp_path / "2.tar") == first
    (root / "bin" / "tool").write_text("changed")
    assert write_archive(root, ImageConfig(reference="a:1"), tmp_path / "3.tar") != first


@pytest.mark.parametrize(("given", "stored"), [
    ("ubuntu:22.04", "docker.io/library/ubuntu:22.04"),
    ("jupyter/tensorflow-notebook", "docker.io/jupyter/tensorflow-notebook:latest"),
    ("nvcr.io/nvidia/cuda:12.8.0-base-ubuntu24.04", "nvcr.io/nvidia/cuda:12.8.0-base-ubuntu24.04"),
    ("localhost/x", "localhost/x:latest"),
    ("registry:5000/x:1", "registry:5000/x:1"),
])
def test_references_are_normalised_as_the_kubelet_asks_for_them(given: str, stored: str) -> None:
    assert normalise(given) == stored


SPEC = """
apiVersion: v1
kind: Pod
metadata: {name: a}
spec:
  initContainers: [{name: init, image: busybox}]
  containers: [{name: main, image: "nvcr.io/nvidia/cuda:12.9.0-base-ubuntu24.04"}, {name: side, image: busybox}]
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly}
spec:
  jobTemplate:
    spec:
      template:
        spec:
          containers: [{name: job, image: "localhost:5000/team/eval:v2"}]
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: gpu}
spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]}}}
"""


def test_the_images_a_spec_names_are_found_in_pods_and_templates_at_any_depth() -> None:
    assert references_in(SPEC, "spec.yaml") == ["docker.io/library/busybox:latest",
                                                "nvcr.io/nvidia/cuda:12.9.0-base-ubuntu24.04",
                                                "localhost:5000/team/eval:v2"]


@pytest.mark.parametrize(("text", "message"), [
    ("kind: Pod\nspec: {containers: [{name: c, image: Ubuntu}]}",
     "spec.yaml: Pod #1.spec.containers[0].image: 'Ubuntu' is not an image reference"),
    ("kind: Deployment\nmetadata: {name: web}\nspec: {template: {spec: {containers: [{name: c, image: 7}]}}}",
     "spec.yaml: Deployment web.spec.template.spec.containers[0].image: 7 is not an image reference"),
    ("kind: Pod\nspec: [", "spec.yaml: not YAML"),
    ("- just\n- a list", "spec.yaml: document 1 is not an object"),
])
def test_a_spec_with_a_wrong_image_is_refused_naming_object_and_field(text: str, message: str) -> None:
    with pytest.raises(SpecImagesError) as error:
        references_in(text, "spec.yaml")
    assert str(error.value).startswith(message)


def test_kubelets_are_configured_for_this_sandbox_and_apart_from_each_other(tmp_path: Path) -> None:
    layout = ClusterLayout("c", tmp_path, plan_nodes([("a", "dgx-a100"), ("b", "gb200-nvl?clique=3")]))
    a, b = layout.nodes
    ca = config.kubelet_config(layout, a, Path("a.crt"), Path("a.key"))
    cb = config.kubelet_config(layout, b, Path("b.crt"), Path("b.key"))
    assert ca["failCgroupV1"] is False and ca["oomScoreAdj"] == 0
    assert ca["authentication"]["anonymous"] == {"enabled": False}  # type: ignore[index]
    assert ca["authorization"] == {"mode": "Webhook"}
    assert (ca["address"], cb["address"]) == ("10.231.0.11", "10.231.0.12")
    assert ca["cgroupRoot"] != cb["cgroupRoot"]
    assert json.loads(config.cni_config(a))["plugins"][0]["ipam"]["ranges"] == [[{"subnet": "10.244.1.0/24",
                                                                                 "gateway": "10.244.1.1"}]]
    assert node_labels(b) == {"nvidia.com/gpu.present": "true", "gpu-dra.simulated-profile": "gb200-nvl",
                              "gpu-dra.simulated-clique": "3"}
    argv = config.apiserver_argv(Path("/bin"), layout)
    assert "--authorization-mode=Node,RBAC" in argv and "--enable-admission-plugins=NodeRestriction" in argv
    assert "restrict_oom_score_adj = true" in config.containerd_config(Path("/cni"), "/usr/sbin/runc")


def test_certificates_name_kubeadms_identities_and_the_user_context_is_merged(tmp_path: Path) -> None:
    from cryptography import x509

    keys = pki.Pki(tmp_path / "pki")
    cert_file, key_file = keys.client(pki.node_identity("n1"))
    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    assert cert.subject.rfc4514_string() == "CN=system:node:n1,O=system:nodes"
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    assert pki.Pki(tmp_path / "pki").client(pki.node_identity("n1")) == (cert_file, key_file)  # kept, not remade
    ours = keys.kubeconfig(pki.ADMIN, "https://127.0.0.1:1234", tmp_path / "ours.yaml", context="gpu-dra-c")
    target = tmp_path / "config"
    target.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": "other",
                                      "contexts": [{"name": "other", "context": {"cluster": "o", "user": "o"}}],
                                      "clusters": [], "users": []}))
    assert kubeconfig.merge(target, "c", ours) == "other"
    merged = yaml.safe_load(target.read_text())
    assert merged["current-context"] == "gpu-dra-c"
    assert {c["name"] for c in merged["contexts"]} == {"other", "gpu-dra-c"}
    (user,) = [u for u in merged["users"] if u["name"] == "gpu-dra-c"]
    assert user["user"]["client-certificate-data"]


@pytest.mark.process  # gcc
def test_a_simulated_driver_install_runs_its_tools_in_our_images_pods(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Upstream nodes' driver installs: the IMEX stand-ins run with the testbed image's python and are given the
    fabric-imex-mgmt numbers (a container's procfs has no simulated driver), and nvidia-cuda-mps-control is a
    static program (it runs in the MPS daemon pod whatever libc the image has), compiled once."""
    import subprocess

    from driver.discovery import discover
    from driver.nvml import load_backend
    from sim.runtime import driverinstall
    from sim.runtime.driverinstall import FABRIC_IMEX_MGMT_MINOR
    from sim.nvml.simulator import SIM_CAPS_MAJOR
    from sim.upstream import drivertools
    from sim.upstream.images import IMAGE_PYTHON

    monkeypatch.setenv("GPU_DRA_CACHE", str(tmp_path / "cache"))
    inventory = discover(load_backend("sim:gb200-nvl", node="gb-1"), "gb-1")
    root = driverinstall.write(tmp_path / "driver", "gb-1", inventory, container_python=IMAGE_PYTHON)
    imex = (root / "usr" / "bin" / "nvidia-imex").read_text()
    assert imex.startswith(f"#!{IMAGE_PYTHON}\n")
    assert f"needs=({len(inventory.gpus)}, ({FABRIC_IMEX_MGMT_MINOR}, {SIM_CAPS_MAJOR}))" in imex
    drivertools.install(root)
    mps = root / "usr" / "bin" / "nvidia-cuda-mps-control"
    assert _program_header_types(mps.read_bytes()) and 3 not in _program_header_types(mps.read_bytes())  # PT_INTERP
    built = drivertools.mps_control()
    assert built.stat().st_mtime_ns == drivertools.mps_control().stat().st_mtime_ns  # cached, not rebuilt
    # A client with no daemon answers as NVIDIA's does.
    done = subprocess.run([str(mps)], input="get_default_active_thread_percentage\n", capture_output=True, text=True,
                          env={"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "no-daemon")}, timeout=10)
    assert done.returncode != 0 and "Cannot find MPS control daemon process" in done.stdout + done.stderr


def _program_header_types(elf: bytes) -> list[int]:
    """The p_type of each program header of an ELF64 little-endian file."""
    assert elf[:4] == b"\x7fELF" and elf[4] == 2 and elf[5] == 1
    phoff, = struct.unpack_from("<Q", elf, 0x20)
    size, count = struct.unpack_from("<HH", elf, 0x36)
    return [struct.unpack_from("<I", elf, phoff + i * size)[0] for i in range(count)]


def test_the_agent_runs_mps_daemons_in_pods_where_the_driver_install_has_the_tool(tmp_path: Path) -> None:
    """A simulated node whose driver install has nvidia-cuda-mps-control (the upstream testbed's) runs MPS daemons
    in pods with NVIDIA's tools from that install; other simulated nodes keep the simulator's in-process ones."""
    from driver.commands.plugin import _mps_daemon_tools
    from driver.gputools import NvidiaTools
    from driver.nvml import load_backend

    nvml = load_backend("sim:t4-1", node="n")
    assert _mps_daemon_tools(nvml, None) is None
    assert _mps_daemon_tools(nvml, tmp_path) is None
    tool = tmp_path / "usr" / "bin" / "nvidia-cuda-mps-control"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    tools = _mps_daemon_tools(nvml, tmp_path)
    assert isinstance(tools, NvidiaTools)
    argv, _ = tools.command(["nvidia-cuda-mps-control", "-d"])
    assert argv == [str(tool), "-d"]
