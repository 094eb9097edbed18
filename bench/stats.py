"""Figures every benchmark prints the same way: percentiles of latencies and the process's peak memory."""

from __future__ import annotations

import resource
from collections.abc import Sequence


def percentile(values: Sequence[float], p: float) -> float:
    """The `p`th percentile (0-100) of `values`, taken at the nearest rank; 0.0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))]


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far, in MiB (Linux reports ru_maxrss in KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
