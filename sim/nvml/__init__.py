"""The NVML simulator: pynvml's names, structs and errors over a profile (YAML data), with fault injection.

Product code reaches it only through `driver.nvml.load_backend("sim:...")`, which imports this package on demand.
"""

from __future__ import annotations

import os
from urllib.parse import parse_qs

from driver.nvml import NvmlUnavailable, ProfileError
from sim.nvml.faults import FAULTS_ENV
from sim.nvml.profile import load_profile, shipped_profiles
from sim.nvml.simulator import SimulatedNvml

__all__ = ["ProfileError", "SimulatedNvml", "load_profile", "load_simulator", "parse_sim_spec", "shipped_profiles"]


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


def load_simulator(spec: str, node: str | None = None) -> SimulatedNvml:
    """An initialised simulator for "sim:NAME" or "sim:/path/profile.yaml" (optionally "?faults=FILE")."""
    name, faults = parse_sim_spec(spec)
    sim = SimulatedNvml(load_profile(name), faults_path=faults, node=node)
    sim.nvmlInit()
    return sim
