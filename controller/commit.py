"""Writing allocations the way kube-scheduler does, and undoing them.

1. metadata: add the finalizer `resource.kubernetes.io/delete-protection` (and drop a stale explanation)
   with an optimistic update, so the claim cannot vanish while it holds devices;
2. status: write `status.allocation` (and `reservedFor` when a pod consumes it) with an optimistic update.
Both steps re-check on the fresh object that nobody else allocated the claim meanwhile; on a conflict the
Writer re-reads and re-applies, so a concurrent writer is never overwritten.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from controller import bindingconditions
from controller import objects as o
from controller.objects import DELETE_PROTECTION_FINALIZER, Obj
from controller.writes import Writer

log = logging.getLogger("gpudra.controller.commit")

MAX_RESERVED_FOR = 256  # resourceapi.ResourceClaimReservedForMaxSize


def pod_reference(pod: Mapping[str, Any]) -> dict[str, str]:
    """The reservedFor entry of a consumer: a pod, or a PodGroup sharing the claim (sim.roles.podgroupclaims)."""
    if pod.get("kind") == "PodGroup":
        return {"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": o.name(pod), "uid": o.uid(pod)}
    return {"resource": "pods", "name": o.name(pod), "uid": o.uid(pod)}


def used_devices(claims: Iterable[Mapping[str, Any]], exclude: Iterable[str] = ()) -> set[tuple[str, str, str]]:
    """Devices held by allocated claims (by key), except the listed claims."""
    skip = set(exclude)
    used: set[tuple[str, str, str]] = set()
    for claim in claims:
        if o.key(claim) not in skip:
            used.update(o.allocated_devices(claim))
    return used


def allocation_devices(allocation: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    return o.allocated_devices({"status": {"allocation": allocation}})


class AllocationCommitter:
    def __init__(self, writer: Writer, *, drop_annotations: Iterable[str] = (), add_annotations: Mapping[str, str] | None = None) -> None:
        self._writer = writer
        self._drop = tuple(drop_annotations)
        self._add = dict(add_annotations or {})

    def allocate(
        self,
        claim: Mapping[str, Any],
        allocation: Mapping[str, Any],
        consumer: Mapping[str, Any] | None,
        annotations: Mapping[str, str] | None = None,
    ) -> Obj | None:
        """Finalizer, then allocation (+ reservation); None when the claim was taken or is gone."""
        taken = False
        extra = {**self._add, **(annotations or {})}

        def protect(fresh: Obj) -> Obj | None:
            nonlocal taken
            if o.allocation(fresh) is not None or o.deleting(fresh):
                taken = True
                return None
            md = fresh.setdefault("metadata", {})
            changed = False
            if DELETE_PROTECTION_FINALIZER not in o.finalizers(fresh):
                md["finalizers"] = [*o.finalizers(fresh), DELETE_PROTECTION_FINALIZER]
                changed = True
            ann = dict(o.annotations(fresh))
            for key in self._drop:
                if key in ann:
                    del ann[key]
                    changed = True
            for key, value in extra.items():
                if ann.get(key) != value:
                    ann[key] = value
                    changed = True
            if changed:
                md["annotations"] = ann
            return fresh if changed else None

        protected = self._writer.update("ResourceClaim", claim, protect)
        if taken:
            return None
        base = protected if protected is not None else claim

        def write(fresh: Obj) -> Obj | None:
            nonlocal taken
            if o.allocation(fresh) is not None or o.deleting(fresh) or DELETE_PROTECTION_FINALIZER not in o.finalizers(fresh):
                taken = True
                return None
            status = dict(fresh.get("status") or {})
            status["allocation"] = bindingconditions.stamp(allocation)
            if consumer is not None:
                status["reservedFor"] = [*o.reserved_for(fresh), pod_reference(consumer)]
            fresh["status"] = status
            return fresh

        stored = self._writer.update_status("ResourceClaim", base, write)
        if stored is None or taken:
            return None
        log.info(
            "claim allocated",
            extra={
                "claim": o.key(stored),
                "devices": ",".join("/".join(d) for d in o.allocated_devices(stored)),
                "pod": o.key(consumer) if consumer is not None else "",
            },
        )
        return stored

    def reserve(self, claim: Mapping[str, Any], consumer: Mapping[str, Any]) -> Obj | None:
        """Add the pod to an allocated claim's reservedFor; None when it cannot (deallocated, full)."""
        refused = False
        ref = pod_reference(consumer)

        def add(fresh: Obj) -> Obj | None:
            nonlocal refused
            if o.allocation(fresh) is None or o.deleting(fresh):
                refused = True
                return None
            current = o.reserved_for(fresh)
            if any(r.get("uid") == ref["uid"] for r in current):
                return None
            if len(current) >= MAX_RESERVED_FOR:
                refused = True
                return None
            fresh.setdefault("status", {})["reservedFor"] = [*current, ref]
            return fresh

        stored = self._writer.update_status("ResourceClaim", claim, add)
        if refused:
            return None
        return stored if stored is not None else self._writer.read("ResourceClaim", claim)

    def undo(self, claim: Mapping[str, Any], consumer: Mapping[str, Any] | None, *, deallocate: bool) -> None:
        """Take back what allocate/reserve wrote (another step of the same placement failed)."""
        consumer_uid = o.uid(consumer) if consumer is not None else None

        def revert(fresh: Obj) -> Obj | None:
            status = dict(fresh.get("status") or {})
            reservations = [r for r in o.reserved_for(fresh) if r.get("uid") != consumer_uid]
            changed = len(reservations) != len(o.reserved_for(fresh))
            if reservations:
                status["reservedFor"] = reservations
            else:
                status.pop("reservedFor", None)
            if deallocate and not reservations and "allocation" in status:
                status.pop("allocation")
                changed = True
            if not changed:
                return None
            fresh["status"] = status
            return fresh

        reverted = self._writer.update_status("ResourceClaim", claim, revert)
        current = reverted if reverted is not None else self._writer.read("ResourceClaim", claim)
        if current is not None and deallocate:
            self.drop_finalizer(current)

    def drop_finalizer(self, claim: Mapping[str, Any]) -> None:
        def drop(fresh: Obj) -> Obj | None:
            if o.allocation(fresh) is not None or DELETE_PROTECTION_FINALIZER not in o.finalizers(fresh):
                return None
            fresh.setdefault("metadata", {})["finalizers"] = [
                f for f in o.finalizers(fresh) if f != DELETE_PROTECTION_FINALIZER
            ]
            return fresh

        self._writer.update("ResourceClaim", claim, drop)
