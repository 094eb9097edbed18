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
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Protocol

from controller import objects as o
from controller.explanation_writer import ExplanationWriter
from controller.gang import GangController, GangSummary
from controller.informer import Informer, Store
from controller.leader import LeaderElector, LeaseTimings
from controller.metrics import ControllerMetrics, MetricsServer
from controller.pending import PendingExplainer
from controller.computedomain import DAEMON_IMAGE, ComputeDomainController
from controller.view import View
from controller.writes import NotLeader, Writer
from gpudra import DEFAULT_DRIVER_NAME
from gpudra.features import Features
from gpudra.kubeapi import ApiError, KubeApi

log = logging.getLogger("gpudra.controller.manager")

# Kinds every mode watches; the cluster roles (embedded mode) add theirs.
CLUSTER_KINDS: tuple[str, ...] = ("Pod", "ResourceClaim", "ResourceSlice", "DeviceClass", "Node")


def default_identity() -> str:
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class ControllerConfig:
    driver_name: str = DEFAULT_DRIVER_NAME
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
class RoleOutcome:
    """What the cluster roles did in one of their steps."""

    claims_created: int = 0
    claims_released: int = 0
    claims_deleted: int = 0
    pods_bound: int = 0
    pods_unschedulable: int = 0
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class RoleContext:
    """What the manager shares with the cluster roles: its caches, the writer that keeps them current, how it
    explains and counts, and its clocks."""

    stores: dict[str, Store]
    writer: Writer
    explainer: ExplanationWriter
    metrics: ControllerMetrics
    features: Features
    driver_name: str
    binding_timeout: float
    resync_period: float
    clock: Callable[[], float]
    wall: Callable[[], datetime]
    timed: Callable[[str], AbstractContextManager[None]]


class ClusterRoles(Protocol):
    """kube-controller-manager's claim work (before the gang controller) and kube-scheduler's and device taint
    eviction (after it), where no real component does them: the embedded testbed's sim.roles plays them
    (`gpu-dra controller --embedded`). Beside a real kube-scheduler there are none, and pending pods are explained
    instead."""

    def claims_pass(self) -> RoleOutcome: ...

    def schedule_pass(self) -> RoleOutcome: ...

    def close(self) -> None: ...


class ClusterRolesFactory(Protocol):
    def kinds(self, features: Features) -> tuple[str, ...]:
        """The kinds the roles read beyond CLUSTER_KINDS."""
        ...

    def __call__(self, context: RoleContext) -> ClusterRoles: ...


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
        roles: ClusterRolesFactory | None = None,
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
        kinds = CLUSTER_KINDS + (roles.kinds(config.features) if roles is not None else ())
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
        self._pods_gone: set[str] = self.stores["Pod"].track()
        self.pending = PendingExplainer(self.explainer, self.metrics, features=config.features, driver_name=config.driver_name)
        self.roles: ClusterRoles | None = None if roles is None else roles(RoleContext(
            self.stores, self.writer, self.explainer, self.metrics, config.features, config.driver_name,
            config.binding_timeout, config.resync_period, clock, wall, self._timed))

    @property
    def embedded(self) -> bool:
        return self.roles is not None

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

    def _timed(self, concern: str) -> AbstractContextManager[None]:
        return _Timer(self.metrics, concern)

    def _pass(self) -> PassReport:
        before = self.roles.claims_pass() if self.roles is not None else RoleOutcome()
        with self._timed("gang"):
            gangs = self.gangs.reconcile(self.view())
        self.metrics.set_gang_states(gangs.states)
        if self.roles is not None:
            after = self.roles.schedule_pass()
        else:
            with self._timed("explain"):
                after = RoleOutcome(pods_unschedulable=self.pending.reconcile(self.view()))
        unschedulable = after.pods_unschedulable
        problems = before.problems + after.problems
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
            claims_created=before.claims_created + after.claims_created,
            claims_released=before.claims_released,
            claims_deleted=before.claims_deleted,
            gangs=gangs,
            pods_bound=after.pods_bound,
            pods_unschedulable=unschedulable,
            problems=problems,
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
                "embedded": self.embedded,
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
        if self.roles is not None:
            self.roles.close()
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
