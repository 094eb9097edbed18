"""Driver-root layouts of real NVIDIA installs, populated with the node in a box's built mocks.

Each `Layout` says where an install keeps its libraries and tools relative to the directory the node agent is
given as `--driver-root`, and where that directory is on the host:

- `ubuntu`: the host's own driver on Ubuntu/Debian: libraries in /usr/lib/x86_64-linux-gnu beside the host's
  `libc.so.6`, which stands for another glibc build than the agent image's (any binary of ours that loads it
  fails, as real ones do with a libc from another distribution release);
- `debian`: Debian's own driver packages: libraries in /usr/lib/x86_64-linux-gnu/nvidia/current, a directory
  only /etc/ld.so.conf.d names, found through the root's /etc/ld.so.cache, built here by glibc's own
  `ldconfig -r` (the host's libc in /usr/lib/x86_64-linux-gnu);
- `rhel`: the host's driver on RHEL and derivatives: /usr/lib64;
- `operator`: the GPU Operator's driver container, whose root the host sees at /run/nvidia/driver (an Ubuntu
  image: its own libc.so.6 beside the NVIDIA libraries);
- `gke`: GKE's driver installer: /home/kubernetes/bin/nvidia with `lib64/` and `bin/` directly below it.

No layout has nvidia-cdi-hook, nvidia-ctk or any NVIDIA Container Toolkit file. `install(host, layout, ...)`
builds one under a directory standing for the host's `/` and returns the `Install`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sim.nodebox.build import Built
from sim.nodebox.nvmlconfig import write as write_nvml_config

VERSIONED_LIBRARIES: tuple[str, ...] = ("libnvidia-ml", "libcuda")


@dataclass(frozen=True)
class Layout:
    name: str
    driver_root: str  # the --driver-root directory, as a path on the host
    lib_dir: str  # relative to the driver root
    bin_dir: str
    libc_dir: str | None  # relative to the driver root: where a libc.so.6 of another glibc build sits, if any
    ld_so_conf: bool = False  # lib_dir is named by /etc/ld.so.conf.d and the root's ld.so.cache (ldconfig -r)

    @property
    def foreign_libc(self) -> bool:
        """A foreign libc beside the NVIDIA libraries."""
        return self.libc_dir == self.lib_dir


LAYOUTS: dict[str, Layout] = {
    "ubuntu": Layout("ubuntu", "/", "usr/lib/x86_64-linux-gnu", "usr/bin", "usr/lib/x86_64-linux-gnu"),
    "debian": Layout("debian", "/", "usr/lib/x86_64-linux-gnu/nvidia/current", "usr/bin", "usr/lib/x86_64-linux-gnu",
                     ld_so_conf=True),
    "rhel": Layout("rhel", "/", "usr/lib64", "usr/bin", None),
    "operator": Layout("operator", "/run/nvidia/driver", "usr/lib/x86_64-linux-gnu", "usr/bin", "usr/lib/x86_64-linux-gnu"),
    "gke": Layout("gke", "/home/kubernetes/bin/nvidia", "lib64", "bin", None),
}


@dataclass(frozen=True)
class Install:
    layout: Layout
    host: Path  # stands for the host's /
    root: Path  # the driver root (what --driver-root and --host-driver-root get here)
    version: str

    @property
    def lib_dir(self) -> Path:
        return self.root / self.layout.lib_dir

    @property
    def bin_dir(self) -> Path:
        return self.root / self.layout.bin_dir

    @property
    def calls_log(self) -> Path:
        """Where the tool stand-ins record what they were asked."""
        return self.bin_dir / "nodebox-calls.log"


def install(host: Path, layout: Layout, built: Built, *, profile: str, node: str, version: str) -> Install:
    """Lay the mocks out under `host` as `layout` installs them, for driver `version`, answering as `profile`."""
    root = host / layout.driver_root.lstrip("/")
    lib_dir = root / layout.lib_dir
    bin_dir = root / layout.bin_dir
    lib_dir.mkdir(parents=True, exist_ok=True)
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, source in (("libnvidia-ml", built.nvml), ("libcuda", built.cuda)):
        versioned = lib_dir / f"{name}.so.{version}"
        shutil.copy2(source, versioned)
        # The installer's links, absolute as distributions write them (relative to the driver root).
        os.symlink(f"/{layout.lib_dir}/{versioned.name}", lib_dir / f"{name}.so.1")
        os.symlink(f"{name}.so.1", lib_dir / f"{name}.so")
    if layout.libc_dir is not None:
        (root / layout.libc_dir).mkdir(parents=True, exist_ok=True)
        shutil.copy2(built.foreign_libc, root / layout.libc_dir / "libc.so.6")
    if layout.ld_so_conf:
        _ld_so_cache(root, layout.lib_dir)
    for tool in (built.nvidia_smi, built.mps_control, built.nvidia_imex):
        shutil.copy2(tool, bin_dir / tool.name)
    write_nvml_config(lib_dir, profile, node)
    return Install(layout, host, root, version)


class LdconfigError(RuntimeError):
    pass


def _ld_so_cache(root: Path, lib_dir: str) -> None:
    """The root's /etc/ld.so.conf naming `lib_dir`, and its /etc/ld.so.cache built by glibc's ldconfig."""
    conf_d = root / "etc" / "ld.so.conf.d"
    conf_d.mkdir(parents=True, exist_ok=True)
    (root / "etc" / "ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (conf_d / "nvidia.conf").write_text(f"/{lib_dir}\n")
    (root / "var" / "cache" / "ldconfig").mkdir(parents=True, exist_ok=True)
    ldconfig = shutil.which("ldconfig") or shutil.which("ldconfig", path="/sbin:/usr/sbin")
    if ldconfig is None:
        raise LdconfigError("ldconfig (glibc's libc-bin) is not installed; the debian layout's ld.so.cache is built with it")
    done = subprocess.run([ldconfig, "-r", str(root)], capture_output=True, text=True, timeout=60)
    if done.returncode != 0 or not (root / "etc" / "ld.so.cache").is_file():
        raise LdconfigError(f"ldconfig -r {root} failed: {done.stderr.strip() or done.stdout.strip()}")
