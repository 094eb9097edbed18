"""The roles the controller's passes run in embedded mode, in kube-controller-manager's and kube-scheduler's order:
claims first (for pod groups, from templates, released, orphans deleted), then, after the gang controller, the
scheduler and device taint eviction. The manager calls `claims_pass` and `schedule_pass`; each sees the writes
of the steps before it through the caches the writer updates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from controller import objects as o
from controller.cel import CelEnvironment
from controller.claims import GeneratedClaims
from controller.ganggroups import gang_label
from controller.manager import RoleContext, RoleOutcome
from controller.pending import is_pending
from controller.snapshots import LiveSnapshot
from controller.view import View
from controller.watchlist import ClaimWatchlist
from sim.roles.claimlifecycle import ClaimLifecycle
from sim.roles.podgroupclaims import PodGroupClaims
from sim.roles.scheduler import EmbeddedScheduler
from sim.roles.taintevict import TaintEvictor
from gpudra.features import Features

import logging

log = logging.getLogger("gpudra.sim.roles")

# Gated kinds: a kube-apiserver serves them only with their feature gate on (REST storage installed only then).
_GATED_KINDS: dict[str, str] = {"PodGroup": "generic_workload", "DeviceTaintRule": "device_taint_rules"}


def _served(kind: str, features: Features) -> bool:
    gate = _GATED_KINDS.get(kind)
    return gate is None or bool(getattr(features, gate))


class EmbeddedRoles:
    """One per manager; state kept across passes comes from the caches' change sets."""

    # What these roles read beyond the kinds every controller watches.
    KINDS: ClassVar[tuple[str, ...]] = ("ResourceClaimTemplate", "PriorityClass", "ResourceQuota", "DeviceTaintRule",
                                        "PodGroup", "PodDisruptionBudget")

    @classmethod
    def kinds(cls, features: Features) -> tuple[str, ...]:
        return tuple(k for k in cls.KINDS if _served(k, features))

    def __init__(self, context: RoleContext) -> None:
        self._ctx = context
        stores = context.stores
        self.claims = ClaimLifecycle(context.writer, context.metrics, clock=context.clock,
                                     report=lambda pod, reason, message:
                                     context.explainer.event(pod, reason, message, component="resource_claim"))
        self.pod_group_claims = PodGroupClaims(context.writer)
        self.live = LiveSnapshot(stores, context.features, CelEnvironment(features=context.features))
        self.scheduler = EmbeddedScheduler(
            context.writer,
            context.explainer,
            context.metrics,
            features=context.features,
            live=self.live,
            driver_name=context.driver_name,
            expand=self._expand_pod,
            pods=stores["Pod"],
            claim_index=self._claim_index,
            binding_timeout=context.binding_timeout,
        )
        self.taint_evictor = TaintEvictor(context.writer, context.explainer)
        self._generated = GeneratedClaims()
        self._index_changes: set[str] = stores["ResourceClaim"].track()
        self._expansion_changes: set[str] = stores["Pod"].track()
        self._taint_inputs = {k: stores[k].track() for k in ("ResourceSlice", "DeviceTaintRule") if k in stores}
        self._template_changes: set[str] = (stores["ResourceClaimTemplate"].track()
                                            if "ResourceClaimTemplate" in stores else set())
        self._last_full_expansion = float("-inf")
        self._held: set[str] = set()  # pods whose PodGroup shares their claims, as of this pass
        self._watchlist = ClaimWatchlist(stores["Pod"], stores["ResourceClaim"], full_every=context.resync_period,
                                         clock=context.clock)

    def _view(self) -> View:
        return View.from_stores(self._ctx.stores)

    def claims_pass(self) -> RoleOutcome:
        features = self._ctx.features
        with self._ctx.timed("claims"):
            view = self._view()
            created = 0
            held: set[str] = set()
            if features.workload_resource_claims:
                # Claims a PodGroup shares first, so member pods never get per-pod claims for them.
                created, held = self.pod_group_claims.sync(view)
                view = self._view()
            self._held = held
            # Pending pods are expanded one by one by the scheduler, right before each is placed.
            upfront = [p for p in self._expansion_candidates(view) if o.key(p) not in held]
            made, problems = self.claims.expand_templates(upfront, view.claims.values(), view.templates,
                                                          index=self._claim_index())
            created += made
            view = self._view()
            # Only the claims that changed, or whose pods did, since the last pass (all once a resync period);
            # reservations by PodGroups are not tracked, so with them every claim is looked at.
            to_check = self._watchlist.claims_to_check(view.claims)
            check = set(view.claims) if features.workload_resource_claims else {o.key(c) for c in to_check}
            released = self.claims.release([c for k, c in view.claims.items() if k in check], view.pods,
                                           view.pod_groups if features.workload_resource_claims else None)
            # Each step sees the previous step's writes: the writer updates the caches it reads from.
            view = self._view()
            deleted = self.claims.delete_orphans([c for k, c in view.claims.items() if k in check], view.pods)
        return RoleOutcome(claims_created=created, claims_released=released, claims_deleted=deleted,
                           problems=tuple(problems))

    def schedule_pass(self) -> RoleOutcome:
        with self._ctx.timed("scheduler"):
            outcome = self.scheduler.reconcile(self._view())
        with self._ctx.timed("taint-eviction"):
            view = self._view()
            stores = self._ctx.stores
            # Slices as the taint rules change them: any slice or rule change, and any rule (its status ages).
            changed = [bool(stores[k].drain(t)) for k, t in self._taint_inputs.items()]
            self.taint_evictor.reconcile(view.pods.values(), view.claims.values(), view.sorted_slices,
                                         view.taint_rules.values(), self._ctx.wall(),
                                         slices_changed=any(changed) or bool(view.taint_rules))
        return RoleOutcome(claims_created=outcome.claims_created, pods_bound=outcome.bound,
                           pods_unschedulable=outcome.unschedulable)

    def close(self) -> None:
        self.scheduler.close()

    def _expand_pod(self, pod: o.Obj, index: GeneratedClaims, templates: Mapping[str, o.Obj]) -> list[o.Obj]:
        if o.key(pod) in self._held:
            return []  # its PodGroup shares its claims (DRAWorkloadResourceClaims): no per-pod claims
        # The scheduler allocates these claims next: they are created protected.
        created, problems = self.claims.expand_pod(pod, index, templates, protected=True)
        for problem in problems:
            log.debug("reconcile problem", extra={"problem": problem})
        return created

    def _claim_index(self) -> GeneratedClaims:
        """The generated-claims index, brought up to date with the claims changed since the last call."""
        store = self._ctx.stores["ResourceClaim"]
        for key in store.drain(self._index_changes):
            self._generated.discard(key)
            claim = store.get(key)
            if claim is not None:
                self._generated.add(claim)
        return self._generated

    def _expansion_candidates(self, view: View) -> list[o.Obj]:
        """Pods the pass expands up front. Expansion only acts on a pod whose status does not name its claims yet,
        which only a new or changed pod (or a template created later) can be; all pods are looked at again every
        resync period in case a create failed."""
        stores = self._ctx.stores
        changed = stores["Pod"].drain(self._expansion_changes)
        templates_changed = bool(stores["ResourceClaimTemplate"].drain(self._template_changes)) \
            if "ResourceClaimTemplate" in stores else False
        now = self._ctx.clock()
        if templates_changed or now - self._last_full_expansion >= self._ctx.resync_period:
            self._last_full_expansion = now
            pods = list(view.pods.values())
        else:
            pods = [view.pods[k] for k in changed if k in view.pods]
        return [p for p in pods if self._expanded_before_scheduling(p, view.templates)]

    def _expanded_before_scheduling(self, pod: o.Obj, templates: Mapping[str, o.Obj]) -> bool:
        """Pods whose claims the pass expands up front: those the scheduler will not take pod by pod (bound, or
        for another scheduler) and those with gang templates, whose claims the gang controller places together."""
        if not is_pending(pod):
            return True
        label = gang_label(self._ctx.driver_name)
        for entry in o.list_field(o.section(pod, "spec"), "resourceClaims"):
            name = entry.get("resourceClaimTemplateName") if isinstance(entry, Mapping) else None
            template = templates.get(f"{o.namespace(pod)}/{name}") if name else None
            if template is not None and label in (o.section(o.section(template, "spec"), "metadata").get("labels") or {}):
                return True
        return False
