"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's leaderelection semantics.

- A candidate tries to acquire every `retry_period`; it takes the lease when it is free (no holder) or
  when the holder has not changed the record for `lease_duration` as observed on the candidate's own
  monotonic clock (never by comparing wall-clock timestamps across machines).
- The leader renews every `retry_period`; if no renewal succeeds within `renew_deadline` it stops leading.
  `renew_deadline < lease_duration`, so a leader stops writing before anyone else may take over.
- Every write is optimistic (resourceVersion), so two candidates never both win the same lease.
- On a clean stop the leader releases: empty holder and a 1 s duration, so a standby takes over at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from gpudra.kubeapi import ApiError, Conflict, KubeApi, NotFound
from gpudra.timestamps import micro_rfc3339

log = logging.getLogger("gpudra.controller.leader")


@dataclass(frozen=True)
class LeaseTimings:
    """client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retry."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def validate(self) -> None:
        if not self.lease_duration > self.renew_deadline:
            raise ValueError(
                f"--lease-duration ({self.lease_duration}) must be greater than --renew-deadline ({self.renew_deadline})"
            )
        if not self.renew_deadline > self.retry_period:
            raise ValueError(
                f"--renew-deadline ({self.renew_deadline}) must be greater than --retry-period ({self.retry_period})"
            )
        if self.retry_period <= 0:
            raise ValueError(f"--retry-period ({self.retry_period}) must be greater than 0")




def lease_spec(
    identity: str, duration_s: int, acquire: datetime, renew: datetime, transitions: int
) -> dict[str, Any]:
    return {
        "holderIdentity": identity,
        "leaseDurationSeconds": duration_s,
        "acquireTime": micro_rfc3339(acquire),
        "renewTime": micro_rfc3339(renew),
        "leaseTransitions": transitions,
    }


class LeaderElector:
    """One candidate for one Lease. `run(stop)` blocks; `is_leader()` is safe from any thread."""

    def __init__(
        self,
        api: KubeApi,
        *,
        namespace: str,
        name: str,
        identity: str,
        timings: LeaseTimings = LeaseTimings(),
        on_change: Callable[[bool], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    ) -> None:
        timings.validate()
        self._api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timings = timings
        self._on_change = on_change
        self._monotonic = monotonic
        self._wall = wall
        self._lock = threading.Lock()
        self._observed_spec: dict[str, Any] | None = None
        self._observed_at = 0.0
        self._last_renew: float | None = None  # monotonic time of the last successful acquire/renew

    # -- state -------------------------------------------------------------------------------------

    def is_leader(self) -> bool:
        """True while the last successful renewal is younger than the renew deadline."""
        with self._lock:
            return self._last_renew is not None and self._monotonic() - self._last_renew < self.timings.renew_deadline

    def _set_leading(self, renewed_at: float | None) -> None:
        with self._lock:
            was = self._last_renew is not None
            self._last_renew = renewed_at
            now = renewed_at is not None
        if was != now:
            log.info(
                "leadership changed",
                extra={"lease": f"{self.namespace}/{self.name}", "identity": self.identity, "leader": now},
            )
            if self._on_change is not None:
                self._on_change(now)

    # -- one attempt (client-go's tryAcquireOrRenew) -----------------------------------------------

    def try_acquire_or_renew(self) -> bool:
        now_mono = self._monotonic()
        now = self._wall()
        duration = max(1, int(round(self.timings.lease_duration)))
        try:
            lease = self._api.get("Lease", self.name, namespace=self.namespace)
        except NotFound:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": lease_spec(self.identity, duration, now, now, 0),
            }
            try:
                created = self._api.create("Lease", body, namespace=self.namespace)
            except (ApiError, OSError) as err:
                log.info("lease create failed", extra={"lease": f"{self.namespace}/{self.name}", "error": str(err)})
                return False
            self._observe(created.get("spec") or {}, now_mono)
            self._set_leading(now_mono)
            return True
        except (ApiError, OSError) as err:
            log.info("lease read failed", extra={"lease": f"{self.namespace}/{self.name}", "error": str(err)})
            return False

        spec = dict(lease.get("spec") or {})
        with self._lock:
            if spec != self._observed_spec:
                self._observed_spec = spec
                self._observed_at = now_mono
            observed_at = self._observed_at
            leading = self._last_renew is not None
        holder = str(spec.get("holderIdentity") or "")
        held_for = float(spec.get("leaseDurationSeconds") or duration)
        if holder and holder != self.identity and observed_at + held_for > now_mono:
            return False  # someone else holds an unexpired lease

        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity and leading:
            acquire = spec.get("acquireTime") or micro_rfc3339(now)
        else:
            acquire = micro_rfc3339(now)
            if holder != self.identity:
                transitions += 1
        new_spec = lease_spec(self.identity, duration, now, now, transitions)
        new_spec["acquireTime"] = acquire
        body = dict(lease)
        body["spec"] = new_spec
        try:
            updated = self._api.replace("Lease", body)
        except Conflict:
            return False  # someone else wrote first; re-read on the next attempt
        except (ApiError, OSError) as err:
            log.info("lease update failed", extra={"lease": f"{self.namespace}/{self.name}", "error": str(err)})
            return False
        self._observe(updated.get("spec") or new_spec, now_mono)
        self._set_leading(now_mono)
        return True

    def _observe(self, spec: dict[str, Any], at: float) -> None:
        with self._lock:
            self._observed_spec = dict(spec)
            self._observed_at = at

    def release(self) -> bool:
        """Give the lease up (clean shutdown) so that a standby does not wait for expiry."""
        with self._lock:
            leading = self._last_renew is not None
        if not leading:
            return False
        self._set_leading(None)
        try:
            lease = self._api.get("Lease", self.name, namespace=self.namespace)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return False
            now = self._wall()
            body = dict(lease)
            body["spec"] = {
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "acquireTime": micro_rfc3339(now),
                "renewTime": micro_rfc3339(now),
                "leaseTransitions": int(spec.get("leaseTransitions") or 0),
            }
            self._api.replace("Lease", body)
        except (ApiError, OSError) as err:
            log.warning("lease release failed", extra={"lease": f"{self.namespace}/{self.name}", "error": str(err)})
            return False
        log.info("lease released", extra={"lease": f"{self.namespace}/{self.name}", "identity": self.identity})
        return True

    def abandon(self) -> None:
        """Stop leading without touching the lease (a crash, as seen by the others)."""
        self._set_leading(None)

    # -- the loop ----------------------------------------------------------------------------------

    def run(self, stop: threading.Event, *, release_on_stop: Callable[[], bool] = lambda: True) -> None:
        """Acquire, then renew until stopped or the renew deadline passes; repeat. Releases on stop."""
        try:
            while not stop.is_set():
                if self.try_acquire_or_renew():
                    self._renew_until_lost(stop)
                else:
                    stop.wait(self.timings.retry_period)
        finally:
            if release_on_stop():
                self.release()
            else:
                self.abandon()

    def _renew_until_lost(self, stop: threading.Event) -> None:
        while not stop.wait(self.timings.retry_period):
            if self.try_acquire_or_renew():
                continue
            with self._lock:
                last = self._last_renew
            if last is None or self._monotonic() - last >= self.timings.renew_deadline:
                log.warning(
                    "leadership lost: renew deadline passed",
                    extra={"lease": f"{self.namespace}/{self.name}", "identity": self.identity},
                )
                self._set_leading(None)
                return
