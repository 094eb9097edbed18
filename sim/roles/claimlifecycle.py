"""ResourceClaim lifecycle, as kube-controller-manager's resourceclaim controller does it (the testbed plays it on
the embedded control plane; on a real cluster kube-controller-manager does).

- Template expansion: a pod's `spec.resourceClaims[].resourceClaimTemplateName` becomes a ResourceClaim named
  from `generateName: <pod>-<podClaimName>-`, annotated with `resource.kubernetes.io/pod-claim-name`, owned by
  the pod (controller=true), and recorded in `pod.status.resourceClaimStatuses`.
- Reservation cleanup: `status.reservedFor` entries whose pod is gone (or another pod of that name) or done are
  dropped; when that empties the list of a claim that carries the delete-protection finalizer, the allocation
  is cleared ("was being used" -> "is not used anymore"; a claim allocated ahead of its consumers, like a gang
  claim, is not deallocated just because nobody reserved it yet), then the finalizer is removed.
- A claim the API server refuses to create (a ResourceQuota, an admission plugin) is reported on its pod as
  `Warning FailedResourceClaimCreation` (`PodResourceClaim <name>: create ResourceClaim : <error>`) and the pod
  is retried with the controller work queue's back-off (5 ms doubling to 1000 s), not on every pass.
- Generated claims follow their pod: deleted when the pod is gone (what the garbage collector does through the
  owner reference) or done.

The planning functions are pure; `ClaimLifecycle` applies their results through KubeApi.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller import objects as o
from controller.claims import GeneratedClaims, claim_from_template, resolve_pod_claims
from controller.metrics import ControllerMetrics
from controller.objects import DELETE_PROTECTION_FINALIZER, POD_CLAIM_NAME_ANNOTATION, Obj
from controller.writes import Writer
from gpudra.kubeapi import ApiError, NotFound

log = logging.getLogger("gpudra.sim.roles.claimlifecycle")


def reservation_valid(entry: Mapping[str, Any], namespace: str, pods: Mapping[str, Mapping[str, Any]],
                      groups: Mapping[str, Mapping[str, Any]] | None = None) -> bool:
    """A reservedFor entry still counts while its pod exists with the same UID and is not done (a PodGroup's,
    when `groups` are known, while the group exists with the same UID)."""
    if groups is not None and entry.get("apiGroup") == "scheduling.k8s.io" and entry.get("resource") == "podgroups":
        group = groups.get(f"{namespace}/{entry.get('name')}")
        return group is not None and o.uid(group) == entry.get("uid")
    if entry.get("resource") != "pods" or entry.get("apiGroup"):
        return True  # consumers other than pods are not ours to judge
    pod = pods.get(f"{namespace}/{entry.get('name')}")
    return pod is not None and o.uid(pod) == entry.get("uid") and not o.pod_done(pod)


@dataclass(frozen=True)
class ClaimRelease:
    """What to change on one claim: the reservations to keep, whether to deallocate, drop the finalizer."""

    reserved_for: list[dict[str, Any]]
    changed_reservations: bool
    deallocate: bool
    remove_finalizer: bool


def plan_release(claim: Mapping[str, Any], pods: Mapping[str, Mapping[str, Any]],
                 groups: Mapping[str, Mapping[str, Any]] | None = None) -> ClaimRelease | None:
    reservations = o.reserved_for(claim)
    valid = [dict(r) for r in reservations if reservation_valid(r, o.namespace(claim), pods, groups)]
    has_finalizer = DELETE_PROTECTION_FINALIZER in o.finalizers(claim)
    allocated = o.allocation(claim) is not None
    changed = len(valid) < len(reservations)
    deallocate = has_finalizer and allocated and not valid and (changed or o.deleting(claim))
    still_allocated = allocated and not deallocate
    remove_finalizer = has_finalizer and not still_allocated and not valid
    if not (changed or deallocate or remove_finalizer):
        return None
    return ClaimRelease(valid, changed, deallocate, remove_finalizer)


def claims_to_delete(claims: Iterable[Mapping[str, Any]], pods: Mapping[str, Mapping[str, Any]]) -> list[Obj]:
    """Generated claims whose owning pod is gone or done (GC, and the resourceclaim controller's cleanup). `pods`
    by `namespace/name`: the owner is the pod of the reference's name while it has the reference's UID (a pod
    of that name created later is another pod), so a check costs a lookup, not an index of every pod."""
    out = []
    for claim in claims:
        ref = o.controller_owner(claim)
        owner = str(ref.get("uid") or "") if ref is not None else ""
        if not owner or POD_CLAIM_NAME_ANNOTATION not in o.annotations(claim) or o.deleting(claim):
            continue
        pod = pods.get(f"{o.namespace(claim)}/{ref.get('name') if ref is not None else ''}")
        if pod is None or o.uid(pod) != owner or o.pod_done(pod):
            out.append(dict(claim))
    return out


# kube-controller-manager's per-item work queue back-off (DefaultControllerRateLimiter's exponential part).
CREATE_BACKOFF_FIRST_S = 0.005
CREATE_BACKOFF_MAX_S = 1000.0
FAILED_CREATION = "FailedResourceClaimCreation"
# Reports a refused creation on the pod: (pod, reason, message); what it returns is not used.
Report = Callable[[Mapping[str, Any], str, str], object]


@dataclass
class _Backoff:
    retry_at: float
    delay: float


class ClaimLifecycle:
    """Applies template expansion, reservation cleanup and deallocation through the API."""

    def __init__(self, writer: Writer, metrics: ControllerMetrics, *, report: Report | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._writer = writer
        self._metrics = metrics
        self._report = report
        self._clock = clock
        self._backoff: dict[str, _Backoff] = {}  # pod uid -> when its refused expansion is tried again

    # -- template expansion ------------------------------------------------------------------------

    def expand_templates(
        self,
        pods: Iterable[Mapping[str, Any]],
        claims: Iterable[Mapping[str, Any]],
        templates: Mapping[str, Mapping[str, Any]],
        index: GeneratedClaims | None = None,
    ) -> tuple[int, list[str]]:
        """Create missing claims for pods' templates and record them in pod status (`index`, when given, is a
        current index of `claims` to use instead of building one).

        Returns how many claims were created and the problems seen (missing templates).
        """
        problems: list[str] = []
        created_count = 0
        index = index if index is not None else GeneratedClaims(claims)
        for pod in pods:
            created, missing = self.expand_pod(pod, index, templates)
            created_count += len(created)
            problems += missing
        return created_count, problems

    def expand_pod(
        self, pod: Mapping[str, Any], index: GeneratedClaims, templates: Mapping[str, Mapping[str, Any]], *,
        protected: bool = False,
    ) -> tuple[list[Obj], list[str]]:
        """Template expansion for one pod: the claims created (also added to `index`) and the problems seen
        (`protected`: see claim_from_template)."""
        problems: list[str] = []
        created_claims: list[Obj] = []
        if o.pod_done(pod) or o.deleting(pod):
            self._backoff.pop(o.uid(pod), None)
            return created_claims, problems
        resolved = resolve_pod_claims(pod, index)
        if not any(pc.template for pc in resolved):
            return created_claims, problems
        held = self._backoff.get(o.uid(pod))
        if held is not None and self._clock() < held.retry_at:
            return created_claims, problems
        statuses: list[dict[str, Any]] = []
        for pc in resolved:
            if pc.template is None:
                continue
            claim_name = pc.claim_name
            if claim_name is None:
                template = templates.get(f"{o.namespace(pod)}/{pc.template}")
                if template is None:
                    problems.append(
                        f"pod {o.key(pod)}: spec.resourceClaims[{pc.pod_claim_name}].resourceClaimTemplateName: "
                        f"ResourceClaimTemplate {o.namespace(pod)}/{pc.template} not found"
                    )
                    continue
                refusals: list[ApiError] = []
                created = self._writer.create("ResourceClaim", claim_from_template(pod, pc.pod_claim_name, template,
                                                                                  protected=protected),
                                              refused=refusals.append)
                if refusals:
                    # As the resourceclaim controller: the pod's sync stops at the first refused claim, reports it
                    # and is requeued with back-off.
                    self._refused(pod, pc.pod_claim_name, refusals[0])
                    return created_claims, problems
                if created is None:
                    continue
                claim_name = o.name(created)
                index.add(created)
                created_claims.append(created)
                self._metrics.claims_created.inc()
                log.info(
                    "claim created from template",
                    extra={"pod": o.key(pod), "podClaim": pc.pod_claim_name, "claim": claim_name, "template": pc.template},
                )
            statuses.append({"name": pc.pod_claim_name, "resourceClaimName": claim_name})
        self._backoff.pop(o.uid(pod), None)
        self._record_statuses(pod, statuses)
        return created_claims, problems

    def _refused(self, pod: Mapping[str, Any], pod_claim_name: str, err: ApiError) -> None:
        now = self._clock()
        previous = self._backoff.get(o.uid(pod))
        delay = min(previous.delay * 2, CREATE_BACKOFF_MAX_S) if previous is not None else CREATE_BACKOFF_FIRST_S
        if len(self._backoff) > 4096:  # pods gone meanwhile are never looked at again: drop what is long over
            self._backoff = {k: b for k, b in self._backoff.items() if b.retry_at > now - CREATE_BACKOFF_MAX_S}
        self._backoff[o.uid(pod)] = _Backoff(now + delay, delay)
        if self._report is not None:
            # The generated claim has no name yet (generateName): upstream's message shows it empty.
            self._report(pod, FAILED_CREATION, f"PodResourceClaim {pod_claim_name}: create ResourceClaim : "
                                               f"{err.message}")

    def _record_statuses(self, pod: Mapping[str, Any], statuses: list[dict[str, Any]]) -> None:
        current = {
            str(s.get("name")): s.get("resourceClaimName")
            for s in o.list_field(o.section(pod, "status"), "resourceClaimStatuses")
            if isinstance(s, Mapping)
        }
        wanted = {s["name"]: s["resourceClaimName"] for s in statuses}
        if all(current.get(k) == v for k, v in wanted.items()):
            return
        merged = dict(current)
        merged.update(wanted)
        entries = [{"name": k, "resourceClaimName": v} for k, v in merged.items() if v]
        self._writer.patch_status("Pod", pod, {"status": {"resourceClaimStatuses": entries}})

    # -- reservations and deallocation -------------------------------------------------------------

    def release(self, claims: Iterable[Mapping[str, Any]], pods: Mapping[str, Mapping[str, Any]],
                groups: Mapping[str, Mapping[str, Any]] | None = None) -> int:
        """Drop stale reservations, deallocate unused claims, remove finalizers; returns claims changed."""
        changed = 0
        for claim in claims:
            if plan_release(claim, pods, groups) is None:
                continue
            if self._apply_release(claim, pods, groups):
                changed += 1
        return changed

    def _apply_release(self, claim: Mapping[str, Any], pods: Mapping[str, Mapping[str, Any]],
                       groups: Mapping[str, Mapping[str, Any]] | None = None) -> bool:
        def status_change(fresh: Obj) -> Obj | None:
            plan = plan_release(fresh, pods, groups)
            if plan is None or not (plan.changed_reservations or plan.deallocate):
                return None
            status = dict(fresh.get("status") or {})
            if plan.reserved_for:
                status["reservedFor"] = plan.reserved_for
            else:
                status.pop("reservedFor", None)
            if plan.deallocate:
                status.pop("allocation", None)
                status.pop("devices", None)
            fresh["status"] = status
            return fresh

        before = o.allocation(claim) is not None
        updated = self._writer.update_status("ResourceClaim", claim, status_change)
        current = updated if updated is not None else self._writer.read("ResourceClaim", claim)
        if current is None:
            return updated is not None
        if before and o.allocation(current) is None:
            self._metrics.deallocations.labels(cause="unreserved").inc()
            log.info("claim deallocated", extra={"claim": o.key(current), "cause": "no consumer left"})

        def drop_finalizer(fresh: Obj) -> Obj | None:
            plan = plan_release(fresh, pods, groups)
            if plan is None or not plan.remove_finalizer:
                return None
            fresh.setdefault("metadata", {})["finalizers"] = [
                f for f in o.finalizers(fresh) if f != DELETE_PROTECTION_FINALIZER
            ]
            return fresh

        dropped = self._writer.update("ResourceClaim", current, drop_finalizer)
        return updated is not None or dropped is not None

    def delete_orphans(self, claims: Iterable[Mapping[str, Any]], pods: Mapping[str, Mapping[str, Any]]) -> int:
        """Delete the generated claims whose pod is gone or done (`pods` by namespace/name)."""
        deleted = 0
        for claim in claims_to_delete(claims, pods):
            try:
                self._writer.delete("ResourceClaim", claim)
            except NotFound:
                continue
            except ApiError as err:
                log.warning("claim delete failed", extra={"claim": o.key(claim), "error": str(err)})
                continue
            deleted += 1
            log.info("generated claim deleted", extra={"claim": o.key(claim), "cause": "owner pod gone or done"})
        return deleted
