"""`drabench` (sim/upstream/gotools/drabench: kube-scheduler's DRA allocator driven directly), built from its pinned
Go module by `sim/upstream/build.sh drabench` into ${GPU_DRA_CACHE:-~/.cache/gpu-dra}/upstream/drabench-<version>-
<digest>/, as the same script builds the cluster's binaries: one builder and one cache key for the shell (make,
CI) and for Python, and a second build is a no-op."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODULE = HERE / "gotools" / "drabench"
BUILD_SCRIPT = HERE / "build.sh"


class BuildError(RuntimeError):
    pass


def version() -> str:
    """The k8s.io/dynamic-resource-allocation version the module pins (the allocator of kube-scheduler 1.37.x)."""
    found = re.search(r"k8s\.io/dynamic-resource-allocation (v[0-9.]+)", (MODULE / "go.mod").read_text())
    if found is None:
        raise BuildError(f"{MODULE / 'go.mod'}: no k8s.io/dynamic-resource-allocation version")
    return found.group(1)


def binary() -> Path:
    """The built drabench, building it first when this module, script and toolchain have none cached. The build's
    progress goes to stderr as it happens (a cold build takes a minute)."""
    if shutil.which("go") is None:
        raise BuildError("go is not on PATH: kube-scheduler's allocator is built from its Go module (Go 1.26)")
    done = subprocess.run(["bash", str(BUILD_SCRIPT), "drabench"], stdout=subprocess.PIPE, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise BuildError(f"`{BUILD_SCRIPT} drabench` failed (exit {done.returncode}); see the lines above")
    built = Path(lines[-1])
    if not built.is_file():
        raise BuildError(f"`{BUILD_SCRIPT} drabench` printed {built}, which is not a file")
    return built
