"""The node side of device binding conditions (KEP-5007) for on-demand MIG placements.

The scheduler allocates a claim to one of this node's MIG placements (which carry `<driver>/mig-ready` and
`<driver>/mig-failed`), reserves it for the pod and then waits before binding. This loop sees such a claim,
prepares it ahead of the kubelet (the Preparer creates the MIG instance, writes the CDI spec and checkpoints the
claim, exactly as NodePrepareResources would; the kubelet's later call finds it prepared) and reports the
device ready in the claim's `status.devices`, or the failure with the Preparer's error. A claim prepared ahead
whose allocation goes away before the kubelet took it over (binding timed out, the pod was deleted) is
unprepared again, which destroys the MIG instance.

Claims are listed every `interval` seconds (the API has no field selector for a claim's node); one pass is
`sync_once`, which tests drive directly.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from driver.prepare import ClaimRef, Preparer
from gpudra import bindingconditions as bc

log = logging.getLogger("gpu-dra.binder")


@dataclass
class BinderReport:
    ready: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)


class MigBinder:
    def __init__(self, api: Any, preparer: Preparer, driver_name: str, pool_name: str, *,
                 interval: float = 1.0) -> None:
        self.api = api
        self.preparer = preparer
        self.driver = driver_name
        self.pool = pool_name
        self.interval = interval
        self.ready_condition, self.failure_condition = (c[0] for c in bc.mig_conditions(driver_name))
        self._ahead: dict[str, ClaimRef] = {}  # claim uid -> prepared here before the kubelet asked
        self._thread: threading.Thread | None = None

    def start(self, stop: threading.Event) -> None:
        self._thread = threading.Thread(target=self._run, args=(stop,), name="mig-binder", daemon=True)
        self._thread.start()

    def join(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval):
            try:
                self.sync_once()
            except Exception as exc:  # noqa: BLE001 - the API may be away for a while; the next pass retries
                log.warning("event=binder-pass-failed error=%r", str(exc))

    def _mine(self, claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        return [r for r in bc.conditioned_results(claim, self.driver) if r.get("pool") == self.pool
                and self.ready_condition in (r.get("bindingConditions") or [])]

    def sync_once(self) -> BinderReport:
        report = BinderReport()
        claims, _ = self.api.list("ResourceClaim")
        by_uid = {str(c["metadata"].get("uid")): c for c in claims}
        for claim in claims:
            mine = self._mine(claim)
            if not mine or not (claim.get("status") or {}).get("reservedFor"):
                continue
            if (claim.get("metadata") or {}).get("deletionTimestamp"):
                continue
            state = bc.binding_state({**claim, "status": {**claim["status"], "allocation": {
                "devices": {"results": mine}}}})
            if state.state != bc.PENDING:
                continue
            meta = claim["metadata"]
            ref = ClaimRef(namespace=str(meta["namespace"]), name=str(meta["name"]), uid=str(meta["uid"]))
            result = self.preparer.prepare([ref])[ref.uid]
            if result.error:
                self._report(claim, mine, ok=False, message=result.error)
                report.failed.append(f"{ref.namespace}/{ref.name}")
                log.warning("event=mig-binding-failed claim=%s/%s error=%r", ref.namespace, ref.name, result.error)
                continue
            self._ahead[ref.uid] = ref
            self._report(claim, mine, ok=True, message="MIG instance created")
            report.ready.append(f"{ref.namespace}/{ref.name}")
            log.info("event=mig-binding-ready claim=%s/%s", ref.namespace, ref.name)
        for uid, ref in list(self._ahead.items()):
            if self.preparer.checkpoint.claim(uid) is None:
                self._ahead.pop(uid)  # the kubelet took it over and has unprepared it since
                continue
            claim = by_uid.get(uid)
            if claim is not None and self._mine(claim):
                continue
            # Deallocated (binding failed or timed out) or deleted before the pod ever started here.
            errors = self.preparer.unprepare([ref])
            if not errors.get(uid):
                self._ahead.pop(uid)
                report.released.append(f"{ref.namespace}/{ref.name}")
                log.info("event=mig-binding-released claim=%s/%s", ref.namespace, ref.name)
        return report

    def _report(self, claim: Mapping[str, Any], results: list[Mapping[str, Any]], *, ok: bool, message: str) -> None:
        now = bc.now_rfc3339()
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
