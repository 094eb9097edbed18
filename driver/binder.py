"""The node side of device binding conditions (KEP-5007) for on-demand MIG placements.

The scheduler allocates a claim to one of this node's MIG placements (which carry `<driver>/mig-ready` and
`<driver>/mig-failed`), reserves it for the pod and then waits before binding. This loop sees such a claim,
prepares it ahead of the kubelet (the Preparer creates the MIG instance, writes the CDI spec and checkpoints the
claim, exactly as NodePrepareResources would; the kubelet's later call finds it prepared) and reports the
device ready in the claim's `status.devices`, or the failure with the Preparer's error. A claim prepared ahead
whose allocation goes away before the kubelet took it over (binding timed out, the pod was deleted) is
unprepared again, which destroys the MIG instance.

Claims are watched (the API has no field selector for a claim's node, so the watch covers all claims and this
loop picks its own); `handle` acts on one claim.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from driver.prepare import ClaimRef, Preparer
from gpudra import bindingconditions as bc
from gpudra.timestamps import rfc3339

log = logging.getLogger("gpu-dra.binder")


class MigBinder:
    def __init__(self, api: Any, preparer: Preparer, driver_name: str, pool_name: str, *,
                 interval: float = 1.0) -> None:
        self.api = api
        self.preparer = preparer
        self.driver = driver_name
        self.pool = pool_name
        self.interval = interval
        self.ready_condition, self.failure_condition = (c[0] for c in bc.mig_conditions(driver_name))
        # claim uid -> prepared here before the kubelet asked; from the checkpoint, so that a binding that fails
        # after an agent restart still releases its MIG instance.
        self._ahead: dict[str, ClaimRef] = {r.uid: r for r in preparer.prepared_ahead()}
        self._thread: threading.Thread | None = None

    def start(self, stop: threading.Event) -> None:
        self._thread = threading.Thread(target=self._run, args=(stop,), name="mig-binder", daemon=True)
        self._thread.start()

    def join(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                for kind, claim in self.api.watch("ResourceClaim", stop=stop):
                    self.handle(claim, deleted=kind == "DELETED")
            except Exception as exc:  # noqa: BLE001 - the API may be away for a while; the watch starts again
                log.warning("event=binder-watch-failed error=%r", str(exc))
                stop.wait(self.interval)

    def _mine(self, claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        return [r for r in bc.conditioned_results(claim, self.driver) if r.get("pool") == self.pool
                and self.ready_condition in (r.get("bindingConditions") or [])]

    def handle(self, claim: Mapping[str, Any], *, deleted: bool = False) -> None:
        """Act on one claim: prepare it ahead and report ready/failed, or release what was prepared ahead."""
        meta = claim.get("metadata") or {}
        uid = str(meta.get("uid"))
        mine = [] if deleted else self._mine(claim)
        if not mine:
            if uid in self._ahead:
                self._release(uid)
            return
        if not (claim.get("status") or {}).get("reservedFor") or meta.get("deletionTimestamp"):
            return
        state = bc.binding_state({**claim, "status": {**claim["status"], "allocation": {"devices": {"results": mine}}}})
        if state.state != bc.PENDING:
            return
        ref = ClaimRef(namespace=str(meta["namespace"]), name=str(meta["name"]), uid=uid)
        result = self.preparer.prepare([ref])[ref.uid]
        if result.error:
            self._report(claim, mine, ok=False, message=result.error)
            log.warning("event=mig-binding-failed claim=%s/%s error=%r", ref.namespace, ref.name, result.error)
            return
        self._ahead[ref.uid] = ref
        self.preparer.mark_prepared_ahead(ref.uid)
        self._report(claim, mine, ok=True, message="MIG instance created")
        log.info("event=mig-binding-ready claim=%s/%s", ref.namespace, ref.name)

    def _release(self, uid: str) -> None:
        """A claim prepared ahead lost its allocation here (binding failed or timed out) or is gone."""
        ref = self._ahead[uid]
        if self.preparer.checkpoint.claim(uid) is None:
            self._ahead.pop(uid)  # the kubelet took it over and has unprepared it since
            return
        errors = self.preparer.unprepare([ref])
        if not errors.get(uid):
            self._ahead.pop(uid)
            log.info("event=mig-binding-released claim=%s/%s", ref.namespace, ref.name)

    def _report(self, claim: Mapping[str, Any], results: list[Mapping[str, Any]], *, ok: bool, message: str) -> None:
        now = rfc3339()
        ours = []
        for r in results:
            entry: dict[str, Any] = {"driver": r["driver"], "pool": r["pool"], "device": r["device"], "conditions": [
                bc.condition(self.ready_condition, ok, "MigInstanceCreated" if ok else "MigInstanceNotCreated",
                             message if ok else "", now),
                bc.condition(self.failure_condition, not ok, "PrepareFailed" if not ok else "Prepared",
                             "" if ok else message, now),
            ]}
            if r.get("shareID"):
                entry["shareID"] = r["shareID"]
            ours.append(entry)
        devices = bc.merge_device_statuses((claim.get("status") or {}).get("devices") or [], ours)
        meta = claim["metadata"]
        # Conditional on the version we read: a concurrent change is seen on the next pass.
        self.api.patch("ResourceClaim", meta["name"], {"metadata": {"resourceVersion": meta["resourceVersion"]},
                                                        "status": {"devices": devices}},
                       namespace=meta["namespace"], subresource="status")
