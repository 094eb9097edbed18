"""Regenerate the committed Python stubs of the kubelet wire protocols, or check that they are current.

    python proto/generate.py           # rewrite api_pb2.py, api_pb2_grpc.py, api_pb2.pyi under gpudra/kubeletapi/
    python proto/generate.py --check   # exit 1 and name the stale files if the committed stubs differ

The .proto sources stay here, in proto/; the stubs live in the package gpudra.kubeletapi, so that the installed
distribution claims no top-level module named `proto` (proto-plus, which Google's client libraries install, owns
it). protoc names a stub's imports and its descriptor after the path it is given the .proto at, so each source is
staged at the stubs' package path first: the descriptors register as gpudra/kubeletapi/dra/v1/api.proto, ...,
distinct, and several `api.proto` files share one process's descriptor pool without colliding.
"""

from __future__ import annotations

import argparse
import importlib.resources
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIR = REPO_ROOT / "proto"
PACKAGE = "gpudra/kubeletapi"

# Relative to proto/ (the sources) and to gpudra/kubeletapi/ (the stubs).
PROTO_FILES: tuple[str, ...] = (
    "dra/v1/api.proto",
    "dra/v1beta1/api.proto",
    "pluginregistration/v1/api.proto",
    "deviceplugin/v1beta1/api.proto",
    "drahealth/v1alpha1/api.proto",
    "drahealth/v1/api.proto",
    "grpchealth/v1/api.proto",
)

GENERATED_SUFFIXES: tuple[str, ...] = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")


@dataclass(frozen=True)
class Difference:
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def _generated_names(proto: str) -> list[str]:
    stem = f"{PACKAGE}/{proto[: -len('.proto')]}"
    return [stem + suffix for suffix in GENERATED_SUFFIXES]


def generate_into(out_dir: Path) -> None:
    """Run protoc for every proto file, writing the stubs under out_dir/gpudra/kubeletapi/."""
    try:
        from grpc_tools import protoc
    except ImportError as exc:
        raise RuntimeError("grpcio-tools is not installed: pip install grpcio-tools (needed only to regenerate stubs)") from exc
    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory() as staging:
        for proto in PROTO_FILES:
            staged = Path(staging) / PACKAGE / proto
            staged.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(SOURCE_DIR / proto, staged)
        for proto in PROTO_FILES:
            args = [
                "grpc_tools.protoc",
                "-I", staging,
                "-I", well_known,
                f"--python_out={out_dir}",
                f"--pyi_out={out_dir}",
                f"--grpc_python_out={out_dir}",
                f"{staging}/{PACKAGE}/{proto}",
            ]
            rc = protoc.main(args)
            if rc != 0:
                raise RuntimeError(f"protoc failed for proto/{proto} (exit code {rc})")


def check() -> list[Difference]:
    """Compare freshly generated stubs with the committed ones."""
    differences: list[Difference] = []
    with tempfile.TemporaryDirectory() as tmp:
        generate_into(Path(tmp))
        for proto in PROTO_FILES:
            for name in _generated_names(proto):
                fresh = (Path(tmp) / name).read_bytes()
                committed_path = REPO_ROOT / name
                if not committed_path.exists():
                    differences.append(Difference(name, "missing; run python proto/generate.py"))
                elif committed_path.read_bytes() != fresh:
                    differences.append(Difference(name, "stale; run python proto/generate.py"))
    return differences


def write() -> list[str]:
    """Regenerate all stubs in place; returns the paths written."""
    written: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        generate_into(Path(tmp))
        for proto in PROTO_FILES:
            package_dir = REPO_ROOT / PACKAGE / Path(proto).parent
            package_dir.mkdir(parents=True, exist_ok=True)
            init = package_dir / "__init__.py"
            if not init.exists():
                init.write_text(f'"""Generated stubs of proto/{proto} (see proto/generate.py)."""\n')
            for name in _generated_names(proto):
                target = REPO_ROOT / name
                fresh = (Path(tmp) / name).read_bytes()
                if not target.exists() or target.read_bytes() != fresh:
                    target.write_bytes(fresh)
                    written.append(name)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python proto/generate.py", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the committed stubs are current")
    args = parser.parse_args(argv)
    try:
        if args.check:
            differences = check()
            for d in differences:
                print(d, file=sys.stderr)
            return 1 if differences else 0
        for path in write():
            print(f"wrote {path}")
        return 0
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
