"""The NVML seam: the errors an NVML backend raises, shared by the real backend (driver.nvml) and the
testbed's simulator (sim.nvml), which imports this module and nothing else of the product's NVML code."""

from __future__ import annotations


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used: the library or the NVIDIA driver is missing, or the spec is wrong."""


class BackendConfigError(ValueError):
    """A backend's own configuration (a simulator profile) cannot be loaded: the message names the file and
    the field path. The simulator raises its subclass, sim.nvml.ProfileError."""
