"""Wires the controller together: informers, leader election, the reconcile loop, metrics, shutdown.

One reconcile loop runs the concerns in a fixed order on every pass, because every concern that allocates
must see the previous one's writes (two loops picking devices from the same stale cache could hand one
device out twice). Passes are driven by watch events (any cache change wakes the loop) and by a periodic
tick (gang timeouts, rate-limited explanations). Only the leader runs passes.

Tests drive it deterministically with `step()` (relist every cache, then one pass) instead of threads.
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone

from controller import objects as o
from controller.cel import CelEnvironment
from controller.claims import ClaimLifecycle, GeneratedClaims
from controller.explanation_writer import ExplanationWriter
from controller.gang import GangController, GangSummary
from controller.ganggroups import gang_label
from controller.podgroupclaims import PodGroupClaims
from controller.informer import Informer, Store
from controller.leader import LeaderElector, LeaseTimings
from controller.metrics import ControllerMetrics, MetricsServer
from controller.scheduler import EmbeddedScheduler, PendingExplainer, is_pending
from controller.snapshots import LiveSnapshot
from controller.computedomain import DAEMON_IMAGE, ComputeDomainController
from controller.taintevict import TaintEvictor
from controller.watchlist import ClaimWatchlist
from controller.view import View
from controller.writes import NotLeader, Writer
from gpudra import DEFAULT_DRIVER_NAME
from gpudra.features import Features
from gpudra.kubeapi import ApiError, KubeApi

log = logging.getLogger("gpudra.controller.manager")

# Kinds every mode watches, and the extra ones embedded mode (the scheduler/controller-manager role) needs.
CLUSTER_KINDS: tuple[str, ...] = ("Pod", "ResourceClaim", "ResourceSlice", "DeviceClass", "Node")
# DeviceTaintRule and PodGroup are watched in embedded mode only: a real cluster's kube-scheduler applies
# taint rules and schedules pod groups itself.
EMBEDDED_KINDS: tuple[str, ...] = ("ResourceClaimTemplate", "PriorityClass", "ResourceQuota", "DeviceTaintRule", "PodGroup",
                                   "PodDisruptionBudget")


# Kinds a kube-apiserver serves only with a feature gate on (its REST storage is installed only then).
_GATED_KINDS: dict[str, str] = {"PodGroup": "generic_workload", "DeviceTaintRule": "device_taint_rules"}


def _served(kind: str, features: Features) -> bool:
    gate = _GATED_KINDS.get(kind)
    return gate is None or bool(getattr(features, gate))


def default_identity() -> str:
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class ControllerConfig:
    driver_name: str = DEFAULT_DRIVER_NAME
    embedded: bool = False
    gang_timeout: float = 300.0
    # KEP-5007: how long the embedded scheduler waits for device binding conditions (DynamicResourcesArgs).
    binding_timeout: float = 600.0
    leader_elect: bool = True
    identity: str = field(default_factory=default_identity)
    lease_namespace: str = "kube-system"
    lease_name: str = "gpu-dra-controller"
    timings: LeaseTimings = LeaseTimings()
    resync_period: float = 30.0
    # The loop runs at least this often without events (gang timeouts, repeated explanations).
    tick: float = 1.0
    # After an event wakes the loop, how long it waits for the events that come with it before a pass.
    coalesce: float = 0.005
    event_repeat_interval: float = 60.0
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"
    features: Features = Features()
    # ComputeDomains (controller.computedomain): the driver's namespace and the IMEX daemon pods' image.
    compute_domain_namespace: str = "gpu-dra-system"
    compute_domain_daemon_image: str = DAEMON_IMAGE
    compute_domain_daemon_pull_secrets: tuple[str, ...] = ()


@dataclass(frozen=True)
class PassReport:
    """What one pass did (for logs and tests)."""

    ran: bool
    claims_created: int = 0
    claims_released: int = 0
    claims_deleted: int = 0
    gangs: GangSummary = GangSummary()
    pods_bound: int = 0
    pods_unschedulable: int = 0
    problems: tuple[str, ...] = ()


class ControllerManager:
    def __init__(
        self,
        api: KubeApi,
        config: ControllerConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    ) -> None:
        self.api = api
        self.config = config
        self.metrics = ControllerMetrics()
        self._clock = clock
        self._wall = wall
        self._stop = threading.Event()
        # The lease outlives the loop: it is released only after the last pass has finished.
        self._elector_stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pass_lock = threading.Lock()
        self._release_on_stop = True
        self._metrics_server: MetricsServer | None = None
        kinds = CLUSTER_KINDS + (tuple(k for k in EMBEDDED_KINDS if _served(k, config.features))
                                 if config.embedded else ())
        self.stores: dict[str, Store] = {kind: Store(kind) for kind in kinds}
        self.informers: dict[str, Informer] = {
            kind: Informer(api, store, self._notify)
            for kind, store in self.stores.items()
        }
        self.elector: LeaderElector | None = None
        if config.leader_elect:
            self.elector = LeaderElector(
                api,
                namespace=config.lease_namespace,
                name=config.lease_name,
                identity=config.identity,
                timings=config.timings,
                on_change=self._leadership_changed,
            )
        else:
            self.metrics.leader.set(1)
        self.writer = Writer(api, self.metrics, may_write=self.may_write, observe=self._observe, forget=self._forget)
        self.explainer = ExplanationWriter(
            self.writer,
            self.metrics,
            driver_name=config.driver_name,
            identity=config.identity,
            clock=clock,
            wall=wall,
            repeat_interval=config.event_repeat_interval,
        )
        self.claims = ClaimLifecycle(self.writer, self.metrics, clock=clock, report=lambda pod, reason, message:
                                     self.explainer.event(pod, reason, message, component="resource_claim"))
        self.pod_group_claims = PodGroupClaims(self.writer)
        self.gangs = GangController(
            self.writer,
            self.explainer,
            self.metrics,
            driver_name=config.driver_name,
            timeout=config.gang_timeout,
            features=config.features,
            wall=wall,
            fresh_claims=self._fresh_claims,
        )
        self.live = LiveSnapshot(self.stores, config.features, CelEnvironment(features=config.features))
        self.scheduler = EmbeddedScheduler(
            self.writer,
            self.explainer,
            self.metrics,
            features=config.features,
            live=self.live,
            driver_name=config.driver_name,
            expand=self._expand_pod,
            pods=self.stores["Pod"],
            claim_index=self._claim_index,
            binding_timeout=config.binding_timeout,
        )
        # Kept across passes from the caches' change sets (embedded mode): the generated-claims index, and the pods
        # whose template expansion the pass must look at again.
        self._generated = GeneratedClaims()
        self._index_changes: set[str] = self.stores["ResourceClaim"].track()
        self._expansion_changes: set[str] = self.stores["Pod"].track()
        self._pods_gone: set[str] = self.stores["Pod"].track()
        self._taint_inputs = {k: self.stores[k].track() for k in ("ResourceSlice", "DeviceTaintRule") if k in self.stores}
        self._template_changes: set[str] = (self.stores["ResourceClaimTemplate"].track()
                                            if "ResourceClaimTemplate" in self.stores else set())
        self._last_full_expansion = float("-inf")
        self._held: set[str] = set()  # pods whose PodGroup shares their claims, as of this pass
        self._watchlist = ClaimWatchlist(self.stores["Pod"], self.stores["ResourceClaim"],
                                         full_every=config.resync_period, clock=clock)
        self.pending = PendingExplainer(self.explainer, self.metrics, features=config.features, driver_name=config.driver_name)
        self.taint_evictor = TaintEvictor(self.writer, self.explainer)

    # -- leadership --------------------------------------------------------------------------------

    def may_write(self) -> bool:
        return self.elector is None or self.elector.is_leader()

    def is_leader(self) -> bool:
        return self.may_write()

    def _leadership_changed(self, leading: bool) -> None:
        self.metrics.leader.set(1 if leading else 0)
        if leading:
            self._wake.set()

    # -- caches ------------------------------------------------------------------------------------

    def _notify(self, kind: str) -> None:
        self._wake.set()

    def _observe(self, kind: str, obj: o.Obj) -> None:
        store = self.stores.get(kind)
        if store is not None and store.upsert(obj):
            self._wake.set()

    def _forget(self, kind: str, obj: o.Obj) -> None:
        store = self.stores.get(kind)
        if store is not None:
            store.remove(obj)

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
        store = self.stores["ResourceClaim"]
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
        changed = self.stores["Pod"].drain(self._expansion_changes)
        templates_changed = bool(self.stores["ResourceClaimTemplate"].drain(self._template_changes)) \
            if "ResourceClaimTemplate" in self.stores else False
        now = self._clock()
        if templates_changed or now - self._last_full_expansion >= self.config.resync_period:
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
        label = gang_label(self.config.driver_name)
        for entry in o.list_field(o.section(pod, "spec"), "resourceClaims"):
            name = entry.get("resourceClaimTemplateName") if isinstance(entry, Mapping) else None
            template = templates.get(f"{o.namespace(pod)}/{name}") if name else None
            if template is not None and label in (o.section(o.section(template, "spec"), "metadata").get("labels") or {}):
                return True
        return False

    def _fresh_claims(self) -> list[o.Obj]:
        """All claims straight from the API server (the re-check before writing an allocation)."""
        items, _ = self.api.list("ResourceClaim")
        claims = list(items)
        for claim in claims:
            self.stores["ResourceClaim"].upsert(claim)
        return claims

    def view(self) -> View:
        return View.from_stores(self.stores)

    def resync(self) -> None:
        """Relist every cache now (what the periodic resync does), synchronously."""
        for informer in self.informers.values():
            informer.relist()

    # -- one pass ----------------------------------------------------------------------------------

    def reconcile_once(self) -> PassReport:
        """Run every concern once, in order. A no-op on a non-leader."""
        with self._pass_lock:
            if not self.may_write():
                return PassReport(ran=False)
            try:
                return self._pass()
            except NotLeader:
                log.warning("leadership lost during a pass; stopped writing", extra={"identity": self.config.identity})
                return PassReport(ran=False)

    def _timed(self, concern: str) -> "_Timer":
        return _Timer(self.metrics, concern)

    def _pass(self) -> PassReport:
        problems: list[str] = []
        created = released = deleted = 0
        if self.config.embedded:
            with self._timed("claims"):
                view = self.view()
                held: set[str] = set()
                if self.config.features.workload_resource_claims:
                    # Claims a PodGroup shares first, so member pods never get per-pod claims for them.
                    created, held = self.pod_group_claims.sync(view)
                    view = self.view()
                self._held = held
                # Pending pods are expanded one by one by the scheduler, right before each is placed.
                upfront = [p for p in self._expansion_candidates(view) if o.key(p) not in held]
                made, missing = self.claims.expand_templates(upfront, view.claims.values(), view.templates,
                                                             index=self._claim_index())
                created += made
                problems += missing
                view = self.view()
                # Only the claims that changed, or whose pods did, since the last pass (all once a resync period);
                # reservations by PodGroups are not tracked, so with them every claim is looked at.
                to_check = self._watchlist.claims_to_check(view.claims)
                check = set(view.claims) if self.config.features.workload_resource_claims else {o.key(c) for c in to_check}
                released = self.claims.release([c for k, c in view.claims.items() if k in check], view.pods,
                                               view.pod_groups if self.config.features.workload_resource_claims else None)
                # Each step sees the previous step's writes: the writer updates the caches it reads from.
                view = self.view()
                deleted = self.claims.delete_orphans([c for k, c in view.claims.items() if k in check], view.pods)
        with self._timed("gang"):
            gangs = self.gangs.reconcile(self.view())
        self.metrics.set_gang_states(gangs.states)
        bound = unschedulable = 0
        if self.config.embedded:
            with self._timed("scheduler"):
                outcome = self.scheduler.reconcile(self.view())
            bound, unschedulable = outcome.bound, outcome.unschedulable
            created += outcome.claims_created
            with self._timed("taint-eviction"):
                view = self.view()
                # Slices as the taint rules change them: any slice or rule change, and any rule (its status ages).
                changed = [bool(self.stores[k].drain(t)) for k, t in self._taint_inputs.items()]
                self.taint_evictor.reconcile(view.pods.values(), view.claims.values(), view.sorted_slices,
                                             view.taint_rules.values(), self._wall(),
                                             slices_changed=any(changed) or bool(view.taint_rules))
        else:
            with self._timed("explain"):
                unschedulable = self.pending.reconcile(self.view())
        self.metrics.pending_pods.set(unschedulable)
        pods = self.stores["Pod"]
        if any(pods.get(key) is None for key in pods.drain(self._pods_gone)):
            # Rate-limit memory goes with the pods; only a pass after a pod went has any to drop.
            self.explainer.forget_pods(o.uid(p) for p in pods.values())
        for problem in problems:
            # Users see these as Events on the pod (rate-limited); the log keeps them at debug level.
            log.debug("reconcile problem", extra={"problem": problem})
        return PassReport(
            ran=True,
            claims_created=created,
            claims_released=released,
            claims_deleted=deleted,
            gangs=gangs,
            pods_bound=bound,
            pods_unschedulable=unschedulable,
            problems=tuple(problems),
        )

    def step(self) -> PassReport:
        """Deterministic drive for tests and one-shot use: renew/acquire the lease, relist, one pass."""
        if self.elector is not None:
            self.elector.try_acquire_or_renew()
        self.resync()
        return self.reconcile_once()

    # -- threads -----------------------------------------------------------------------------------

    def start(self) -> None:
        if self.config.metrics_port is not None:
            self._metrics_server = MetricsServer(self.metrics.registry, self.config.metrics_port, self.config.metrics_host)
            self._metrics_server.start()
            log.info("metrics serving", extra={"port": self._metrics_server.port})
        for kind, informer in self.informers.items():
            self._spawn(f"informer-{kind}", functools.partial(informer.run, self._stop))
        if self.elector is not None:
            elector = self.elector
            self._spawn("leader-election", lambda: elector.run(self._elector_stop, release_on_stop=lambda: self._release_on_stop))
        self._spawn("reconcile", self._loop)
        # NVIDIA's ComputeDomains, once their CRDs are installed (controller.computedomain).
        domains = ComputeDomainController(self.api, self.config.compute_domain_namespace,
                                          image=self.config.compute_domain_daemon_image,
                                          pull_secrets=self.config.compute_domain_daemon_pull_secrets,
                                          driver=self.config.driver_name, may_write=self.may_write)
        self._spawn("compute-domains", lambda: domains.run(self._stop))
        log.info(
            "controller started",
            extra={
                "identity": self.config.identity,
                "embedded": self.config.embedded,
                "driver": self.config.driver_name,
                "leaderElect": self.config.leader_elect,
            },
        )

    @property
    def metrics_port(self) -> int | None:
        return self._metrics_server.port if self._metrics_server is not None else None

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=f"{self.config.identity}-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(informer.synced.wait(max(0.0, deadline - time.monotonic())) for informer in self.informers.values())

    def _loop(self) -> None:
        last_resync = time.monotonic()
        while not self._stop.is_set():
            if self._wake.wait(self.config.tick) and self.config.coalesce > 0:
                # One change arrives as several watch events (a pod, its claim, their status updates, our own
                # writes echoed back): a pass for each would redo the pass's fixed work for nothing.
                self._stop.wait(self.config.coalesce)
            self._wake.clear()
            if self._stop.is_set():
                break
            if not all(i.synced.is_set() for i in self.informers.values()):
                continue
            try:
                if time.monotonic() - last_resync >= self.config.resync_period:
                    last_resync = time.monotonic()
                    self.resync()
                report = self.reconcile_once()
            except (ApiError, OSError) as err:
                log.warning("reconcile pass failed; retrying on the next event", extra={"error": str(err)})
                continue
            except Exception:  # noqa: BLE001 - a long-running loop must survive any bad input
                log.exception("reconcile pass crashed; retrying on the next event")
                continue
            if report.ran and (report.pods_bound or report.claims_created or report.claims_released or report.gangs.changed):
                log.info(
                    "pass",
                    extra={
                        "claimsCreated": report.claims_created,
                        "released": report.claims_released,
                        "deleted": report.claims_deleted,
                        "bound": report.pods_bound,
                        "unschedulable": report.pods_unschedulable,
                        "gangsChanged": report.gangs.changed,
                    },
                )

    def stop(self, *, release: bool = True, timeout: float = 10.0) -> None:
        """Stop every thread; `release=False` leaves the lease as a crash would (for failover tests)."""
        self._release_on_stop = release
        if not release and self.elector is not None:
            self.elector.abandon()  # a crash, as seen by the others: stop writing at once, keep the lease
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            if not thread.name.endswith("leader-election"):
                thread.join(timeout)
        self._elector_stop.set()
        for thread in self._threads:
            thread.join(timeout)
        self._threads.clear()
        self.scheduler.close()
        if self._metrics_server is not None:
            self._metrics_server.stop()
            self._metrics_server = None
        self.metrics.leader.set(0)
        log.info("controller stopped", extra={"identity": self.config.identity, "leaseReleased": release})


class _Timer:
    """Observes one concern's duration into the reconcile latency histogram."""

    def __init__(self, metrics: ControllerMetrics, concern: str) -> None:
        self._metrics = metrics
        self._concern = concern
        self._start = 0.0

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self._metrics.reconcile_seconds.labels(concern=self._concern).observe(time.perf_counter() - self._start)
