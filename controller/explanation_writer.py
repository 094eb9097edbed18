"""Tells users why a pod waits: Events on the pod and an explanation annotation on its claims.

resource.k8s.io/v1 ResourceClaimStatus has no `conditions` field (only allocation, reservedFor and per-device
status), so the claim side of an explanation is the annotation `<driver-name>/explanation`; the pod side is a
core/v1 Event (reason `GpuDraUnschedulable`, or `GpuDraQuotaExceeded` for a namespace quota), which
`kubectl describe pod` shows.

Rate limiting: one Event object per (pod, reason). A changed message is posted at once; the same message is
re-posted (count + 1, lastTimestamp) at most once per `repeat_interval`. Annotations are written only when the
text changes and removed when the claim gets allocated.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from controller import objects as o
from controller.metrics import ControllerMetrics
from controller.objects import Obj
from controller.writes import Writer
from gpudra.timestamps import rfc3339
from gpudra.kubeapi import ApiError

log = logging.getLogger("gpudra.controller.explanation_writer")

COMPONENT = "gpu-dra-controller"
REASON_UNSCHEDULABLE = "GpuDraUnschedulable"
REASON_QUOTA = "GpuDraQuotaExceeded"
REASON_GANG_WAITING = "GpuDraGangWaiting"
REASON_SCHEDULED = "Scheduled"
# Annotations are capped well below the 256 KiB total so one long explanation cannot make a claim unwritable.
MAX_ANNOTATION_CHARS = 4096
MAX_EVENT_MESSAGE_CHARS = 1024


def explanation_annotation(driver_name: str) -> str:
    return f"{driver_name}/explanation"


def event_name(pod: Mapping[str, Any], reason: str) -> str:
    """One stable Event name per (pod object, reason), so repeats update instead of piling up."""
    digest = hashlib.sha256(f"{o.uid(pod)}/{reason}".encode()).hexdigest()[:12]
    return f"{o.name(pod)[:240]}.{digest}"


def truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class _Posted:
    message: str
    at: float  # monotonic
    count: int


def should_post(previous: _Posted | None, message: str, now: float, repeat_interval: float) -> bool:
    if previous is None or previous.message != message:
        return True
    return now - previous.at >= repeat_interval


class ExplanationWriter:
    def __init__(
        self,
        writer: Writer,
        metrics: ControllerMetrics,
        *,
        driver_name: str,
        identity: str,
        clock: Callable[[], float],
        wall: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
        repeat_interval: float = 60.0,
    ) -> None:
        self._writer = writer
        self._metrics = metrics
        self.annotation = explanation_annotation(driver_name)
        # kube-scheduler reports as `<component>-<host>`; our identity is the leader election's `<host>_<suffix>`.
        self._host = identity.partition("_")[0]
        self._clock = clock
        self._wall = wall
        self._repeat = repeat_interval
        self._posted: dict[tuple[str, str], _Posted] = {}
        # The scheduler posts Scheduled events from its write threads (sim.roles.inflight).
        self._posted_lock = threading.Lock()
        self._read_denied_logged = False

    # -- events ------------------------------------------------------------------------------------

    def event(self, pod: Mapping[str, Any], reason: str, message: str, *, warning: bool = True,
              component: str = COMPONENT, action: str | None = None, related: Mapping[str, Any] | None = None) -> bool:
        """Post (or refresh) the Event; returns whether anything was written. `component`: who reports it (the
        embedded scheduler reports as kube-scheduler does, `default-scheduler`); `related`: a second pod the Event
        is about (a preemptor)."""
        message = truncate(message, MAX_EVENT_MESSAGE_CHARS)
        memo_key = (o.uid(pod) or o.key(pod), reason)
        now = self._clock()
        with self._posted_lock:
            previous = self._posted.get(memo_key)
        if not should_post(previous, message, now, self._repeat):
            return False
        count = 1 if previous is None else previous.count + 1
        stamp = rfc3339(self._wall())
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event_name(pod, reason), "namespace": o.namespace(pod) or "default"},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": o.name(pod),
                "namespace": o.namespace(pod),
                "uid": o.uid(pod),
            },
            "reason": reason,
            "message": message,
            "type": "Warning" if warning else "Normal",
            "source": {"component": component},
            "reportingComponent": component,
            "reportingInstance": f"{component}-{self._host}",
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": count,
        }
        if action is not None:
            body["action"] = action
        if related is not None:
            body["related"] = {"apiVersion": "v1", "kind": "Pod", "name": o.name(related),
                               "namespace": o.namespace(related), "uid": o.uid(related)}
        written = self._upsert_event(body, likely_new=previous is None)
        if written:
            with self._posted_lock:
                self._posted[memo_key] = _Posted(message, now, count)
            self._metrics.events.labels(reason=reason).inc()
            log.info("event posted", extra={"pod": o.key(pod), "reason": reason, "eventMessage": message})
        return written

    def _upsert_event(self, body: Obj, *, likely_new: bool) -> bool:
        # An event this instance has not posted is usually new: create first and read only when it already
        # exists (an earlier incarnation posted it), which saves a GET per scheduled pod.
        if likely_new and self._writer.create("Event", body) is not None:
            return True
        try:
            existing = self._writer.read("Event", body)
        except ApiError as err:
            # Typically 403 (a deployment whose RBAC grants create/patch but not get on events). Reading only
            # served to carry the stored count on; a merge patch with our own count refreshes the event
            # without it, as client-go's event recorder does. One log line, not one per event and pass.
            if not self._read_denied_logged:
                self._read_denied_logged = True
                log.warning(
                    "cannot read events; refreshing them by patch from now on (grant get on events)",
                    extra={"event": o.key(body), "status": err.status, "error": str(err)},
                )
            # Without memory of the event (a restarted controller) our count means nothing: the stored one stays.
            patched = self._patch_event(body, with_count=not likely_new)
            return patched or (not likely_new and self._writer.create("Event", body) is not None)
        if existing is None:
            return False if likely_new else self._writer.create("Event", body) is not None

        def refresh(fresh: Obj) -> Obj:
            fresh["message"] = body["message"]
            fresh["lastTimestamp"] = body["lastTimestamp"]
            fresh["count"] = int(fresh.get("count") or 1) + 1
            fresh["type"] = body["type"]
            return fresh

        try:
            return self._writer.update("Event", existing, refresh) is not None
        except ApiError as err:
            log.warning("event update failed", extra={"event": o.key(body), "error": str(err)})
            return False

    def _patch_event(self, body: Obj, *, with_count: bool) -> bool:
        patch = {k: body[k] for k in ("message", "lastTimestamp", "type") + (("count",) if with_count else ())}
        return self._writer.patch("Event", body, patch) is not None

    # -- claim annotations -------------------------------------------------------------------------

    def annotate(self, claims: Iterable[Mapping[str, Any]], message: str) -> None:
        text = truncate(message, MAX_ANNOTATION_CHARS)
        for claim in claims:
            if o.allocation(claim) is not None or o.annotations(claim).get(self.annotation) == text:
                continue
            self._writer.patch("ResourceClaim", claim, {"metadata": {"annotations": {self.annotation: text}}})

    def clear(self, claims: Iterable[Mapping[str, Any]]) -> None:
        for claim in claims:
            if self.annotation in o.annotations(claim):
                self._writer.patch("ResourceClaim", claim, {"metadata": {"annotations": {self.annotation: None}}})

    def forget_pods(self, live_uids: Iterable[str]) -> None:
        """Drop rate-limit memory of pods that are gone."""
        live = set(live_uids)
        with self._posted_lock:
            for memo_key in [k for k in self._posted if k[0] not in live]:
                del self._posted[memo_key]

    def forget(self, pod: Mapping[str, Any], reason: str) -> None:
        """Forget one (pod, reason), so that the next occurrence is posted at once (the reason came back)."""
        with self._posted_lock:
            self._posted.pop((o.uid(pod) or o.key(pod), reason), None)
