"""Embedded mode's kube-scheduler role for DRA, and cluster mode's explanations for pending pods.

EmbeddedScheduler, per pass:
- pending pods (no nodeName, not done) in PriorityClass order, ties by creation time;
- per pod: its claims must all exist (template claims are created by ClaimLifecycle first); claims already
  allocated pin the pod to their nodes; the others are allocated together on the best node
  (controller.scoring.Placer over the allocator, one Filter call per node); legacy `nvidia.com/gpu` requests
  need Node allocatable minus what bound pods request, unless a DeviceClass backs them (DRAExtendedResource:
  the pod then gets Kubernetes' special claim `<pod>-extended-resources-xxxxx`, created, allocated and named
  in the pod's status.extendedResourceClaimStatus before binding); namespace device quotas are checked;
- before writing, the chosen devices are checked free against a fresh list of claims (plus this pass's own
  writes); then finalizer + allocation + reservedFor per claim, then pods/binding. A failed step undoes the
  earlier ones of that pod;
- a pod that cannot be placed gets an Event (rate-limited) and its pending claims the explanation annotation;
  it is retried on the next pass, which runs whenever something changes.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller import bindingconditions
from controller import objects as o
from controller import podgroupclaims, podgroups
from controller.allocator import AllocationError, ClusterSnapshot, Node, parse_claim
from controller.cel import CelEnvironment
from controller.claims import GeneratedClaims, resolve_pod_claims
from controller.commit import AllocationCommitter, allocation_devices, used_devices
from controller.diagnosis import NodeReason, explain, summarize
from controller.explanation_writer import REASON_GANG_WAITING, REASON_QUOTA, REASON_SCHEDULED, REASON_UNSCHEDULABLE, ExplanationWriter
from controller.extended import (
    EXTENDED_GPU_RESOURCE, class_for_resource, dra_extended_requests, extended_resource_claim, free_by_node, pod_request,
)
from controller.gang import gang_label, is_gang_claim
from controller.metrics import ControllerMetrics
from controller.nodefit import allocation_rejects, as_allocator_node, node_rejects
from controller.objects import Obj
from controller.podconditions import mark_unschedulable
from controller.priority import scheduling_order
from controller.quota import check_quota, devices_by_class
from controller.scoring import NoPlacement, Placer
from controller.snapshots import build_snapshot
from controller.view import View
from controller.writes import NotLeader, Writer, bind_pod
from gpudra.features import Features

log = logging.getLogger("gpudra.controller.scheduler")

# Pods for other schedulers are left alone; in embedded mode we are the default scheduler.
OUR_SCHEDULERS = ("", "default-scheduler")


def is_pending(pod: Mapping[str, Any]) -> bool:
    spec = o.section(pod, "spec")
    return (
        not spec.get("nodeName")
        and not o.pod_done(pod)
        and not o.deleting(pod)
        and str(spec.get("schedulerName") or "") in OUR_SCHEDULERS
    )


def unavailable_message(total_nodes: int, reasons: Iterable[NodeReason]) -> str:
    """kube-scheduler's shape: `0/N nodes are available: <why, grouped>`."""
    return f"0/{total_nodes} nodes are available: {summarize(list(reasons))}"


def _pod_shape(pod: Mapping[str, Any]) -> str:
    """What node_rejects reads from a pod, as a key: pods alike in it get the same verdict on every node."""
    spec = o.section(pod, "spec")
    # repr never fails on odd input; two spellings of one selector only cost a second cache entry.
    return repr((spec.get("nodeSelector"), spec.get("tolerations")))


@dataclass(frozen=True)
class PodClaims:
    """A pod's claims in spec order, or why the pod must wait before placement is even tried."""

    claims: list[Obj]
    wait_reason: str = ""
    wait_event: str = REASON_UNSCHEDULABLE
    silent: bool = False  # waiting for something this pass itself is creating: no event


def gather_pod_claims(
    pod: Mapping[str, Any],
    claims_by_key: Mapping[str, Obj],
    driver: str,
    templates: Mapping[str, Obj] | None = None,
    generated: GeneratedClaims | None = None,
) -> PodClaims:
    ns = o.namespace(pod)
    out: list[Obj] = []
    for pc in resolve_pod_claims(pod, generated if generated is not None else claims_by_key.values()):
        if pc.claim_name is None:
            if templates is not None and f"{ns}/{pc.template}" not in templates:
                return PodClaims(
                    [],
                    f"spec.resourceClaims[{pc.pod_claim_name}].resourceClaimTemplateName: "
                    f'resourceclaimtemplate "{pc.template}" not found in namespace {ns}',
                )
            return PodClaims([], f"waiting for the ResourceClaim of pod claim {pc.pod_claim_name} to be created", silent=True)
        claim = claims_by_key.get(f"{ns}/{pc.claim_name}")
        if claim is None:
            return PodClaims([], f'resourceclaim "{pc.claim_name}" not found')
        if o.deleting(claim):
            return PodClaims([], f'resourceclaim "{pc.claim_name}" is being deleted')
        if o.allocation(claim) is None and is_gang_claim(claim, driver):
            gang = o.labels(claim).get(gang_label(driver))
            return PodClaims(
                [],
                f"claim {o.key(claim)} belongs to gang {ns}/{gang}, which is allocated all-or-nothing once all its claims exist and fit",
                REASON_GANG_WAITING,
            )
        out.append(claim)
    return PodClaims(out)


@dataclass(frozen=True)
class SchedulerOutcome:
    bound: int = 0
    unschedulable: int = 0


@dataclass
class _PassState:
    """What one pass knows and has done so far; every successful placement updates it."""

    view: View
    claims_by_key: dict[str, Obj]
    snapshot: ClusterSnapshot
    placer: Placer
    busy: set[tuple[str, str, str]]
    extended_free: dict[str, int]
    node_objects: dict[str, Obj]
    bound_per_node: Counter[str]
    generated: GeneratedClaims
    node_names: list[str]
    allocator_nodes: dict[str, Node]
    # Per pod shape (nodeSelector and tolerations, all node_rejects reads of a pod): node -> why not, or None.
    node_verdicts: dict[str, dict[str, str | None]]


class EmbeddedScheduler:
    def __init__(
        self,
        writer: Writer,
        explainer: ExplanationWriter,
        metrics: ControllerMetrics,
        *,
        features: Features,
        fresh_claims: Callable[[], list[Obj]],
        driver_name: str,
        binding_timeout: float = bindingconditions.DEFAULT_BINDING_TIMEOUT_SECONDS,
    ) -> None:
        self.binding_timeout = binding_timeout
        self._writer = writer
        self._explainer = explainer
        self._metrics = metrics
        self._features = features
        self._fresh_claims = fresh_claims
        self.driver = driver_name
        self._cel = CelEnvironment(features=features)
        self._committer = AllocationCommitter(writer, drop_annotations=(explainer.annotation,))

    def _start_pass(self, view: View) -> _PassState:
        fresh = self._fresh_claims()
        claims_by_key = {o.key(c): c for c in fresh}
        snapshot, _ = build_snapshot(view, fresh)
        node_objects = {o.name(n): n for n in view.nodes.values()}
        bound = Counter(
            str(o.section(p, "spec").get("nodeName")) for p in view.pods.values() if o.pod_scheduled(p) and not o.pod_done(p)
        )
        return _PassState(
            view=view,
            claims_by_key=claims_by_key,
            snapshot=snapshot,
            placer=Placer(snapshot, self._features, self._cel),
            busy=used_devices(fresh),
            extended_free=free_by_node(view.nodes.values(), view.pods.values()),
            node_objects=node_objects,
            bound_per_node=bound,
            generated=GeneratedClaims(fresh),
            node_names=sorted(node_objects) if node_objects else list(snapshot.node_names),
            allocator_nodes={name: as_allocator_node(n) for name, n in node_objects.items()},
            node_verdicts={},
        )

    def reconcile(self, view: View) -> SchedulerOutcome:
        pending = [p for p in view.pods.values() if is_pending(p)]
        if not pending:
            return SchedulerOutcome()
        state = self._start_pass(view)
        bound = unschedulable = 0
        for pod in scheduling_order(pending, view.priority_classes.values()):
            try:
                placed = self._schedule(pod, state)
            except NotLeader:
                raise
            except AllocationError as err:
                self._unschedulable(pod, [], str(err), reason="error")
                placed = False
            except Exception:  # noqa: BLE001 - one malformed pod must not stop the others
                log.exception("placing pod failed", extra={"pod": o.key(pod)})
                placed = False
            if placed:
                bound += 1
            else:
                unschedulable += 1
        return SchedulerOutcome(bound, unschedulable)

    # -- one pod -----------------------------------------------------------------------------------

    def _candidate_nodes(self, pod: Obj, claims: list[Obj], need_extended: int, state: _PassState) -> tuple[list[str], list[NodeReason]]:
        ok: list[str] = []
        rejected: list[NodeReason] = []
        verdicts = state.node_verdicts.setdefault(_pod_shape(pod), {})
        for name in state.node_names:
            node_obj = state.node_objects.get(name)
            if node_obj is None:
                why = None
            elif name in verdicts:
                why = verdicts[name]
            else:
                why = verdicts[name] = node_rejects(pod, node_obj)
            if why is None:
                cached = state.allocator_nodes.get(name)
                node = cached if cached is not None else Node.inferred(name)
                why = allocation_rejects(claims, node)
            if why is None and need_extended:
                free = state.extended_free.get(name, 0)
                if free < need_extended:
                    why = f"Insufficient nvidia.com/gpu (requested {need_extended}, free {max(free, 0)})"
            if why is None:
                ok.append(name)
            else:
                rejected.append(NodeReason(name, "unschedulable", why))
        return ok, rejected

    def _schedule(self, pod: Obj, state: _PassState) -> bool:
        group_wait = podgroups.wait_reason(pod, state.view, state.claims_by_key)
        if group_wait:
            self._unschedulable(pod, [], group_wait, event=REASON_GANG_WAITING, reason="waiting")
            return False
        gathered = gather_pod_claims(pod, state.claims_by_key, self.driver, state.view.templates, state.generated)
        if gathered.wait_reason:
            if not gathered.silent:
                self._unschedulable(pod, [], gathered.wait_reason, event=gathered.wait_event, reason="waiting")
            return False
        claims = gathered.claims
        need_extended = pod_request(pod)
        special: Obj | None = None
        mappings: list[dict[str, str]] = []
        if self._features.extended_resource:
            special, mappings, wait = self._extended_claim(pod, state)
            if wait:
                self._unschedulable(pod, [], wait, reason="waiting")
                return False
            if special is not None:
                claims = [*claims, special]
                if any(m["resourceName"] == EXTENDED_GPU_RESOURCE for m in mappings):
                    need_extended = 0  # served by DRA, not by a device plugin's allocatable
        candidates, rejected = self._candidate_nodes(pod, claims, need_extended, state)
        total_nodes = len(candidates) + len(rejected)
        pending = [c for c in claims if o.allocation(c) is None]
        if not candidates:
            message = unavailable_message(total_nodes, rejected) if total_nodes else "no nodes available to schedule pods"
            self._unschedulable(pod, pending, message, reason="no-nodes")
            return False

        allocations: list[dict[str, Any]] = []
        if pending:
            try:
                parsed = [parse_claim(c) for c in pending]
                result = state.placer.place(parsed, candidates)
                reasons = explain(state.snapshot, parsed, candidates, self._features, self._cel) \
                    if isinstance(result, NoPlacement) else []
            except AllocationError as err:
                # A CEL runtime error, a missing DeviceClass...: the claims' explanation says so too, not only the Event.
                self._unschedulable(pod, pending, str(err), reason="error")
                return False
            if isinstance(result, NoPlacement):
                self._unschedulable(pod, pending, unavailable_message(total_nodes, [*reasons, *rejected]), reason="unschedulable")
                return False
            node, allocations = result.node, result.allocations
        else:
            # Nothing to allocate: spread such pods over the nodes that can take them.
            node = min(candidates, key=lambda n: (state.bound_per_node[n], n))

        new_devices: Counter[str] = Counter()
        for claim, alloc in zip(pending, allocations):
            new_devices.update(devices_by_class(claim, alloc))
        verdict = check_quota(o.namespace(pod), new_devices, state.claims_by_key.values(), state.view.quotas.values())
        if not verdict.ok:
            self._unschedulable(pod, pending, verdict.message, event=REASON_QUOTA, reason="quota")
            return False

        planned = [d for alloc in allocations for d in allocation_devices(alloc)]
        if state.busy.intersection(planned):
            self._metrics.failures.labels(reason="conflict").inc()
            log.warning("chosen devices are no longer free; retrying next pass", extra={"pod": o.key(pod), "node": node})
            return False

        if special is not None and o.allocation(special) is None:
            created = self._create_special(pod, special, mappings)
            if created is None:
                return False
            index = next(i for i, c in enumerate(pending) if c is special)
            pending = [*pending[:index], created, *pending[index + 1:]]
        written = self._write(pod, node, pending, allocations, [c for c in claims if o.allocation(c) is not None], state)
        if written is None:  # allocated and reserved, waiting for binding conditions: the devices are taken
            state.placer.commit([o.key(c) for c in pending], allocations, node)
            state.busy.update(planned)
            return False
        if not written:
            if special is not None and o.allocation(special) is None:
                # Undo the special claim and the pod's pointer to it; the next pass starts afresh.
                self._writer.delete("ResourceClaim", pending[index])
                self._writer.patch_status("Pod", pod, {"status": {"extendedResourceClaimStatus": None}})
            return False
        log.info("pod bound", extra={"pod": o.key(pod), "node": node, "claims": len(claims), "allocated": len(pending)})
        self._metrics.allocations.labels(path="scheduler").inc(len(pending))
        kind = "dra" if claims else ("extended-resource" if need_extended else "plain")
        self._metrics.bindings.labels(kind=kind).inc()
        state.placer.commit([o.key(c) for c in pending], allocations, node)
        state.busy.update(planned)
        state.extended_free[node] = state.extended_free.get(node, 0) - need_extended
        state.bound_per_node[node] += 1
        self._explainer.forget(pod, REASON_UNSCHEDULABLE)
        self._explainer.event(pod, REASON_SCHEDULED, f"Successfully assigned {o.key(pod)} to {node}", warning=False)
        return True

    def _extended_claim(self, pod: Obj, state: _PassState) -> tuple[Obj | None, list[dict[str, str]], str]:
        """The pod's special claim for DRA-backed extended resources: the one its status names if that exists
        (an earlier pass created it), else an unsaved one to allocate; (None, [], "") when it asks for none."""
        requests, mappings = dra_extended_requests(pod, class_for_resource(state.view.classes.values()))
        if not requests:
            return None, [], ""
        named = o.section(o.section(pod, "status"), "extendedResourceClaimStatus").get("resourceClaimName")
        if named:
            existing = state.claims_by_key.get(f"{o.namespace(pod)}/{named}")
            if existing is None:
                return None, [], f'resourceclaim "{named}" (the pod\'s extended resource claim) not found'
            return existing, mappings, ""
        return extended_resource_claim(pod, requests, f"{o.name(pod)}-extended-resources"), mappings, ""

    def _create_special(self, pod: Obj, special: Obj, mappings: list[dict[str, str]]) -> Obj | None:
        """Create the special claim (generated name) and record it in the pod's status, as kube-scheduler does."""
        body = {**special, "metadata": {**o.meta(special), "name": None, "generateName": f"{o.name(pod)}-extended-resources-"}}
        del body["metadata"]["name"]
        created = self._writer.create("ResourceClaim", body)
        if created is None:
            return None
        status = {"status": {"extendedResourceClaimStatus": {"resourceClaimName": o.name(created), "requestMappings": mappings}}}
        if self._writer.patch_status("Pod", pod, status) is None:
            self._writer.delete("ResourceClaim", created)
            return None
        return created

    def _write(
        self,
        pod: Obj,
        node: str,
        pending: list[Obj],
        allocations: list[dict[str, Any]],
        allocated: list[Obj],
        state: _PassState,
    ) -> bool | None:
        """True when bound, False when nothing stays written, None when the claims stay allocated and reserved
        while the pod waits for device binding conditions (controller.bindingconditions)."""
        done: list[tuple[Obj, bool]] = []  # (claim, deallocate on undo)

        def undo() -> None:
            for claim, dealloc in reversed(done):
                self._committer.undo(claim, pod, deallocate=dealloc)
            self._metrics.failures.labels(reason="write-failed").inc()

        for claim, alloc in zip(pending, allocations):
            stored = self._committer.allocate(claim, bindingconditions.stamp(alloc), self._consumer(claim, pod, state))
            if stored is None:
                undo()
                return False
            done.append((stored, True))
            state.claims_by_key[o.key(stored)] = stored
        for claim in allocated:
            stored = self._committer.reserve(claim, self._consumer(claim, pod, state))
            if stored is None:
                undo()
                return False
            done.append((stored, False))
            state.claims_by_key[o.key(stored)] = stored
        gate = self._binding_gate(pod, [c for c, _ in done])
        if gate != bindingconditions.BIND:
            return None if gate == bindingconditions.WAIT else False
        if not bind_pod(self._writer, pod, node):
            undo()
            return False
        return True

    def _consumer(self, claim: Obj, pod: Obj, state: _PassState) -> Obj:
        """The pod, or its PodGroup for a claim the group shares (DRAWorkloadResourceClaims)."""
        if not self._features.workload_resource_claims:
            return pod
        return podgroupclaims.consumer_for(claim, pod, state.view)

    def _binding_gate(self, pod: Obj, claims: list[Obj]) -> str:
        """KEP-5007 PreBind: BIND; WAIT while a device's binding conditions are not all true (the claims keep their
        allocation); RETRY after the claims were deallocated because a binding failed or timed out."""
        gate = bindingconditions.verdict(claims, timeout_seconds=self.binding_timeout)
        if gate.action == bindingconditions.BIND:
            return gate.action
        if gate.action == bindingconditions.WAIT:
            self._explainer.event(pod, bindingconditions.EVENT_PENDING, gate.message, warning=False)
            return gate.action
        for claim in gate.release:
            bindingconditions.deallocate(self._writer.update_status, claim, o.uid(pod))
            current = self._writer.read("ResourceClaim", claim)
            if current is not None and o.allocation(current) is None:
                self._committer.drop_finalizer(current)
        self._metrics.failures.labels(reason="binding-failed").inc()
        self._explainer.event(pod, REASON_UNSCHEDULABLE, gate.message)
        return gate.action

    def _unschedulable(self, pod: Obj, pending: list[Obj], message: str, *, event: str = REASON_UNSCHEDULABLE, reason: str) -> None:
        self._metrics.failures.labels(reason=reason).inc()
        self._explainer.event(pod, event, message)
        self._explainer.annotate(pending, message)
        mark_unschedulable(self._writer, pod, message)


class PendingExplainer:
    """Cluster mode: kube-scheduler allocates; we explain pods that wait on claims that cannot fit."""

    def __init__(self, explainer: ExplanationWriter, metrics: ControllerMetrics, *, features: Features, driver_name: str) -> None:
        self._explainer = explainer
        self._metrics = metrics
        self._features = features
        self.driver = driver_name
        self._cel = CelEnvironment(features=features)

    def reconcile(self, view: View) -> int:
        waiting = 0
        state: tuple[ClusterSnapshot, Placer] | None = None
        claims_by_key = dict(view.claims)
        for pod in sorted((p for p in view.pods.values() if is_pending(p)), key=o.key):
            if not o.list_field(o.section(pod, "spec"), "resourceClaims"):
                continue
            gathered = gather_pod_claims(pod, claims_by_key, self.driver)
            if gathered.wait_reason:
                if not gathered.silent:
                    waiting += 1
                    self._explainer.event(pod, gathered.wait_event, gathered.wait_reason)
                continue
            pending = [c for c in gathered.claims if o.allocation(c) is None]
            if not pending:
                continue
            if state is None:
                snapshot, _ = build_snapshot(view, view.allocated_claims())
                state = (snapshot, Placer(snapshot, self._features, self._cel))
            snapshot, placer = state
            nodes = [n for n in snapshot.node_names if allocation_rejects(gathered.claims, snapshot.node(n)) is None]
            try:
                parsed = [parse_claim(c) for c in pending]
                result = placer.place(parsed, nodes)
                if not isinstance(result, NoPlacement):
                    continue  # it fits somewhere: kube-scheduler will place it
                message = unavailable_message(len(snapshot.node_names), explain(snapshot, parsed, nodes, self._features, self._cel))
            except AllocationError as err:
                message = str(err)
            waiting += 1
            self._metrics.failures.labels(reason="unschedulable").inc()
            self._explainer.event(pod, REASON_UNSCHEDULABLE, message)
            self._explainer.annotate(pending, message)
        return waiting
