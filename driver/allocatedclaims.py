"""Which of this node's devices the scheduler has allocated to ResourceClaims of our driver, from the API server.

The ledger (driver.checkpoint) only learns of a DRA claim when the kubelet prepares it. Between the scheduler writing
a claim's allocation and NodePrepareResources, the kubelet's device manager could still hand the same GPU to a
legacy pod, and the later prepare would be refused. The device plugin shim therefore also treats the devices of
claims *allocated* to this node's pool as held by DRA, for reporting only; the ledger stays the authority for holds.

Allocation fields cannot be selected on by the API server (no field or label selector reaches them), so every claim
is listed, then watched, and filtered in memory; a periodic relist (`resync_seconds`) repairs anything a watch
might miss. When the API server cannot be reached the view is emptied (the shim falls back to the ledger alone) and
the failure is logged once until the API answers again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

log = logging.getLogger("gpu-dra.allocatedclaims")

DEFAULT_RESYNC_SECONDS = 60.0
# After a failed list or watch, how long to wait before trying the API server again.
RETRY_SECONDS = 5.0

ClaimKey = tuple[str, str]  # (namespace, name)
LIST_PAGE_SIZE = 500


def claim_label(claim: Mapping[str, Any]) -> str:
    """`ResourceClaim <namespace>/<name> (uid <uid>)`, the form Allocate errors name a claim in."""
    meta = claim.get("metadata") or {}
    return f"ResourceClaim {meta.get('namespace') or ''}/{meta.get('name') or ''} (uid {meta.get('uid') or '?'})"


def allocated_devices(claim: Mapping[str, Any], driver_name: str, pool: str) -> frozenset[str]:
    """Names of the devices of `pool` the claim's allocation gives it from `driver_name`; tolerant of bad input."""
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    if not isinstance(results, list):
        return frozenset()
    return frozenset(
        str(r["device"])
        for r in results
        if isinstance(r, Mapping) and r.get("driver") == driver_name and r.get("pool") == pool and r.get("device")
    )


def devices_by_claim(
    claims: Iterable[Mapping[str, Any]], driver_name: str, pool: str
) -> dict[ClaimKey, tuple[str, frozenset[str]]]:
    """(namespace, name) -> (claim label, allocated device names) for the claims allocated devices of `pool`."""
    out: dict[ClaimKey, tuple[str, frozenset[str]]] = {}
    for claim in claims:
        names = allocated_devices(claim, driver_name, pool)
        if names:
            meta = claim.get("metadata") or {}
            out[(str(meta.get("namespace") or ""), str(meta.get("name") or ""))] = (claim_label(claim), names)
    return out


def claims_by_device(by_claim: Mapping[ClaimKey, tuple[str, frozenset[str]]]) -> dict[str, tuple[str, ...]]:
    """Device name -> the labels of the claims allocated it (sorted)."""
    out: dict[str, list[str]] = {}
    for label, names in by_claim.values():
        for name in names:
            out.setdefault(name, []).append(label)
    return {name: tuple(sorted(labels)) for name, labels in out.items()}


class AllocatedClaims:
    """The allocated devices of this node's pool, kept current by list-then-watch of all ResourceClaims.

    `snapshot()` is device name -> claim labels; `on_change` is called (from the watch thread) whenever that
    mapping changes. `resync()` lists once, synchronously; `start()` runs the watch loop on a thread."""

    def __init__(
        self, api: Any, driver_name: str, node_name: str, *, resync_seconds: float = DEFAULT_RESYNC_SECONDS,
        retry_seconds: float = RETRY_SECONDS,
    ) -> None:
        self._api = api
        self.driver_name = driver_name
        self.pool = node_name  # our driver publishes one pool per node, named after the node
        self.resync_seconds = resync_seconds
        self.retry_seconds = retry_seconds
        self._lock = threading.Lock()
        self._claims: dict[ClaimKey, tuple[str, frozenset[str]]] = {}
        self._view: dict[str, tuple[str, ...]] = {}
        self._unreachable = False
        self._on_change: Callable[[], None] = lambda: None
        self._stop = threading.Event()
        self._watch_stop: threading.Event | None = None
        self._rv: str | None = None
        self._thread: threading.Thread | None = None

    def snapshot(self) -> dict[str, tuple[str, ...]]:
        with self._lock:
            return dict(self._view)

    @property
    def reachable(self) -> bool:
        with self._lock:
            return not self._unreachable

    # ---- updates -------------------------------------------------------------------------------------------

    def _set(self, claims: dict[ClaimKey, tuple[str, frozenset[str]]]) -> None:
        view = claims_by_device(claims)
        with self._lock:
            self._claims = claims
            changed = view != self._view
            self._view = view
        if changed:
            self._notify()

    def _apply(self, event: str, claim: Mapping[str, Any]) -> None:
        meta = claim.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        with self._lock:
            claims = dict(self._claims)
        claims.pop(key, None)
        if event != "DELETED":
            claims.update(devices_by_claim([claim], self.driver_name, self.pool))
        self._set(claims)

    def _notify(self) -> None:
        try:
            self._on_change()
        except Exception:  # a failing consumer must not stop the watch
            log.exception("event=allocated-claims-callback-failed")

    def _mark(self, reachable: bool, error: Exception | None = None) -> None:
        with self._lock:
            was_unreachable, self._unreachable = self._unreachable, not reachable
        if not reachable and not was_unreachable:
            log.warning(
                "event=claims-unavailable node=%s error=%r fallback=ledger-only (GPUs of claims allocated but not yet "
                "prepared are not withheld from the device plugin until the API server answers)", self.pool, str(error)
            )
            self._set({})
        elif reachable and was_unreachable:
            log.info("event=claims-available node=%s", self.pool)

    def resync(self) -> bool:
        """List every ResourceClaim now and replace the view; False (view emptied) when the API fails."""
        found: dict[ClaimKey, tuple[str, frozenset[str]]] = {}
        rv = ""
        try:
            # Page by page, keeping only this node's: at 50,000 claims a whole list held at once costs the agent
            # about 500 MiB (`gpu-dra bench memory`), a page of LIST_PAGE_SIZE a few MiB.
            for page, page_rv in self._api.list_pages("ResourceClaim", limit=LIST_PAGE_SIZE):
                found.update(devices_by_claim(page, self.driver_name, self.pool))
                rv = page_rv
        except Exception as exc:  # any failure of the API means: ledger only
            self._mark(False, exc)
            return False
        with self._lock:
            self._rv = str(rv) if rv else None
        self._set(found)
        self._mark(True)
        return True

    # ---- the watch loop --------------------------------------------------------------------------------------

    def start(self, on_change: Callable[[], None] = lambda: None) -> None:
        self._on_change = on_change
        self._thread = threading.Thread(target=self._run, name="allocated-claims", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            watch_stop = self._watch_stop
        if watch_stop is not None:
            watch_stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.resync():
                self._stop.wait(self.retry_seconds)
                continue
            self._watch_until_resync()

    def _watch_until_resync(self) -> None:
        """Follow the watch until the next resync is due (a timer ends it), `stop()`, or an API failure."""
        stop = threading.Event()
        with self._lock:
            self._watch_stop = stop
            rv = self._rv
        if self._stop.is_set():
            return
        timer = threading.Timer(self.resync_seconds, stop.set)
        timer.daemon = True
        timer.start()
        try:
            # The resync just listed: resume from its resourceVersion rather than replaying every claim as ADDED.
            for event, claim in self._api.watch("ResourceClaim", stop=stop, resource_version=rv):
                if stop.is_set():
                    break
                self._apply(event, claim)
        except Exception as exc:  # any failure of the API means: ledger only until the next successful list
            self._mark(False, exc)
            self._stop.wait(self.retry_seconds)
        finally:
            timer.cancel()
            with self._lock:
                self._watch_stop = None
