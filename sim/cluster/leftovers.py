"""Stopping what a cluster's supervisor left running when it died without cleaning up (SIGKILL): its children by
pid (each one's command line names the state dir, so a reused pid is never taken for one), then each node
runtime's host processes (sim.runtime.hostprocess) and containers, conmon monitors and namespace holder
(sim.runtime.podman.stop_leftovers). Used by
`cluster down`, `cluster up` of a cluster whose supervisor is gone, and a restarted supervisor."""

from __future__ import annotations

import os
import signal

from sim.cluster.spec import ClusterPaths, SupervisorStatus, pid_is_ours, read_json
from sim.runtime import hostprocess
from sim.runtime.podman import stop_leftovers


def stop_children(paths: ClusterPaths, *, except_pid: int | None = None) -> list[str]:
    """SIGKILL the processes a previous supervisor recorded (not the supervisor itself, not `except_pid`)."""
    raw = read_json(paths.status)
    sup = SupervisorStatus.from_json(raw) if isinstance(raw, dict) else None
    if sup is None:
        return []
    marker = str(paths.root)
    stopped = []
    for proc in sup.processes:
        if proc.role in ("supervisor", "kubelet") or proc.pid in (sup.pid, except_pid):
            continue
        if pid_is_ours(proc.pid, marker):
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            stopped.append(f"{proc.role} (pid {proc.pid})")
    return stopped


def stop_runtimes(paths: ClusterPaths) -> list[str]:
    return [f"{what} of node {d.name}" for d in sorted((paths.root / "runtime" / "nodes").glob("*"))
            for what in [*hostprocess.stop_leftovers(d / "host"), *stop_leftovers(d)]]
