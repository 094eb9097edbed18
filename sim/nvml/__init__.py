"""The NVML simulator: pynvml's names, structs and errors over a profile (YAML data), with fault injection.

Product code reaches it only through `driver.nvml.load_backend("sim:...")`, which imports this package on demand.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from urllib.parse import parse_qs

from driver.nvmlapi import NvmlUnavailable
from sim.nvml.faults import FAULTS_ENV, read_faults
from sim.nvml.profile import ProfileError, load_profile, shipped_profiles
from sim.nvml.simulator import SimulatedNvml

__all__ = ["ProfileError", "SimulatedNvml", "load_profile", "load_simulator", "parse_sim_spec", "shipped_profiles"]


def parse_sim_spec(spec: str) -> tuple[str, str | None]:
    """'sim:NAME?faults=/path' -> (NAME, '/path'); the faults file falls back to $GPU_DRA_SIM_FAULTS."""
    name, faults, _ = parse_sim_options(spec)
    return name, faults


def parse_sim_options(spec: str) -> tuple[str, str | None, int | None]:
    """'sim:NAME?faults=/path&clique=N' -> (NAME, '/path', N). `clique` puts the node's fabric-attached GPUs in
    NVLink clique N of the profile's fabric (a GB200 NVL72 rack is one clique; several racks, several cliques)."""
    body = spec[len("sim:"):]
    name, _, query = body.partition("?")
    faults: str | None = None
    clique: int | None = None
    if query:
        params = parse_qs(query, keep_blank_values=True)
        unknown = set(params) - {"faults", "clique"}
        if unknown:
            raise NvmlUnavailable(f"--nvml {spec}: unknown option(s) {sorted(unknown)}; accepted: "
                                  "faults=/path/faults.json, clique=N")
        faults = params.get("faults", [""])[-1] or None
        text = params.get("clique", [""])[-1]
        if text:
            if not text.isdigit() or int(text) > 0x7FFFFFFF:
                raise NvmlUnavailable(f"--nvml {spec}: clique={text!r}: expected a clique id, 0 to 2147483647")
            clique = int(text)
    if faults is None:
        faults = os.environ.get(FAULTS_ENV) or None
    if not name:
        raise NvmlUnavailable(f"--nvml {spec}: missing profile; accepted: sim:NAME ({', '.join(shipped_profiles())}) or sim:/path/profile.yaml")
    return name, faults, clique


def load_simulator(spec: str, node: str | None = None) -> SimulatedNvml:
    """An initialised simulator for "sim:NAME" or "sim:/path/profile.yaml" (optionally "?faults=FILE")."""
    name, faults, clique = parse_sim_options(spec)
    if faults is not None:
        check_faults_file(faults, spec)
    profile = load_profile(name)
    if clique is not None:
        if profile.fabric is None:
            raise NvmlUnavailable(f"--nvml {spec}: clique={clique}: profile {profile.name} has no NVLink fabric "
                                  "(use a fabric profile such as gb200-nvl)")
        profile = profile.model_copy(update={"fabric": profile.fabric.model_copy(update={"clique_id": clique})})
    sim = SimulatedNvml(profile, faults_path=faults, node=node)
    sim.nvmlInit()
    return sim


log = logging.getLogger("gpu-dra.sim")


def check_faults_file(path: str, spec: str) -> None:
    """A faults file is reported at start: an unusable one is an error, a missing one a warning (it may be written
    later; until then there are no faults)."""
    target = Path(path)
    if not target.parent.is_dir():
        raise NvmlUnavailable(f"--nvml {spec}: faults file {path}: its directory {target.parent} does not exist")
    if not target.exists():
        log.warning("event=faults-file-missing path=%s msg=\"no faults until the file is written; it is re-read on "
                    "every NVML call\"", path)
        return
    try:
        read_faults(target)
    except (ValueError, OSError) as exc:
        raise NvmlUnavailable(f"--nvml {spec}: faults file {path}: {exc}") from None
