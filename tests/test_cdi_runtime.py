"""Our MIG CDI spec with the driver's device numbers through a real container runtime (podman with runc):
- straight through podman: the capability nodes, which do not exist on this host, are created in the container
  from the type, major and minor the spec carries (a spec with paths only fails there);
- through the testbed's runtime (sim.runtime), from a real prepare: the container sees exactly its MIG device.

They run where podman, runc, a static busybox and root are available, and must run in CI
(tests/runtime_helpers.py); a private mount namespace gives each run its own /run, so nothing of the host's CDI or
podman state is touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from driver import cdi
from driver.checkpoint import Checkpoint
from driver.discovery import discover
from driver.driverfiles import discover as discover_driver_files
from driver.nvml import load_backend
from driver.prepare import ClaimRef, Preparer
from driver.slices import mig_device_name
from sim.runtime import Runtimes, driverinstall
from sim.runtime.podman import ContainerRequest
from tests.plugin_helpers import short_tmp
from tests.runtime_helpers import require_podman
from tests.test_prepare import Claims, RecordingSharing, claim

pytestmark = pytest.mark.process  # every test here starts a container runtime

RUNC = next((p for p in ("/usr/sbin/runc", "/usr/bin/runc") if os.access(p, os.X_OK)), None)
BUSYBOX = next((p for p in ("/bin/busybox", "/usr/bin/busybox") if os.access(p, os.X_OK)), None)
NODE = "node-a"
DRIVER = "gpu.nvidia.com"
CAPS_MAJOR = 249


def _fake_proc(root: Path) -> Path:
    proc = root / "proc"
    (proc / "driver/nvidia/capabilities/gpu0/mig/gi2/ci0").mkdir(parents=True)
    (proc / "devices").write_text("Character devices:\n195 nvidia-frontend\n241 nvidia-uvm\n249 nvidia-caps\n\nBlock devices:\n")
    (proc / "driver/nvidia/capabilities/gpu0/mig/gi2/access").write_text("DeviceFileMinor: 4021\nDeviceFileMode: 292\n")
    (proc / "driver/nvidia/capabilities/gpu0/mig/gi2/ci0/access").write_text("DeviceFileMinor: 4022\nDeviceFileMode: 292\n")
    return proc


def test_mig_spec_runs_through_podman_without_the_nodes_on_the_host(tmp_path: Path) -> None:
    require_podman()
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


def test_prepared_mig_claim_with_driver_numbers_through_the_testbed_runtime() -> None:
    """A real prepare on a simulated MIG node whose procfs publishes device numbers; the container gets exactly
    its MIG device's capability nodes with those numbers, and the simulated nvidia-smi in it lists that device."""
    require_podman()
    with short_tmp() as tmp:
        inventory = discover(load_backend("sim:h100-mig", node=NODE), NODE)
        mig_gpu = next(g for g in inventory.gpus if g.mig_devices)
        mig = mig_gpu.mig_devices[0]
        gi_minor, ci_minor = cdi.mig_cap_minors(mig_gpu.minor, mig.gpu_instance_id, mig.compute_instance_id)
        proc = tmp / "proc"
        gi_dir = proc / f"driver/nvidia/capabilities/gpu{mig_gpu.minor}/mig/gi{mig.gpu_instance_id}"
        (gi_dir / f"ci{mig.compute_instance_id}").mkdir(parents=True)
        (proc / "devices").write_text(f"Character devices:\n195 nvidia\n{CAPS_MAJOR} nvidia-caps\n\nBlock devices:\n")
        (gi_dir / "access").write_text(f"DeviceFileMinor: {gi_minor}\nDeviceFileMode: 292\n")
        (gi_dir / f"ci{mig.compute_instance_id}" / "access").write_text(f"DeviceFileMinor: {ci_minor}\nDeviceFileMode: 292\n")
        root = driverinstall.write(tmp / "driver", NODE, inventory)
        files = discover_driver_files(root, inventory.driver_version, host_root=str(root))
        (tmp / "boot_id").write_text("boot-1")
        cp, report = Checkpoint.open(tmp / "plugin", boot_id_path=tmp / "boot_id")
        claims = Claims()
        preparer = Preparer(
            driver_name=DRIVER, node_name=NODE, get_claim=claims.get, inventory=lambda: inventory, checkpoint=cp,
            cdi_dir=tmp / "cdi", sharing_backend=RecordingSharing(), mps_root=tmp / "mps",
            common_edits=files.container_edits(), device_numbers=lambda: cdi.DeviceNumbers.read(proc),
        )
        preparer.start(report)
        uid = "10000000-aaaa-bbbb-cccc-000000000001"
        claims.add(claim("m", uid, [("mig", mig_device_name(mig_gpu, mig))], pool=NODE))
        result = preparer.prepare([ClaimRef(uid, "ns", "m")])[uid]
        assert result.error == ""
        ids = tuple(i for d in result.devices for i in d.cdi_device_ids)
        runtime = Runtimes(tmp / "runtime").for_node(NODE, tmp / "cdi")
        try:
            script = ("nvidia-smi -L; echo VISIBLE=$NVIDIA_VISIBLE_DEVICES; "
                      "stat -c '%n %t:%T' /dev/nvidia-caps/*")
            runtime.run(ContainerRequest("sees-mig", ("sh", "-c", script), {}, ids))
            deadline = time.monotonic() + 60
            while runtime.status("sees-mig").running:
                assert time.monotonic() < deadline, "container still running after 60 s"
                time.sleep(0.1)
            status = runtime.status("sees-mig")
            out = runtime.logs("sees-mig")
        finally:
            runtime.close()
    assert status.exit_code == 0, out
    lines = out.splitlines()
    assert f"  MIG {mig.profile:<12} Device  0: (UUID: {mig.uuid})" in lines
    assert "VISIBLE=void" in lines
    caps = sorted(line for line in lines if line.startswith("/dev/nvidia-caps/"))
    assert caps == sorted([f"/dev/nvidia-caps/nvidia-cap{gi_minor} {CAPS_MAJOR:x}:{gi_minor:x}",
                           f"/dev/nvidia-caps/nvidia-cap{ci_minor} {CAPS_MAJOR:x}:{ci_minor:x}"])
