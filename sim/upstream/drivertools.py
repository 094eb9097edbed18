"""NVIDIA driver tools for the upstream backend's simulated driver installs, built from the node in a box's C
stand-ins (sim/nodebox/c) as static programs: they run wherever the install is mounted, in our image's pods (the
MPS control daemon's, driver.mpsdaemon) as on the host, whatever libc is there, as the real driver's tools do.

Cached by a digest of the source and flags in ${GPU_DRA_CACHE:-~/.cache/gpu-dra}/driver-tools, so a second
cluster start compiles nothing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from sim.nodebox.build import CFLAGS, SOURCES, BuildError

STATIC_FLAGS = ("-static", "-s")


def cache_dir() -> Path:
    return Path(os.environ.get("GPU_DRA_CACHE") or Path.home() / ".cache" / "gpu-dra") / "driver-tools"


def mps_control() -> Path:
    """The static `nvidia-cuda-mps-control` stand-in, compiled once per source digest."""
    source = SOURCES / "nvidia-cuda-mps-control.c"
    flags = (*CFLAGS, *STATIC_FLAGS, f"-I{SOURCES}")
    digest = hashlib.sha256(source.read_bytes() + (SOURCES / "record.h").read_bytes()
                            + " ".join(CFLAGS + STATIC_FLAGS).encode()).hexdigest()[:16]
    out = cache_dir() / f"nvidia-cuda-mps-control-{digest}"
    if out.is_file():
        return out
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BuildError("gcc is not installed (apt-get install -y gcc libc6-dev): the upstream nodes' simulated driver "
                         "gets its nvidia-cuda-mps-control compiled from sim/nodebox/c")
    out.parent.mkdir(parents=True, exist_ok=True)
    # Nodes start in parallel: each compiles to a file of its own and the first rename wins.
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        built = Path(tmp) / out.name
        done = subprocess.run([gcc, *flags, "-o", str(built), str(source)], capture_output=True, text=True,
                              timeout=120)
        if done.returncode != 0:
            raise BuildError(f"gcc -static nvidia-cuda-mps-control.c failed (libc6-dev has the static libc): "
                             f"{done.stderr.strip()}")
        built.replace(out)
    return out


def install(driver_root: Path) -> None:
    """Put the tools into a simulated driver install (its usr/bin, where the driver's own are)."""
    target = driver_root / "usr" / "bin" / "nvidia-cuda-mps-control"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(mps_control(), target)
    target.chmod(0o755)
