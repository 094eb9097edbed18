"""The NVML seam (driver.nvmlapi.NvmlBackend): both backends satisfy it, statically and at run time.

mypy checks this file (pyproject.toml's [tool.mypy] files): the typed assignments below fail `make lint` when the
simulator's methods stop matching the Protocol. RealNvml forwards `nvml*` names to pynvml, which has no type
information, so the run-time checks compare every member with pynvml's own functions.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pynvml
import pytest

from driver.nvml import RealNvml, load_backend
from driver.nvmlapi import NvmlBackend
from sim.nvml.simulator import SimulatedNvml


def _static_checks(sim: SimulatedNvml, real: RealNvml) -> tuple[NvmlBackend, NvmlBackend]:
    # The assignments are what mypy checks; calling this function is what makes them run-time facts too.
    simulated: NvmlBackend = sim
    wrapped: NvmlBackend = real
    return simulated, wrapped


def _members() -> list[str]:
    return sorted(n for n, v in vars(NvmlBackend).items() if not n.startswith("_") and callable(v))


def _positional(fn: Callable[..., Any], *, bound: bool) -> tuple[int, int]:
    """(required, total) positional parameters of `fn`, without `self` when it is an unbound method."""
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not bound:
        params = params[1:]
    return sum(p.default is p.empty for p in params), len(params)


def test_the_seam_lists_what_the_driver_calls() -> None:
    members = _members()
    assert len(members) >= 50
    assert {"nvmlDeviceGetHandleByIndex", "nvmlEventSetWait", "pcie_root", "set_timeslice", "mps_start",
            "mps_command", "mps_stop", "mps_running"} <= set(members)


def test_both_backends_are_nvml_backends() -> None:
    sim = load_backend("sim:t4-1")
    assert isinstance(sim, SimulatedNvml)
    simulated, wrapped = _static_checks(sim, RealNvml(pynvml))
    for name in _members():
        assert callable(getattr(simulated, name)), name
        assert callable(getattr(wrapped, name)), name  # an `nvml*` name pynvml lacks raises AttributeError here


@pytest.mark.parametrize("name", [n for n in _members() if n.startswith("nvml")])
def test_each_nvml_call_takes_pynvml_arguments(name: str) -> None:
    """The Protocol, the simulator and pynvml agree on how many positional arguments each call takes."""
    want = _positional(getattr(pynvml, name), bound=True)
    assert _positional(getattr(NvmlBackend, name), bound=False) == want, name
    assert _positional(getattr(SimulatedNvml, name), bound=False) == want, name
