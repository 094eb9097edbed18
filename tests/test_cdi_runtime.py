"""Our MIG CDI spec through a real container runtime (podman with runc): the capability nodes, which do not
exist on this host, are created in the container from the type, major and minor the spec carries.

Runs where podman, runc, a static busybox and root are available (CI installs them); a private mount namespace
gives the run its own /run/cdi, so nothing of the host's CDI or podman state is touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from driver import cdi

RUNC = next((p for p in ("/usr/sbin/runc", "/usr/bin/runc") if os.access(p, os.X_OK)), None)
BUSYBOX = next((p for p in ("/bin/busybox", "/usr/bin/busybox") if os.access(p, os.X_OK)), None)
MISSING = [what for what, ok in (
    ("root", os.geteuid() == 0), ("podman", shutil.which("podman") is not None), ("runc", RUNC is not None),
    ("busybox", BUSYBOX is not None), ("unshare", shutil.which("unshare") is not None),
) if not ok]

pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)} to run containers")


def _fake_proc(root: Path) -> Path:
    proc = root / "proc"
    (proc / "driver/nvidia/capabilities/gpu0/mig/gi2/ci0").mkdir(parents=True)
    (proc / "devices").write_text("Character devices:\n195 nvidia-frontend\n241 nvidia-uvm\n249 nvidia-caps\n\nBlock devices:\n")
    (proc / "driver/nvidia/capabilities/gpu0/mig/gi2/access").write_text("DeviceFileMinor: 4021\nDeviceFileMode: 292\n")
    (proc / "driver/nvidia/capabilities/gpu0/mig/gi2/ci0/access").write_text("DeviceFileMinor: 4022\nDeviceFileMode: 292\n")
    return proc


def test_mig_spec_runs_through_podman_without_the_nodes_on_the_host(tmp_path: Path) -> None:
    assert not Path("/dev/nvidia-caps/nvidia-cap4021").exists()  # the point: the host lacks them
    spec = cdi.claim_spec(
        "uid-mig", [cdi.DeviceEdits("gpu-0-mig-1g-10gb-2", "MIG-x", gpu_minor=0, mig=(2, 0))],
        numbers=cdi.DeviceNumbers.read(_fake_proc(tmp_path)),
    )
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    (spec_dir / cdi.spec_file_name("uid-mig")).write_text(json.dumps(spec))
    rootfs = tmp_path / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    shutil.copy(str(BUSYBOX), rootfs / "bin" / "busybox")
    (rootfs / "bin" / "sh").symlink_to("busybox")
    device = cdi.qualified_id(cdi.cdi_device_name("uid-mig", "gpu-0-mig-1g-10gb-2"))
    podman = (
        # vfs storage and a runroot on the namespace's own /run: no mount of podman's outlives the namespace.
        f"podman --root {tmp_path}/storage --storage-driver vfs --runroot /run/podman --runtime {RUNC} run --rm --network=none "
        f"--ulimit nofile=1024:1024 --ulimit nproc=1024:1024 --device {device} --rootfs {rootfs} "
        "/bin/sh -c 'busybox stat -c \"%n %F %t:%T %a\" /dev/nvidia0 /dev/nvidiactl /dev/nvidia-uvm "
        "/dev/nvidia-caps/nvidia-cap4021 /dev/nvidia-caps/nvidia-cap4022; echo VISIBLE=$NVIDIA_VISIBLE_DEVICES'"
    )
    # Our own /run (hence /var/run/cdi) in a private mount namespace: the spec is the only one podman sees.
    script = f"mount -t tmpfs tmpfs /run && mkdir -p /run/cdi && cp {spec_dir}/* /run/cdi/ && {podman}"
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=180)
    if done.returncode != 0 and "cannot" in done.stderr and "namespace" in done.stderr:
        pytest.skip(f"no private mount namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    # stat prints major:minor in hex.
    assert "/dev/nvidia-caps/nvidia-cap4021 character special file f9:fb5 444" in lines
    assert "/dev/nvidia-caps/nvidia-cap4022 character special file f9:fb6 444" in lines
    assert "/dev/nvidia0 character special file c3:0 " in [line[: len("/dev/nvidia0 character special file c3:0 ")] for line in lines]
    assert any(line.startswith("/dev/nvidia-uvm character special file f1:0") for line in lines)
    assert "VISIBLE=void" in lines
