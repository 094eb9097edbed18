"""The protobuf schemas of the Kubernetes API (k8s.io/api and k8s.io/apimachinery `generated.proto`), as one
compiled descriptor set the embedded control plane decodes and encodes `application/vnd.kubernetes.protobuf`
bodies with.

    python -m controlplane.k8sapi --api GITDIR --apimachinery GITDIR [--ref REF]   # refresh the .proto copies, recompile
    python -m controlplane.k8sapi --check                                          # exit 1 if descriptors.binpb is stale

The .proto files under controlplane/k8sproto/ are upstream's, at the tag named in SOURCE_REF, with comments removed (field
numbers and types are all the wire needs); `descriptors.binpb` is what protoc compiles from them (a
FileDescriptorSet without source info), loaded at runtime with no protoc needed.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent / "k8sproto"
DESCRIPTORS = ROOT / "descriptors.binpb"
# What the Go structs say that the .proto files do not, per message: `omitZero`, the fields Go declares non-pointer
# `omitempty` (a zero value there means "not set": Go always writes such fields in protobuf, never in JSON);
# `inline`, the embedded structs whose fields JSON flattens into the outer object (`json:",inline"`).
GO_FIELDS = ROOT / "gofields.json"
SOURCE_REF = "v0.37.0-beta.0"  # kubernetes/api and kubernetes/apimachinery tags (Kubernetes 1.37)

API_GROUPS: tuple[str, ...] = (
    "core/v1", "apps/v1", "batch/v1", "coordination/v1", "scheduling/v1", "scheduling/v1alpha3", "scheduling/v1beta1",
    "resource/v1", "resource/v1beta1", "resource/v1beta2", "rbac/v1", "authentication/v1", "authorization/v1",
    "policy/v1",
)
APIMACHINERY: tuple[str, ...] = (
    "pkg/api/resource", "pkg/apis/meta/v1", "pkg/runtime", "pkg/runtime/schema", "pkg/util/intstr",
)


def proto_paths() -> list[str]:
    """Every vendored file, as its import path (`k8s.io/api/core/v1/generated.proto`)."""
    return ([f"k8s.io/apimachinery/{p}/generated.proto" for p in APIMACHINERY]
            + [f"k8s.io/api/{g}/generated.proto" for g in API_GROUPS])


_STRUCT = re.compile(r"^type (\w+) struct \{")
_FIELD = re.compile(r'^\s+\w+\s+(\S+)\s+`json:"([^"]*)"[^`]*protobuf:"[^"]*name=(\w+)')
# An embedded struct (`DeviceConfiguration \`json:"" protobuf:"...,name=deviceConfiguration"\``): inlined in JSON.
_EMBEDDED = re.compile(r'^\s+[\w.]+\s+`json:"(?:,inline)?"[^`]*protobuf:"[^"]*name=(\w+)')


def go_fields(go_sources: dict[str, str]) -> dict[str, dict[str, list[str]]]:
    """From Go sources by proto package: {"omitZero": {message: fields}, "inline": {message: fields}}."""
    out: dict[str, list[str]] = {}
    inline: dict[str, list[str]] = {}
    for package, text in go_sources.items():
        struct = ""
        for line in text.splitlines():
            m = _STRUCT.match(line)
            if m:
                struct = m.group(1)
                continue
            if line.startswith("}"):
                struct = ""
                continue
            embedded = _EMBEDDED.match(line)
            if struct and embedded:
                inline.setdefault(f"{package}.{struct}", []).append(embedded.group(1))
                continue
            f = _FIELD.match(line)
            if not struct or not f:
                continue
            if f.group(2).startswith(",inline"):
                inline.setdefault(f"{package}.{struct}", []).append(f.group(3))
            elif not f.group(1).startswith(("*", "[]", "map[")) and "omitempty" in f.group(2):
                out.setdefault(f"{package}.{struct}", []).append(f.group(3))
    return {"omitZero": {k: sorted(v) for k, v in sorted(out.items())},
            "inline": {k: sorted(v) for k, v in sorted(inline.items())}}


def _go_sources(repo: Path, ref: str, inner_dir: str) -> str:
    names = subprocess.run(["git", "--git-dir", str(repo), "ls-tree", "--name-only", f"{ref}:{inner_dir}"],
                           check=True, capture_output=True, text=True).stdout.split()
    texts = []
    for name in names:
        if name.endswith(".go") and not name.endswith("_test.go") and not name.startswith(("zz_", "generated")):
            texts.append(subprocess.run(["git", "--git-dir", str(repo), "show", f"{ref}:{inner_dir}/{name}"],
                                        check=True, capture_output=True, text=True).stdout)
    return "\n".join(texts)


def strip_comments(text: str) -> str:
    """The proto without its `//` comment lines and blank runs (no string literal in these files holds `//`)."""
    lines = [re.sub(r"\s*//.*$", "", line) for line in text.splitlines()]
    out: list[str] = []
    for line in lines:
        if line.strip() or (out and out[-1].strip()):
            out.append(line.rstrip())
    return "\n".join(out).strip() + "\n"


def refresh(api: Path, apimachinery: Path, ref: str) -> None:
    sources: dict[str, str] = {}
    for path in proto_paths():
        repo, inner = (api, path[len("k8s.io/api/"):]) if path.startswith("k8s.io/api/") else \
            (apimachinery, path[len("k8s.io/apimachinery/"):])
        package = path[: -len("/generated.proto")].replace("/", ".")
        sources[package] = _go_sources(repo, ref, inner[: -len("/generated.proto")])
    GO_FIELDS.write_text(json.dumps(go_fields(sources), separators=(",", ":")) + "\n")
    for path in proto_paths():
        repo, inner = (api, path[len("k8s.io/api/"):]) if path.startswith("k8s.io/api/") else \
            (apimachinery, path[len("k8s.io/apimachinery/"):])
        text = subprocess.run(["git", "--git-dir", str(repo), "show", f"{ref}:{inner}"], check=True,
                              capture_output=True, text=True).stdout
        target = ROOT / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(strip_comments(text))


def compile_descriptors() -> bytes:
    from grpc_tools import protoc  # type: ignore[import-untyped]  # noqa: PLC0415 - only regeneration and its check need protoc

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.binpb"
        code = protoc.main(["grpc_tools.protoc", "-I", str(ROOT), "--include_imports",
                            f"--descriptor_set_out={out}", *proto_paths()])
        if code != 0:
            raise RuntimeError(f"protoc failed ({code}) on controlplane/k8sproto")
        return out.read_bytes()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m controlplane.k8sapi", description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", type=Path, help="a git directory of kubernetes/api")
    parser.add_argument("--apimachinery", type=Path, help="a git directory of kubernetes/apimachinery")
    parser.add_argument("--ref", default=SOURCE_REF, help="the tag or commit to read (default %(default)s)")
    parser.add_argument("--check", action="store_true", help="only check that descriptors.binpb is current")
    args = parser.parse_args(argv)
    if args.check:
        if not DESCRIPTORS.exists() or DESCRIPTORS.read_bytes() != compile_descriptors():
            print(f"{DESCRIPTORS} is stale: run python -m controlplane.k8sapi", file=sys.stderr)
            return 1
        return 0
    if args.api and args.apimachinery:
        refresh(args.api, args.apimachinery, args.ref)
    DESCRIPTORS.write_bytes(compile_descriptors())
    print(f"wrote {DESCRIPTORS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
