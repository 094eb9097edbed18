"""Container probes: the kubelet's prober state machine, pure, with a fake clock and probe results (the kubelet
simulator running them in real containers is in tests/test_kubelet_runtime.py)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest

from sim.kubelet.probes import ContainerProber, ProbeSpec, probe_specs


class _Inline:
    """A pool that runs each probe at once (its Future is done when submit returns)."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(fn(*args))
        return future


def _prober(container: dict[str, Any], results: list[bool], clock: list[float],
            reported: list[tuple[str, str]]) -> ContainerProber:
    def execute(spec: ProbeSpec) -> tuple[bool, str]:
        return results.pop(0), "no"

    return ContainerProber("main", probe_specs(container), 0.0, execute=execute,
                           report=lambda spec, out: reported.append((spec.kind, out)),
                           pool=_Inline(), clock=lambda: clock[0])  # type: ignore[arg-type]


def test_probe_defaults_follow_the_api() -> None:
    specs = probe_specs({"readinessProbe": {"httpGet": {"port": 8080}},
                         "livenessProbe": {"exec": {"command": ["true"]}, "successThreshold": 3, "periodSeconds": 2}})
    ready = specs["readiness"]
    assert (ready.handler, ready.initial_delay, ready.timeout, ready.period, ready.success_threshold,
            ready.failure_threshold) == ("httpGet", 0.0, 1.0, 10.0, 1, 3)
    assert specs["liveness"].success_threshold == 1 and specs["liveness"].period == 2.0  # liveness needs 1


def test_readiness_starts_false_and_flips_on_thresholds() -> None:
    clock, reported = [0.0], []
    container = {"readinessProbe": {"exec": {"command": ["check"]}, "initialDelaySeconds": 5, "periodSeconds": 1,
                                    "successThreshold": 2, "failureThreshold": 2}}
    results = [True, True, False, False]
    prober = _prober(container, results, clock, reported)
    assert prober.poll().ready is False  # not due before its initial delay
    clock[0] = 5.0
    prober.poll()  # runs: success 1 of 2
    clock[0] = 6.0
    prober.poll()  # runs: success 2 of 2 (taken at the next poll)
    assert prober.poll().ready is True
    clock[0] = 7.0
    prober.poll()
    clock[0] = 8.0
    prober.poll()
    verdict = prober.poll()
    assert verdict.ready is False and verdict.kill == ""  # readiness never restarts a container
    assert reported == [("readiness", "no"), ("readiness", "no")]


def test_startup_gates_the_others_and_liveness_kills_after_its_failure_threshold() -> None:
    clock, reported = [0.0], []
    container = {"startupProbe": {"exec": {"command": ["up"]}, "periodSeconds": 1, "failureThreshold": 5},
                 "livenessProbe": {"exec": {"command": ["alive"]}, "periodSeconds": 1, "failureThreshold": 2}}
    results = [False, True, False, False]
    prober = _prober(container, results, clock, reported)
    verdict = prober.poll()  # startup run 1 fails
    assert (verdict.started, verdict.ready) == (False, False)
    clock[0] = 1.0
    prober.poll()  # startup run 2 succeeds
    clock[0] = 2.0
    verdict = prober.poll()  # started: liveness runs (fails once)
    assert verdict.started is True and verdict.ready is True and not verdict.kill
    clock[0] = 3.0
    prober.poll()  # liveness fails twice
    verdict = prober.poll()
    assert verdict.kill == "Container main failed liveness probe, will be restarted"
    assert reported == [("startup", "no"), ("liveness", "no"), ("liveness", "no")]


def test_a_startup_probe_that_never_passes_kills_the_container() -> None:
    clock, reported = [0.0], []
    prober = _prober({"startupProbe": {"tcpSocket": {"port": 1}, "periodSeconds": 1, "failureThreshold": 2}},
                     [False, False], clock, reported)
    prober.poll()
    clock[0] = 1.0
    prober.poll()
    assert prober.poll().kill == "Container main failed startup probe, will be restarted"


def test_exec_probe_commands_expand_the_static_env_as_the_kubelet_does() -> None:
    """kubecontainer.ExpandContainerCommandOnlyStatic: literal `value`s, `valueFrom` entries as "", no envFrom;
    `$$` escapes, unknown names stay as written (NVIDIA's IMEX daemon probes run `-v $(LOG_VERBOSITY)`)."""
    container = {
        "env": [{"name": "LOG_VERBOSITY", "value": "4"}, {"name": "POD_IP", "valueFrom": {"fieldRef": {
            "fieldPath": "status.podIP"}}}, {"name": "NESTED", "value": "$(LOG_VERBOSITY)"}],
        "envFrom": [{"configMapRef": {"name": "cm"}}],
        "startupProbe": {"exec": {"command": ["check", "-v", "$(LOG_VERBOSITY)", "ip=$(POD_IP)", "$$(LOG_VERBOSITY)",
                                              "$(FROM_CONFIGMAP)", "$(NESTED)", "$$$$", "$(unclosed", "$(A$$B)", "$x", "cost$"]}},
        "livenessProbe": {"httpGet": {"path": "/$(LOG_VERBOSITY)", "port": 80}},
    }
    specs = probe_specs(container)
    assert specs["startup"].action["command"] == [
        "check", "-v", "4", "ip=", "$(LOG_VERBOSITY)", "$(FROM_CONFIGMAP)", "$(LOG_VERBOSITY)", "$$", "$(unclosed",
        "$(A$$B)", "$x", "cost$"]
    assert specs["liveness"].action["path"] == "/$(LOG_VERBOSITY)"  # only exec commands are expanded
    assert container["startupProbe"]["exec"]["command"][2] == "$(LOG_VERBOSITY)"  # the pod spec is left alone


@pytest.mark.process  # the hook's exec runs `true`
def test_exec_lifecycle_hooks_run_their_command_as_written() -> None:
    """The kubelet's lifecycle handler passes Exec.Command unexpanded (pkg/kubelet/lifecycle/handlers.go)."""
    import threading

    from sim.kubelet import hooks

    seen: list[list[str]] = []

    class Runtime:
        def exec_argv(self, name: str, command: list[str], *, tty: bool = False) -> list[str]:
            seen.append(list(command))
            return ["true"]

        def network_pid(self, name: str) -> None:
            return None

    container = {"name": "main", "env": [{"name": "X", "value": "1"}]}
    error = hooks.run(Runtime(), "c1", container, "10.0.0.1", {"exec": {"command": ["echo", "$(X)"]}}, 5.0,
                      threading.Event())
    assert error is None and seen == [["echo", "$(X)"]]
