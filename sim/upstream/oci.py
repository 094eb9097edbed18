"""OCI image archives written from a directory tree, without a container engine: one uncompressed layer
(containerd stores layers uncompressed anyway, so compressing costs CPU for nothing on one machine), a config, a
manifest and an index naming the image, in the OCI image layout that `ctr images import` reads.

The layer is reproducible: entries sorted, times clamped to 0, owners numeric; so the same tree gives the same
digest."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

LAYER = "application/vnd.oci.image.layer.v1.tar"
CONFIG = "application/vnd.oci.image.config.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
# Directories whose contents a runtime replaces with its own mounts.
_SKIP_CONTENTS = ("dev", "proc", "sys", "run", "tmp", "var/cache/apt", "var/lib/apt/lists")


@dataclass(frozen=True)
class ImageConfig:
    reference: str
    cmd: Sequence[str] = ()
    entrypoint: Sequence[str] = ()
    env: Sequence[str] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
    working_dir: str = "/"
    labels: dict[str, str] = field(default_factory=dict)


def _walk(root: Path) -> Iterator[Path]:
    """Every path below `root` in sorted order, parents first; the contents of runtime-mounted directories skipped."""
    stack = [root]
    while stack:
        here = stack.pop()
        entries = sorted(os.scandir(here), key=lambda e: e.name, reverse=True)
        for entry in entries:
            path = Path(entry.path)
            rel = path.relative_to(root).as_posix()
            yield path
            if entry.is_dir(follow_symlinks=False) and rel not in _SKIP_CONTENTS:
                stack.append(path)


def _layer(root: Path, out: Path) -> str:
    """Write the tree as a tar to `out`; return its sha256 hex digest."""
    with out.open("wb") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        links: dict[tuple[int, int], str] = {}
        for path in _walk(root):
            rel = path.relative_to(root).as_posix()
            info = tar.gettarinfo(str(path), arcname=rel)
            info.mtime = 0
            info.uname = info.gname = ""
            st = path.lstat()
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                key = (st.st_dev, st.st_ino)
                if key in links:
                    info.type, info.linkname, info.size = tarfile.LNKTYPE, links[key], 0
                    tar.addfile(info)
                    continue
                links[key] = rel
            if info.isreg():
                with path.open("rb") as data:
                    tar.addfile(info, data)
            elif info.type in (tarfile.SYMTYPE, tarfile.DIRTYPE, tarfile.CHRTYPE, tarfile.BLKTYPE,
                               tarfile.FIFOTYPE):
                tar.addfile(info)
    digest = hashlib.sha256()
    with out.open("rb") as data:
        while chunk := data.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _blob(blobs: Path, data: bytes) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return digest, len(data)


def write_archive(root: Path, config: ImageConfig, archive: Path) -> str:
    """Write `root` as an OCI image archive at `archive` (a tar of the layout); return the manifest digest."""
    with tempfile.TemporaryDirectory(dir=archive.parent) as tmp:
        layout = Path(tmp)
        blobs = layout / "blobs" / "sha256"
        blobs.mkdir(parents=True)
        staged = layout / "layer.tar"
        layer_digest = _layer(root, staged)
        layer_size = staged.stat().st_size
        staged.rename(blobs / layer_digest)
        image_config: dict[str, object] = {
            "architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
            "config": {"Env": list(config.env), "Cmd": list(config.cmd) or None,
                       "Entrypoint": list(config.entrypoint) or None, "WorkingDir": config.working_dir,
                       "Labels": config.labels or None},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
            "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "gpu-dra sim.upstream.oci"}],
        }
        config_digest, config_size = _blob(blobs, json.dumps(image_config, sort_keys=True).encode())
        manifest = {"schemaVersion": 2, "mediaType": MANIFEST,
                    "config": {"mediaType": CONFIG, "digest": f"sha256:{config_digest}", "size": config_size},
                    "layers": [{"mediaType": LAYER, "digest": f"sha256:{layer_digest}", "size": layer_size}]}
        manifest_digest, manifest_size = _blob(blobs, json.dumps(manifest, sort_keys=True).encode())
        tag = config.reference.rsplit(":", 1)[1] if ":" in config.reference.rsplit("/", 1)[-1] else "latest"
        index = {"schemaVersion": 2, "manifests": [{
            "mediaType": MANIFEST, "digest": f"sha256:{manifest_digest}", "size": manifest_size,
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": config.reference, "org.opencontainers.image.ref.name": tag}}]}
        (layout / "index.json").write_text(json.dumps(index))
        (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
        part = archive.with_name(archive.name + ".part")
        with tarfile.open(part, "w", format=tarfile.PAX_FORMAT) as tar:
            for name in ("oci-layout", "index.json", "blobs"):
                tar.add(layout / name, arcname=name)
        part.rename(archive)
    return f"sha256:{manifest_digest}"


def read_index(archive: Path) -> dict[str, object]:
    """The index.json of an archive (what `ctr images import` reads the name from)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ValueError(f"{archive}: no index.json")
        return dict(json.load(io.TextIOWrapper(member)))
