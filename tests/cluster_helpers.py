"""`gpu-dra cluster up` for end-to-end tests: a cluster in a private home (its state, kubeconfig), taken down after."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.plugin_helpers import short_tmp

ROOT = Path(__file__).resolve().parent.parent
KUBECTL = str(ROOT / ".venv" / "bin" / "kubectl")


@dataclass(frozen=True)
class UpCluster:
    env: dict[str, str]  # the environment the cluster commands (and kubectl) run with
    kubeconfig: Path

    @property
    def kubectl(self) -> list[str]:
        return [KUBECTL, "--kubeconfig", str(self.kubeconfig), "-n", "default"]


@contextmanager
def cluster_up(name: str, nodes: str, runtime: str) -> Iterator[UpCluster]:
    """`cluster up --nodes NODES --runtime RUNTIME` (asserting it succeeded), then `cluster down`."""
    with short_tmp() as home:
        kubeconfig = home / "kube" / "config"
        env = dict(os.environ, XDG_STATE_HOME=str(home / "state"), KUBECONFIG=str(kubeconfig), PYTHONPATH=str(ROOT))

        def cluster(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "cli.main", "cluster", *args, "--name", name], env=env,
                                  cwd=str(ROOT), capture_output=True, text=True, timeout=300)

        up = cluster("up", "--nodes", nodes, "--runtime", runtime)
        try:
            assert up.returncode == 0, up.stderr[-3000:]
            yield UpCluster(env, kubeconfig)
        finally:
            cluster("down")
