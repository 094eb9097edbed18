"""NVML backends: the real library through pynvml, or the simulator over a profile.

`load_backend(spec, node=None)` returns an initialised `driver.nvmlapi.NvmlBackend`: pynvml's function names, return
types and errors, plus `pcie_root(pci_bus_id)` (the one topology fact NVML lacks) and the GPU settings NVML
has no call for: `set_timeslice(gpu_uuid, level)` and MPS control daemons (`mps_start(dirs, device_uuids)`,
`mps_command(dirs, command)`, `mps_stop(dirs)`, `mps_running(dirs)`), which raise `GpuToolError`. The real
backend runs NVIDIA's tools for them (driver.gputools), the simulator keeps them as state.

The real library is loaded by path from the driver root (`--driver-root`, see driver.driverroot), never by
name: the agent's image has no NVIDIA library and its dynamic loader does not search the host's directories.
pynvml (nvidia-ml-py) only knows `CDLL("libnvidia-ml.so.1")`, so the handle it keeps in `pynvml.nvmlLib` is
set here, under pynvml's own load lock, before `nvmlInit` (which then finds it loaded and uses it).

The simulator is part of the testbed (`sim.nvml`), not of the product: `_simulator()` is the one place where
product code reaches it, imported only when a `sim:` spec is asked for, so a node running `--nvml real` never
loads it and an image without the testbed says so instead of failing to import.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from driver.driverroot import DriverRoot, DriverRootError
from driver.gputools import MpsDirs, NvidiaTools
from driver.nvmlapi import NvmlBackend, NvmlUnavailable

__all__ = ["RealNvml", "load_backend", "shipped_profiles", "sysfs_pcie_root"]

SYSFS_PCI_DEVICES = Path("/sys/bus/pci/devices")


def _simulator() -> ModuleType:
    """The testbed's NVML simulator (`sim.nvml`); the only import of the testbed from product code."""
    try:
        import sim.nvml
    except ModuleNotFoundError as exc:
        if exc.name in ("sim", "sim.nvml"):
            raise NvmlUnavailable("the NVML simulator (package `sim`) is not part of this installation; use --nvml real") from exc
        raise
    return sim.nvml


def shipped_profiles() -> list[str]:
    """Names of the simulator profiles this installation ships (empty without the testbed)."""
    try:
        return _simulator().shipped_profiles()
    except NvmlUnavailable:
        return []


def sysfs_pcie_root(pci_bus_id: str, devices_dir: Path = SYSFS_PCI_DEVICES) -> str | None:
    """The PCIe root complex of a device: the `pciDDDD:BB` component of its resolved sysfs path."""
    try:
        resolved = (devices_dir / pci_bus_id.lower()).resolve(strict=True)
    except OSError:
        return None
    for part in resolved.parts:
        if part.startswith("pci") and ":" in part:
            return part
    return None


class RealNvml:
    """pynvml itself, plus `pcie_root` from sysfs. Attribute access is forwarded to the module."""

    def __init__(self, module: Any, devices_dir: Path = SYSFS_PCI_DEVICES, tools: NvidiaTools | None = None) -> None:
        self._module = module
        self._devices_dir = devices_dir
        self._tools = tools or NvidiaTools()

    @property
    def tools(self) -> NvidiaTools:
        return self._tools

    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvml"):
            return getattr(self._module, name)
        raise AttributeError(name)

    def pcie_root(self, pci_bus_id: str) -> str | None:
        return sysfs_pcie_root(pci_bus_id, self._devices_dir)

    def set_timeslice(self, gpu_uuid: str, level: int) -> None:
        self._tools.set_timeslice(gpu_uuid, level)

    def mps_start(
        self, dirs: MpsDirs, device_uuids: Sequence[str], commands: Sequence[str] = (), *, multi_user: bool = False,
    ) -> None:
        self._tools.mps_start(dirs, device_uuids, commands, multi_user=multi_user)

    def mps_wait(self, dirs: MpsDirs) -> None:
        """`nvidia-cuda-mps-control -d` returns once its daemon listens: nothing to wait for."""

    def mps_command(self, dirs: MpsDirs, command: str) -> str:
        return self._tools.mps_command(dirs, command)

    def mps_stop(self, dirs: MpsDirs) -> None:
        self._tools.mps_stop(dirs)

    def mps_running(self, dirs: MpsDirs) -> bool:
        return self._tools.mps_running(dirs)


_UNAVAILABLE_HINT = (
    "NVML is not available: the NVIDIA driver (libnvidia-ml.so.1) was not found or could not be initialised ({detail}). "
    "On a machine without NVIDIA GPUs use the simulator, e.g. --nvml sim:dgx-h100 (shipped profiles: {profiles}) "
    "or --nvml sim:/path/to/profile.yaml"
)


def install_library(module: Any, path: Path) -> None:
    """Make pynvml use the NVML library at `path` (idempotent for the same file).

    Raises NvmlUnavailable when the file cannot be loaded, or when pynvml already holds another library
    (one process can only have one NVML)."""
    with module.libLoadLock:
        current = module.nvmlLib
        if current is not None:
            loaded = getattr(current, "_name", None)
            if loaded and Path(loaded).resolve() == path.resolve():
                return
            raise NvmlUnavailable(f"NVML is already loaded from {loaded!r} in this process; cannot also load {path}")
        try:
            library = ctypes.CDLL(str(path))
        except OSError as exc:
            raise NvmlUnavailable(f"{path} could not be loaded: {exc}") from exc
        # pynvml caches function pointers only from a loaded library, so its cache is still empty here.
        module.nvmlLib = library


def _load_real(driver_root: Path | None) -> RealNvml:
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(_UNAVAILABLE_HINT.format(detail=f"the nvidia-ml-py package is not installed: {exc}",
                                                       profiles=", ".join(shipped_profiles()))) from exc
    root = DriverRoot(driver_root) if driver_root is not None else None
    if root is not None:
        try:
            install_library(pynvml, root.find_library())
        except (DriverRootError, NvmlUnavailable) as exc:
            raise NvmlUnavailable(_UNAVAILABLE_HINT.format(detail=str(exc), profiles=", ".join(shipped_profiles()))) from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        where = f"loaded from {pynvml.nvmlLib._name}" if root is not None else "looked up by name"
        raise NvmlUnavailable(
            _UNAVAILABLE_HINT.format(detail=f"nvmlInit of the library {where} failed: {exc}", profiles=", ".join(shipped_profiles()))
        ) from exc
    return RealNvml(pynvml, tools=NvidiaTools(driver_root=root))


def load_backend(spec: str, node: str | None = None, driver_root: Path | None = None) -> NvmlBackend:
    """An initialised NVML backend for "real", "sim:NAME" or "sim:/path/profile.yaml" (optionally "?faults=FILE").

    `node` is the node the backend serves: the simulator derives that node's own GPU and MIG UUIDs from it
    (real NVML reports the hardware's and ignores it). Without it simulated UUIDs are the profile's verbatim.
    `driver_root` is where real NVML and NVIDIA's tools are looked up by path; None: by name on this
    machine's loader path and PATH (a host with the driver installed, e.g. `gpu-dra inventory` run there).

    Raises NvmlUnavailable (real NVML missing, bad spec) or BackendConfigError (bad simulator profile).
    """
    if spec == "real":
        return _load_real(driver_root)
    if spec.startswith("sim:"):
        return _simulator().load_simulator(spec, node=node)
    raise NvmlUnavailable(f"--nvml {spec!r}: accepted: real, sim:NAME ({', '.join(shipped_profiles())}) or sim:/path/profile.yaml")
