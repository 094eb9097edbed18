"""Graceful deletion, as kube-apiserver's generic registry (BeforeDelete) and pod strategy (CheckGracefulDelete)
decide it.

A pod bound to a node and not yet terminal is not removed when it is deleted: it gets a deletionTimestamp (now
plus its grace period) and deletionGracePeriodSeconds, and stays (Terminating) until its kubelet has stopped its
containers and deletes it again with a grace period of 0. A later delete may only shorten the grace period; 0
(`kubectl delete --force --grace-period=0`) removes it at once. Every other kind, and a pod that never ran or
has finished, is deleted immediately (its finalizers permitting)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from collections.abc import Mapping

from gpudra.timestamps import parse_rfc3339, rfc3339

DEFAULT_POD_GRACE_SECONDS = 30


@dataclass(frozen=True)
class Decision:
    """What a delete does to a stored object: `metadata` to store (None: nothing changes) and whether the object
    is removed now (finalizers still hold it when it has some)."""

    metadata: dict[str, Any] | None
    remove: bool


def pod_grace_period(pod: Mapping[str, Any], requested: int | None) -> int:
    """The grace period a pod is deleted with: the request's, else its spec's; 0 when it was never scheduled or
    has finished; a negative request means 1."""
    spec = pod.get("spec") or {}
    if requested is not None:
        period = requested
    else:
        configured = spec.get("terminationGracePeriodSeconds")
        period = int(configured) if configured is not None else DEFAULT_POD_GRACE_SECONDS
    if not spec.get("nodeName") or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        period = 0
    return 1 if period < 0 else period


def decide(kind: str, obj: Mapping[str, Any], options: Mapping[str, Any], now: datetime | None = None) -> Decision:
    """The effect of deleting `obj` (of `kind`) with DeleteOptions `options`."""
    meta = obj.get("metadata") or {}
    requested = options.get("gracePeriodSeconds")
    requested = int(requested) if requested is not None else None
    moment = now or datetime.now(timezone.utc)
    if meta.get("deletionTimestamp"):
        current = meta.get("deletionGracePeriodSeconds")
        if not current:
            return Decision(None, True)  # already due (or a finalizer-held deletion): remove, finalizers permitting
        if requested is None or requested >= int(current):
            return Decision(None, False)  # a pending graceful deletion is only ever shortened
        started = (parse_rfc3339(meta["deletionTimestamp"]) or moment) - timedelta(seconds=int(current))
        shortened = max(requested, 0)
        return Decision({**meta, "deletionTimestamp": rfc3339(started + timedelta(seconds=shortened)),
                         "deletionGracePeriodSeconds": shortened}, shortened == 0)
    if kind != "Pod":
        return Decision(None, True)
    period = pod_grace_period(obj, requested)
    marked = {**meta, "deletionTimestamp": rfc3339(moment + timedelta(seconds=period)),
              "deletionGracePeriodSeconds": period}
    if meta.get("generation"):
        marked["generation"] = int(meta["generation"]) + 1
    return Decision(marked, period == 0)
