"""The NVIDIA driver's user-space files a CUDA container needs, as CDI container edits.

A CDI-only runtime (containerd or CRI-O with CDI enabled, no NVIDIA runtime hook) injects exactly what the spec
says. Device nodes alone leave a container without libcuda.so.1, libnvidia-ml.so.1 or nvidia-smi, so the node
agent adds the driver's files to every claim spec's top-level `containerEdits`:

- the driver's libraries, known by the driver's own naming: every regular file `<name>.so.<driver version>` in
  the driver root's library directories (what the driver installer, the distribution packages and the GPU
  Operator's driver container all install; no list of names kept here goes stale with a new driver). Those
  directories are first the ones the root's own /etc/ld.so.cache names for such files (driver.ldcache: Debian's
  packages keep them in /usr/lib/<triple>/nvidia/current), then the standard ones;
- each mounted read-only as a file under its versioned name *and* under its soname (read from the ELF, e.g.
  `libcuda.so.1`), into the container's system library directories of both families (`/usr/lib/<triple>` for
  Debian/Ubuntu images, `/usr/lib64` for RHEL/Fedora images): the loader's built-in search path finds them with
  no symlink created in the container (docs/containers.md says why: the NVIDIA Container Toolkit is not on GKE
  nodes, nor on hosts that only have a driver);
- the development names NVIDIA's create-symlinks hook gives a container, mounted as files the same way: the
  `.so` name where the install has that link beside the library, `libcuda.so` and `libnvidia-opticalflow.so`
  always, `libGLX_indirect.so.0` for libGLX_nvidia;
- with the agent's own hook installed on the host (driver.cdihook), a createContainer hook that rebuilds the
  container's ld.so.cache over those directories (`ldconfig -p` then lists libcuda, as Triton requires);
- nvidia-smi and friends at /usr/bin, the GSP firmware of this driver version, the persistenced / fabric
  manager sockets;
- when the deployment provides an `nvidia-cdi-hook` on the host (`--cdi-hook-path`, toolkit 1.18 or later), the
  two hooks NVIDIA's nvcdi adds for every container: `enable-cuda-compat` (CUDA forward-compatibility libraries
  of the image take effect when newer than the host driver) and `disable-device-node-modification` (NVML in the
  container does not create or chmod device nodes).

Files are looked up under a driver root (the host's `/` mounted into the agent's pod, a driver container's
root, GKE's /home/kubernetes/bin/nvidia); the spec names them by their path on the host (`host_root` + the
path inside the driver root).

`scan` is the I/O edge: it reads the few directories involved into a `RootSnapshot`. `plan` is pure: snapshot
and driver version in, mounts and hooks out. `discover` runs both.
"""

from __future__ import annotations

import logging
import os
import platform
import posixpath
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from driver import cdihook, ldcache
from driver.elfsoname import soname

log = logging.getLogger("gpu-dra.driverfiles")

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
CONTAINER_BIN_DIR = "/usr/bin"
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
HOOK_ENV: tuple[str, ...] = ("NVIDIA_CTK_DEBUG=false",)  # as nvcdi writes its hooks
# Development links NVIDIA's toolkit creates whether or not the install has them (its create-symlinks hook):
# frameworks dlopen `libcuda.so` and link with `-lcuda`.
ALWAYS_DEV_LINKS: frozenset[str] = frozenset({"libcuda.so", "libnvidia-opticalflow.so"})
GLX_INDIRECT = "libGLX_indirect.so.0"  # GLVND's indirect GLX library, NVIDIA's for an NVIDIA display

_MAX_LINK_HOPS = 40  # the kernel's own limit on symlinks followed in one lookup
_MULTIARCH = {"x86_64": "x86_64-linux-gnu", "amd64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu",
              "arm64": "aarch64-linux-gnu"}


def container_library_dirs(machine: str | None = None) -> tuple[str, ...]:
    """Where the driver's libraries go in containers: the system library dir of Debian-family images (multiarch)
    and of RHEL-family images, both on their loader's built-in search path."""
    triple = _MULTIARCH.get((machine or platform.machine()).lower(), "x86_64-linux-gnu")
    return (f"/usr/lib/{triple}", "/usr/lib64")


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
    env: tuple[str, ...] = HOOK_ENV

    def cdi(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hookName": self.hook_name, "path": self.path, "args": list(self.args)}
        if self.env:
            out["env"] = list(self.env)
        return out


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
    sonames: Mapping[str, str] = field(default_factory=dict)  # library path -> its DT_SONAME
    links: frozenset[str] = frozenset()  # symbolic links named `<name>.so` in the library dirs (development links)
    dirs: tuple[str, ...] = ()  # the library dirs that exist, in search order
    bin_dirs: tuple[str, ...] = ()  # the bin dirs that exist, in search order
    firmware_dirs: tuple[str, ...] = ()  # the firmware dirs of this driver version that exist
    warnings: tuple[str, ...] = ()  # what was wrong with the root (a corrupt ld.so.cache), for the notes


# ---- pure core ---------------------------------------------------------------------------------------------


def is_driver_library(name: str, version: str) -> bool:
    """`libcuda.so.580.95.05` for driver 580.95.05: the driver's naming of the libraries it installs."""
    return name.endswith(f".so.{version}") and len(name) > len(f".so.{version}")


def _host_path(host_root: str, path: str) -> str:
    return posixpath.normpath(posixpath.join(host_root, path.lstrip("/")))


def dev_link_name(soname: str) -> str:
    """The development name of a library: `libcuda.so` for `libcuda.so.1` (extensions dropped down to `.so`)."""
    name = soname
    while name and not name.endswith(".so"):
        stem, dot, _ = name.rpartition(".")
        if not dot:
            return soname
        name = stem
    return name or soname


def extra_link_names(name: str, soname: str, directory: str, snapshot: RootSnapshot, version: str) -> list[str]:
    """The names NVIDIA's toolkit gives a driver library in a container beyond its soname: the `.so` development
    link where the install has one beside the library, and always `libcuda.so` and `libnvidia-opticalflow.so`
    (programs dlopen and link them by those names), and GLVND's `libGLX_indirect.so.0` for libGLX_nvidia."""
    out: list[str] = []
    dev = dev_link_name(soname)
    if dev != soname and (dev in ALWAYS_DEV_LINKS or posixpath.join(directory, dev) in snapshot.links):
        out.append(dev)
    if name == f"libGLX_nvidia.so.{version}":
        out.append(GLX_INDIRECT)
    return out


def _first_executable(snapshot: RootSnapshot, dirs: Iterable[str], name: str) -> str | None:
    return next((p for p in (posixpath.join(d, name) for d in dirs) if p in snapshot.executables), None)


def plan(
    snapshot: RootSnapshot, version: str, *, host_root: str = "/", hook_path: str | None = None,
    container_dirs: tuple[str, ...] | None = None, ldcache_hook: str | None = None,
) -> DriverFiles:
    """Mounts and hooks for the driver files in `snapshot` of driver `version` (pure).

    `hook_path` is an nvidia-cdi-hook (1.18 or later) on the host, or None; `container_dirs` where libraries go
    in the container (default: `container_library_dirs()`); `ldcache_hook` the agent's own hook on the host
    (driver.cdihook), which then rebuilds every container's loader cache, or None."""
    notes: list[str] = list(snapshot.warnings)
    mounts: list[Mount] = []
    libraries: dict[str, str] = {}  # file name -> path in the root; the first library dir holding a name wins
    for directory in snapshot.dirs:
        for path in sorted(p for p in snapshot.files if posixpath.dirname(p) == directory):
            name = posixpath.basename(path)
            if is_driver_library(name, version):
                libraries.setdefault(name, path)
    if not libraries:
        notes.append(f"no driver {version} libraries (e.g. libcuda.so.{version}) in {', '.join(snapshot.dirs or LIBRARY_DIRS)}"
                     f" (the root's {ldcache.CACHE_PATH} names none)")
    targets: set[str] = set()
    dirs = container_dirs or container_library_dirs()
    for name, path in sorted(libraries.items()):
        names = [name]
        so = snapshot.sonames.get(path)
        if so and so != name and "/" not in so:
            names.append(so)
        # Development links as files too: the runtime creates each mount target inside the container's root
        # (a link made by a hook in an untrusted root before pivot_root could be led to the host).
        names += extra_link_names(name, names[-1], posixpath.dirname(path), snapshot, version)
        for directory in dirs:
            for n in names:
                target = posixpath.join(directory, n)
                if target not in targets:  # two files of one soname: the first (sorted) wins, as ldconfig picks one
                    targets.add(target)
                    mounts.append(Mount(_host_path(host_root, path), target))
    for name in BINARIES:
        binary = _first_executable(snapshot, snapshot.bin_dirs, name)
        if binary is not None:
            mounts.append(Mount(_host_path(host_root, binary), posixpath.join(CONTAINER_BIN_DIR, name)))
    firmware = sorted(
        p for p in snapshot.files
        if posixpath.dirname(p) in snapshot.firmware_dirs
        and posixpath.basename(p).startswith("gsp") and p.endswith(".bin")
    )
    mounts += [Mount(_host_path(host_root, p), p, DATA_MOUNT_OPTIONS) for p in firmware]
    mounts += [Mount(_host_path(host_root, p), p, DATA_MOUNT_OPTIONS) for p in snapshot.sockets]

    hooks: list[Hook] = []
    if ldcache_hook is not None and libraries:
        hooks.append(Hook(ldcache_hook, cdihook.update_ldcache_args(dirs), env=(cdihook.HOOK_PATH_ENV,)))
    if hook_path is not None and libraries:
        hooks.append(Hook(hook_path, ("nvidia-cdi-hook", "enable-cuda-compat", f"--host-driver-version={version}")))
        hooks.append(Hook(hook_path, ("nvidia-cdi-hook", "disable-device-node-modification")))
    elif libraries:
        notes.append("no --cdi-hook-path: containers get the driver's files but no CUDA forward-compat switch and no "
                     "disabling of NVML's device-node modification (both need nvidia-cdi-hook 1.18+ on the host)")
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
    sonames: dict[str, str] = {}
    links: set[str] = set()
    cached, warning = ldcache.read(root)
    lib_dirs = _existing_dirs(root, [*cached_library_dirs(root, cached, version), *LIBRARY_DIRS])

    def note_file(path: str) -> bool:
        try:
            st = os.lstat(root / path.lstrip("/"))
        except OSError:
            return False
        if stat.S_ISREG(st.st_mode):
            files.add(path)
            if st.st_mode & 0o111:
                executables.add(path)
            return True
        if stat.S_ISSOCK(st.st_mode) and path not in sockets:
            sockets.append(path)
        return False

    for d in lib_dirs:
        try:
            names = sorted(os.listdir(root / d.lstrip("/")))
        except OSError:
            continue
        for name in names:
            path = posixpath.join(d, name)
            if name.endswith(".so") and os.path.islink(root / path.lstrip("/")):
                links.add(path)
            if is_driver_library(name, version) and note_file(path):
                so = soname(root / path.lstrip("/"))
                if so is not None:
                    sonames[path] = so
    bin_dirs = _existing_dirs(root, BIN_DIRS)
    for d in bin_dirs:
        for name in BINARIES:
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
        files=frozenset(files), executables=frozenset(executables), sockets=tuple(sockets), sonames=sonames,
        links=frozenset(links), dirs=tuple(lib_dirs), bin_dirs=tuple(bin_dirs), firmware_dirs=tuple(firmware_dirs),
        warnings=(warning,) if warning else (),
    )


def cached_library_dirs(root: Path, entries: Iterable[ldcache.Entry], version: str) -> list[str]:
    """The directories (resolved inside the root) where the cache's entries lead to driver `version` libraries,
    in the cache's order."""
    out: list[str] = []
    for entry in entries:
        real = resolve_in_root(root, entry.path)
        if real is not None and is_driver_library(posixpath.basename(real), version):
            directory = posixpath.dirname(real)
            if directory not in out:
                out.append(directory)
    return out


def discover(
    root: Path, version: str, *, host_root: str = "/", hook_path: str | None = None, ldcache_hook: str | None = None,
) -> DriverFiles:
    """The driver files under `root` for driver `version`; nothing when the root does not exist."""
    if not root.is_dir():
        return DriverFiles(notes=(f"driver root {root} is not a directory",))
    return plan(scan(root, version), version, host_root=host_root, hook_path=hook_path, ldcache_hook=ldcache_hook)
