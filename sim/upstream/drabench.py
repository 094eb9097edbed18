"""Builds `drabench` (sim/upstream/gotools/drabench: kube-scheduler's DRA allocator driven directly) from its
pinned Go module into ${GPU_DRA_CACHE:-~/.cache/gpu-dra}/upstream/drabench-<version>-<digest>/, keyed by the
module files and the Go toolchain, so that a second build is a no-op (as sim/upstream/build.sh does for the
cluster's binaries)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODULE = Path(__file__).resolve().parent / "gotools" / "drabench"
GO_ENV = {"GOTOOLCHAIN": "local", "GOFLAGS": "-mod=readonly -trimpath -buildvcs=false", "CGO_ENABLED": "0"}


class BuildError(RuntimeError):
    pass


def version() -> str:
    """The k8s.io/dynamic-resource-allocation version the module pins (the allocator of kube-scheduler 1.37.x)."""
    found = re.search(r"k8s\.io/dynamic-resource-allocation (v[0-9.]+)", (MODULE / "go.mod").read_text())
    if found is None:
        raise BuildError(f"{MODULE / 'go.mod'}: no k8s.io/dynamic-resource-allocation version")
    return found.group(1)


def binary() -> Path:
    """The built drabench, building it first when this module and toolchain have none cached."""
    go = shutil.which("go")
    if go is None:
        raise BuildError("go is not on PATH: kube-scheduler's allocator is built from its Go module (Go 1.26)")
    env = {**os.environ, **GO_ENV}
    toolchain = subprocess.run([go, "version"], capture_output=True, text=True, env=env, check=False).stdout
    digest = hashlib.sha256(toolchain.encode() + b"".join(
        (MODULE / name).read_bytes() for name in ("go.mod", "go.sum", "main.go"))).hexdigest()[:12]
    out = Path(os.environ.get("GPU_DRA_CACHE") or Path.home() / ".cache" / "gpu-dra") / "upstream" / \
        f"drabench-{version()}-{digest}"
    built = out / "drabench"
    if built.is_file():
        return built
    print(f"drabench: building kube-scheduler's DRA allocator ({version()}) into {out}", file=sys.stderr, flush=True)
    started = time.monotonic()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        target = Path(tmp) / "drabench"
        done = subprocess.run([go, "build", "-ldflags", "-s -w", "-o", str(target), "."], cwd=MODULE, env=env,
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BuildError(f"go build of {MODULE} failed:\n{done.stderr.strip()}")
        out.mkdir(exist_ok=True)
        target.replace(built)
    print(f"drabench: built in {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True)
    return built
