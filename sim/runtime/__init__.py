"""Container runtimes for the kubelet simulator: `podman` (real containers with CDI devices) or `none`.

`choose(kind, state_dir)` answers which runtime a run gets: `podman` requires everything it needs here (root,
podman, runc, a static busybox, unshare/nsenter) and says what is missing otherwise; `auto` takes podman
when it can run and `none` with one line saying why not. `Runtimes` makes one runtime per simulated node.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sim.runtime.hostprocess import HostProcessRuntime, RoutingRuntime
from sim.runtime.podman import PodmanRuntime, find_runc
from sim.runtime.rootfs import build as build_rootfs
from sim.runtime.rootfs import find_busybox

RUNTIME_CHOICES: tuple[str, ...] = ("auto", "podman", "none")
INSTALL_HINT = "apt-get install -y podman runc busybox-static"


@dataclass(frozen=True)
class Choice:
    kind: str  # "podman" or "none"
    reason: str  # why (always set for none under auto; a one-line notice)


def podman_missing() -> list[str]:
    """What this machine lacks to run containers with podman (empty: it can)."""
    missing: list[str] = []
    if os.geteuid() != 0:
        missing.append("not running as root (the runtime needs a private mount namespace and mknod)")
    if shutil.which("podman") is None:
        missing.append("podman is not installed")
    if find_runc() is None:
        missing.append("runc is not installed (podman's default crun cannot run containers here)")
    if find_busybox() is None:
        missing.append("no static busybox (busybox-static) for the container root filesystem")
    for tool in ("unshare", "nsenter", "mount", "mknod"):
        if shutil.which(tool) is None:
            missing.append(f"{tool} is not installed")
    if not missing:
        # Root is not enough inside some sandboxes: try the one privileged thing the runtime starts with.
        try:
            done = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True,
                                  text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            missing.append(f"unshare --mount failed: {exc}")
        else:
            if done.returncode != 0:
                missing.append(f"cannot create a private mount namespace: {done.stderr.strip()}")
    return missing


def choose(kind: str) -> Choice:
    """Which runtime `kind` (auto|podman|none) gives here; raises ValueError when podman was asked for and cannot run."""
    if kind not in RUNTIME_CHOICES:
        raise ValueError(f"{kind!r}: expected one of {', '.join(RUNTIME_CHOICES)}")
    if kind == "none":
        return Choice("none", "--runtime none: containers are not started; pods are marked Running after prepare")
    missing = podman_missing()
    if not missing:
        return Choice("podman", "containers run with podman (runc) and CDI devices")
    why = "; ".join(missing)
    if kind == "podman":
        raise ValueError(f"podman cannot run here: {why} (install: {INSTALL_HINT})")
    return Choice("none", f"containers are not started ({why}; install: {INSTALL_HINT}); "
                          "pods are marked Running after prepare")


class Runtimes:
    """Makes the podman runtime of each simulated node under one state dir, sharing one rootfs."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        busybox = find_busybox()
        runc = find_runc()
        if busybox is None or runc is None:
            raise ValueError("podman cannot run here: " + "; ".join(podman_missing()))
        self.runc = runc
        self.rootfs = build_rootfs(state_dir / "rootfs", busybox)

    def for_node(self, node: str, cdi_dir: Path, host_devices: Sequence[tuple[str, int, int]] = ()) -> RoutingRuntime:
        """The node's runtime; `host_devices` (path, major, minor) are the device nodes its host has. Our own
        image's containers run as host processes (sim.runtime.hostprocess), every other one with podman."""
        runtime = PodmanRuntime(self.state_dir / "nodes" / node, cdi_dir, self.rootfs, runc=self.runc,
                                host_devices=host_devices)
        runtime.start()
        return RoutingRuntime(runtime, HostProcessRuntime(self.state_dir / "nodes" / node / "host", cdi_dir))
