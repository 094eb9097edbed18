"""Simulator fault injection, in-process and through a JSON file another process writes.

The file holds the whole fault state:

    {"xids": [{"uuid": "GPU-...", "xid": 79}, ...],      # events, delivered once each, in order
     "lost": ["GPU-..."],                                  # GPUs that fell off the bus
     "failCalls": [{"function": "nvmlDeviceGetNumaNodeId", "uuid": null, "error": "NOT_SUPPORTED"}]}

Xid entries are an append-only log: the simulator delivers each entry once, so a writer
adds to the list rather than replacing it. `lost` and `failCalls` are state: the latest
file content wins.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pynvml

from gpudra.atomicfile import atomic_write

FAULTS_ENV = "GPU_DRA_SIM_FAULTS"


def error_names() -> list[str]:
    return sorted(n[len("NVML_ERROR_"):] for n in dir(pynvml) if n.startswith("NVML_ERROR_"))


def error_code(name: str) -> int:
    """NVML error code for a name such as NOT_SUPPORTED, GPU_IS_LOST, UNKNOWN."""
    code = getattr(pynvml, "NVML_ERROR_" + name.upper(), None)
    if not isinstance(code, int):
        raise ValueError(f"error {name!r} is not an NVML error; accepted: {', '.join(error_names())}")
    return code


@dataclass(frozen=True)
class XidFault:
    uuid: str
    xid: int


@dataclass(frozen=True)
class CallFault:
    """Make `function` raise `error` (for one GPU when uuid is set, else for every call)."""

    function: str
    error: str = "UNKNOWN"
    uuid: str | None = None

    def __post_init__(self) -> None:
        if not self.function.startswith("nvml"):
            raise ValueError(f"failCalls.function: {self.function!r} is not an NVML function name (nvml...)")
        error_code(self.error)


@dataclass(frozen=True)
class Faults:
    xids: tuple[XidFault, ...] = ()
    lost: frozenset[str] = field(default_factory=frozenset)
    fail_calls: tuple[CallFault, ...] = ()
    # GPUs whose NVLink fabric link is down (a tray's cable or switch tray): still in their clique, but
    # GpuFabricInfoV's healthMask reports the route unhealthy and bandwidth degraded.
    fabric_unhealthy: frozenset[str] = field(default_factory=frozenset)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "xids": [{"uuid": x.uuid, "xid": x.xid} for x in self.xids],
            "lost": sorted(self.lost),
            "failCalls": [{"function": c.function, "uuid": c.uuid, "error": c.error} for c in self.fail_calls],
        }
        if self.fabric_unhealthy:
            out["fabricUnhealthy"] = sorted(self.fabric_unhealthy)
        return out

    @classmethod
    def from_json(cls, data: object, source: str) -> Faults:
        if not isinstance(data, dict):
            raise ValueError(f"{source}: expected an object with xids, lost, failCalls and fabricUnhealthy")
        unknown = set(data) - {"xids", "lost", "failCalls", "fabricUnhealthy"}
        if unknown:
            raise ValueError(f"{source}: unknown field(s) {sorted(unknown)}; accepted: xids, lost, failCalls, "
                             "fabricUnhealthy")
        xids = []
        for i, x in enumerate(data.get("xids", []) or []):
            if not isinstance(x, dict) or not isinstance(x.get("uuid"), str) or not isinstance(x.get("xid"), int):
                raise ValueError(f"{source}: xids.{i}: expected {{\"uuid\": str, \"xid\": int}}")
            xids.append(XidFault(x["uuid"], x["xid"]))
        lost = data.get("lost", []) or []
        if not isinstance(lost, list) or not all(isinstance(u, str) for u in lost):
            raise ValueError(f"{source}: lost: expected a list of GPU UUIDs")
        calls = []
        for i, c in enumerate(data.get("failCalls", []) or []):
            if not isinstance(c, dict) or not isinstance(c.get("function"), str):
                raise ValueError(f"{source}: failCalls.{i}.function: expected an NVML function name")
            try:
                calls.append(CallFault(c["function"], str(c.get("error", "UNKNOWN")), c.get("uuid")))
            except ValueError as exc:
                raise ValueError(f"{source}: failCalls.{i}: {exc}") from exc
        fabric = data.get("fabricUnhealthy", []) or []
        if not isinstance(fabric, list) or not all(isinstance(u, str) for u in fabric):
            raise ValueError(f"{source}: fabricUnhealthy: expected a list of GPU UUIDs")
        return cls(tuple(xids), frozenset(lost), tuple(calls), frozenset(fabric))


def read_faults(path: str | Path) -> Faults:
    """Read a faults file; a missing file means no faults."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Faults()
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: not valid JSON: {exc}") from exc
    return Faults.from_json(data, str(p))


def write_faults(
    path: str | Path,
    *,
    xids: Iterable[tuple[str, int]] = (),
    lost: Iterable[str] = (),
    fail_calls: Iterable[CallFault] = (),
    fabric_unhealthy: Iterable[str] = (),
) -> None:
    """Write the whole fault state atomically (temp file + rename), for tests and the demo."""
    faults = Faults(
        tuple(XidFault(u, x) for u, x in xids),
        frozenset(lost),
        tuple(fail_calls),
        frozenset(fabric_unhealthy),
    )
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, (json.dumps(faults.to_json(), indent=2) + "\n").encode())


def append_xid(path: str | Path, uuid: str, xid: int) -> None:
    """Add one Xid event to a faults file, keeping what is there (a read-modify-write by one writer)."""
    current = read_faults(path)
    write_faults(
        path,
        xids=[(x.uuid, x.xid) for x in current.xids] + [(uuid, xid)],
        lost=current.lost,
        fail_calls=current.fail_calls,
        fabric_unhealthy=current.fabric_unhealthy,
    )
