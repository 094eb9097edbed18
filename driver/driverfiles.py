"""The NVIDIA driver's user-space files a CUDA container needs, as CDI container edits.

A CDI-only runtime (containerd or CRI-O with CDI enabled, no NVIDIA runtime hook) injects exactly what the spec
says. Device nodes alone leave a container without libcuda.so, libnvidia-ml.so or nvidia-smi, so the node agent
adds the driver's files to every claim spec's top-level `containerEdits`, the way `nvidia-ctk cdi generate` does
for the compute and utility capabilities:

- libraries named `<lib>.so.<driver version>` in the usual library dirs, bind-mounted read-only at the same path;
- the host's `.so.1` / `.so` links to them, recreated in the container by `nvidia-cdi-hook create-symlinks`,
  then `nvidia-cdi-hook update-ldcache` for the library dirs so the dynamic linker finds them;
- nvidia-smi and friends, the GSP firmware of this driver version, the persistenced / fabric manager sockets.

Files are looked up under a driver root (the host's `/` mounted into the agent's pod, or a driver container's
root); the spec names them by their path on the host (`host_root` + the path inside the driver root).

`scan` is the I/O edge: it reads the few directories involved into a `RootSnapshot`. `plan` is pure: snapshot
and driver version in, mounts and hooks out. `discover` runs both.
"""

from __future__ import annotations

import logging
import os
import posixpath
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("gpu-dra.driverfiles")

# The compute and utility libraries of nvidia-container-toolkit's capability lists (libnvidia-container), as
# they are named on disk before the `.so.<version>` suffix. Libraries a given driver does not ship (older or
# newer) are simply not found.
COMPUTE_UTILITY_LIBRARIES: tuple[str, ...] = (
    # utility
    "libnvidia-ml",
    "libnvidia-cfg",
    "libnvidia-nscq",
    # compute
    "libcuda",
    "libcudadebugger",
    "libnvidia-opencl",
    "libnvidia-gpucomp",
    "libnvidia-ptxjitcompiler",
    "libnvidia-fatbinaryloader",
    "libnvidia-allocator",
    "libnvidia-compiler",
    "libnvidia-pkcs11",
    "libnvidia-pkcs11-openssl3",
    "libnvidia-nvvm",
)
LIBRARY_DIRS: tuple[str, ...] = (
    "/usr/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib",
    "/lib",
)
BINARIES: tuple[str, ...] = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
BIN_DIRS: tuple[str, ...] = ("/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin", "/bin", "/sbin")
# nvidia-cdi-hook ships with the NVIDIA Container Toolkit; the GPU operator installs it under /usr/local/nvidia.
HOOK_BINARY = "nvidia-cdi-hook"
HOOK_DIRS: tuple[str, ...] = BIN_DIRS + ("/usr/local/nvidia/toolkit",)
FIRMWARE_DIRS: tuple[str, ...] = ("/lib/firmware/nvidia", "/usr/lib/firmware/nvidia")
# The MPS pipe dir is mounted by the sharing edits of the claims that use MPS, not here.
IPC_SOCKETS: tuple[str, ...] = (
    "/run/nvidia-persistenced/socket",
    "/var/run/nvidia-persistenced/socket",
    "/run/nvidia-fabricmanager/socket",
    "/var/run/nvidia-fabricmanager/socket",
)

MOUNT_OPTIONS: tuple[str, ...] = ("ro", "nosuid", "nodev", "bind")
# Nothing is executed or mapped executable from a socket or firmware blob.
DATA_MOUNT_OPTIONS: tuple[str, ...] = MOUNT_OPTIONS + ("noexec",)
HOOK_LIFECYCLE = "createContainer"  # in the container's mount namespace, after the mounts, before pivot_root

_MAX_LINK_HOPS = 40  # the kernel's own limit on symlinks followed in one lookup


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = MOUNT_OPTIONS

    def cdi(self) -> dict[str, Any]:
        return {"hostPath": self.host_path, "containerPath": self.container_path, "options": list(self.options)}


@dataclass(frozen=True)
class Hook:
    path: str  # absolute path of the hook binary on the host
    args: tuple[str, ...]  # argv, argv[0] included
    hook_name: str = HOOK_LIFECYCLE

    def cdi(self) -> dict[str, Any]:
        return {"hookName": self.hook_name, "path": self.path, "args": list(self.args)}


@dataclass(frozen=True)
class DriverFiles:
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()
    notes: tuple[str, ...] = ()  # why something expected was left out (logged once by the caller)

    def container_edits(self) -> dict[str, Any]:
        """The CDI containerEdits holding these files; empty when nothing was found."""
        edits: dict[str, Any] = {}
        if self.mounts:
            edits["mounts"] = [m.cdi() for m in self.mounts]
        if self.hooks:
            edits["hooks"] = [h.cdi() for h in self.hooks]
        return edits


@dataclass(frozen=True)
class RootSnapshot:
    """What `scan` saw under a driver root. Every path is absolute *inside* the root, already resolved
    (no symlinked directories), so the same file seen through /lib64 and /usr/lib64 appears once."""

    files: frozenset[str] = frozenset()  # regular files
    executables: frozenset[str] = frozenset()  # regular files with an execute bit
    sockets: tuple[str, ...] = ()  # IPC sockets found, in IPC_SOCKETS order
    links: Mapping[str, str] = field(default_factory=dict)  # symlink path -> its link text, for library dirs
    dirs: tuple[str, ...] = ()  # the library dirs that exist, in search order
    bin_dirs: tuple[str, ...] = ()  # the bin dirs that exist, in search order
    hook_dirs: tuple[str, ...] = ()
    firmware_dirs: tuple[str, ...] = ()  # the firmware dirs of this driver version that exist


# ---- pure core ---------------------------------------------------------------------------------------------


def library_file_names(version: str) -> tuple[str, ...]:
    return tuple(f"{lib}.so.{version}" for lib in COMPUTE_UTILITY_LIBRARIES)


def _host_path(host_root: str, path: str) -> str:
    return posixpath.normpath(posixpath.join(host_root, path.lstrip("/")))


def _links_to(snapshot: RootSnapshot, directory: str, targets: set[str]) -> list[tuple[str, str]]:
    """(link text, link path) for each symlink in `directory` whose chain ends at one of `targets`."""
    found = []
    for link, text in sorted(snapshot.links.items()):
        if posixpath.dirname(link) != directory:
            continue
        current, hops = link, 0
        while current in snapshot.links and hops < _MAX_LINK_HOPS:
            current = posixpath.normpath(posixpath.join(posixpath.dirname(current), snapshot.links[current]))
            hops += 1
        if current in targets:
            found.append((text, link))
    return found


def _first_executable(snapshot: RootSnapshot, dirs: Iterable[str], name: str) -> str | None:
    return next((p for p in (posixpath.join(d, name) for d in dirs) if p in snapshot.executables), None)


def plan(snapshot: RootSnapshot, version: str, *, host_root: str = "/") -> DriverFiles:
    """Mounts and hooks for the driver files in `snapshot` of driver `version` (pure)."""
    notes: list[str] = []
    mounts: list[Mount] = []
    libraries: list[str] = []
    names = library_file_names(version)
    for directory in snapshot.dirs:
        for name in names:
            path = posixpath.join(directory, name)
            if path in snapshot.files and path not in libraries:
                libraries.append(path)
    if not libraries:
        notes.append(f"no driver {version} libraries (e.g. libcuda.so.{version}) in {', '.join(LIBRARY_DIRS)}")
    mounts += [Mount(_host_path(host_root, p), p) for p in libraries]
    for name in BINARIES:
        binary = _first_executable(snapshot, snapshot.bin_dirs, name)
        if binary is not None:
            mounts.append(Mount(_host_path(host_root, binary), binary))
    firmware = sorted(
        p for p in snapshot.files
        if posixpath.dirname(p) in snapshot.firmware_dirs
        and posixpath.basename(p).startswith("gsp") and p.endswith(".bin")
    )
    mounts += [Mount(_host_path(host_root, p), p, DATA_MOUNT_OPTIONS) for p in firmware]
    mounts += [Mount(_host_path(host_root, p), p, DATA_MOUNT_OPTIONS) for p in snapshot.sockets]

    hooks: list[Hook] = []
    hook_path = _first_executable(snapshot, snapshot.hook_dirs, HOOK_BINARY)
    if libraries and hook_path is None:
        notes.append(
            f"{HOOK_BINARY} not found in {', '.join(HOOK_DIRS)}: containers get the libraries but no .so links or "
            "ld.so cache entries for them (install the NVIDIA Container Toolkit on the node)"
        )
    elif libraries and hook_path is not None:
        host_hook = _host_path(host_root, hook_path)
        lib_dirs = list(dict.fromkeys(posixpath.dirname(p) for p in libraries))
        link_args: list[str] = []
        for directory in lib_dirs:
            for text, link in _links_to(snapshot, directory, set(libraries)):
                # An absolute link text names a path inside the driver root, which is the same path in the container.
                link_args += ["--link", f"{text}::{link}"]
        if link_args:
            hooks.append(Hook(host_hook, (HOOK_BINARY, "create-symlinks", *link_args)))
        folder_args = [a for d in lib_dirs for a in ("--folder", d)]
        hooks.append(Hook(host_hook, (HOOK_BINARY, "update-ldcache", *folder_args)))
    return DriverFiles(mounts=tuple(mounts), hooks=tuple(hooks), notes=tuple(notes))


# ---- I/O edge ----------------------------------------------------------------------------------------------


def resolve_in_root(root: Path, path: str) -> str | None:
    """`path` with every symlink followed as the host would, absolute link texts taken relative to `root`.

    Returns the resolved path inside the root, or None if a component is missing or links loop."""
    parts = [p for p in path.split("/") if p]
    resolved: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = root.joinpath(*resolved, part)
        try:
            st = os.lstat(candidate)
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > _MAX_LINK_HOPS:
                return None
            try:
                text = os.readlink(candidate)
            except OSError:
                return None
            if text.startswith("/"):
                resolved = []
            parts = [p for p in text.split("/") if p] + parts
            continue
        resolved.append(part)
    return "/" + "/".join(resolved)


def _existing_dirs(root: Path, candidates: Iterable[str]) -> list[str]:
    out: list[str] = []
    for d in candidates:
        real = resolve_in_root(root, d)
        if real is not None and real not in out and (root / real.lstrip("/")).is_dir():
            out.append(real)
    return out


def scan(root: Path, version: str) -> RootSnapshot:
    """Read what `plan` needs from the driver root; unreadable or missing parts are simply absent."""
    files: set[str] = set()
    executables: set[str] = set()
    sockets: list[str] = []
    links: dict[str, str] = {}
    lib_dirs = _existing_dirs(root, LIBRARY_DIRS)
    wanted = set(library_file_names(version))
    prefixes = tuple(f"{lib}.so" for lib in COMPUTE_UTILITY_LIBRARIES)

    def note_file(path: str) -> None:
        try:
            st = os.lstat(root / path.lstrip("/"))
        except OSError:
            return
        if stat.S_ISREG(st.st_mode):
            files.add(path)
            if st.st_mode & 0o111:
                executables.add(path)
        elif stat.S_ISSOCK(st.st_mode) and path not in sockets:
            sockets.append(path)

    for d in lib_dirs:
        try:
            entries = list(os.scandir(root / d.lstrip("/")))
        except OSError:
            continue
        for entry in entries:
            path = posixpath.join(d, entry.name)
            if entry.name in wanted:
                note_file(path)
            elif entry.name.startswith(prefixes) and entry.is_symlink():
                try:
                    links[path] = os.readlink(entry.path)
                except OSError:
                    continue
    bin_dirs = _existing_dirs(root, BIN_DIRS)
    hook_dirs = _existing_dirs(root, HOOK_DIRS)
    # HOOK_DIRS holds every BIN_DIR, so one pass over it notes the binaries `plan` looks up in either list.
    for d in hook_dirs:
        for name in (*BINARIES, HOOK_BINARY):
            note_file(posixpath.join(d, name))
    firmware_dirs = _existing_dirs(root, [f"{f}/{version}" for f in FIRMWARE_DIRS])
    for d in firmware_dirs:
        try:
            names = sorted(os.listdir(root / d.lstrip("/")))
        except OSError:
            continue
        for name in names:
            note_file(posixpath.join(d, name))
    for sock in IPC_SOCKETS:
        real = resolve_in_root(root, sock)
        if real is not None:
            note_file(real)
    return RootSnapshot(
        files=frozenset(files), executables=frozenset(executables), sockets=tuple(sockets), links=links,
        dirs=tuple(lib_dirs), bin_dirs=tuple(bin_dirs), hook_dirs=tuple(hook_dirs), firmware_dirs=tuple(firmware_dirs),
    )


def discover(root: Path, version: str, *, host_root: str = "/") -> DriverFiles:
    """The driver files under `root` for driver `version`; nothing when the root does not exist."""
    if not root.is_dir():
        return DriverFiles(notes=(f"driver root {root} is not a directory",))
    return plan(scan(root, version), version, host_root=host_root)
