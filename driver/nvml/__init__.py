"""NVML backends: the real library through pynvml, or the simulator over a profile.

`load_backend(spec, node=None)` returns an initialised object with pynvml's function names, return
types and errors, plus `pcie_root(pci_bus_id)` (the one topology fact NVML lacks) and the GPU settings NVML
has no call for: `set_timeslice(gpu_uuid, level)` and MPS control daemons (`mps_start(dirs, device_uuids)`,
`mps_command(dirs, command)`, `mps_stop(dirs)`, `mps_running(dirs)`), which raise `GpuToolError`. The real
backend runs NVIDIA's tools for them (driver.gputools), the simulator keeps them as state.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from driver.gputools import MpsDirs, NvidiaTools
from driver.nvml.faults import FAULTS_ENV
from driver.nvml.profile import ProfileError, load_profile, shipped_profiles
from driver.nvml.sim import SimulatedNvml

__all__ = ["NvmlUnavailable", "ProfileError", "RealNvml", "SimulatedNvml", "load_backend", "sysfs_pcie_root"]

SYSFS_PCI_DEVICES = Path("/sys/bus/pci/devices")


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used: the library or the NVIDIA driver is missing, or the spec is wrong."""


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

    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvml"):
            return getattr(self._module, name)
        raise AttributeError(name)

    def pcie_root(self, pci_bus_id: str) -> str | None:
        return sysfs_pcie_root(pci_bus_id, self._devices_dir)

    def set_timeslice(self, gpu_uuid: str, level: int) -> None:
        self._tools.set_timeslice(gpu_uuid, level)

    def mps_start(self, dirs: MpsDirs, device_uuids: Sequence[str]) -> None:
        self._tools.mps_start(dirs, device_uuids)

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


def _load_real() -> RealNvml:
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(
            _UNAVAILABLE_HINT.format(detail=f"the nvidia-ml-py package is not installed: {exc}", profiles=", ".join(shipped_profiles()))
        ) from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(_UNAVAILABLE_HINT.format(detail=str(exc), profiles=", ".join(shipped_profiles()))) from exc
    return RealNvml(pynvml)


def parse_sim_spec(spec: str) -> tuple[str, str | None]:
    """'sim:NAME?faults=/path' -> (NAME, '/path'); the faults file falls back to $GPU_DRA_SIM_FAULTS."""
    body = spec[len("sim:"):]
    name, _, query = body.partition("?")
    faults: str | None = None
    if query:
        params = parse_qs(query, keep_blank_values=True)
        unknown = set(params) - {"faults"}
        if unknown:
            raise NvmlUnavailable(f"--nvml {spec}: unknown option(s) {sorted(unknown)}; accepted: faults=/path/faults.json")
        faults = params.get("faults", [""])[-1] or None
    if faults is None:
        faults = os.environ.get(FAULTS_ENV) or None
    if not name:
        raise NvmlUnavailable(f"--nvml {spec}: missing profile; accepted: sim:NAME ({', '.join(shipped_profiles())}) or sim:/path/profile.yaml")
    return name, faults


def load_backend(spec: str, node: str | None = None) -> Any:
    """An initialised NVML backend for "real", "sim:NAME" or "sim:/path/profile.yaml" (optionally "?faults=FILE").

    `node` is the node the backend serves: the simulator derives that node's own GPU and MIG UUIDs from it
    (real NVML reports the hardware's and ignores it). Without it simulated UUIDs are the profile's verbatim.

    Raises NvmlUnavailable (real NVML missing, bad spec) or ProfileError (bad profile).
    """
    if spec == "real":
        return _load_real()
    if spec.startswith("sim:"):
        name, faults = parse_sim_spec(spec)
        sim = SimulatedNvml(load_profile(name), faults_path=faults, node=node)
        sim.nvmlInit()
        return sim
    raise NvmlUnavailable(f"--nvml {spec!r}: accepted: real, sim:NAME ({', '.join(shipped_profiles())}) or sim:/path/profile.yaml")
