"""Driver files for CDI-only runtimes: discovery in a fake 580.95.05 driver root, the CDI edits it yields,
and clean degradation when the root or the hook binary is missing."""

from __future__ import annotations

import argparse
import json
import os
import socket
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
    discover,
    plan,
    resolve_in_root,
)
from driver.nvml import load_backend
from driver.plugin.agent import AgentSettings, NodeAgent
from driver.prepare import ClaimNotFound, ClaimRef
from driver.slices import gpu_device_name
from tests.plugin_helpers import short_tmp

VERSION = "580.95.05"
LIBDIR = "/usr/lib/x86_64-linux-gnu"
LIBS = ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler", "libnvidia-nvvm", "libcudadebugger", "libnvidia-gpucomp")


def _touch(path: Path, text: str = "x", mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def fake_root(root: Path, *, hook: bool = True, persistenced: bool = False) -> Path:
    """A driver root laid out like an Ubuntu 580.95.05 install with merged /usr."""
    lib = root / LIBDIR.lstrip("/")
    for name in LIBS:
        _touch(lib / f"{name}.so.{VERSION}")
        os.symlink(f"{name}.so.{VERSION}", lib / f"{name}.so.1")
    os.symlink("libcuda.so.1", lib / "libcuda.so")
    # An absolute link text names a path inside the driver root.
    os.symlink(f"{LIBDIR}/libnvidia-ml.so.1", lib / "libnvidia-ml.so")
    _touch(lib / "libnvidia-ml.so.570.86.15")  # a leftover of an older driver: not this version
    _touch(lib / f"libnvidia-glcore.so.{VERSION}")  # graphics: not a compute/utility library
    os.symlink("usr/lib", root / "lib")  # merged /usr: /lib/x86_64-linux-gnu is the same dir
    for binary in ("nvidia-smi", "nvidia-debugdump", "nvidia-cuda-mps-control"):
        _touch(root / "usr/bin" / binary, "#!/bin/sh\n", 0o755)
    _touch(root / "usr/bin/nvidia-persistenced", "not executable")
    if hook:
        _touch(root / "usr/bin/nvidia-cdi-hook", "#!/bin/sh\n", 0o755)
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


def test_resolve_in_root_follows_links_inside_the_root(tmp_path: Path) -> None:
    root = fake_root(tmp_path / "root")
    os.symlink("/usr/lib", root / "lib64")
    assert resolve_in_root(root, "/lib/x86_64-linux-gnu") == LIBDIR
    assert resolve_in_root(root, "/lib64/x86_64-linux-gnu/../x86_64-linux-gnu") == LIBDIR
    assert resolve_in_root(root, "/usr/lib64") is None
    os.symlink("loop", root / "loop")
    assert resolve_in_root(root, "/loop/x") is None


def test_discovers_libraries_binaries_firmware_and_hooks(tmp_path: Path) -> None:
    root = fake_root(tmp_path / "root")
    files = discover(root, VERSION, host_root="/")
    mounts = {m.container_path: m for m in files.mounts}
    libs = sorted(p for p in mounts if p.startswith(LIBDIR))
    # Found once although /lib/x86_64-linux-gnu leads to the same dir; other versions and graphics libs left out.
    assert libs == sorted(f"{LIBDIR}/{n}.so.{VERSION}" for n in LIBS)
    assert {p for p in mounts if "/bin/" in p} == {"/usr/bin/nvidia-smi", "/usr/bin/nvidia-debugdump", "/usr/bin/nvidia-cuda-mps-control"}
    assert {p for p in mounts if "firmware" in p} == {
        f"/usr/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin", f"/usr/lib/firmware/nvidia/{VERSION}/gsp_tu10x.bin",
    }
    for path, m in mounts.items():
        assert m.host_path == path
        assert m.options == (DATA_MOUNT_OPTIONS if "firmware" in path else MOUNT_OPTIONS)
    assert [h.args[:2] for h in files.hooks] == [("nvidia-cdi-hook", "create-symlinks"), ("nvidia-cdi-hook", "update-ldcache")]
    symlinks, ldcache = files.hooks
    assert symlinks.path == "/usr/bin/nvidia-cdi-hook" and symlinks.hook_name == "createContainer"
    links = symlinks.args[3::2]
    assert set(symlinks.args[2::2]) == {"--link"}
    assert f"libcuda.so.{VERSION}::{LIBDIR}/libcuda.so.1" in links
    assert f"libcuda.so.1::{LIBDIR}/libcuda.so" in links
    assert f"{LIBDIR}/libnvidia-ml.so.1::{LIBDIR}/libnvidia-ml.so" in links
    assert len(links) == len(LIBS) + 2
    assert ldcache.args == ("nvidia-cdi-hook", "update-ldcache", "--folder", LIBDIR)
    assert files.notes == ()


def test_host_root_prefixes_host_paths_only(tmp_path: Path) -> None:
    root = fake_root(tmp_path / "root")
    files = discover(root, VERSION, host_root="/run/nvidia/driver")
    cuda = next(m for m in files.mounts if m.container_path.endswith(f"libcuda.so.{VERSION}"))
    assert cuda.host_path == f"/run/nvidia/driver{LIBDIR}/libcuda.so.{VERSION}"
    assert cuda.container_path == f"{LIBDIR}/libcuda.so.{VERSION}"
    assert {h.path for h in files.hooks} == {"/run/nvidia/driver/usr/bin/nvidia-cdi-hook"}


def test_ipc_socket_is_mounted_once() -> None:
    # Unix socket paths must fit 107 bytes, pytest's tmp_path often does not.
    with short_tmp() as tmp:
        files = discover(fake_root(tmp / "r", persistenced=True), VERSION)
    sockets = [m for m in files.mounts if m.container_path.endswith("/socket")]
    # Seen as /run/... and through /var/run -> /run, mounted once under its resolved path.
    assert [(m.host_path, m.container_path, m.options) for m in sockets] == [
        ("/run/nvidia-persistenced/socket", "/run/nvidia-persistenced/socket", DATA_MOUNT_OPTIONS),
    ]


def test_missing_hook_keeps_mounts_and_says_why(tmp_path: Path) -> None:
    files = discover(fake_root(tmp_path / "root", hook=False), VERSION)
    assert files.hooks == ()
    assert any(m.container_path == f"{LIBDIR}/libcuda.so.{VERSION}" for m in files.mounts)
    assert len(files.notes) == 1 and "nvidia-cdi-hook not found" in files.notes[0]
    assert "hooks" not in files.container_edits()


def test_missing_root_or_other_version_yields_nothing(tmp_path: Path) -> None:
    missing = discover(tmp_path / "absent", VERSION)
    assert missing.mounts == () and missing.hooks == () and missing.container_edits() == {}
    assert "is not a directory" in missing.notes[0]
    other = discover(fake_root(tmp_path / "root"), "590.10.01")
    assert not any(".so." in m.container_path or "firmware" in m.container_path for m in other.mounts)
    assert other.hooks == ()
    assert "no driver 590.10.01 libraries" in other.notes[0]


def test_plan_is_pure_and_needs_no_files() -> None:
    snapshot = RootSnapshot(
        files=frozenset({f"/usr/lib64/libcuda.so.{VERSION}"}), executables=frozenset({"/usr/bin/nvidia-cdi-hook"}),
        links={"/usr/lib64/libcuda.so.1": f"libcuda.so.{VERSION}"}, dirs=("/usr/lib64",), hook_dirs=("/usr/bin",),
    )
    files = plan(snapshot, VERSION)
    assert [m.container_path for m in files.mounts] == [f"/usr/lib64/libcuda.so.{VERSION}"]
    assert files.hooks[0].args == ("nvidia-cdi-hook", "create-symlinks", "--link", f"libcuda.so.{VERSION}::/usr/lib64/libcuda.so.1")
    assert plan(snapshot, VERSION) == files


def _device() -> cdi.DeviceEdits:
    return cdi.DeviceEdits(device_name="gpu-0", uuid="GPU-0", gpu_minor=0)


def test_spec_carries_driver_files_at_top_level_with_minimal_valid_version(tmp_path: Path) -> None:
    files = discover(fake_root(tmp_path / "root"), VERSION)
    spec = cdi.claim_spec("abc-1", [_device()], files.container_edits())
    assert cdi.validate_spec(spec) == []
    assert spec["cdiVersion"] == "0.3.0"  # mounts without a type and hooks are in the oldest accepted format
    top = spec["containerEdits"]
    assert [m["containerPath"] for m in top["mounts"]] == [m.container_path for m in files.mounts]
    assert top["mounts"][0]["options"] == ["ro", "nosuid", "nodev", "bind"]
    assert [h["hookName"] for h in top["hooks"]] == ["createContainer", "createContainer"]
    assert top["hooks"][1]["args"] == ["nvidia-cdi-hook", "update-ldcache", "--folder", LIBDIR]
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


def test_agent_puts_driver_files_into_every_claim_spec(tmp_path: Path) -> None:
    agent = _agent(tmp_path, fake_root(tmp_path / "root"))
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
