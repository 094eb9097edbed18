"""Container probes as the kubelet's prober workers run them (pkg/kubelet/prober).

Each run of a container gets its own workers, one per probe it declares. A startup probe runs first and gates the
others: until it succeeds the container is not started (`started: false`) and neither readiness nor liveness is
probed. Readiness starts as failed and liveness as succeeded; a result flips after `successThreshold` consecutive
successes or `failureThreshold` consecutive failures. A probe runs `initialDelaySeconds` after the container
started, then every `periodSeconds`, each run bounded by `timeoutSeconds`. Every failed run is reported (the
kubelet's `Unhealthy` Event: `<Kind> probe failed: <output>`); a liveness or startup probe that failed
`failureThreshold` times in a row asks for the container to be killed (and restarted per restartPolicy).

This module decides; running a probe (exec in the container, HTTP, TCP or gRPC inside its network namespace) is
the kubelet's part, handed in as `execute`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sim.kubelet.envvars import expand, static_env

KINDS = ("startup", "readiness", "liveness")
FIELDS = {"startup": "startupProbe", "readiness": "readinessProbe", "liveness": "livenessProbe"}
TITLES = {"startup": "Startup", "readiness": "Readiness", "liveness": "Liveness"}
HANDLERS = ("exec", "httpGet", "tcpSocket", "grpc")


@dataclass(frozen=True)
class ProbeSpec:
    kind: str  # one of KINDS
    handler: str  # one of HANDLERS
    action: Mapping[str, Any]  # the handler's fields (command; path, port, scheme, httpHeaders; port; service)
    initial_delay: float
    timeout: float
    period: float
    success_threshold: int
    failure_threshold: int
    grace: int | None = None  # terminationGracePeriodSeconds of a liveness or startup probe: its kill's grace


def _number(probe: Mapping[str, Any], name: str, default: int) -> int:
    value = probe.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def probe_specs(container: Mapping[str, Any]) -> dict[str, ProbeSpec]:
    """The container's probes with the API's defaults (kube-apiserver validated them): kind -> spec."""
    out: dict[str, ProbeSpec] = {}
    for kind in KINDS:
        probe = container.get(FIELDS[kind])
        if not isinstance(probe, Mapping):
            continue
        handler = next((h for h in HANDLERS if isinstance(probe.get(h), Mapping)), None)
        if handler is None:
            continue
        delay = probe.get("initialDelaySeconds")
        action = probe[handler]
        if handler == "exec":
            # The kubelet's prober expands $(VAR) in the command from the container's static env (its lifecycle
            # hooks run their command as written: sim.kubelet.hooks).
            env = static_env(container)
            action = {**action, "command": [expand(str(a), env) for a in action.get("command") or []]}
        out[kind] = ProbeSpec(
            kind=kind, handler=handler, action=action,
            initial_delay=float(delay) if isinstance(delay, int) and not isinstance(delay, bool) and delay > 0 else 0.0,
            timeout=float(_number(probe, "timeoutSeconds", 1)), period=float(_number(probe, "periodSeconds", 10)),
            # Liveness and startup probes must have successThreshold 1 (API validation).
            success_threshold=_number(probe, "successThreshold", 1) if kind == "readiness" else 1,
            failure_threshold=_number(probe, "failureThreshold", 3),
            grace=probe["terminationGracePeriodSeconds"] if kind != "readiness" and isinstance(
                probe.get("terminationGracePeriodSeconds"), int) else None)
    return out


@dataclass(frozen=True)
class Verdict:
    started: bool  # no startup probe, or it succeeded
    ready: bool  # started, and no readiness probe or it succeeds
    kill: str = ""  # set when a liveness or startup probe failed for good: the kubelet's Killing message
    kill_grace: int | None = None  # that probe's own grace period, if it has one


Execute = Callable[[ProbeSpec], tuple[bool, str]]  # runs one probe: (succeeded, output)
Report = Callable[[ProbeSpec, str], None]  # a failed run: the Unhealthy Event


@dataclass
class _Worker:
    spec: ProbeSpec
    next_at: float
    result: bool
    successes: int = 0
    failures: int = 0
    running: Future[tuple[bool, str]] | None = None


class ContainerProber:
    """The probe workers of one run of one container (`started_at`: when it started, on `clock`)."""

    def __init__(self, container: str, specs: Mapping[str, ProbeSpec], started_at: float, *, execute: Execute,
                 report: Report, pool: ThreadPoolExecutor, clock: Callable[[], float]) -> None:
        self.container = container
        self._workers = {kind: _Worker(spec, started_at + spec.initial_delay, result=kind == "liveness")
                         for kind, spec in specs.items()}
        self._execute = execute
        self._report = report
        self._pool = pool
        self._clock = clock

    @property
    def probed(self) -> bool:
        return bool(self._workers)

    def _started(self) -> bool:
        startup = self._workers.get("startup")
        return startup is None or startup.result

    def poll(self) -> Verdict:
        """Take the results of finished runs and start the probes that are due; what the container is now."""
        now = self._clock()
        for kind in KINDS:
            worker = self._workers.get(kind)
            if worker is None:
                continue
            if worker.running is not None:
                if not worker.running.done():
                    continue
                self._take(worker, worker.running)
                worker.running = None
                if kind != "readiness" and worker.failures >= worker.spec.failure_threshold:
                    return Verdict(False, False, kill=self._kill_message(kind), kill_grace=worker.spec.grace)
            if kind == "startup" and worker.result:
                continue  # a startup probe that succeeded never runs again for this container
            if kind != "startup" and not self._started():
                continue
            if now >= worker.next_at:
                worker.next_at = now + worker.spec.period
                worker.running = self._pool.submit(self._execute, worker.spec)
        started = self._started()
        readiness = self._workers.get("readiness")
        return Verdict(started, started and (readiness is None or readiness.result))

    def _take(self, worker: _Worker, run: Future[tuple[bool, str]]) -> None:
        try:
            ok, output = run.result()
        except Exception as exc:  # noqa: BLE001 - a probe that could not run failed
            ok, output = False, str(exc)
        if ok:
            worker.successes, worker.failures = worker.successes + 1, 0
            if worker.successes >= worker.spec.success_threshold:
                worker.result = True
            return
        worker.successes, worker.failures = 0, worker.failures + 1
        self._report(worker.spec, output)
        if worker.failures >= worker.spec.failure_threshold:
            worker.result = False

    def _kill_message(self, kind: str) -> str:
        return f"Container {self.container} failed {kind} probe, will be restarted"

    def stop(self) -> None:
        for worker in self._workers.values():
            if worker.running is not None:
                worker.running.cancel()
