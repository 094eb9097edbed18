"""Embedded mode's kube-scheduler role for DRA (the testbed's; on a real cluster kube-scheduler does this).

EmbeddedScheduler, per pass, pod by pod:
- pending pods (no nodeName, not done, not bound by us already) in a bounded queue (`max_pods`) ordered by
  PriorityClass value, then creation time (sim.roles.schedqueue); pods created during the pass join the
  queue in their rank before the next pod is taken; a pass stops after `budget` seconds so that the other
  concerns run, and the next pass starts at once;
- per pod: its template claims are created (the `expand` hook, ahead of its placement), then its claims must
  all exist; claims already allocated pin the pod to their nodes; the others are allocated together on the
  best node (controller.scoring.Placer over the allocator); legacy `nvidia.com/gpu` requests need Node
  allocatable minus what bound pods request, unless a DeviceClass backs them (DRAExtendedResource: the pod then
  gets Kubernetes' special claim `<pod>-extended-resources-xxxxx`, created, allocated and named in the pod's
  status.extendedResourceClaimStatus before binding); namespace device quotas are checked (`pre_bind` checks);
- the snapshot the Placer searches is a LiveSnapshot: kept current from the informer caches' deltas and
  from this scheduler's own allocations at commit, never rebuilt by a relist;
- placement happens on the scheduling thread, one pod at a time in queue order; the API writes around it run
  on a small pool (sim.roles.inflight): the template claims of the next pods are created while this one is
  placed, and a placed pod is *assumed* (devices taken, claims allocated, pod bound, for the rest of the pass)
  while its writes run: finalizer (when the claim lacks it) + allocation + reservedFor per claim, then
  pods/binding and the Scheduled Event. A failed step undoes the earlier ones of that pod and gives its devices
  back; its pod is tried on the next pass. A pass ends with no write in flight. A bound pod is assumed bound
  until the watch shows it (no re-read after binding);
- a pod that cannot be placed may preempt pods of lower priority (sim.roles.preemption: victims deleted, the
  pod nominated to their node), and is reported through `_unschedulable` (an Event, rate-limited, and the
  explanation annotation on its pending claims); it is retried on the next pass, which runs whenever
  something changes.
"""

from __future__ import annotations

import logging
import time
from bisect import insort
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from controller import bindingconditions
from controller import objects as o
from controller import podgroups
from sim.roles import podgroupclaims, preemption
from controller.allocator import AllocationError, ClusterSnapshot, Node, parse_claim
from controller.claims import GeneratedClaims
from controller.commit import AllocationCommitter
from controller.diagnosis import NodeReason, explain
from controller.explanation_writer import REASON_GANG_WAITING, REASON_QUOTA, REASON_SCHEDULED, REASON_UNSCHEDULABLE, ExplanationWriter
from controller.extended import class_for_resource, dra_extended_requests, extended_resource_claim
from sim.roles.fiterror import EVENT_REASON as FAILED_SCHEDULING, SCHEDULER_NAME, NodeStatus, fit_error
from controller.metrics import ControllerMetrics
from sim.roles.nodefit import (
    REASON_CANNOT_ALLOCATE, REASON_CLAIM_ELSEWHERE, as_allocator_node, dynamic_rejects,
    preferred_nodes, required_affinity, static_rejects,
)
from sim.roles.nodeusage import NodeLoad, NodeUsage
from sim.roles.podresources import Demand, HostPort, host_ports, is_extended, node_allocatable, pod_demand
from controller.objects import Obj
from controller.pending import allocation_rejects, gather_pod_claims, is_pending, unavailable_message
from sim.roles.inflight import InFlight
from controller.informer import Store
from sim.roles.podconditions import mark_disrupted, mark_unschedulable
from sim.roles.priority import pod_priority, priority_values
from sim.roles.schedqueue import SchedulingQueue, SortKey
from sim.roles.quota import check_quota, devices_by_class
from controller.scoring import NoPlacement, Placer
from controller.snapshots import LiveSnapshot
from controller.view import View
from controller.writes import NotLeader, Writer, bind_pod
from gpudra.features import Features

log = logging.getLogger("gpudra.sim.roles.scheduler")

def _pod_shape(pod: Mapping[str, Any]) -> str:
    """What static_rejects reads from a pod, as a key: pods alike in it get the same verdict on every node."""
    spec = o.section(pod, "spec")
    # repr never fails on odd input; two spellings of one selector only cost a second cache entry.
    return repr((spec.get("nodeSelector"), spec.get("tolerations"), o.section(spec.get("affinity") or {}, "nodeAffinity")
                 .get("requiredDuringSchedulingIgnoredDuringExecution")))


def _scheduler_status(reason: NodeReason) -> NodeStatus:
    """How kube-scheduler's Filter would have reported this node: our node-level rejections carry its reasons; a
    device explanation is the DynamicResources plugin's `cannot allocate all claims`."""
    return NodeStatus(reason.scheduler or (REASON_CANNOT_ALLOCATE,), reason.resolvable)


@dataclass(frozen=True)
class SchedulerOutcome:
    bound: int = 0
    unschedulable: int = 0
    claims_created: int = 0


# Expands one pod's template claims: (pod, generated-claims index, templates) -> the claims it created.
ExpandHook = Callable[[Obj, GeneratedClaims, Mapping[str, Obj]], list[Obj]]


@dataclass
class _PassState:
    """What one pass knows and has done so far; every successful placement updates it."""

    view: View
    claims_by_key: dict[str, Obj]
    snapshot: ClusterSnapshot
    placer: Placer
    node_objects: dict[str, Obj]
    generated: GeneratedClaims
    node_names: list[str]
    allocator_nodes: dict[str, Node]
    allocatable: dict[str, dict[str, int]]  # status.allocatable of the nodes that have a Node object
    # Per pod shape (nodeSelector, tolerations, required node affinity: all static_rejects reads of a pod): the
    # nodes that take it.
    shape_nodes: dict[str, "_Candidates"]
    priorities: tuple[dict[str, int], int]  # PriorityClass values and the default priority (priority_values)
    # The pods bound to a node, as preemption looked at them in this pass (a pass deletes none but victims).
    residents: dict[str, list[preemption.Victim]] = field(default_factory=dict)
    # Node -> pod UID -> pod, for the pending pods nominated to a node (status.nominatedNodeName): kube-scheduler
    # counts them on that node for pods that do not outrank them.
    nominations: dict[str, dict[str, preemption.Victim]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Candidates:
    names: list[str]  # in node name order
    members: frozenset[str]
    rejected: list[NodeReason]


_BOUND, _WAITING, _FAILED = "bound", "waiting", "failed"


@dataclass(frozen=True)
class _Binding:
    """One placed pod's writes: allocate `pending` (with `allocations`), reserve `allocated`, bind to `node`."""

    pod: Obj
    node: str
    pending: list[Obj]
    allocations: list[dict[str, Any]]
    allocated: list[Obj]
    consumers: list[Obj]  # the reservedFor consumer of each claim, pending ones first
    demand: Demand
    ports: tuple[HostPort, ...]
    kind: str  # the bindings metric's label
    before: dict[str, Obj]  # the pod's claims as they were before this binding, by key


@dataclass(frozen=True)
class _Bound:
    binding: _Binding
    outcome: str  # _BOUND, _WAITING (allocated, waiting for binding conditions) or _FAILED (nothing stays written)
    stored: list[Obj]  # the claims as the API stored them
    error: Exception | None = None


@dataclass(frozen=True)
class _Preempted:
    """What DefaultPreemption decided for a pod no node takes."""

    message: str | None = None  # its FailedScheduling part ("" when it nominated a node; None: no victims found)
    nominate: str | None = None  # the pod's nominatedNodeName to write ("" takes it back; None leaves it)
    note: str = ""  # what our own explanation adds


@dataclass
class _Tally:
    bound: int = 0
    unschedulable: int = 0
    claims_created: int = 0


class EmbeddedScheduler:
    def __init__(
        self,
        writer: Writer,
        explainer: ExplanationWriter,
        metrics: ControllerMetrics,
        *,
        features: Features,
        live: LiveSnapshot,
        driver_name: str,
        pods: Store,
        expand: ExpandHook | None = None,
        max_pods: int = 1000,
        budget: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        claim_index: Callable[[], GeneratedClaims] | None = None,
        binding_timeout: float = bindingconditions.DEFAULT_BINDING_TIMEOUT_SECONDS,
        bindings_in_flight: int = 8,
        expansions_ahead: int = 4,
    ) -> None:
        self.binding_timeout = binding_timeout
        self.bindings_in_flight = bindings_in_flight
        self.expansions_ahead = expansions_ahead
        # Threads for the writes beside placement (sim.roles.inflight), started with the first pass that writes.
        self._pool_instance: ThreadPoolExecutor | None = None
        self._writer = writer
        self._explainer = explainer
        self._metrics = metrics
        self._features = features
        self._live = live
        self._expand = expand
        self.driver = driver_name
        self.max_pods = max_pods
        self.budget = budget
        self._clock = clock
        self._cel = live.cel_env
        self._committer = AllocationCommitter(writer, drop_annotations=(explainer.annotation,))
        # Pods bound by this scheduler whose binding the caches have not shown yet: pod UID -> node.
        self._assumed: dict[str, str] = {}
        # The pod cache and its change set: pods that arrive during a pass are queued in the same pass.
        self._pods = pods
        # The generated-claims index kept current by the manager (None: built from the view each pass).
        self._claim_index = claim_index
        # (snapshot, node objects, node names, allocator nodes, allocatable, candidates per pod shape), kept while
        # the nodes are.
        self._node_cache: tuple[ClusterSnapshot, dict[str, Obj], list[str], dict[str, Node], dict[str, dict[str, int]],
                                dict[str, _Candidates]] | None = None
        # What the bound pods hold on each node (NodeResourcesFit, NodePorts), kept from the pod cache's changes.
        self._usage = NodeUsage()
        self._pod_changes: set[str] = pods.track()
        self._pending: dict[str, Obj] = {}  # pending pods by key, kept from the pod cache's changes

    @property
    def _pool(self) -> ThreadPoolExecutor:
        if self._pool_instance is None:
            self._pool_instance = ThreadPoolExecutor(self.bindings_in_flight + self.expansions_ahead + 1,
                                                     thread_name_prefix="scheduler-writes")
        return self._pool_instance

    def close(self) -> None:
        """Stop the write threads (a pass never leaves work on them); a later pass starts new ones."""
        pool, self._pool_instance = self._pool_instance, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _current_nodes(self) -> tuple[ClusterSnapshot, Placer]:
        """The live snapshot, with what is known per node (and per pod shape and node) kept for it: that holds
        while the nodes do, and the live snapshot is rebuilt whenever a Node changes, so its identity says whether
        they did."""
        snapshot, placer = self._live.current()
        if self._node_cache is None or self._node_cache[0] is not snapshot:
            node_objects = dict(self._live.nodes)
            names = sorted(node_objects) if node_objects else list(snapshot.node_names)
            allocator_nodes = {n: as_allocator_node(node_objects[n]) if n in node_objects else Node.inferred(n) for n in names}
            allocatable = {n: node_allocatable(obj) for n, obj in node_objects.items()}
            self._usage.set_pod_limits({n: a.get("pods", 0) for n, a in allocatable.items()})
            self._node_cache = (snapshot, node_objects, names, allocator_nodes, allocatable, {})
        return snapshot, placer

    def _start_pass(self, view: View, priorities: tuple[dict[str, int], int], waiting: list[Obj]) -> _PassState:
        snapshot, placer = self._current_nodes()
        assert self._node_cache is not None  # _current_nodes keeps it, for this snapshot
        _, node_objects, names, allocator_nodes, allocatable, shape_nodes = self._node_cache
        nominations: dict[str, dict[str, preemption.Victim]] = {}
        for pod in waiting:
            nominated = o.section(pod, "status").get("nominatedNodeName")
            if nominated:
                nominations.setdefault(str(nominated), {})[o.uid(pod)] = preemption.Victim(
                    pod, pod_priority(pod, *priorities), pod_demand(pod), host_ports(pod))
        return _PassState(
            view=view,
            claims_by_key=dict(view.claims),
            snapshot=snapshot,
            placer=placer,
            node_objects=node_objects,
            generated=self._claim_index() if self._claim_index is not None else GeneratedClaims(view.claims.values()),
            node_names=names,
            allocator_nodes=allocator_nodes,
            allocatable=allocatable,
            shape_nodes=shape_nodes,
            priorities=priorities,
            nominations=nominations,
        )

    def reconcile(self, view: View) -> SchedulerOutcome:
        self._refresh_pending()
        waiting = list(self._pending.values())
        # Forget assumed bindings once the cache shows them (or the pod is gone); skip the others.
        waiting_uids = {o.uid(p) for p in waiting}
        self._assumed = {uid: node for uid, node in self._assumed.items() if uid in waiting_uids}
        values, default = priority_values(view.priority_classes.values())
        queue = SchedulingQueue(values, default, self.max_pods)
        for pod in waiting:
            if o.uid(pod) not in self._assumed:
                queue.push(dict(pod))
        if not queue:
            self._current_nodes()  # kept current while idle: the first pod of a burst does not pay for a rebuild
            return SchedulerOutcome()
        state = self._start_pass(view, (values, default), waiting)
        tally = _Tally()
        bindings: InFlight[_Bound] = InFlight(self._pool, self.bindings_in_flight)
        # Popped pods with their expansion started, in queue order: a pod that arrives meanwhile and outranks one
        # of them is popped too and goes before it, so that placement follows the rank of every pod known so far.
        ahead: list[tuple[SortKey, int, Obj, Future[list[Obj]] | None]] = []
        handled: set[str] = set()
        deadline = self._clock() + self.budget
        try:
            while True:
                if handled and self._clock() > deadline:
                    break  # the rest waits for the next pass (the other concerns run in between)
                self._admit_arrivals(queue, handled)
                while len(ahead) <= self.expansions_ahead or queue.outranks(ahead[-1][0]):
                    queued = queue.pop()
                    if queued is None:
                        break
                    handled.add(o.key(queued))
                    insort(ahead, (queue.sort_key(queued), len(handled), queued,
                                   self._start_expansion(queued, state, view)), key=lambda e: e[:2])
                if not ahead:
                    break
                _, _, pod, expansion = ahead.pop(0)
                self._settle(bindings.finished(), state, tally)
                try:
                    for created in expansion.result() if expansion is not None else ():
                        state.claims_by_key[o.key(created)] = created
                        tally.claims_created += 1
                    if self._schedule(pod, state, bindings, tally):
                        continue
                except NotLeader:
                    raise
                except AllocationError as err:
                    self._unschedulable(pod, [], str(err), reason="error")
                except Exception:  # noqa: BLE001 - one malformed pod must not stop the others
                    log.exception("placing pod failed", extra={"pod": o.key(pod)})
                tally.unschedulable += 1
        finally:
            # Nothing of this pass stays in flight: the other concerns of the pass never race its writes.
            for _, _, _, expansion in ahead:
                if expansion is not None and expansion.exception() is None:
                    tally.claims_created += len(expansion.result())
            self._settle(bindings.finished(everything=True), state, tally)
        return SchedulerOutcome(tally.bound, tally.unschedulable, tally.claims_created)

    def _start_expansion(self, pod: Obj, state: _PassState, view: View) -> Future[list[Obj]] | None:
        """Create the pod's template claims on the pool, while the pods ahead of it are placed."""
        if self._expand is None or not any(
            isinstance(e, Mapping) and e.get("resourceClaimTemplateName")
            for e in o.list_field(o.section(pod, "spec"), "resourceClaims")
        ):
            return None
        expand = self._expand
        return self._pool.submit(lambda: expand(pod, state.generated, view.templates))

    def _admit_arrivals(self, queue: SchedulingQueue, handled: set[str]) -> None:
        """Queue the pods that became pending since the pass began (created meanwhile), each in its rank."""
        for key in self._refresh_pending():
            if key in handled:
                continue
            pod = self._pending.get(key)
            if pod is not None and o.uid(pod) not in self._assumed:
                queue.push(dict(pod))

    def _refresh_pending(self) -> set[str]:
        """Bring the pending pods up to date with the pod cache's changes (a pass costs what changed, not every
        pod in the cluster); the keys that changed."""
        changed = self._pods.drain(self._pod_changes)
        for key in changed:
            pod = self._pods.get(key)
            # A pod this scheduler bound holds its node's resources although the cache may not show it bound yet.
            if pod is None or o.pod_scheduled(pod) or o.uid(pod) not in self._assumed:
                self._usage.observe(key, pod)
            if pod is not None and is_pending(pod):
                self._pending[key] = pod
            else:
                self._pending.pop(key, None)
        return changed

    # -- one pod -----------------------------------------------------------------------------------

    def _candidate_nodes(self, pod: Obj, claims: list[Obj], demand: Demand, ports: tuple[HostPort, ...],
                         skip: frozenset[str], state: _PassState) -> _Candidates:
        """The nodes the pod may use, and why the others not. The verdict on the pod's own constraints (node
        selector, tolerations, required node affinity) is computed once per pod shape while the nodes are
        unchanged; resources and host ports are checked per pod against what the nodes' bound pods hold (a pod
        that requests nothing only against the nodes that are full), and allocated claims pin a pod further."""
        shape = _pod_shape(pod)
        base = state.shape_nodes.get(shape)
        if base is None:
            affinity = required_affinity(pod)  # AllocationError when malformed: the pod is reported, not placed
            ok: list[str] = []
            rejected: list[NodeReason] = []
            for name in state.node_names:
                node_obj = state.node_objects.get(name)
                why = static_rejects(pod, node_obj, state.allocator_nodes[name], affinity) if node_obj is not None else None
                if why is None:
                    ok.append(name)
                else:
                    rejected.append(NodeReason(name, "unschedulable", why.explanation, scheduler=why.reasons,
                                               resolvable=why.resolvable))
            base = _Candidates(ok, frozenset(ok), rejected)
            state.shape_nodes[shape] = base
        pinned = any((o.allocation(c) or {}).get("nodeSelector") is not None for c in claims)
        fit = not demand.empty or bool(ports)
        if not pinned and not fit and not (self._usage.full & base.members):
            return base
        names: list[str] = []
        more = list(base.rejected)
        priority = pod_priority(pod, *state.priorities) if state.nominations else 0
        for name in base.names:
            why = None
            allocatable = state.allocatable.get(name)
            if allocatable is not None and (fit or name in self._usage.full):
                why = dynamic_rejects(demand, ports, allocatable, self._load(name, priority, pod, state), skip)
            if why is not None:
                more.append(NodeReason(name, "unschedulable", why.explanation, scheduler=why.reasons, resolvable=why.resolvable))
                continue
            elsewhere = allocation_rejects(claims, state.allocator_nodes[name]) if pinned else None
            if elsewhere is not None:
                more.append(NodeReason(name, "unschedulable", elsewhere, scheduler=(REASON_CLAIM_ELSEWHERE,)))
                continue
            names.append(name)
        return _Candidates(names, frozenset(names), more)

    def _schedule(self, pod: Obj, state: _PassState, bindings: InFlight[_Bound], tally: _Tally) -> bool:
        """Place one pod and start its binding (whose outcome `_settle` counts); False when it cannot be placed now
        (reported as unschedulable)."""
        group_wait = podgroups.wait_reason(pod, state.view, state.claims_by_key, self._explainer.annotation)
        if group_wait is not None:
            self._unschedulable(pod, [], group_wait.message, reason="waiting", event=REASON_GANG_WAITING,
                                warning=not group_wait.forming)
            return False
        gathered = gather_pod_claims(pod, state.claims_by_key, self.driver, state.view.templates, state.generated,
                                     self._explainer.annotation)
        if gathered.claims and bindings.touching(o.key(c) for c in gathered.claims):
            # A claim it shares is being written for an earlier pod: take that result first.
            self._settle(bindings.finished(claims=[o.key(c) for c in gathered.claims]), state, tally)
            gathered = gather_pod_claims(pod, state.claims_by_key, self.driver, state.view.templates, state.generated,
                                         self._explainer.annotation)
        if gathered.wait_reason:
            if not gathered.silent:
                self._unschedulable(pod, [], gathered.wait_reason, event=gathered.wait_event, reason="waiting",
                                    warning=gathered.warning,
                                    prefilter=gathered.wait_reason if gathered.wait_event == REASON_UNSCHEDULABLE else "",
                                    state=state)
            return False
        claims = gathered.claims
        demand, ports = pod_demand(pod), host_ports(pod)
        skip: frozenset[str] = frozenset()
        special: Obj | None = None
        mappings: list[dict[str, str]] = []
        if self._features.extended_resource:
            special, mappings, wait = self._extended_claim(pod, state)
            if wait:
                self._unschedulable(pod, [], wait, reason="waiting", prefilter=wait, state=state)
                return False
            if special is not None:
                claims = [*claims, special]
                # Served by DRA (the special claim), not by a device plugin's allocatable.
                skip = frozenset(m["resourceName"] for m in mappings)
        found = self._candidate_nodes(pod, claims, demand, ports, skip, state)
        candidates, rejected = found.names, found.rejected
        total_nodes = len(candidates) + len(rejected)
        pending = [c for c in claims if o.allocation(c) is None]
        if not candidates:
            message = unavailable_message(total_nodes, rejected) if total_nodes else "no nodes available to schedule pods"
            decided = self._preempt(pod, state, claims, pending, demand, ports, skip) if total_nodes else _Preempted()
            self._unschedulable(pod, pending, message + decided.note, reason="no-nodes", statuses=rejected, state=state,
                                preempted=decided)
            return False

        allocations: list[dict[str, Any]] = []
        if pending:
            try:
                parsed = [parse_claim(c) for c in pending]
                preferred = preferred_nodes(pod, candidates, state.allocator_nodes)
                result = state.placer.place(parsed, frozenset(preferred)) if preferred else None
                if result is None or isinstance(result, NoPlacement):
                    result = state.placer.place(parsed, found.members)
                reasons = explain(state.snapshot, parsed, candidates, self._features, self._cel) \
                    if isinstance(result, NoPlacement) else []
            except AllocationError as err:
                # A CEL runtime error, a missing DeviceClass...: the claims' explanation says so too, not only the Event.
                self._unschedulable(pod, pending, str(err), reason="error")
                return False
            if isinstance(result, NoPlacement):
                decided = self._preempt(pod, state, claims, pending, demand, ports, skip)
                self._unschedulable(pod, pending, unavailable_message(total_nodes, [*reasons, *rejected]) + decided.note,
                                    reason="unschedulable", statuses=[*reasons, *rejected], state=state, preempted=decided)
                return False
            node, allocations = result.node, result.allocations
        else:
            # Nothing to allocate: spread such pods over the nodes that can take them.
            preferred = preferred_nodes(pod, candidates, state.allocator_nodes) or candidates
            node = min(preferred, key=lambda n: (self._usage.load(n).pods, n))

        if not self._pre_bind(pod, node, pending, allocations, state):
            return False

        index = -1
        if special is not None and o.allocation(special) is None:
            created = self._create_special(pod, special, mappings)
            if created is None:
                return False
            index = next(i for i, c in enumerate(pending) if c is special)
            pending = [*pending[:index], created, *pending[index + 1:]]
        allocated = [c for c in claims if o.allocation(c) is not None]
        binding = _Binding(
            pod=pod, node=node, pending=pending, allocations=allocations, allocated=allocated,
            consumers=[self._consumer(c, pod, state) for c in (*pending, *allocated)],
            demand=demand, ports=ports,
            kind="dra" if claims else ("extended-resource" if any(is_extended(n) for n, _ in demand.amounts) else "plain"),
            before={o.key(c): c for c in (*pending, *allocated)},
        )
        self._assume(binding, state)
        if index < 0:
            self._settle(bindings.submit(lambda: self._bind(binding), binding.before), state, tally)
            return True
        # The special claim was just created for this pod: bind now, so that a failure can take it back.
        bound = self._bind(binding)
        self._settle([bound], state, tally)
        if bound.outcome == _FAILED:
            self._writer.delete("ResourceClaim", pending[index])
            self._writer.patch_status("Pod", pod, {"status": {"extendedResourceClaimStatus": None}})
        return True

    # -- binding: assumed on the scheduling thread, written on the pool, settled on the scheduling thread ---------

    def _assume(self, binding: _Binding, state: _PassState) -> None:
        """What the pass believes from now on: the devices are taken, the claims allocated (quota checks see that),
        the pod bound to the node."""
        pending_keys = [o.key(c) for c in binding.pending]
        self._live.commit(pending_keys, binding.allocations, binding.node)
        for claim, alloc in zip(binding.pending, binding.allocations):
            state.claims_by_key[o.key(claim)] = {**claim, "status": {**o.section(claim, "status"), "allocation": alloc}}
        self._assumed[o.uid(binding.pod)] = binding.node
        self._usage.hold(o.key(binding.pod), binding.node, binding.demand, binding.ports)
        for nominated in state.nominations.values():
            nominated.pop(o.uid(binding.pod), None)  # it holds what it asked for where it is bound

    def _bind(self, binding: _Binding) -> _Bound:
        """On the pool: the binding's writes, and what became of them (never raises)."""
        try:
            return self._write_binding(binding)
        except NotLeader as err:
            return _Bound(binding, _FAILED, [], error=err)
        except Exception as err:  # noqa: BLE001 - the scheduling thread reports it; the pod is tried again
            log.exception("binding pod failed", extra={"pod": o.key(binding.pod), "node": binding.node})
            return _Bound(binding, _FAILED, [], error=err)

    def _write_binding(self, binding: _Binding) -> _Bound:
        """Finalizer + allocation + reservedFor per claim, the binding gate, then pods/binding and the Scheduled
        event. A failed step undoes the earlier ones."""
        pod = binding.pod
        done: list[tuple[Obj, bool]] = []  # (claim, deallocate on undo)

        def undo() -> _Bound:
            for claim, dealloc in reversed(done):
                self._committer.undo(claim, pod, deallocate=dealloc)
            self._metrics.failures.labels(reason="write-failed").inc()
            return _Bound(binding, _FAILED, [])

        consumers = iter(binding.consumers)
        for claim, alloc in zip(binding.pending, binding.allocations):
            stored = self._committer.allocate(claim, alloc, next(consumers))
            if stored is None:
                return undo()
            done.append((stored, True))
        for claim in binding.allocated:
            stored = self._committer.reserve(claim, next(consumers))
            if stored is None:
                return undo()
            done.append((stored, False))
        stored_claims = [c for c, _ in done]
        gate = self._binding_gate(pod, stored_claims)
        if gate == bindingconditions.WAIT:
            return _Bound(binding, _WAITING, stored_claims)  # allocated and reserved: the devices stay taken
        if gate != bindingconditions.BIND:
            return _Bound(binding, _FAILED, [])  # the gate deallocated them
        if not bind_pod(self._writer, pod, binding.node, refresh=False):
            return undo()
        log.info("pod bound", extra={"pod": o.key(pod), "node": binding.node, "claims": len(binding.before),
                                     "allocated": len(binding.pending)})
        self._metrics.allocations.labels(path="scheduler").inc(len(binding.pending))
        self._metrics.bindings.labels(kind=binding.kind).inc()
        self._explainer.forget(pod, REASON_UNSCHEDULABLE)
        self._explainer.event(pod, REASON_SCHEDULED, f"Successfully assigned {o.key(pod)} to {binding.node}", warning=False,
                              component=SCHEDULER_NAME, action="Binding")
        return _Bound(binding, _BOUND, stored_claims)

    def _settle(self, results: Iterable[_Bound], state: _PassState, tally: _Tally) -> None:
        """Take finished bindings into the pass: what the API stored replaces what was assumed; a binding that did
        not happen gives its devices back and its pod waits for the next pass (one waiting for device binding
        conditions keeps its devices)."""
        lost: NotLeader | None = None
        for result in results:
            binding = result.binding
            if isinstance(result.error, NotLeader):
                lost = result.error
            if result.outcome == _FAILED:
                state.claims_by_key.update(binding.before)
                self._live.release([o.key(c) for c in binding.pending])
            for stored in result.stored:
                state.claims_by_key[o.key(stored)] = stored
            if result.outcome == _BOUND:
                tally.bound += 1
            else:
                tally.unschedulable += 1
                self._assumed.pop(o.uid(binding.pod), None)
                self._usage.release(o.key(binding.pod))
        if lost is not None:
            raise lost

    def _pre_bind(self, pod: Obj, node: str, pending: list[Obj], allocations: list[dict[str, Any]], state: _PassState) -> bool:
        """Checks between choosing a node and writing anything (namespace device quotas); False after reporting
        the pod unschedulable. Further checks (binding conditions, gangs) belong here."""
        new_devices: Counter[str] = Counter()
        for claim, alloc in zip(pending, allocations):
            new_devices.update(devices_by_class(claim, alloc))
        verdict = check_quota(o.namespace(pod), new_devices, state.claims_by_key.values(), state.view.quotas.values())
        if not verdict.ok:
            self._unschedulable(pod, pending, verdict.message, event=REASON_QUOTA, reason="quota")
            return False
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

    def _unschedulable(self, pod: Obj, pending: list[Obj], message: str, *, event: str = REASON_UNSCHEDULABLE, reason: str,
                       statuses: list[NodeReason] | None = None, prefilter: str = "", state: _PassState | None = None,
                       warning: bool = True, preempted: _Preempted = _Preempted()) -> None:
        """Report a pod that stays pending: our explanation (an Event and the claims' annotation) and, where
        kube-scheduler would have tried the pod (`statuses` per node, or a `prefilter` reason before any node),
        its FailedScheduling Event in its words, which the PodScheduled condition carries as it does there."""
        self._metrics.failures.labels(reason=reason).inc()
        self._explainer.event(pod, event, message, warning=warning)
        self._explainer.annotate(pending, message)
        condition = message
        if state is not None and (statuses is not None or prefilter):
            total = len(state.node_names)
            condition = "no nodes available to schedule pods" if not total else fit_error(
                total, [_scheduler_status(r) for r in statuses or ()], pod, prefilter=prefilter, preemption=preempted.message)
            self._explainer.event(pod, FAILED_SCHEDULING, condition, component=SCHEDULER_NAME, action="Scheduling")
        mark_unschedulable(self._writer, pod, condition, nominated_node=preempted.nominate)

    # -- preemption (sim.roles.preemption) -----------------------------------------------------------------------

    def _preempt(self, pod: Obj, state: _PassState, claims: list[Obj], pending: list[Obj], demand: Demand,
                 ports: tuple[HostPort, ...], skip: frozenset[str]) -> _Preempted:
        """DefaultPreemption for a pod no node takes: on the nodes where only NodeResourcesFit or NodePorts
        refused it, the fewest pods of lower priority to remove; the best such node's victims are deleted."""
        if o.section(pod, "spec").get("preemptionPolicy") == "Never":
            return _Preempted()
        values, default = state.priorities
        priority = pod_priority(pod, values, default)
        base = state.shape_nodes.get(_pod_shape(pod))
        nodes = base.names if base is not None else []
        nominated = str(o.section(pod, "status").get("nominatedNodeName") or "")
        if nominated in (base.members if base is not None else ()) and any(
                v.priority < priority and preemption.terminating_by_preemption(v.pod) for v in self._residents(nominated, state)):
            return _Preempted(preemption.NOT_ELIGIBLE_TERMINATING,
                              note=f"; waiting for the pods it preempted on node {nominated} to terminate")
        pinned = any((o.allocation(c) or {}).get("nodeSelector") is not None for c in claims)
        budgets = list(state.view.disruption_budgets.values())
        found: list[preemption.Candidate] = []
        try:
            parsed = [parse_claim(c) for c in pending]
            for name in nodes:
                allocatable = state.allocatable.get(name)
                if allocatable is None:
                    continue
                load = self._load(name, priority, pod, state)

                def fits(after: NodeLoad, allocatable: Mapping[str, int] = allocatable) -> bool:
                    return dynamic_rejects(demand, ports, allocatable, after, skip) is None

                if fits(load) or (pinned and allocation_rejects(claims, state.allocator_nodes[name]) is not None):
                    continue  # not refused for resources or ports here: removing pods cannot help
                lower = [v for v in self._residents(name, state) if v.priority < priority]
                victims = preemption.select_victims(load, preemption.with_budgets(lower, budgets), fits)
                if victims is None:
                    continue
                # Victims free no devices (kube-scheduler's DynamicResources plugin cannot remove pods either).
                if parsed and isinstance(state.placer.place(parsed, frozenset({name})), NoPlacement):
                    continue
                found.append(preemption.Candidate(name, victims))
                if len(found) >= preemption.candidates_wanted(len(state.node_names)):
                    break
        except AllocationError:
            found = []
        if not found:
            return _Preempted(nominate="")
        chosen = preemption.pick(found)
        state.residents.pop(chosen.node, None)  # read again from the cache, which will show the victims leaving
        for victim in chosen.victims:
            if o.meta(victim.pod).get("deletionTimestamp"):
                continue  # already on its way out
            mark_disrupted(self._writer, victim.pod, {"status": "True", "reason": preemption.CONDITION_REASON,
                                                      "message": preemption.condition_message(SCHEDULER_NAME)})
            self._writer.delete("Pod", victim.pod)
            self._explainer.event(victim.pod, preemption.EVENT_REASON, preemption.event_message(pod, chosen.node),
                                  warning=False, component=SCHEDULER_NAME, action=preemption.EVENT_ACTION, related=pod)
        # Pods of lower priority nominated to that node may no longer fit there: they look again.
        on_node = state.nominations.setdefault(chosen.node, {})
        for uid, other in list(on_node.items()):
            if other.priority < priority:
                self._writer.patch_status("Pod", other.pod, {"status": {"nominatedNodeName": None}})
                del on_node[uid]
        for elsewhere in state.nominations.values():
            elsewhere.pop(o.uid(pod), None)
        on_node[o.uid(pod)] = preemption.Victim(pod, priority, demand, ports)
        log.info("preempting", extra={"pod": o.key(pod), "node": chosen.node,
                                      "victims": [o.key(v.pod) for v in chosen.victims]})
        named = ", ".join(o.key(v.pod) for v in chosen.victims)
        return _Preempted("", chosen.node, f"; preempting {len(chosen.victims)} pod(s) of lower priority on node "
                                           f"{chosen.node} ({named})")

    def _load(self, node: str, priority: int, pod: Obj, state: _PassState) -> NodeLoad:
        """What the node's pods hold, and the other pods nominated to it that rank as high as `pod` (`priority`)."""
        load = self._usage.load(node)
        nominated = state.nominations.get(node)
        if not nominated:
            return load
        held = [v for uid, v in nominated.items() if uid != o.uid(pod) and v.priority >= priority]
        return preemption.without(load, (), held) if held else load

    def _residents(self, node: str, state: _PassState) -> list[preemption.Victim]:
        """The pods bound to `node` as the cache shows them (pods this pass only assumed there are not victims)."""
        known = state.residents.get(node)
        if known is not None:
            return known
        values, default = state.priorities
        found: list[preemption.Victim] = []
        for key in sorted(self._usage.pods_on(node)):
            resident = self._pods.get(key)
            if resident is not None and o.section(resident, "spec").get("nodeName") == node:
                found.append(preemption.Victim(resident, pod_priority(resident, values, default), pod_demand(resident),
                                               host_ports(resident)))
        state.residents[node] = found
        return found
