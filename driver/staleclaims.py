"""Periodic stale-claim cleanup: claims this node prepared that no pod here can use any more are unprepared by
the agent itself, as NVIDIA's plugin does.

The kubelet unprepares a claim when the last pod using it is gone, but not always: a force-deleted pod, a kubelet
that lost its state, a claim deleted while the agent was down. A prepared claim is stale when, read from the API,
- it is gone, or a claim of that name now has another UID (deleted and created again),
- it is no longer allocated, or its allocation has no device of this driver and pool,
- or it is reserved for nobody (every pod that used it has finished; the binder prepares ahead only after the
  scheduler reserved the claim, so a claim prepared ahead is reserved too).
A claim must look stale on two consecutive sweeps before it is unprepared, so that a read racing a change in
flight (an allocation being written) does not undo a claim in use. Unprepare is the same as the kubelet's: MIG
instances it created are destroyed, the CDI spec goes, the ledger is released.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from driver.checkpoint import ClaimPhase
from driver.prepare import ClaimRef, Preparer

log = logging.getLogger("gpu-dra.staleclaims")

DEFAULT_INTERVAL_SECONDS = 600.0


def stale_reason(claim: Mapping[str, Any] | None, uid: str, driver: str, pool: str) -> str:
    """Why a claim prepared here (UID `uid`) is stale, "" when a pod here may still use it."""
    if claim is None:
        return "deleted from the API"
    if (claim.get("metadata") or {}).get("uid") != uid:
        return "replaced by a claim of the same name with another UID"
    status = claim.get("status") or {}
    allocation = status.get("allocation")
    if not allocation:
        return "no longer allocated"
    results = (allocation.get("devices") or {}).get("results") or []
    if not any(r.get("driver") == driver and r.get("pool") == pool for r in results):
        return f"its allocation has no device of driver {driver} in pool {pool}"
    if not status.get("reservedFor"):
        return "reserved for no pod"
    return ""


@dataclass
class SweepReport:
    unprepared: list[str] = field(default_factory=list)
    suspected: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


class StaleClaimSweeper:
    def __init__(self, get_claim: Callable[[str, str], Mapping[str, Any] | None], preparer: Preparer,
                 driver_name: str, pool_name: str, *, interval: float = DEFAULT_INTERVAL_SECONDS) -> None:
        self._get = get_claim
        self.preparer = preparer
        self.driver = driver_name
        self.pool = pool_name
        self.interval = interval
        self._suspects: dict[str, str] = {}  # uid -> reason seen on the previous sweep
        self._thread: threading.Thread | None = None

    def sweep_once(self) -> SweepReport:
        report = SweepReport()
        # Half-prepared records are the start-up recovery's (rolled back or finished there), not ours; those kept
        # for the kubelet's retry (their MPS daemon was late) are: a kubelet whose prepare failed never unprepares.
        records = [r for r in self.preparer.checkpoint.state.claims.values()
                   if r.phase is ClaimPhase.PREPARE_COMPLETED or r.mps_kept]
        suspects: dict[str, str] = {}
        for record in records:
            label = f"{record.namespace}/{record.name}"
            try:
                claim = self._get(record.namespace, record.name)
            except Exception as exc:  # noqa: BLE001 - the API away: nothing is judged stale on a failed read
                log.warning("event=stale-check-failed claim=%s error=%r", label, str(exc))
                if record.uid in self._suspects:
                    suspects[record.uid] = self._suspects[record.uid]
                continue
            reason = stale_reason(claim, record.uid, self.driver, self.pool)
            if not reason:
                continue
            if record.uid not in self._suspects:
                suspects[record.uid] = reason
                report.suspected.append(label)
                continue
            errors = self.preparer.unprepare([ClaimRef(uid=record.uid, namespace=record.namespace, name=record.name)])
            if errors.get(record.uid):
                suspects[record.uid] = reason  # tried again next sweep
                report.failed.append(label)
                log.error("event=stale-claim-unprepare-failed claim=%s uid=%s error=%r", label, record.uid,
                          errors[record.uid])
            else:
                report.unprepared.append(label)
                log.warning("event=stale-claim-unprepared claim=%s uid=%s reason=%r", label, record.uid, reason)
        self._suspects = suspects
        return report

    def start(self, stop: threading.Event) -> None:
        self._thread = threading.Thread(target=self._run, args=(stop,), name="stale-claims", daemon=True)
        self._thread.start()

    def join(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval):
            try:
                self.sweep_once()
            except Exception:  # noqa: BLE001 - the next sweep tries again
                log.exception("event=stale-sweep-failed")
