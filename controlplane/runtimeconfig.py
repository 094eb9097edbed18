"""kube-apiserver's `--runtime-config`: which API group versions (and resources) are served.

As in kube-apiserver (k8s.io/apiserver resourceconfig): GA versions are served by default, beta and alpha
versions are not (every beta API since 1.24 starts disabled); `api/all`, `api/ga`, `api/beta` and `api/alpha`
switch a whole stage, `GROUP/VERSION` one group version (`v1` or `api/v1` for the core group),
`GROUP/VERSION/RESOURCE` one resource; later, more specific keys win over broader ones. A value is `true`,
`false` or empty (true).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_STAGE = re.compile(r"^v\d+(?P<stage>alpha|beta)?\d*$")
_STAGE_KEYS = ("api/ga", "api/beta", "api/alpha")


class RuntimeConfigError(ValueError):
    """A `--runtime-config` value kube-apiserver would refuse; the message names the entry."""


def stage(version: str) -> str:
    """"ga", "beta" or "alpha" for a Kubernetes API version name."""
    m = _STAGE.match(version)
    return (m.group("stage") or "ga") if m else "ga"


@dataclass(frozen=True)
class RuntimeConfig:
    """Parsed `--runtime-config` entries; `serves` answers for one resource of one group version."""

    entries: tuple[tuple[str, bool], ...] = ()

    @classmethod
    def parse(cls, specs: str | list[str] | None, known: set[tuple[str, str]] | None = None) -> RuntimeConfig:
        """`specs`: comma-separated `key=value` lists (one string or several flags). `known`, the (group,
        version) pairs the server has, makes a key naming any other group version an error."""
        items: list[tuple[str, bool]] = []
        for spec in [specs] if isinstance(specs, str) else (specs or []):
            for item in filter(None, (s.strip() for s in spec.split(","))):
                key, _, raw = item.partition("=")
                key = key.strip().strip("/")
                raw = raw.strip().lower() or "true"
                if raw not in ("true", "false"):
                    raise RuntimeConfigError(f"--runtime-config {item!r}: invalid value {raw!r} (accepted: true, false)")
                if not key:
                    raise RuntimeConfigError(f"--runtime-config {item!r}: the key is empty")
                if key not in ("api/all", *_STAGE_KEYS) and known is not None:
                    group, version, _ = _split(key)
                    if (group, version) not in known:
                        served = ", ".join(sorted(f"{g}/{v}" if g else v for g, v in known))
                        raise RuntimeConfigError(f"--runtime-config {item!r}: unknown API group version "
                                                 f"{group + '/' if group else ''}{version}; this server has: {served}")
                items.append((key, raw == "true"))
        return cls(tuple(items))

    def serves(self, group: str, version: str, plural: str) -> bool:
        on = stage(version) == "ga"
        # Broadest first, so that a more specific entry decides.
        for rank in range(4):
            for key, value in self.entries:
                if _rank(key) == rank and _applies(key, rank, group, version, plural):
                    on = value
        return on


def _applies(key: str, rank: int, group: str, version: str, plural: str) -> bool:
    if rank == 0:
        return True
    if rank == 1:
        return key == f"api/{stage(version)}"
    return _split(key) == (group, version, plural if rank == 3 else "")


def _rank(key: str) -> int:
    if key == "api/all":
        return 0
    if key in _STAGE_KEYS:
        return 1
    return 3 if _split(key)[2] else 2


def _split(key: str) -> tuple[str, str, str]:
    """(group, version, resource) of a `--runtime-config` key; the core group is "" (`v1`, `api/v1`)."""
    parts = key.split("/")
    if parts[0] == "api":
        parts = parts[1:]
    if len(parts) == 1:
        return "", parts[0], ""
    if len(parts) == 2 and _STAGE.match(parts[0]):
        return "", parts[0], parts[1]  # a core resource: v1/pods
    if len(parts) == 2:
        return parts[0], parts[1], ""
    return parts[0], parts[1], "/".join(parts[2:])
