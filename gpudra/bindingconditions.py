"""Device binding conditions (KEP-5007, DRADeviceBindingConditions: alpha 1.34, beta and on from 1.36).

A device that needs work after allocation before its pod may bind carries `bindingConditions` and
`bindingFailureConditions` in its ResourceSlice; the allocator copies both into the allocation result. The
scheduler then writes the allocation and `reservedFor`, and waits (PreBind) until, in the claim's
`status.devices` entry of that device (matched by driver, pool and device; the share ID is not compared), every
binding condition is True. A True failure condition, or `allocation.allocationTimestamp` plus the binding timeout
(600 s by default) passing, makes it deallocate the claim and schedule the pod again.

gpu-dra uses it for on-demand MIG on partitionable GPUs: the node agent creates the MIG instance once the claim
is allocated to one of its placements and reserved, then reports `<driver>/mig-ready` (or `<driver>/mig-failed`).
This module holds what both sides read and write; it is pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

DEFAULT_BINDING_TIMEOUT_SECONDS = 600.0  # DynamicResourcesArgs.bindingTimeout default

READY = "ready"
PENDING = "pending"
FAILED = "failed"


def mig_conditions(driver: str) -> tuple[list[str], list[str]]:
    """(bindingConditions, bindingFailureConditions) of an on-demand MIG placement."""
    return [f"{driver}/mig-ready"], [f"{driver}/mig-failed"]




def _results(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    alloc = ((claim.get("status") or {}).get("allocation")) or {}
    return [r for r in ((alloc.get("devices") or {}).get("results") or []) if isinstance(r, Mapping)]


def conditioned_results(claim: Mapping[str, Any], driver: str | None = None) -> list[Mapping[str, Any]]:
    """Allocation results that carry binding conditions (of `driver` only, when given)."""
    return [r for r in _results(claim) if r.get("bindingConditions") and (driver is None or r.get("driver") == driver)]


def device_status(claim: Mapping[str, Any], result: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The claim's status.devices entry for an allocation result (driver, pool, device; shareID not compared)."""
    for entry in (claim.get("status") or {}).get("devices") or []:
        if (entry.get("driver"), entry.get("pool"), entry.get("device")) == (
                result.get("driver"), result.get("pool"), result.get("device")):
            return entry
    return None


def _true(entry: Mapping[str, Any] | None, condition: str) -> bool:
    if entry is None:
        return False
    return any(c.get("type") == condition and c.get("status") == "True" for c in entry.get("conditions") or [])


@dataclass(frozen=True)
class BindingState:
    state: str  # READY (also: nothing to wait for) | PENDING | FAILED
    message: str = ""


def binding_state(claim: Mapping[str, Any], driver: str | None = None) -> BindingState:
    """The scheduler's isClaimReadyForBinding for one claim."""
    waiting: list[str] = []
    for r in conditioned_results(claim, driver):
        entry = device_status(claim, r)
        device = f"{r.get('driver')}/{r.get('pool')}/{r.get('device')}"
        for failure in r.get("bindingFailureConditions") or []:
            if _true(entry, failure):
                detail = next((c.get("message") for c in entry.get("conditions") or []  # type: ignore[union-attr]
                               if c.get("type") == failure and c.get("message")), "")
                return BindingState(FAILED, f"device {device}: binding failure condition {failure} is true"
                                            + (f": {detail}" if detail else ""))
        missing = [c for c in r.get("bindingConditions") or [] if not _true(entry, c)]
        if missing:
            waiting.append(f"{device} ({', '.join(missing)})")
    if waiting:
        return BindingState(PENDING, "waiting for binding conditions of " + "; ".join(waiting))
    return BindingState(READY)


def timed_out(claim: Mapping[str, Any], now: datetime, timeout_seconds: float) -> bool:
    """allocationTimestamp + timeout has passed (a claim without a timestamp never times out)."""
    stamp = (((claim.get("status") or {}).get("allocation")) or {}).get("allocationTimestamp")
    if not stamp:
        return False
    try:
        at = datetime.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return False
    return (now - at).total_seconds() > timeout_seconds


def condition(kind: str, status: bool, reason: str, message: str, now: str) -> dict[str, Any]:
    """A metav1.Condition for a status.devices entry."""
    return {"type": kind, "status": "True" if status else "False", "reason": reason, "message": message[:32768],
            "lastTransitionTime": now}


def merge_device_statuses(current: Sequence[Mapping[str, Any]], ours: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """status.devices with `ours` replacing the entries of the same (driver, pool, device, shareID)."""
    def key(e: Mapping[str, Any]) -> tuple[Any, ...]:
        return e.get("driver"), e.get("pool"), e.get("device"), e.get("shareID")

    replaced = {key(e) for e in ours}
    return [dict(e) for e in current if key(e) not in replaced] + [dict(e) for e in ours]
