"""Starting and driving a real Kubernetes cluster (the upstream backend) from tests.

The cluster is started the way a user starts it, `gpu-dra cluster up --kubernetes upstream`, and driven with the
kubectl built beside it. Where the backend cannot run (not root, no Go), tests skip saying why; in CI
(`GPU_DRA_UPSTREAM=required`, set by .ci/run) they fail instead, so a broken backend cannot pass as skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
REQUIRED_ENV = "GPU_DRA_UPSTREAM"


def unavailable() -> str | None:
    """Why the upstream backend cannot run here, or None."""
    if os.geteuid() != 0:
        return "the upstream backend runs kubelets and containerd, which need root"
    for tool in ("go", "unshare", "ip", "runc", "nft", "debootstrap", "gcc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (the upstream backend needs it)"
    return None


def require_upstream() -> None:
    why = unavailable()
    if why is None:
        return
    if os.environ.get(REQUIRED_ENV) == "required":
        pytest.fail(f"{REQUIRED_ENV}=required but {why}", pytrace=False)
    pytest.skip(why)


@dataclass
class UpstreamCluster:
    name: str
    env: dict[str, str]
    state: Path
    bin_dir: Path

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig.yaml"

    def kubectl(self, *argv: str, stdin: str | None = None, check: bool = True, timeout: float = 120) -> str:
        result = subprocess.run([str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *argv],
                                input=stdin, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
        return result.stdout + (result.stderr if not check else "")

    def get(self, *argv: str) -> Any:
        return json.loads(self.kubectl("get", *argv, "-o", "json"))

    def gpu_dra(self, *argv: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([sys.executable, "-m", "cli", *argv], cwd=str(ROOT), env=self.env,
                                capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"gpu-dra {' '.join(argv)} failed ({result.returncode}):\n{result.stdout}\n"
                                 f"{result.stderr}")
        return result

    def node_dir(self, node: str) -> Path:
        return self.state / "nodes" / node

    def logs(self) -> str:
        """The last lines of every component's log (for a failing assertion's message)."""
        out = []
        for log in sorted((self.state / "logs").glob("*.log")):
            out.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(out)


def wait_for(what: str, check: Callable[[], Any], timeout: float = 180.0, interval: float = 1.0) -> Any:
    """Poll until `check()` returns something truthy; fail naming `what` and the last value or error."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except AssertionError as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not after {timeout:.0f} s (last: {last})")


def start(name: str, tmp: Path, nodes: str, *flags: str, wait: float = 600) -> UpstreamCluster:
    env = dict(os.environ, XDG_STATE_HOME=str(tmp / "state"), KUBECONFIG=str(tmp / "kubeconfig"))
    result = subprocess.run([sys.executable, "-m", "cli", "cluster", "up", "--kubernetes", "upstream", "--name", name,
                             "--nodes", nodes, "--wait", str(int(wait)), *flags], cwd=str(ROOT), env=env,
                            capture_output=True, text=True, timeout=wait + 900)
    state = tmp / "state" / "gpu-dra" / "clusters" / name
    if result.returncode != 0:
        subprocess.run([sys.executable, "-m", "cli", "cluster", "down", "--name", name], cwd=str(ROOT), env=env,
                       capture_output=True, timeout=300)
        raise AssertionError(f"cluster up failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    spec = json.loads((state / "spec.json").read_text())
    return UpstreamCluster(name, env, state, Path(spec["bin_dir"]))


def stop(cluster: UpstreamCluster) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", "cluster", "down", "--name", cluster.name], cwd=str(ROOT),
                          env=cluster.env, capture_output=True, text=True, timeout=300)


@contextlib.contextmanager
def running(name: str, tmp: Path, nodes: str, *flags: str) -> Iterator[UpstreamCluster]:
    """A cluster for a test module (`flags` go to `cluster up`), taken down the hard way: the supervisor dies
    (SIGKILL) with every node, container and shim still running, and `cluster down` must still leave nothing
    behind."""
    require_upstream()
    up = start(name, tmp, nodes, *flags)
    try:
        yield up
    finally:
        status = json.loads((up.state / "status.json").read_text())
        os.kill(status["pid"], signal.SIGKILL)
        down = stop(up)
        assert down.returncode == 0, down.stderr
        assert not Path(f"/run/netns/gpu-dra-{name}").exists()
        assert not list(Path("/sys/fs/cgroup/pids").glob(f"gpu-dra.{name}.*"))
        assert not up.state.exists()
        left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _mentions(p, str(up.state))]
        assert left == [], [(p.name, (p / "cmdline").read_bytes()) for p in left]


def _mentions(proc: Path, text: str) -> bool:
    try:
        return text.encode() in (proc / "cmdline").read_bytes()
    except OSError:
        return False
