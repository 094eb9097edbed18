"""Container lifecycle hooks as the kubelet runs them (pkg/kubelet/lifecycle): `postStart` once a container has
started, `preStop` before it is sent SIGTERM, within its grace period.

A handler is an `exec` in the container, an `httpGet` against its port (reached in its network namespace, as probes
reach it) or a `sleep`; `tcpSocket` is accepted by the API for compatibility only, and the kubelet fails it. A failed
postStart kills the container, which then restarts as its restartPolicy says; a failed preStop is reported and the
stop goes on. The kubelet's events leave the hook's output out (it may hold secrets). An exec hook's command runs
as written: unlike an exec probe's (sim.kubelet.probes), the kubelet does not expand $(VAR) in it
(pkg/kubelet/lifecycle/handlers.go passes `Exec.Command` unchanged)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from sim.kubelet.probes import ProbeSpec
from sim.kubelet.proberun import ProbeRuntime, run_probe

POST_START, PRE_STOP = "postStart", "preStop"
# (event reason, message) of a failed hook, in the kubelet's words
FAILED = {POST_START: ("FailedPostStartHook", "PostStartHook failed"),
          PRE_STOP: ("FailedPreStopHook", "PreStopHook failed")}


def handler(container: Mapping[str, Any], hook: str) -> Mapping[str, Any] | None:
    """The container's `lifecycle.<hook>` handler, if it has one."""
    lifecycle = container.get("lifecycle")
    found = lifecycle.get(hook) if isinstance(lifecycle, Mapping) else None
    return found if isinstance(found, Mapping) else None


def run(runtime: ProbeRuntime, runtime_name: str, container: Mapping[str, Any], pod_ip: str,
        action: Mapping[str, Any], timeout: float, stop: threading.Event) -> str | None:
    """Run one handler for at most `timeout` seconds (or until `stop`): None when it succeeded, else why not."""
    sleep = action.get("sleep")
    if isinstance(sleep, Mapping):
        seconds = sleep.get("seconds")
        stop.wait(min(float(seconds), timeout) if isinstance(seconds, int) and seconds > 0 else 0)
        return None
    kind = next((k for k in ("exec", "httpGet") if isinstance(action.get(k), Mapping)), None)
    if kind is None:
        return f"invalid handler: {sorted(action)} (the kubelet runs exec, httpGet and sleep)"
    spec = ProbeSpec(kind="liveness", handler=kind, action=action[kind], initial_delay=0.0, timeout=timeout,
                     period=timeout, success_threshold=1, failure_threshold=1)
    ok, output = run_probe(runtime, runtime_name, container, pod_ip, spec)
    return None if ok else (output or "the handler failed")
