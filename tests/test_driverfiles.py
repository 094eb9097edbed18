"""Driver files for CDI-only runtimes: discovery in a fake 580.95.05 driver root (libraries are real ELF shared
objects built with gcc, so their sonames are read as on a node), the CDI edits it yields, and clean degradation
when the root is missing or of another version."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from driver import cdi
from driver.commands import plugin
from driver.discovery import discover as discover_inventory
from driver.driverfiles import (
    DATA_MOUNT_OPTIONS,
    MOUNT_OPTIONS,
    DriverFiles,
    RootSnapshot,
    container_library_dirs,
    discover,
    plan,
    resolve_in_root,
)
from driver.elfsoname import soname
from driver.nvml import load_backend
from driver.plugin.agent import AgentSettings, NodeAgent
from driver.prepare import ClaimNotFound, ClaimRef
from driver.slices import gpu_device_name
from tests.plugin_helpers import short_tmp

VERSION = "580.95.05"
LIBDIR = "/usr/lib/x86_64-linux-gnu"
LIBS = ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler", "libnvidia-nvvm", "libGLX_nvidia")
CONTAINER_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64")


@pytest.fixture(scope="module")
def elf_libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny shared object per library name, with the soname the driver gives it (`<name>.so.1`, libGLX_nvidia
    `.so.0`)."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the shared objects")
    out = tmp_path_factory.mktemp("elf")
    src = out / "lib.c"
    src.write_text("int nodebox_symbol(void) { return 1; }\n")
    built = {}
    for name in LIBS:
        so = f"{name}.so.0" if name == "libGLX_nvidia" else f"{name}.so.1"
        path = out / f"{name}.so"
        subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{so}", "-o", str(path), str(src)], check=True)
        built[name] = path
    return built


def _touch(path: Path, text: str = "x", mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def fake_root(root: Path, libs: dict[str, Path], *, persistenced: bool = False) -> Path:
    """A driver root laid out like an Ubuntu 580.95.05 install with merged /usr, an NVIDIA Container Toolkit too."""
    lib = root / LIBDIR.lstrip("/")
    lib.mkdir(parents=True)
    for name, built in libs.items():
        shutil.copy(built, lib / f"{name}.so.{VERSION}")
        os.symlink(f"{name}.so.{VERSION}", lib / f"{name}.so.1")
    os.symlink("libcuda.so.1", lib / "libcuda.so")
    shutil.copy(libs["libnvidia-ml"], lib / "libnvidia-ml.so.570.86.15")  # a leftover of an older driver
    _touch(lib / "libc.so.6")  # the host's libc: not the driver's
    os.symlink("usr/lib", root / "lib")  # merged /usr: /lib/x86_64-linux-gnu is the same dir
    for binary in ("nvidia-smi", "nvidia-debugdump", "nvidia-cuda-mps-control", "nvidia-cdi-hook"):
        _touch(root / "usr/bin" / binary, "#!/bin/sh\n", 0o755)
    _touch(root / "usr/bin/nvidia-persistenced", "not executable")
    firmware = root / "usr/lib/firmware/nvidia" / VERSION
    _touch(firmware / "gsp_ga10x.bin")
    _touch(firmware / "gsp_tu10x.bin")
    _touch(root / "usr/lib/firmware/nvidia/570.86.15/gsp_ga10x.bin")
    if persistenced:
        (root / "run/nvidia-persistenced").mkdir(parents=True)
        (root / "var").mkdir()
        os.symlink("/run", root / "var/run")
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(root / "run/nvidia-persistenced/socket"))
        sock.close()
    return root


@pytest.mark.process
def test_resolve_in_root_follows_links_inside_the_root(tmp_path: Path, elf_libs: dict[str, Path]) -> None:
    root = fake_root(tmp_path / "root", elf_libs)
    os.symlink("/usr/lib", root / "lib64")
    assert resolve_in_root(root, "/lib/x86_64-linux-gnu") == LIBDIR
    assert resolve_in_root(root, "/lib64/x86_64-linux-gnu/../x86_64-linux-gnu") == LIBDIR
    assert resolve_in_root(root, "/usr/lib64") is None
    os.symlink("loop", root / "loop")
    assert resolve_in_root(root, "/loop/x") is None


@pytest.mark.process
def test_development_links_follow_the_install_and_the_ldcache_hook_scans_both_families(
    tmp_path: Path, elf_libs: dict[str, Path],
) -> None:
    """A `.so` development link the install has beside a library is given to containers (as a file mount of the
    library); one it lacks is not, except libcuda.so and libnvidia-opticalflow.so, which NVIDIA's toolkit always
    creates. With the agent's own hook, every spec rebuilds the container's loader cache over both families'
    library directories."""
    root = fake_root(tmp_path / "root", elf_libs)
    lib = root / LIBDIR.lstrip("/")
    os.unlink(lib / "libcuda.so")  # an install without the link: containers get it all the same
    os.symlink("libnvidia-ml.so.1", lib / "libnvidia-ml.so")
    shutil.copy(elf_libs["libcuda"], lib / f"libnvidia-opticalflow.so.{VERSION}")  # soname libcuda.so.1 aside
    files = discover(root, VERSION, ldcache_hook="/var/lib/kubelet/plugins/gpu.nvidia.com-cdi-hook/gpu-dra-cdi-hook")
    mounts = {m.container_path: m.host_path for m in files.mounts}
    for directory in CONTAINER_DIRS:
        assert mounts[f"{directory}/libcuda.so"] == f"{LIBDIR}/libcuda.so.{VERSION}"
        assert mounts[f"{directory}/libnvidia-ml.so"] == f"{LIBDIR}/libnvidia-ml.so.{VERSION}"
        assert f"{directory}/libnvidia-nvvm.so" not in mounts and f"{directory}/libnvidia-ptxjitcompiler.so" not in mounts
    (hook,) = [h.cdi() for h in files.hooks]
    assert hook == {
        "hookName": "createContainer", "path": "/var/lib/kubelet/plugins/gpu.nvidia.com-cdi-hook/gpu-dra-cdi-hook",
        "args": ["gpu-dra-cdi-hook", "update-ldcache", "--folder", CONTAINER_DIRS[0], "--folder", CONTAINER_DIRS[1]],
        "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
    }
    # No library of this driver, nothing to cache: no hook.
    assert discover(root, "1.2.3", ldcache_hook="/x/gpu-dra-cdi-hook").hooks == ()


def test_dev_link_names() -> None:
    from driver.driverfiles import dev_link_name

    assert dev_link_name("libcuda.so.1") == "libcuda.so"
    assert dev_link_name("libnvidia-ml.so.580.95.05") == "libnvidia-ml.so"
    assert dev_link_name("libcuda.so") == "libcuda.so"
    assert dev_link_name("ld-linux") == "ld-linux"


@pytest.mark.process
def test_soname_is_read_from_the_elf(elf_libs: dict[str, Path], tmp_path: Path) -> None:
    assert soname(elf_libs["libcuda"]) == "libcuda.so.1"
    assert soname(elf_libs["libGLX_nvidia"]) == "libGLX_nvidia.so.0"
    _touch(tmp_path / "text.so.1", "not an ELF file")
    assert soname(tmp_path / "text.so.1") is None
    assert soname(tmp_path / "absent") is None


@pytest.mark.process
def test_every_library_of_the_driver_version_is_mounted_under_its_soname_in_both_families(
    tmp_path: Path, elf_libs: dict[str, Path],
) -> None:
    root = fake_root(tmp_path / "root", elf_libs)
    files = discover(root, VERSION, host_root="/")
    mounts = {m.container_path: m for m in files.mounts}
    assert container_library_dirs("x86_64") == CONTAINER_DIRS
    for directory in CONTAINER_DIRS:
        libs = sorted(p for p in mounts if p.startswith(directory + "/"))
        expected = [f"{directory}/{n}.so.{VERSION}" for n in LIBS]
        expected += [f"{directory}/{n}.so.0" if n == "libGLX_nvidia" else f"{directory}/{n}.so.1" for n in LIBS]
        # The development links NVIDIA's toolkit creates: libcuda.so always, GLVND's indirect GLX library.
        expected += [f"{directory}/libcuda.so", f"{directory}/libGLX_indirect.so.0"]
        # Found once although /lib/x86_64-linux-gnu is the same dir; other versions and the host's libc left out.
        assert libs == sorted(expected)
        assert mounts[f"{directory}/libcuda.so"].host_path == f"{LIBDIR}/libcuda.so.{VERSION}"
        assert mounts[f"{directory}/libGLX_indirect.so.0"].host_path == f"{LIBDIR}/libGLX_nvidia.so.{VERSION}"
        # The soname is the versioned file itself, mounted as a file: no link and no ld.so cache needed.
        assert mounts[f"{directory}/libcuda.so.1"].host_path == f"{LIBDIR}/libcuda.so.{VERSION}"
    assert {p for p in mounts if "/bin/" in p} == {"/usr/bin/nvidia-smi", "/usr/bin/nvidia-debugdump", "/usr/bin/nvidia-cuda-mps-control"}
    assert {p for p in mounts if "firmware" in p} == {
        f"/usr/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin", f"/usr/lib/firmware/nvidia/{VERSION}/gsp_tu10x.bin",
    }
    for path, m in mounts.items():
        assert m.options == (DATA_MOUNT_OPTIONS if "firmware" in path else MOUNT_OPTIONS)
        assert Path(m.host_path).is_file() or m.host_path.startswith("/usr/")
    # A host's own nvidia-cdi-hook (of a toolkit version we do not know) is never used.
    assert files.hooks == ()
    assert len(files.notes) == 1 and "--cdi-hook-path" in files.notes[0]


@pytest.mark.process
def test_a_deployed_hook_adds_forward_compat_and_device_node_hooks(tmp_path: Path, elf_libs: dict[str, Path]) -> None:
    hook = "/var/lib/kubelet/plugins/gpu.nvidia.com/bin/nvidia-cdi-hook"
    files = discover(fake_root(tmp_path / "root", elf_libs), VERSION, hook_path=hook)
    assert [h.cdi() for h in files.hooks] == [
        {"hookName": "createContainer", "path": hook, "env": ["NVIDIA_CTK_DEBUG=false"],
         "args": ["nvidia-cdi-hook", "enable-cuda-compat", f"--host-driver-version={VERSION}"]},
        {"hookName": "createContainer", "path": hook, "env": ["NVIDIA_CTK_DEBUG=false"],
         "args": ["nvidia-cdi-hook", "disable-device-node-modification"]},
    ]
    assert files.notes == ()


@pytest.mark.process
def test_host_root_prefixes_host_paths_only(tmp_path: Path, elf_libs: dict[str, Path]) -> None:
    root = fake_root(tmp_path / "root", elf_libs)
    files = discover(root, VERSION, host_root="/run/nvidia/driver")
    cuda = next(m for m in files.mounts if m.container_path == f"/usr/lib64/libcuda.so.{VERSION}")
    assert cuda.host_path == f"/run/nvidia/driver{LIBDIR}/libcuda.so.{VERSION}"


@pytest.mark.process
def test_ipc_socket_is_mounted_once(elf_libs: dict[str, Path]) -> None:
    # Unix socket paths must fit 107 bytes, pytest's tmp_path often does not.
    with short_tmp() as tmp:
        files = discover(fake_root(tmp / "r", elf_libs, persistenced=True), VERSION)
    sockets = [m for m in files.mounts if m.container_path.endswith("/socket")]
    # Seen as /run/... and through /var/run -> /run, mounted once under its resolved path.
    assert [(m.host_path, m.container_path, m.options) for m in sockets] == [
        ("/run/nvidia-persistenced/socket", "/run/nvidia-persistenced/socket", DATA_MOUNT_OPTIONS),
    ]


@pytest.mark.process
def test_missing_root_or_other_version_yields_nothing(tmp_path: Path, elf_libs: dict[str, Path]) -> None:
    missing = discover(tmp_path / "absent", VERSION)
    assert missing.mounts == () and missing.hooks == () and missing.container_edits() == {}
    assert "is not a directory" in missing.notes[0]
    other = discover(fake_root(tmp_path / "root", elf_libs), "590.10.01", hook_path="/h")
    assert not any(".so." in m.container_path or "firmware" in m.container_path for m in other.mounts)
    assert other.hooks == ()
    assert "no driver 590.10.01 libraries" in other.notes[0]


def test_plan_is_pure_and_needs_no_files() -> None:
    snapshot = RootSnapshot(
        files=frozenset({f"/usr/lib64/libcuda.so.{VERSION}", "/usr/lib64/libfoo.so.1"}),
        sonames={f"/usr/lib64/libcuda.so.{VERSION}": "libcuda.so.1"}, dirs=("/usr/lib64",),
    )
    files = plan(snapshot, VERSION, container_dirs=("/usr/lib64",))
    assert [(m.host_path, m.container_path) for m in files.mounts] == [
        (f"/usr/lib64/libcuda.so.{VERSION}", f"/usr/lib64/libcuda.so.{VERSION}"),
        (f"/usr/lib64/libcuda.so.{VERSION}", "/usr/lib64/libcuda.so.1"),
        (f"/usr/lib64/libcuda.so.{VERSION}", "/usr/lib64/libcuda.so"),
    ]
    assert plan(snapshot, VERSION, container_dirs=("/usr/lib64",)) == files


def _device() -> cdi.DeviceEdits:
    return cdi.DeviceEdits(device_name="gpu-0", uuid="GPU-0", gpu_minor=0)


@pytest.mark.process
def test_spec_carries_driver_files_at_top_level_with_minimal_valid_version(tmp_path: Path, elf_libs: dict[str, Path]) -> None:
    files = discover(fake_root(tmp_path / "root", elf_libs), VERSION, hook_path="/usr/bin/nvidia-cdi-hook")
    spec = cdi.claim_spec("abc-1", [_device()], files.container_edits())
    assert cdi.validate_spec(spec) == []
    assert spec["cdiVersion"] == "0.3.0"  # mounts without a type and hooks are in the oldest accepted format
    top = spec["containerEdits"]
    assert [m["containerPath"] for m in top["mounts"]] == [m.container_path for m in files.mounts]
    assert top["mounts"][0]["options"] == ["ro", "nosuid", "nodev", "bind"]
    assert [h["hookName"] for h in top["hooks"]] == ["createContainer", "createContainer"]
    assert top["hooks"][1]["args"] == ["nvidia-cdi-hook", "disable-device-node-modification"]
    # Per-device edits are untouched; a UID starting with a digit still needs 0.5.0, a typed mount 0.4.0.
    assert "mounts" not in spec["devices"][0]["containerEdits"]
    assert cdi.claim_spec("1bc", [_device()], files.container_edits())["cdiVersion"] == "0.5.0"
    typed = {"mounts": [{"hostPath": "/a", "containerPath": "/a", "type": "bind"}]}
    assert cdi.claim_spec("abc", [_device()], typed)["cdiVersion"] == "0.4.0"
    assert "containerEdits" not in cdi.claim_spec("abc", [_device()], DriverFiles().container_edits())


@pytest.mark.parametrize(
    ("hook", "error"),
    [
        ({"hookName": "preStart", "path": "/usr/bin/h"}, "hooks[0].hookName: 'preStart' must be one of prestart"),
        ({"hookName": "createContainer", "path": "usr/bin/h"}, "hooks[0].path: required, an absolute path"),
        ({"hookName": "createContainer"}, "hooks[0].path: required, an absolute path"),
        ({"hookName": "poststop", "path": "/h", "args": ["h", 1]}, "hooks[0].args: must be a list of strings"),
        ({"hookName": "poststop", "path": "/h", "env": ["NOEQUALS"]}, "hooks[0].env[0]: 'NOEQUALS' must be NAME=VALUE"),
        ({"hookName": "poststop", "path": "/h", "timeout": 0}, "hooks[0].timeout: 0 must be a whole number"),
        ({"hookName": "poststop", "path": "/h", "when": {}}, "hooks[0].when: unknown field"),
    ],
)
def test_validator_rejects_bad_hooks(hook: dict[str, object], error: str) -> None:
    spec = cdi.claim_spec("abc", [_device()], {"hooks": [hook]})
    errors = cdi.validate_spec(spec)
    assert any(e.startswith(f"containerEdits.{error}") for e in errors), errors


def test_validator_rejects_bad_mount_options() -> None:
    spec = cdi.claim_spec("abc", [_device()], {"mounts": [{"hostPath": "/a", "containerPath": "/a", "options": "ro"}]})
    assert cdi.validate_spec(spec) == ["containerEdits.mounts[0].options: must be a list of strings"]


def _agent(tmp_path: Path, driver_root: Path | None) -> NodeAgent:
    nvml = load_backend("sim:t4-1", node="node-a")
    inventory = discover_inventory(nvml, "node-a")
    (tmp_path / "boot_id").write_text("boot-1\n")
    gpu = inventory.gpus[0]
    claim = {
        "metadata": {"namespace": "ns", "name": "c1", "uid": "uid-1"}, "spec": {},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": gpu_device_name(gpu)},
        ], "config": []}}},
    }

    def get_claim(namespace: str, name: str) -> dict[str, object]:
        if (namespace, name) != ("ns", "c1"):
            raise ClaimNotFound(f"{namespace}/{name}")
        return claim

    settings = AgentSettings(
        node_name="node-a", driver_name="gpu.nvidia.com", kubelet_dir=tmp_path / "kubelet", cdi_dir=tmp_path / "cdi",
        boot_id_path=tmp_path / "boot_id", driver_root=driver_root, host_driver_root="/host",
    )
    agent = NodeAgent(settings, nvml=nvml, inventory=inventory, get_claim=get_claim)
    agent.preparer.start(agent.load_report)
    return agent


@pytest.mark.process
def test_agent_puts_driver_files_into_every_claim_spec(tmp_path: Path, elf_libs: dict[str, Path]) -> None:
    agent = _agent(tmp_path, fake_root(tmp_path / "root", elf_libs))
    try:
        assert agent.preparer.prepare([ClaimRef("uid-1", "ns", "c1")])["uid-1"].error == ""
        spec = json.loads((tmp_path / "cdi" / cdi.spec_file_name("uid-1")).read_text())
    finally:
        agent.checkpoint.close()
    assert cdi.validate_spec(spec) == []
    assert spec["containerEdits"] == agent.driver_files.container_edits()
    assert f"/host{LIBDIR}/libcuda.so.{VERSION}" in [m["hostPath"] for m in spec["containerEdits"]["mounts"]]


def test_agent_on_a_root_without_driver_writes_todays_spec(tmp_path: Path) -> None:
    empty = tmp_path / "empty-root"
    empty.mkdir()
    agent = _agent(tmp_path, empty)
    try:
        assert agent.preparer.prepare([ClaimRef("uid-1", "ns", "c1")])["uid-1"].error == ""
        spec = json.loads((tmp_path / "cdi" / cdi.spec_file_name("uid-1")).read_text())
    finally:
        agent.checkpoint.close()
    assert "containerEdits" not in spec
    assert agent.driver_files.mounts == () and agent.driver_files.hooks == ()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--nvml", "real"], Path("/")),
        (["--nvml", "sim:dgx-a100"], None),
        (["--nvml", "sim:dgx-a100", "--driver-root", "/driver-root"], Path("/driver-root")),
        (["--nvml", "real", "--driver-root", "/run/nvidia/driver"], Path("/run/nvidia/driver")),
    ],
)
def test_plugin_scans_the_host_root_only_for_real_gpus_unless_told(argv: list[str], expected: Path | None) -> None:
    parser = argparse.ArgumentParser()
    plugin.register(parser)
    assert plugin._driver_root(parser.parse_args(["--node", "n1", *argv])) == expected
