"""Clusters for end-to-end tests: `gpu-dra cluster up` in a private home (its state, kubeconfig), taken down after;
or a node and the workload controllers beside a test's own API server."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpudra.kubeapi import KubeApi
from sim.cluster.workloads import WorkloadController
from sim.kubelet.pods import NodeKubelet
from tests.plugin_helpers import DRIVER, short_tmp

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
def cluster_up(name: str, nodes: str, runtime: str, *options: str) -> Iterator[UpCluster]:
    """`cluster up --nodes NODES --runtime RUNTIME [OPTIONS...]` (asserting it succeeded), then `cluster down`."""
    with short_tmp() as home:
        kubeconfig = home / "kube" / "config"
        env = dict(os.environ, XDG_STATE_HOME=str(home / "state"), KUBECONFIG=str(kubeconfig), PYTHONPATH=str(ROOT))

        def cluster(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "cli.main", "cluster", *args, "--name", name], env=env,
                                  cwd=str(ROOT), capture_output=True, text=True, timeout=300)

        up = cluster("up", "--nodes", nodes, "--runtime", runtime, *options)
        try:
            assert up.returncode == 0, up.stderr[-3000:]
            yield UpCluster(env, kubeconfig)
        finally:
            cluster("down")


@contextmanager
def node_and_workload_controllers(api: KubeApi, node: str) -> Iterator[None]:
    """A kubelet simulator for `node` (no container runtime: pods just run) and the cluster's workload controllers,
    against `api`, for tests that drive Deployments with kubectl but need no scheduler (pods name their node)."""
    with short_tmp() as tmp:
        kubelet = NodeKubelet(api, node, tmp / "kubelet", DRIVER)
        kubelet.start()
        controllers = WorkloadController(api, interval=0.2)
        controllers.start()
        try:
            yield
        finally:
            controllers.stop()
            kubelet.stop()
