"""Figures every benchmark prints the same way: percentiles of latencies, the process's peak memory and the
digest of the placements made."""

from __future__ import annotations

import hashlib
import json
import os
import resource
from pathlib import Path
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def percentile(values: Sequence[float], p: float) -> float:
    """The `p`th percentile (0-100) of `values`, taken at the nearest rank; 0.0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))]


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far, in MiB (Linux reports ru_maxrss in KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of another process so far (Linux /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def placement_digest(placements: Iterable[tuple[str, str | None, Sequence[Mapping[str, Any]]]]) -> str:
    """SHA-256 over (claim, node, devices in result order) per placement, in the order given; a claim that was
    not placed has node None and no devices. Two runs placed identically exactly when their digests match."""
    h = hashlib.sha256()
    for claim, node, allocations in placements:
        devices = [[r.get("request"), r.get("driver"), r.get("pool"), r.get("device")]
                   for alloc in allocations for r in (alloc.get("devices") or {}).get("results") or []]
        h.update(json.dumps([claim, node, devices], separators=(",", ":")).encode())
        h.update(b"\n")
    return h.hexdigest()
