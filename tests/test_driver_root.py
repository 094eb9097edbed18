"""NVML and NVIDIA's tools found and loaded by path from a driver root (a fake one built here)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from driver.driverroot import DriverRoot, DriverRootError
from driver.gputools import CommandResult, GpuToolError, MpsDirs, NvidiaTools

# A stand-in libnvidia-ml.so.1: enough of NVML's C API for pynvml's init and a device count.
FAKE_NVML_C = r"""
#include <string.h>
static int initialised = 0;
int nvmlInit_v2(void) { initialised = 1; return 0; }
int nvmlInitWithFlags(unsigned int flags) { initialised = 1; return 0; }
int nvmlShutdown(void) { initialised = 0; return 0; }
int nvmlDeviceGetCount_v2(unsigned int *count) { if (!initialised) return 1; *count = 3; return 0; }
int nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    strncpy(version, "550.54.15-fake", length); return 0; }
const char *nvmlErrorString(int result) { return "fake error"; }
"""


def _build_library(tmp_path: Path) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the stand-in libnvidia-ml.so.1")
    source = tmp_path / "fake_nvml.c"
    source.write_text(FAKE_NVML_C)
    out = tmp_path / "libnvidia-ml.so.550.54.15"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(source)], check=True)
    return out


def _fake_root(tmp_path: Path, lib_dir: str = "usr/lib/x86_64-linux-gnu") -> Path:
    """A driver root laid out like a host: the versioned library, and `.so.1` as an absolute link to it."""
    built = _build_library(tmp_path)
    root = tmp_path / "driver-root"
    d = root / lib_dir
    d.mkdir(parents=True)
    shutil.copy(built, d / built.name)
    # Absolute link text, as distributions install it: must resolve inside the root, not in this machine's /.
    (d / "libnvidia-ml.so.1").symlink_to(f"/{lib_dir}/{built.name}")
    return root


@pytest.mark.process
def test_library_found_through_an_absolute_link_inside_the_root(tmp_path: Path) -> None:
    root = _fake_root(tmp_path, "usr/lib64")
    found = DriverRoot(root).find_library()
    assert found == root / "usr/lib64/libnvidia-ml.so.550.54.15"


def test_missing_library_names_every_path_searched(tmp_path: Path) -> None:
    root = tmp_path / "empty-root"
    root.mkdir()
    with pytest.raises(DriverRootError) as err:
        DriverRoot(root).find_library()
    message = str(err.value)
    for d in DriverRoot(root).library_dirs:
        assert str(root / d.lstrip("/") / "libnvidia-ml.so.1") in message
    assert "--driver-root" in message


@pytest.mark.process
def test_real_backend_loads_nvml_by_path_from_the_driver_root(tmp_path: Path) -> None:
    """In a fresh interpreter (pynvml holds one library per process): the fake root's library is the one used."""
    root = _fake_root(tmp_path)
    script = textwrap.dedent(f"""
        import pynvml
        from pathlib import Path
        from driver.nvml import load_backend
        nvml = load_backend("real", driver_root=Path({str(root)!r}))
        print(nvml.nvmlDeviceGetCount(), pynvml.nvmlLib._name, nvml.nvmlSystemGetDriverVersion())
    """)
    env = {**os.environ, "LD_LIBRARY_PATH": ""}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    count, loaded, version = done.stdout.split()
    assert count == "3"
    assert loaded == str(root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15")
    assert version == "550.54.15-fake"


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[list[str], dict[str, str]]] = []

    def run(self, argv, *, env=None, stdin=None) -> CommandResult:  # noqa: ANN001 - CommandRunner protocol
        self.calls.append((list(argv), dict(env or {})))
        return CommandResult(0, "", "")


@pytest.mark.process
def test_tools_run_from_the_driver_root_with_its_nvml_preloaded(tmp_path: Path) -> None:
    root = _fake_root(tmp_path, "usr/lib64")
    bin_dir = root / "usr/bin"
    bin_dir.mkdir(parents=True)
    for tool in ("nvidia-smi", "nvidia-cuda-mps-control"):
        (bin_dir / tool).write_text("#!/bin/sh\n")
        (bin_dir / tool).chmod(0o755)
    runner = _Recorder()
    tools = NvidiaTools(runner, driver_root=DriverRoot(root))
    tools.set_timeslice("GPU-1", 2)
    tools.mps_command(MpsDirs(tmp_path / "pipe", tmp_path / "log"), "get_server_list")
    (smi, smi_env), (mps, mps_env) = runner.calls
    assert smi == [str(bin_dir / "nvidia-smi"), "compute-policy", "-i", "GPU-1", "--set-timeslice", "2"]
    library = str(root / "usr/lib64/libnvidia-ml.so.550.54.15")
    assert smi_env["LD_PRELOAD"].split(":")[0] == library
    assert "LD_LIBRARY_PATH" not in smi_env  # the driver's lib dir may hold the host's libc
    assert mps[0] == str(bin_dir / "nvidia-cuda-mps-control")
    assert mps_env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "pipe") and mps_env["LD_PRELOAD"].startswith(library)


def test_a_tool_missing_from_the_root_names_the_paths(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    tools = NvidiaTools(_Recorder(), driver_root=DriverRoot(root))
    with pytest.raises(GpuToolError, match=f"{root}/usr/bin/nvidia-smi"):
        tools.set_timeslice("GPU-1", 0)


def test_nvidia_uvm_is_loaded_chrooted_into_the_driver_root_or_said_missing(tmp_path: Path) -> None:
    from driver.gputools import ensure_uvm_loaded

    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "devices").write_text("Character devices:\n195 nvidia-frontend\n\nBlock devices:\n  8 sd\n")
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    runner = _Recorder()
    reason = ensure_uvm_loaded(DriverRoot(root), proc, runner)
    assert reason is not None and runner.calls == []
    assert reason.startswith("CUDA will lack /dev/nvidia-uvm: the nvidia-uvm module is not loaded")
    assert f"the driver root {root} has no nvidia-modprobe" in reason and "load it on the host" in reason
    modprobe = root / "usr/bin/nvidia-modprobe"
    modprobe.write_text("#!/bin/sh\n")
    modprobe.chmod(0o755)
    # It exits 0 but the module does not appear (no modprobe, no modules where it ran): said, not assumed.
    reason = ensure_uvm_loaded(DriverRoot(root), proc, runner)
    assert runner.calls[0][0] == ["chroot", str(root), "/usr/bin/nvidia-modprobe", "-u", "-c=0"]
    assert reason is not None and "exited 0 but the nvidia-uvm module is not loaded" in reason

    class Loads(_Recorder):
        def run(self, argv, *, env=None, stdin=None) -> CommandResult:  # noqa: ANN001 - CommandRunner protocol
            (proc / "devices").write_text("Character devices:\n195 nvidia-frontend\n511 nvidia-uvm\n")
            return super().run(argv, env=env, stdin=stdin)

    assert ensure_uvm_loaded(DriverRoot(root), proc, Loads()) is None
    assert ensure_uvm_loaded(DriverRoot(root), proc, runner) is None and len(runner.calls) == 1  # loaded: nothing run
    (proc / "devices").unlink()
    assert "CUDA will lack /dev/nvidia-uvm: cannot read" in (ensure_uvm_loaded(DriverRoot(root), proc, runner) or "")


@pytest.mark.process
def test_nvidia_modprobe_runs_inside_the_driver_root_with_its_modprobe(tmp_path: Path) -> None:
    """The driver root's nvidia-modprobe, really run chrooted into the root: it finds the root's own
    /sbin/modprobe (the agent's image has none) and the module appears; a failing one is reported with its
    stderr and the hint to load it on the host."""
    from driver.gputools import ensure_uvm_loaded
    from sim.runtime.rootfs import find_busybox

    busybox = find_busybox()
    if busybox is None or os.geteuid() != 0:
        pytest.skip("needs root (chroot) and a static busybox (busybox-static)")
    root = tmp_path / "root"
    for d in ("bin", "sbin", "usr/bin", "proc-box"):
        (root / d).mkdir(parents=True)
    shutil.copy2(busybox, root / "bin/busybox")
    os.symlink("busybox", root / "bin/sh")
    (root / "proc-box/devices").write_text("Character devices:\n195 nvidia-frontend\n")
    # The root's modprobe "loads" the module: the box's procfs gains its major.
    (root / "sbin/modprobe").write_text(
        '#!/bin/sh\n[ "$1" = nvidia-uvm ] || exit 1\nprintf "511 nvidia-uvm\\n" >> /proc-box/devices\n')
    (root / "usr/bin/nvidia-modprobe").write_text(
        '#!/bin/sh\n[ "$1 $2" = "-u -c=0" ] || { echo "bad args $*" >&2; exit 2; }\nexec /sbin/modprobe nvidia-uvm\n')
    for tool in ("sbin/modprobe", "usr/bin/nvidia-modprobe"):
        (root / tool).chmod(0o755)
    assert ensure_uvm_loaded(DriverRoot(root), root / "proc-box") is None
    assert "511 nvidia-uvm" in (root / "proc-box/devices").read_text()

    (root / "proc-box/devices").write_text("Character devices:\n195 nvidia-frontend\n")
    (root / "sbin/modprobe").write_text('#!/bin/sh\necho "modprobe: FATAL: Module nvidia-uvm not found" >&2\nexit 1\n')
    reason = ensure_uvm_loaded(DriverRoot(root), root / "proc-box")
    assert reason is not None and reason.startswith("CUDA will lack /dev/nvidia-uvm: ")
    assert "exited with status 1: modprobe: FATAL: Module nvidia-uvm not found" in reason, reason
