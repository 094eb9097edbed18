"""Regenerate the committed Python stubs of the kubelet wire protocols, or check that they are current.

    python -m proto.generate           # rewrite api_pb2.py, api_pb2_grpc.py, api_pb2.pyi beside each .proto
    python -m proto.generate --check   # exit 1 and name the stale files if the committed stubs differ

protoc runs from the repository root with `-I .`, so each descriptor is registered under its own path
(proto/dra/v1/api.proto, proto/dra/v1beta1/api.proto, ...) and several `api.proto` files can share one
process's descriptor pool without colliding.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

PROTO_FILES: tuple[str, ...] = (
    "proto/dra/v1/api.proto",
    "proto/dra/v1beta1/api.proto",
    "proto/pluginregistration/v1/api.proto",
    "proto/deviceplugin/v1beta1/api.proto",
    "proto/drahealth/v1alpha1/api.proto",
    "proto/drahealth/v1/api.proto",
    "proto/grpchealth/v1/api.proto",
)

GENERATED_SUFFIXES: tuple[str, ...] = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")


@dataclass(frozen=True)
class Difference:
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def _generated_names(proto: str) -> list[str]:
    stem = proto[: -len(".proto")]
    return [stem + suffix for suffix in GENERATED_SUFFIXES]


def generate_into(out_dir: Path) -> None:
    """Run protoc for every proto file, writing the stubs under out_dir (mirroring the repo layout)."""
    try:
        from grpc_tools import protoc
    except ImportError as exc:
        raise RuntimeError("grpcio-tools is not installed: pip install grpcio-tools (needed only to regenerate stubs)") from exc
    import importlib.resources

    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    for proto in PROTO_FILES:
        args = [
            "grpc_tools.protoc",
            "-I",
            str(REPO_ROOT),
            "-I",
            well_known,
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(REPO_ROOT / proto),
        ]
        rc = protoc.main(args)
        if rc != 0:
            raise RuntimeError(f"protoc failed for {proto} (exit code {rc})")


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
                    differences.append(Difference(name, "missing; run python -m proto.generate"))
                elif committed_path.read_bytes() != fresh:
                    differences.append(Difference(name, "stale; run python -m proto.generate"))
    return differences


def write() -> list[str]:
    """Regenerate all stubs in place; returns the paths written."""
    written: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        generate_into(Path(tmp))
        for proto in PROTO_FILES:
            package_dir = REPO_ROOT / Path(proto).parent
            init = package_dir / "__init__.py"
            if not init.exists():
                init.write_text(f'"""Generated stubs of {proto} (see proto/generate.py)."""\n')
            for name in _generated_names(proto):
                target = REPO_ROOT / name
                fresh = (Path(tmp) / name).read_bytes()
                if not target.exists() or target.read_bytes() != fresh:
                    target.write_bytes(fresh)
                    written.append(name)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proto.generate", description=__doc__.splitlines()[0])
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
