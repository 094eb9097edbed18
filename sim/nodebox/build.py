"""Compiles the node in a box's C sources (sim/nodebox/c) with gcc into one directory, once per caller.

`build(out_dir)` returns a `Built` naming each artifact: the NVML and CUDA mock libraries (sonames
libnvidia-ml.so.1 and libcuda.so.1), the nvidia-smi, nvidia-cuda-mps-control and nvidia-imex stand-ins, the CUDA
stand-in program, the two programs that find libcuda as frameworks do (`dlopen("libcuda.so")`, linked with `-lcuda`)
and the foreign libc.so.6. Raises BuildError (with gcc's output) when gcc is missing or fails.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sim.nvml.simulator import SIM_CAPS_MAJOR
from sim.runtime.driverinstall import FABRIC_IMEX_MGMT_MINOR

SOURCES = Path(__file__).parent / "c"
CFLAGS: tuple[str, ...] = ("-O1", "-Wall", "-Werror", "-Wno-format-truncation")


class BuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class Built:
    nvml: Path
    cuda: Path
    nvidia_smi: Path
    mps_control: Path
    cuda_probe: Path
    foreign_libc: Path
    nvidia_imex: Path
    cuda_dev: Path  # dlopen("libcuda.so"), the development name
    cuda_linked: Path  # linked with -lcuda against the stand-in (needs libcuda.so.1 from the loader)


def _gcc(*args: str) -> None:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BuildError("gcc is not installed (apt-get install -y gcc); the node in a box is compiled at test time")
    done = subprocess.run([gcc, *CFLAGS, *args], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise BuildError(f"gcc {' '.join(args)} failed: {done.stderr.strip()}")


def build(out_dir: Path, cuda_version: int = 13000) -> Built:
    out_dir.mkdir(parents=True, exist_ok=True)
    built = Built(
        nvml=out_dir / "libnvidia-ml.so", cuda=out_dir / "libcuda.so", nvidia_smi=out_dir / "nvidia-smi",
        mps_control=out_dir / "nvidia-cuda-mps-control", cuda_probe=out_dir / "cudaprobe",
        foreign_libc=out_dir / "libc.so.6", nvidia_imex=out_dir / "nvidia-imex", cuda_dev=out_dir / "cudadev",
        cuda_linked=out_dir / "cudalink",
    )
    _gcc("-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o", str(built.nvml), str(SOURCES / "nvml.c"))
    _gcc("-shared", "-fPIC", f"-DNODEBOX_CUDA_VERSION={cuda_version}", "-Wl,-soname,libcuda.so.1", "-o", str(built.cuda),
         str(SOURCES / "cuda.c"))
    _gcc("-o", str(built.nvidia_smi), str(SOURCES / "nvidia-smi.c"), "-ldl")
    _gcc("-o", str(built.mps_control), str(SOURCES / "nvidia-cuda-mps-control.c"))
    _gcc("-o", str(built.cuda_probe), str(SOURCES / "cudaprobe.c"), "-ldl")
    # Linked against the NVML mock by its soname (the library is named libnvidia-ml.so here, as -l finds it).
    _gcc(f"-DNODEBOX_CAPS_MAJOR={SIM_CAPS_MAJOR}", f"-DNODEBOX_FABRIC_IMEX_MINOR={FABRIC_IMEX_MGMT_MINOR}", "-o",
         str(built.nvidia_imex), str(SOURCES / "nvidia-imex.c"), f"-L{out_dir}", "-lnvidia-ml")
    _gcc("-o", str(built.cuda_dev), str(SOURCES / "cudadev.c"), "-ldl")
    # Linked by the development name in the build dir (libcuda.so is the stand-in itself), recorded by its soname.
    _gcc("-o", str(built.cuda_linked), str(SOURCES / "cudalink.c"), f"-L{out_dir}", "-lcuda")
    _gcc("-shared", "-fPIC", "-nostdlib", "-Wl,-soname,libc.so.6", "-o", str(built.foreign_libc),
         str(SOURCES / "foreign-libc.c"))
    return built
