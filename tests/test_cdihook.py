"""The agent's CDI hook (driver/cdihook.py): installed as the agent installs it, run as runc runs a createContainer
hook (the OCI state on stdin, the bundle's config.json naming the root), against prepared container roots; the
container test on every install layout is in tests/test_nodebox.py."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from driver import cdihook

pytestmark = pytest.mark.process  # runs the installed script, gcc and the host's ldconfig

DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64")


def _ldconfig() -> str:
    found = shutil.which("ldconfig") or shutil.which("ldconfig", path="/sbin:/usr/sbin")
    if found is None:
        pytest.skip("glibc's ldconfig is not installed")
    return found


@pytest.fixture(scope="module")
def libcuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build a shared object")
    out = tmp_path_factory.mktemp("lib")
    (out / "l.c").write_text("int cuInit(unsigned f) { return (int)f; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(out / "libcuda.so"),
                    str(out / "l.c")], check=True)
    return out / "libcuda.so"


def _container(tmp: Path, libcuda: Path, *, root_path: str = "rootfs", pretty: bool = True) -> tuple[Path, Path]:
    """A bundle whose config.json names its root as containerd writes it (relative) and a root holding the
    driver's libcuda under its names, as the CDI mounts leave it at createContainer time."""
    bundle = tmp / "bundle"
    root = bundle / "rootfs"
    for d in DIRS:
        (root / d.lstrip("/")).mkdir(parents=True)
        for name in ("libcuda.so.580.95.05", "libcuda.so.1", "libcuda.so"):
            shutil.copy2(libcuda, root / d.lstrip("/") / name)
    (root / "etc").mkdir()
    config = {"ociVersion": "1.2.0", "process": {"user": {"uid": 0, "gid": 0}, "args": ["sh"]},
              "root": {"path": root_path, "readonly": True},
              "mounts": [{"destination": "/proc", "type": "proc", "source": "proc", "options": ["root"]}],
              "annotations": {"root": "not the root"}}
    (bundle / "config.json").write_text(json.dumps(config, indent=1 if pretty else None))
    return bundle, root


def _run(hook: Path, bundle: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    state = {"ociVersion": "1.2.0", "id": "c1", "status": "creating", "pid": os.getpid()}
    if bundle is not None:
        state["bundle"] = str(bundle)
    return subprocess.run([str(hook), *args], input=json.dumps(state), capture_output=True, text=True, timeout=60,
                          env={})  # runc gives a hook only its spec's env


def _cached(ldconfig: str, root: Path) -> list[str]:
    out = subprocess.run([ldconfig, "-r", str(root), "-p"], capture_output=True, text=True, timeout=60).stdout
    return sorted(line.split()[-1] for line in out.splitlines() if "=>" in line)


def test_the_hook_rebuilds_the_containers_cache_with_the_hosts_ldconfig(tmp_path: Path, libcuda: Path) -> None:
    ldconfig = _ldconfig()
    hook = cdihook.install(tmp_path / "hooks")
    for pretty, root_path in ((True, "rootfs"), (False, None)):
        case = tmp_path / f"case-{pretty}"
        bundle, root = _container(case, libcuda, pretty=pretty)
        if root_path is None:  # podman writes the root's absolute path
            config = json.loads((bundle / "config.json").read_text())
            config["root"]["path"] = str(root)
            (bundle / "config.json").write_text(json.dumps(config))
        assert not (root / "etc/ld.so.cache").exists()
        done = _run(hook, bundle, *cdihook.update_ldcache_args(DIRS)[1:])
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert _cached(ldconfig, root) == [f"{d}/libcuda.so.1" for d in DIRS]
        # -X: the image's files are left as they were (no link made, none replaced).
        assert all(not (root / d.lstrip("/") / "libcuda.so.1").is_symlink() for d in DIRS)


def test_the_cache_is_written_inside_the_root_even_through_the_images_links(tmp_path: Path, libcuda: Path) -> None:
    """ldconfig chroots into the root before it reads or writes: an image whose /etc is a link to an absolute
    path has its cache written under its own root, never on the host."""
    ldconfig = _ldconfig()
    hook = cdihook.install(tmp_path / "hooks")
    bundle, root = _container(tmp_path, libcuda)
    host_target = tmp_path / "host-etc"
    host_target.mkdir()
    (root / "etc").rmdir()
    (root / "inside").mkdir()
    os.symlink(str(host_target), root / "etc")  # an absolute link: on the host it would lead to host-etc
    (root / host_target.relative_to("/")).mkdir(parents=True)
    done = _run(hook, bundle, *cdihook.update_ldcache_args(DIRS)[1:])
    assert done.returncode == 0, done.stderr
    assert list(host_target.iterdir()) == []
    assert (root / host_target.relative_to("/") / "ld.so.cache").is_file()
    assert _cached(ldconfig, root) == [f"{d}/libcuda.so.1" for d in DIRS]


def test_bad_invocations_fail_naming_what_is_wrong(tmp_path: Path, libcuda: Path) -> None:
    hook = cdihook.install(tmp_path / "hooks")
    bundle, root = _container(tmp_path, libcuda)
    done = _run(hook, bundle, "create-symlinks")
    assert done.returncode == 2 and "unknown command 'create-symlinks'" in done.stderr
    done = _run(hook, bundle, "update-ldcache", "--folder", "usr/lib64")
    assert done.returncode == 2 and "expected an absolute path inside the container" in done.stderr
    done = _run(hook, bundle, "update-ldcache", "--folder", "/usr/lib64;reboot")
    assert done.returncode == 2 and "only letters, digits" in done.stderr
    done = _run(hook, None, "update-ldcache")
    assert done.returncode == 1 and "names no absolute bundle path" in done.stderr
    config = json.loads((bundle / "config.json").read_text())
    config["root"]["path"] = "/"
    (bundle / "config.json").write_text(json.dumps(config))
    done = _run(hook, bundle, "update-ldcache")
    assert done.returncode == 1 and "not a directory other than /" in done.stderr
    assert not (root / "etc/ld.so.cache").exists()


def test_a_root_without_etc_starts_with_a_warning(tmp_path: Path, libcuda: Path) -> None:
    """A distroless image has no /etc: its cache cannot be written, and its container still starts (the loader's
    built-in path finds the mounted libraries all the same)."""
    _ldconfig()
    hook = cdihook.install(tmp_path / "hooks")
    bundle, root = _container(tmp_path, libcuda)
    (root / "etc").rmdir()
    done = _run(hook, bundle, *cdihook.update_ldcache_args(DIRS)[1:])
    assert done.returncode == 0 and "has no /etc: the container's ld.so.cache is not updated" in done.stderr


def test_install_is_atomic_idempotent_and_refuses_a_directory_others_can_write(tmp_path: Path) -> None:
    hook = cdihook.install(tmp_path / "hooks")
    assert hook == tmp_path / "hooks" / cdihook.HOOK_FILE
    assert stat.S_IMODE(hook.stat().st_mode) == 0o755 and hook.read_text() == cdihook.SCRIPT
    assert stat.S_IMODE((tmp_path / "hooks").stat().st_mode) & 0o022 == 0
    inode = hook.stat().st_ino
    assert cdihook.install(tmp_path / "hooks") == hook and hook.stat().st_ino == inode  # unchanged: not rewritten
    hook.write_text("#!/bin/sh\nexit 0\n")  # an older agent's script, or a tampered one
    cdihook.install(tmp_path / "hooks")
    assert hook.read_text() == cdihook.SCRIPT
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(cdihook.HookInstallError, match="writable by no one else"):
        cdihook.install(shared)
    os.symlink(tmp_path / "hooks", tmp_path / "link")
    with pytest.raises(cdihook.HookInstallError, match="symbolic link"):
        cdihook.install(tmp_path / "link")
