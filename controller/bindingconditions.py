"""The embedded scheduler's PreBind wait for device binding conditions (KEP-5007), kept apart from the placing.

kube-scheduler writes allocation, `reservedFor` and `allocationTimestamp`, then waits before binding the pod
until every binding condition of the allocated devices is True in the claim's `status.devices`. A True failure
condition or the binding timeout deallocates the pod's claims (allocation, reservedFor and status.devices are
cleared) so that the next scheduling attempt allocates again. Our scheduler works in passes, so the wait is a
verdict per pass: `WAIT` keeps what was written and leaves the pod unbound until a later pass (a claim update or
the resync starts one).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from gpudra import bindingconditions as bc
from gpudra.timestamps import rfc3339

log = logging.getLogger("gpudra.controller.bindingconditions")

BIND = "bind"
WAIT = "wait"
RETRY = "retry"
EVENT_PENDING = "BindingConditionsPending"
DEFAULT_BINDING_TIMEOUT_SECONDS = bc.DEFAULT_BINDING_TIMEOUT_SECONDS


def stamp(allocation: Mapping[str, Any], now: str | None = None) -> dict[str, Any]:
    """The allocation with `allocationTimestamp` (the base of the binding timeout) when it has none.

    kube-scheduler 1.36+ (DRADeviceBindingConditions and DRAResourceClaimDeviceStatus on) stamps every allocation
    it writes, and in PreBind stamps an allocated claim that has none, in the same status update that adds its pod
    to reservedFor. An allocation is immutable, so that update is refused (`status.allocation: ... field cannot be
    modified once set`) and the pod never binds when another allocator (a gang's) wrote one without the stamp: every
    allocation is written stamped. An API server with the gates off drops the field."""
    out = dict(allocation)
    if not out.get("allocationTimestamp"):
        out["allocationTimestamp"] = now or rfc3339()
    return out


@dataclass(frozen=True)
class Verdict:
    action: str  # BIND | WAIT | RETRY
    message: str = ""
    release: tuple[Mapping[str, Any], ...] = ()  # claims to deallocate on RETRY


def verdict(claims: Sequence[Mapping[str, Any]], *, timeout_seconds: float = bc.DEFAULT_BINDING_TIMEOUT_SECONDS,
            now: datetime | None = None) -> Verdict:
    """What to do with a pod whose claims are allocated and reserved for it."""
    now = now or datetime.now(timezone.utc)
    waiting: list[str] = []
    for claim in claims:
        state = bc.binding_state(claim)
        if state.state == bc.READY:
            continue
        name = f"{(claim.get('metadata') or {}).get('namespace')}/{(claim.get('metadata') or {}).get('name')}"
        if state.state == bc.FAILED:
            return Verdict(RETRY, f"ResourceClaim {name}: {state.message}", _conditioned(claims))
        if bc.timed_out(claim, now, timeout_seconds):
            return Verdict(RETRY, f"ResourceClaim {name}: binding conditions not met within {timeout_seconds:.0f} s "
                                  f"({state.message})", _conditioned(claims))
        waiting.append(f"ResourceClaim {name}: {state.message}")
    if waiting:
        return Verdict(WAIT, "; ".join(waiting))
    return Verdict(BIND)


def _conditioned(claims: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any], ...]:
    return tuple(c for c in claims if bc.conditioned_results(c))


def deallocate(update_status: Callable[[str, Mapping[str, Any], Callable[[dict[str, Any]], dict[str, Any] | None]], Any],
               claim: Mapping[str, Any], pod_uid: str) -> None:
    """Clear allocation, reservedFor and status.devices of a claim only this pod reserves (as the scheduler's
    PostFilter does); a claim other pods share is left alone."""
    def clear(fresh: dict[str, Any]) -> dict[str, Any] | None:
        status = dict(fresh.get("status") or {})
        others = [r for r in status.get("reservedFor") or [] if r.get("uid") != pod_uid]
        if others or "allocation" not in status:
            return None
        for key in ("allocation", "reservedFor", "devices"):
            status.pop(key, None)
        fresh["status"] = status
        return fresh

    update_status("ResourceClaim", claim, clear)
