"""Deployments through ReplicaSets: RollingUpdate within maxSurge/maxUnavailable, Recreate, revisions and history
(sim.cluster.deployments, pure), and `kubectl rollout status/history/undo/restart` and `kubectl scale` against the
embedded control plane with the cluster's workload controllers and a kubelet simulator (no runtime)."""

from __future__ import annotations

import copy
import itertools
from datetime import datetime, timedelta, timezone
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from controlplane.patch import merge_patch
from sim.cluster.deployments import REVISION, REVISION_HISTORY, surge_and_unavailable
from sim.cluster.workloads import plan
from tests.cluster_helpers import node_and_workload_controllers
from tests.conftest import RunningApiServer
from tests.plugin_helpers import NODE

KUBECTL = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "kubectl")
READY = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}


class World:
    """Objects as the API server would hold them, the cluster's controllers applied pass by pass, pods Ready at
    once (or never, with `ready=False`)."""

    def __init__(self, deploy: dict[str, Any]) -> None:
        self.uids = itertools.count(1)
        self.objects: dict[str, list[dict[str, Any]]] = {"Deployment": [self._stamp(deploy)], "ReplicaSet": [], "Pod": []}
        self.ready = True

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        obj["metadata"].setdefault("namespace", "default")
        obj["metadata"]["uid"] = f"uid-{next(self.uids)}"
        if not obj["metadata"].get("name"):
            obj["metadata"]["name"] = obj["metadata"]["generateName"] + obj["metadata"]["uid"]
        obj["metadata"].setdefault("generation", 1)
        return obj

    def find(self, kind: str, name: str) -> dict[str, Any]:
        return next(o for o in self.objects[kind] if o["metadata"]["name"] == name)

    def step(self, now: datetime | None = None) -> None:
        todo = plan(self.objects, now)
        for kind, obj in todo.create:
            self.objects[kind].append(self._stamp(obj))
        for kind, (_, name), body in todo.patch:
            obj = self.find(kind, name)
            obj.update(merge_patch(obj, body))
        for kind, (_, name) in todo.delete:
            self.objects[kind] = [o for o in self.objects[kind] if o["metadata"]["name"] != name]
        # The garbage collector: pods of deleted ReplicaSets go.
        rs_uids = {rs["metadata"]["uid"] for rs in self.objects["ReplicaSet"]}
        self.objects["Pod"] = [p for p in self.objects["Pod"] if p["metadata"]["ownerReferences"][0]["uid"] in rs_uids]
        for pod in self.objects["Pod"]:
            if self.ready:
                pod.setdefault("status", READY)
        for (kind, _, name), status in todo.statuses.items():
            self.find(kind, name)["status"] = status

    def change_template(self, image: str) -> None:
        deploy = self.objects["Deployment"][0]
        deploy["spec"]["template"]["spec"]["containers"][0]["image"] = image
        deploy["metadata"]["generation"] += 1

    def rs_replicas(self) -> dict[str, int]:
        return {rs["spec"]["template"]["spec"]["containers"][0]["image"]: rs["spec"]["replicas"]
                for rs in self.objects["ReplicaSet"]}


def _deploy(replicas: int = 4, **strategy: Any) -> dict[str, Any]:
    return {"metadata": {"name": "web"}, "spec": {
        "replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
        **({"strategy": strategy} if strategy else {}),
        "template": {"metadata": {"labels": {"app": "web"}},
                     "spec": {"containers": [{"name": "web", "image": "v1"}]}}}}


def test_fenceposts() -> None:
    assert surge_and_unavailable(_deploy(4)) == (1, 1)  # 25% of 4, up and down
    assert surge_and_unavailable(_deploy(10)) == (3, 2)
    assert surge_and_unavailable(_deploy(3, type="RollingUpdate", rollingUpdate={"maxSurge": 0, "maxUnavailable": "10%"})) == (0, 1)


def test_rolling_update_stays_within_surge_and_unavailability() -> None:
    w = World(_deploy(4, type="RollingUpdate", rollingUpdate={"maxSurge": 1, "maxUnavailable": 1}))
    for _ in range(6):
        w.step()
    assert w.rs_replicas() == {"v1": 4} and len(w.objects["Pod"]) == 4
    (rs1,) = w.objects["ReplicaSet"]
    assert rs1["metadata"]["annotations"][REVISION] == "1"
    assert w.objects["Deployment"][0]["metadata"]["annotations"][REVISION] == "1"
    w.change_template("v2")
    seen = []
    for _ in range(20):
        w.step()
        total = sum(w.rs_replicas().values())
        seen.append(w.rs_replicas())
        assert total <= 5, seen  # replicas + maxSurge
        ready = sum(1 for p in w.objects["Pod"] if p.get("status"))
        assert ready >= 3 or len(seen) == 1, seen  # replicas - maxUnavailable
    assert w.rs_replicas() == {"v1": 0, "v2": 4}
    assert len({tuple(sorted(s.items())) for s in seen}) > 2  # it went step by step, not all at once
    status = w.objects["Deployment"][0]["status"]
    assert status["updatedReplicas"] == 4 and status["availableReplicas"] == 4 and status["observedGeneration"] == 2
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == "NewReplicaSetAvailable"
    new = next(rs for rs in w.objects["ReplicaSet"] if rs["spec"]["replicas"] == 4)
    assert new["metadata"]["annotations"][REVISION] == "2"
    # Back to v1 (what `kubectl rollout undo` does): the old ReplicaSet is reused and becomes revision 3.
    w.change_template("v1")
    for _ in range(20):
        w.step()
    assert w.rs_replicas() == {"v1": 4, "v2": 0}
    old = w.find("ReplicaSet", rs1["metadata"]["name"])
    assert old["metadata"]["annotations"][REVISION] == "3" and old["metadata"]["annotations"][REVISION_HISTORY] == "1"


def test_new_pods_that_never_become_ready_stop_the_rollout() -> None:
    w = World(_deploy(4, type="RollingUpdate", rollingUpdate={"maxSurge": 1, "maxUnavailable": 0}))
    for _ in range(6):
        w.step()
    w.ready = False
    w.change_template("broken")
    for _ in range(10):
        w.step()
    assert w.rs_replicas() == {"v1": 4, "broken": 1}
    status = w.objects["Deployment"][0]["status"]
    assert status["updatedReplicas"] == 1 and status["availableReplicas"] == 4 and status["replicas"] == 5


def test_a_stalled_rollout_exceeds_its_progress_deadline() -> None:
    deploy = _deploy(2, type="RollingUpdate", rollingUpdate={"maxSurge": 1, "maxUnavailable": 0})
    deploy["spec"]["progressDeadlineSeconds"] = 60
    w = World(deploy)
    for _ in range(6):
        w.step()
    w.ready = False
    w.change_template("broken")
    start = datetime.now(timezone.utc)
    for _ in range(4):  # the new ReplicaSet and its first pod, which never becomes ready
        w.step(start)

    def progressing() -> dict[str, Any]:
        return next(c for c in w.objects["Deployment"][0]["status"]["conditions"] if c["type"] == "Progressing")

    assert (progressing()["status"], progressing()["reason"]) == ("True", "ReplicaSetUpdated")
    late = start + timedelta(seconds=62)  # nothing has moved for longer than the deadline
    w.step(late)
    rs = next(r["metadata"]["name"] for r in w.objects["ReplicaSet"]
              if r["spec"]["template"]["spec"]["containers"][0]["image"] == "broken")
    assert (progressing()["status"], progressing()["reason"], progressing()["message"]) == (
        "False", "ProgressDeadlineExceeded", f'ReplicaSet "{rs}" has timed out progressing.')
    w.step(late + timedelta(seconds=1))
    assert progressing()["reason"] == "ProgressDeadlineExceeded"  # it stays so while nothing moves
    # Pods becoming ready is progress again.
    for pod in w.objects["Pod"]:
        pod["status"] = READY
    w.step(late + timedelta(seconds=2))
    assert progressing()["status"] == "True"


def test_recreate_and_revision_history_limit() -> None:
    w = World(_deploy(2, type="Recreate"))
    w.objects["Deployment"][0]["spec"]["revisionHistoryLimit"] = 1
    for _ in range(4):
        w.step()
    for image in ("v2", "v3"):
        w.change_template(image)
        w.step()
        assert w.rs_replicas()[image] == 0  # old pods first
        for _ in range(4):
            w.step()
        assert w.rs_replicas()[image] == 2
    assert set(w.rs_replicas()) == {"v2", "v3"}  # v1 went: one old ReplicaSet kept


def kubectl(s: RunningApiServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KUBECTL, "--kubeconfig", str(s.kubeconfig), "-n", "default", *args],
                          capture_output=True, text=True, timeout=90)


@pytest.mark.process
def test_kubectl_rollout_status_history_undo_restart(apiserver: RunningApiServer) -> None:
    if not Path(KUBECTL).exists():
        pytest.skip("kubectl is installed by `make install-test`")
    api = apiserver.api
    with node_and_workload_controllers(api, NODE):
        deploy = _deploy(3)
        deploy["spec"]["template"]["spec"]["nodeName"] = NODE
        api.create("Deployment", deploy, namespace="default")
        done = kubectl(apiserver, "rollout", "status", "deployment/web", "--timeout=60s")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().endswith('deployment "web" successfully rolled out')
        assert kubectl(apiserver, "set", "image", "deployment/web", "web=v2").returncode == 0
        done = kubectl(apiserver, "rollout", "status", "deployment/web", "--timeout=60s")
        assert done.returncode == 0 and "successfully rolled out" in done.stdout, done.stderr
        history = kubectl(apiserver, "rollout", "history", "deployment/web")
        assert history.returncode == 0, history.stderr
        assert [line.split()[0] for line in history.stdout.splitlines()[2:] if line.strip()] == ["1", "2"]
        undo = kubectl(apiserver, "rollout", "undo", "deployment/web")
        assert undo.returncode == 0 and undo.stdout.strip() == "deployment.apps/web rolled back", undo.stderr
        assert kubectl(apiserver, "rollout", "status", "deployment/web", "--timeout=60s").returncode == 0
        image = api.get("Deployment", "web", namespace="default")["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image == "v1"
        history = kubectl(apiserver, "rollout", "history", "deployment/web")
        assert [line.split()[0] for line in history.stdout.splitlines()[2:] if line.strip()] == ["2", "3"]
        restart = kubectl(apiserver, "rollout", "restart", "deployment/web")
        assert restart.returncode == 0 and restart.stdout.strip() == "deployment.apps/web restarted", restart.stderr
        assert kubectl(apiserver, "rollout", "status", "deployment/web", "--timeout=60s").returncode == 0
        assert len(api.list("ReplicaSet", namespace="default")[0]) == 3
        assert kubectl(apiserver, "scale", "deployment/web", "--replicas=1").returncode == 0
        deadline = time.monotonic() + 60
        while (row := kubectl(apiserver, "get", "deploy", "web", "--no-headers").stdout.split())[:4] != \
                ["web", "1/1", "1", "1"]:
            assert time.monotonic() < deadline, row
            time.sleep(0.2)
        assert len(api.list("Pod", namespace="default")[0]) == 1
