"""The host's NVIDIA driver install as the node agent sees it: a directory tree (`--driver-root`).

The agent's image carries no NVIDIA library or tool. The host's driver install is mounted into the pod (the
host's `/` when the driver is installed on the host, `/run/nvidia/driver` when a driver container of the GPU
Operator provides it) and everything driver-specific is found under that mount, by path:

- `libnvidia-ml.so.1` where the driver root's own dynamic-linker cache (/etc/ld.so.cache, driver.ldcache) says
  it is, as NVIDIA's nvcdi looks it up (Debian's packages keep the driver in /usr/lib/<triple>/nvidia/current),
  else in the usual library directories (a root without a cache, or with a corrupt one: GKE's has none);
- `nvidia-smi`, `nvidia-cuda-mps-control` in the usual binary directories.

Links are followed as the host would (absolute link texts relative to the driver root), so a `.so.1` link to
`/usr/lib64/libnvidia-ml.so.550.54.15` resolves inside the mount, not inside the agent's image. A lookup that
finds nothing raises `DriverRootError` naming every path it tried.

Tools run from the driver root get the driver's `libnvidia-ml.so.1` preloaded and nothing else (as NVIDIA's
driver runs them): the tool then finds that NVML by its soname, already loaded, and everything else (libc above
all) through the agent image's own loader paths. Putting the driver's library directory on `LD_LIBRARY_PATH`
instead would hand the tool that directory's `libc.so.6` too: on Ubuntu/Debian hosts and in the GPU Operator's
driver container it is /usr/lib/x86_64-linux-gnu, which holds the host's glibc, of another build than the
image's loader, and the tool dies before `main`.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from driver import ldcache
from driver.driverfiles import BIN_DIRS, LIBRARY_DIRS, resolve_in_root

NVML_LIBRARY = "libnvidia-ml.so.1"
# Beyond the distribution directories: where GKE's installer and a few vendor images put the driver.
EXTRA_LIBRARY_DIRS: tuple[str, ...] = ("/usr/lib64/nvidia", "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib")
EXTRA_BIN_DIRS: tuple[str, ...] = ("/opt/bin", "/usr/local/nvidia/bin", "/home/kubernetes/bin/nvidia/bin")


class DriverRootError(RuntimeError):
    """A driver file was not found under the driver root; the message lists every path searched."""


def _search(root: Path, name: str, dirs: Iterable[str], *, executable: bool) -> tuple[Path | None, list[str]]:
    tried: list[str] = []
    for d in dirs:
        candidate = f"{d.rstrip('/')}/{name}"
        tried.append(str(root / candidate.lstrip("/")))
        resolved = resolve_in_root(root, candidate)
        if resolved is None:
            continue
        path = root / resolved.lstrip("/")
        if not path.is_file():
            continue
        if executable and not (path.stat().st_mode & 0o111):
            continue
        return path, tried
    return None, tried


@dataclass(frozen=True)
class DriverRoot:
    """Lookups under one driver root (a path in the agent's filesystem)."""

    path: Path

    @property
    def library_dirs(self) -> tuple[str, ...]:
        return LIBRARY_DIRS + EXTRA_LIBRARY_DIRS

    @property
    def bin_dirs(self) -> tuple[str, ...]:
        return BIN_DIRS + EXTRA_BIN_DIRS

    def find_library(self, name: str = NVML_LIBRARY) -> Path:
        entries, _ = ldcache.read(self.path)  # a corrupt cache is reported with the driver files (driver.driverfiles)
        cached = [posixpath.dirname(e.path) for e in entries if e.soname == name]
        found, tried = _search(self.path, name, [*cached, *self.library_dirs], executable=False)
        if found is None:
            raise DriverRootError(
                f"{name} was not found under the driver root {self.path} (searched: {', '.join(tried)}); "
                "mount the host's driver install there (the host's / or /run/nvidia/driver) and pass --driver-root"
            )
        return found

    def find_binary(self, name: str) -> Path:
        found, tried = _search(self.path, name, self.bin_dirs, executable=True)
        if found is None:
            raise DriverRootError(
                f"{name} was not found under the driver root {self.path} (searched: {', '.join(tried)}); "
                "it comes with the NVIDIA driver"
            )
        return found

    def tool_env(self, base: Mapping[str, str]) -> dict[str, str]:
        """Environment for running a driver tool from this root: its NVML preloaded, no library dir searched."""
        env = dict(base)
        try:
            library = self.find_library()
        except DriverRootError:
            return env  # the tool's own error will say what is missing
        env["LD_PRELOAD"] = ":".join(p for p in (str(library), env.get("LD_PRELOAD", "")) if p)
        return env
