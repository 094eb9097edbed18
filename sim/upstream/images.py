"""The images the upstream cluster runs, built here without docker or a registry:

- the product image under the reference the manifests name (`ghcr.io/gpu-dra/gpu-dra:v<version>`): a Debian
  rootfs (debootstrap, minbase + python3), the locked runtime dependencies installed by pip, and the product
  packages only, as the Dockerfile builds it;
- its testbed variant (`...:v<version>-testbed`), which adds the NVML simulator (the `sim` package) so that an
  agent can run `--nvml sim:...` on a node without GPUs (the kind and upstream overlays name it);
- the pod sandbox (`pause`, a static C program of ours) under the name containerd asks for;
- stand-ins for the public workload images that specs name (`ubuntu:22.04`, NVIDIA's CUDA samples, ...): a
  busybox rootfs, as the embedded runtime runs every image; an image with no stand-in is not imported, so the
  kubelet reports its real ErrImagePull.

Everything is cached outside the repository (${GPU_DRA_CACHE:-~/.cache/gpu-dra}/images), keyed by what it is
built from, so a second build is a no-op.

    python -m sim.upstream.images [--only product|testbed]   # prints one archive path per line
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from sim.upstream.oci import ImageConfig, write_archive

ROOT = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
BASE_PACKAGES = ("python3",)
IMAGE_PYTHON = "/usr/bin/python3"  # Debian's, which the image's packages are installed for
PRODUCT_PACKAGES = ("gpudra", "driver", "controller", "cli")
TESTBED_PACKAGES = (*PRODUCT_PACKAGES, "sim")
IMAGE_NAME = "ghcr.io/gpu-dra/gpu-dra"
# containerd 2.x's default sandbox image (its CRI config `pinned_images.sandbox`).
PAUSE_REFERENCE = "registry.k8s.io/pause:3.10.1"
# Public images that NVIDIA's quickstart and samples name; each runs on the busybox stand-in, as do the images
# manifests/examples names (workload_references()).
WORKLOAD_STAND_INS = (
    "docker.io/library/busybox:1.36",
    "docker.io/library/ubuntu:22.04",
    "docker.io/library/ubuntu:24.04",
    "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0",
    "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
)


def workload_references() -> list[str]:
    """The stand-in list plus every image manifests/examples names, normalised as the kubelet does
    (`ubuntu:22.04` -> `docker.io/library/ubuntu:22.04`)."""
    found = set(WORKLOAD_STAND_INS)
    for path in sorted((ROOT / "manifests" / "examples").glob("*.yaml")):
        found.update(references_in(path.read_text(), str(path.relative_to(ROOT))))
    return sorted(found)


# Where a Kubernetes object holds containers: a pod's spec, and every workload's pod template below its spec.
_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
# [registry[:port]/]path[:tag][@algorithm:hex], the path lowercase: what the kubelet's parser accepts, loosely.
_REFERENCE = re.compile(r"^(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._/-]+[a-z0-9]+)*(?::[\w][\w.-]{0,127})?"
                        r"(?:@[a-z0-9]+:[a-f0-9]{32,})?$")


class SpecImagesError(ValueError):
    pass


def references_in(text: str, source: str) -> list[str]:
    """Every image the containers of a YAML stream's objects name (pods, pod templates at any depth), normalised,
    in order of first appearance. Raises SpecImagesError naming the source, object and field of what is wrong."""
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise SpecImagesError(f"{source}: not YAML: {exc}") from None
    found: dict[str, None] = {}

    def walk(node: object, where: str) -> None:
        if isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, f"{where}[{i}]")
            return
        if not isinstance(node, dict):
            return
        for key, value in node.items():
            if key in _CONTAINER_LISTS and isinstance(value, list):
                for i, container in enumerate(value):
                    image = container.get("image") if isinstance(container, dict) else None
                    if image is None:
                        continue
                    try:
                        found[check_reference(image)] = None
                    except SpecImagesError as exc:
                        raise SpecImagesError(f"{source}: {where}.{key}[{i}].image: {exc}") from None
            walk(value, f"{where}.{key}")

    for i, document in enumerate(documents):
        if not isinstance(document, dict):
            raise SpecImagesError(f"{source}: document {i + 1} is not an object")
        meta = document.get("metadata") if isinstance(document.get("metadata"), dict) else {}
        walk(document, f"{document.get('kind', 'object')} {meta.get('name', f'#{i + 1}')}")
    return list(found)


def check_reference(image: object) -> str:
    """`image` normalised, or SpecImagesError saying what a reference looks like."""
    if not isinstance(image, str) or not _REFERENCE.match(image):
        raise SpecImagesError(f"{image!r} is not an image reference ([registry/]name[:tag][@digest], the name "
                              "lowercase)")
    return normalise(image)


def normalise(reference: str) -> str:
    """A reference as containerd's CRI stores it: docker.io's implied registry, library/ and :latest made explicit."""
    name, digest = reference.split("@", 1) if "@" in reference else (reference, "")
    first = name.split("/", 1)[0]
    if "/" not in name or ("." not in first and ":" not in first and first != "localhost"):
        name = f"docker.io/{name if '/' in name else 'library/' + name}"
    if not digest and ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    return name + (f"@{digest}" if digest else "")
_PAUSE_C = r"""
/* The pod sandbox's init: holds the pod's namespaces, reaps orphans, exits on SIGINT/SIGTERM. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
    struct sigaction term = {.sa_handler = stop}, child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    sigaction(SIGINT, &term, 0);
    sigaction(SIGTERM, &term, 0);
    sigaction(SIGCHLD, &child, 0);
    for (;;) pause();
}
"""


class ImageBuildError(RuntimeError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("GPU_DRA_CACHE") or Path.home() / ".cache" / "gpu-dra") / "images"


def project_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def product_reference(testbed: bool = False) -> str:
    return f"{IMAGE_NAME}:v{project_version()}{'-testbed' if testbed else ''}"


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:16]


def _tree_digest(packages: Sequence[str]) -> bytes:
    """What the product's source tree holds (names and contents of its .py, .yaml, .json, .proto files)."""
    h = hashlib.sha256()
    for package in packages:
        for path in sorted((ROOT / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return h.digest()


def _run(argv: Sequence[str], what: str, **kwargs: object) -> None:
    result = subprocess.run(list(argv), capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-15:]
        raise ImageBuildError(f"{what} failed (exit {result.returncode}): {' '.join(argv)}\n" + "\n".join(tail))


def _cached(name: str, key: str, build: Callable[[Path], None]) -> Path:
    """The archive `name-key.tar` in the cache, built by `build(path)` when absent."""
    target = cache_dir() / f"{name}-{key}.tar"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        print(f"images: building {name} ({key})", file=sys.stderr, flush=True)
        build(target)
        for stale in target.parent.glob(f"{name}-*.tar"):
            if stale != target and stale.name[len(name) + 1:-4].isalnum():
                stale.unlink()  # an older build of the same image
    return target


def base_rootfs() -> Path:
    """Debian minbase with python3, made once by debootstrap (needs root and Debian's registry)."""
    key = _digest(SUITE.encode(), " ".join(BASE_PACKAGES).encode())
    target = cache_dir() / f"rootfs-{SUITE}-{key}"
    if (target / ".complete").exists():
        return target
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap is not installed (apt-get install debootstrap)")
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"images: debootstrap {SUITE} into {target}", file=sys.stderr, flush=True)
    _run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE, str(target)],
         "debootstrap")
    # What an image does not need: package lists, caches, documentation.
    for rel in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale"):
        shutil.rmtree(target / rel, ignore_errors=True)
    (target / ".complete").write_text(SUITE)
    return target


def _site_packages(rootfs: Path) -> Path:
    found = sorted((rootfs / "usr" / "lib").glob("python3.*"))
    found = [p for p in found if p.name[len("python3."):].isdigit()]
    if not found:
        raise ImageBuildError(f"{rootfs}: no python3 in the base rootfs")
    return rootfs / "usr" / "local" / "lib" / found[-1].name / "dist-packages"


def _python_version(rootfs: Path) -> str:
    return _site_packages(rootfs).parent.name.removeprefix("python")


def _product_archive(testbed: bool, target: Path) -> None:
    base = base_rootfs()
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        rootfs = Path(tmp) / "rootfs"
        _run(["cp", "-a", str(base), str(rootfs)], "copying the base rootfs")
        (rootfs / ".complete").unlink()
        site = _site_packages(rootfs)
        site.mkdir(parents=True, exist_ok=True)
        # The locked dependencies as binary wheels for the image's Python, exactly as the Dockerfile installs them.
        _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile", "--only-binary=:all:",
              "--python-version", _python_version(rootfs), "--implementation", "cp", "--platform",
              "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
              "--platform", "any", "--target", str(site), "-r", str(ROOT / "requirements.lock")],
             "pip install of requirements.lock")
        src = Path(tmp) / "src"
        src.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(ROOT / name, src / name)
        for package in TESTBED_PACKAGES if testbed else PRODUCT_PACKAGES:
            shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
        _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile", "--no-build-isolation",
              "--target", str(site), str(src)], "pip install of gpu-dra")
        # pip --target writes scripts with this machine's interpreter, not the image's.
        shutil.rmtree(site / "bin", ignore_errors=True)
        entry = rootfs / "usr" / "local" / "bin" / "gpu-dra"
        entry.write_text(f"#!{IMAGE_PYTHON}\nimport sys\nfrom cli.main import main\nsys.exit(main())\n")
        entry.chmod(0o755)
        _run(["chroot", str(rootfs), "gpu-dra", "--version"], "gpu-dra --version inside the image")
        write_archive(rootfs, ImageConfig(reference=product_reference(testbed), cmd=("gpu-dra", "--help")), target)


def product_image(testbed: bool = False) -> Path:
    packages = TESTBED_PACKAGES if testbed else PRODUCT_PACKAGES
    key = _digest(_tree_digest(packages), (ROOT / "requirements.lock").read_bytes(),
                  (ROOT / "pyproject.toml").read_bytes(), SUITE.encode(), Path(__file__).read_bytes())
    name = "gpu-dra-testbed" if testbed else "gpu-dra"
    return _cached(name, key, lambda target: _product_archive(testbed, target))


def _busybox_rootfs(rootfs: Path) -> None:
    busybox = Path("/bin/busybox")
    if not busybox.exists():
        raise ImageBuildError("/bin/busybox is missing (apt-get install busybox-static)")
    for rel in ("bin", "etc", "tmp", "proc", "sys", "dev", "root", "var/tmp"):
        (rootfs / rel).mkdir(parents=True, exist_ok=True)
    shutil.copy2(busybox, rootfs / "bin" / "busybox")
    applets = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        if applet != "busybox":
            (rootfs / "bin" / applet).symlink_to("busybox")
    # Specs run `bash -c ...` (NVIDIA's quickstart does); busybox has no bash applet, its sh runs those scripts.
    bash = rootfs / "bin" / "bash"
    bash.write_text('#!/bin/sh\nexec /bin/sh "$@"\n')
    bash.chmod(0o755)
    (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n")
    (rootfs / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")


def workload_image(reference: str) -> Path:
    """A busybox stand-in imported under `reference` (the specs' public image names)."""
    busybox = Path("/bin/busybox")
    key = _digest(reference.encode(), busybox.read_bytes() if busybox.exists() else b"", Path(__file__).read_bytes())

    def build(target: Path) -> None:
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            _busybox_rootfs(Path(tmp))
            write_archive(Path(tmp), ImageConfig(reference=reference, cmd=("sh",),
                                                 env=("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",),
                                                 labels={"gpu-dra.stand-in": "busybox"}), target)

    return _cached("stand-in-" + reference.replace("/", "_").replace(":", "_"), key, build)


def pause_image() -> Path:
    key = _digest(_PAUSE_C.encode(), PAUSE_REFERENCE.encode(), Path(__file__).read_bytes())

    def build(target: Path) -> None:
        if shutil.which("gcc") is None:
            raise ImageBuildError("gcc is not installed (apt-get install gcc libc6-dev): it builds the pause binary")
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            rootfs = Path(tmp) / "rootfs"
            rootfs.mkdir()
            source = Path(tmp) / "pause.c"
            source.write_text(_PAUSE_C)
            _run(["gcc", "-static", "-Os", "-s", "-o", str(rootfs / "pause"), str(source)], "compiling pause")
            write_archive(rootfs, ImageConfig(reference=PAUSE_REFERENCE, entrypoint=("/pause",), env=()), target)

    return _cached("pause", key, build)


@dataclass(frozen=True)
class ImageSet:
    product: Path
    testbed: Path
    pause: Path
    workloads: tuple[Path, ...]

    def all(self) -> list[Path]:
        return [self.product, self.testbed, self.pause, *self.workloads]


def build_all() -> ImageSet:
    return ImageSet(product_image(), product_image(testbed=True), pause_image(),
                    tuple(workload_image(ref) for ref in workload_references()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.upstream.images", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("product", "testbed"),
                        help="build only that image and print its archive (default: all of them, one a line)")
    args = parser.parse_args(argv)
    try:
        paths = [product_image(testbed=args.only == "testbed")] if args.only else build_all().all()
    except ImageBuildError as exc:
        print(f"images: {exc}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
