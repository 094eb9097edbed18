"""What the cluster's supervisor watches besides exits: the API server's liveness (a server whose store can no
longer write is restarted like one that exited), and the controllers it runs, whose failures `cluster status`
reports."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from controlplane import EmbeddedApiServer
from controlplane.backend import Change
from gpudra.kubeapi import ApiError
from sim.cluster.liveness import Liveness, livez
from sim.cluster.periodic import Periodic
from sim.cluster.report import status_object, status_table
from sim.cluster.spec import ClusterPaths, ClusterSpec, SupervisorStatus
from sim.cluster.supervisor import Supervisor, _Slot
from sim.demo.cluster import NodeSpec
from sim.demo.processes import Child


def _child(tmp_path: Path, argv: list[str]) -> Child:
    log = open(tmp_path / "child.log", "wb")  # noqa: SIM115 (the Child owns it)
    proc = subprocess.Popen(argv, stdout=log, stderr=log)
    return Child("apiserver", proc, tmp_path / "child.log", 0, log)


@pytest.mark.process  # the supervised child is a real process
def test_an_api_server_that_cannot_write_is_restarted(tmp_path: Path) -> None:
    paths = ClusterPaths(tmp_path / "state")
    sup = Supervisor(paths, ClusterSpec("t", (NodeSpec("n1", "t4-1"),), "none"))
    sup.liveness = Liveness(period_s=0.0, threshold=2)
    restarted: list[str] = []
    sup._restart = lambda slot: restarted.append(slot.role)  # type: ignore[method-assign]
    child = _child(tmp_path, [sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        sup.slots.append(_Slot("apiserver", None, child))
        with EmbeddedApiServer(state_file=tmp_path / "store.db") as server:
            sup.status.server = server.url
            assert livez(server.url, None) is None
            sup.watch_once(0.0)
            assert restarted == [] and sup.failing() == []

            def full_disk(batch: list[Change]) -> None:
                raise OSError(28, "No space left on device")

            assert server.store._log is not None
            server.store._log._write_batch = full_disk  # type: ignore[method-assign]
            request = urllib.request.Request(
                f"{server.url}/apis/coordination.k8s.io/v1/namespaces/default/leases", method="POST",
                data=json.dumps({"metadata": {"name": "l"}, "spec": {}}).encode(),
                headers={"Content-Type": "application/json"})
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request)
            # the client learns why, not where the store is on the host
            message = json.loads(refused.value.read())["message"]
            assert refused.value.code == 500 and "No space left on device" in message
            assert str(tmp_path) not in message
            assert server.store.storage_failure() is not None
            sup.watch_once(1.0)  # one failure: not yet
            assert restarted == [] and sup.failing() == [
                {"component": "apiserver", "message": "/livez failed 1 times in a row: HTTP 500: livez check failed"}]
            sup.watch_once(2.0)  # the threshold: restarted
            assert restarted == ["apiserver"]
        assert SupervisorStatus.from_json(json.loads(paths.status.read_text())).failing == [
            {"component": "apiserver", "message": "/livez failed 1 times in a row: HTTP 500: livez check failed"}]
    finally:
        child.process.kill()
        child.process.wait()
        child.stop(0.1)


def test_a_failing_controller_is_reported_until_it_recovers() -> None:
    outcomes: list[Exception | None] = [ApiError(401, "Unauthorized", "Unauthorized"), None]

    def reconcile() -> None:
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    loop = Periodic("workloads", reconcile, 1.0, logging.getLogger("test"))
    loop.run_once()
    assert loop.failure == "401 Unauthorized: Unauthorized"
    loop.run_once()
    assert loop.failure is None


def test_cluster_status_shows_what_is_failing() -> None:
    spec = ClusterSpec("t", (NodeSpec("n1", "t4-1"),), "none")
    sup = SupervisorStatus(1, "ready", "https://127.0.0.1:1",
                           failing=[{"component": "workload controllers", "message": "Unauthorized"}])
    again = SupervisorStatus.from_json(sup.to_json())
    obj: dict[str, Any] = status_object(spec, again, True, None, "gpu-dra-t", None, "gpu.nvidia.com")
    assert obj["failing"] == [{"component": "workload controllers", "message": "Unauthorized"}]
    assert "FAILING: workload controllers: Unauthorized" in status_table(obj)
