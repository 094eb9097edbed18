"""The pod status the kubelet simulator publishes, as a 1.37 kubelet's status manager writes it: conditions in
generateAPIPodStatus's order (PodReadyToStartContainers first), each keeping its lastTransitionTime while its status
stays; startTime from the first status; hostIP the node's InternalIP; a container that cannot be created waiting
with its error (CreateContainerConfigError, CreateContainerError).

The pure parts need nothing; the rest runs a NodeKubelet against the embedded API server with a fake runtime (no
podman): its `run` starts every container, or refuses those of the image "broken"; a container exits (code 1) when
the test says so."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from sim.kubelet.pods import ContainerRun, NodeKubelet, container_status, pod_conditions, start_failed_status
from sim.runtime.podman import ContainerRequest, ContainerStatus, RuntimeError_, Seen
from tests.conftest import RunningApiServer
from tests.plugin_helpers import DRIVER, NODE, short_tmp

ORDER = ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"]
NODE_IP = "127.237.0.1"  # as sim.cluster.spec gives a node its own loopback InternalIP


def test_conditions_come_in_the_kubelets_order_with_pod_ready_to_start_containers() -> None:
    running = container_status(ContainerRun("main", "k8s_main_p_ns_u_0", 0, (), "t0"))
    conditions = pod_conditions([running], "t1")
    assert [c["type"] for c in conditions] == ORDER
    assert all(c["status"] == "True" and c["lastTransitionTime"] == "t1" for c in conditions)
    # Before the sandbox exists (volumes being mounted) and once the pod is terminated (its sandbox stopped): False.
    waiting = pod_conditions([running], "t1", sandbox=False)
    assert waiting[0] == {"type": "PodReadyToStartContainers", "status": "False", "lastTransitionTime": "t1"}


def test_a_condition_keeps_its_last_transition_time_while_its_status_stays() -> None:
    unready = {"name": "main", "ready": False}
    ready = {"name": "main", "ready": True}
    scheduled = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": "t0"}]  # the scheduler's
    first = pod_conditions([unready], "t1", previous=scheduled)
    times = {c["type"]: c["lastTransitionTime"] for c in first}
    assert times == {"PodReadyToStartContainers": "t1", "Initialized": "t1", "Ready": "t1", "ContainersReady": "t1",
                     "PodScheduled": "t0"}
    # The container becomes ready: only Ready and ContainersReady change, and only they get the new time.
    second = {c["type"]: c for c in pod_conditions([ready], "t2", previous=first)}
    assert {t: c["lastTransitionTime"] for t, c in second.items()} == {
        "PodReadyToStartContainers": "t1", "Initialized": "t1", "Ready": "t2", "ContainersReady": "t2",
        "PodScheduled": "t0"}
    # Unchanged statuses: every time stays.
    third = pod_conditions([ready], "t3", previous=list(second.values()))
    assert [c["lastTransitionTime"] for c in third] == ["t1", "t1", "t2", "t2", "t0"]
    # Terminated: the sandbox is stopped and the container not ready.
    done = {c["type"]: c for c in pod_conditions([unready], "t4", previous=third, sandbox=False,
                                                     terminated="Failed")}
    assert done["PodReadyToStartContainers"]["lastTransitionTime"] == "t4" and done["Ready"]["lastTransitionTime"] == "t4"
    assert done["Initialized"]["lastTransitionTime"] == "t1"


def test_a_container_that_could_not_be_created_waits_with_its_error() -> None:
    fresh = start_failed_status("main", "CreateContainerConfigError", "couldn't find key m in ConfigMap ns/cfg", None)
    assert fresh["state"] == {"waiting": {"reason": "CreateContainerConfigError",
                                          "message": "couldn't find key m in ConfigMap ns/cfg"}}
    assert fresh["ready"] is False and fresh["started"] is False and fresh["restartCount"] == 0 and "lastState" not in fresh
    # A failed restart: the previous run stays in lastState and the restart count is not raised.
    exited = ContainerRun("main", "k8s_main_p_ns_u_2", 2, (), "t0", running=False, exit_code=1, finished_at="t1")
    again = start_failed_status("main", "CreateContainerError", "no such image", exited)
    assert again["restartCount"] == 2 and again["lastState"]["terminated"]["exitCode"] == 1
    assert again["state"]["waiting"]["reason"] == "CreateContainerError"


class FakeRuntime:
    """Starts every container (running until `exited` names it), refuses those of the image "broken"."""

    def __init__(self) -> None:
        self.requests: list[ContainerRequest] = []
        self.exited: set[str] = set()  # runtime names of the containers that exited with code 1

    def run(self, request: ContainerRequest) -> ContainerStatus:
        if request.image == "broken":
            raise RuntimeError_(f"creating container {request.name}: image not known")
        self.requests.append(request)
        return ContainerStatus(request.name, True, None, "2026-01-01T00:00:00Z")

    def status(self, name: str) -> ContainerStatus:
        if name in self.exited:
            return ContainerStatus(name, False, 1, "2026-01-01T00:00:00Z", "2026-01-01T00:00:01Z")
        return ContainerStatus(name, True, None, "2026-01-01T00:00:00Z")

    def remove(self, name: str, grace_seconds: int = 1) -> None:
        pass

    def kill(self, name: str) -> None:
        pass

    def seen(self, name: str) -> Seen | None:
        return None

    def exec_argv(self, name: str, command: Sequence[str], *, tty: bool = False) -> list[str] | None:
        return None

    def attach_argv(self, name: str, *, stdin: bool) -> list[str] | None:
        return None

    def tty_of(self, name: str) -> tuple[bool, bool]:
        return False, False

    def network_pid(self, name: str) -> int | None:
        return None


@pytest.fixture
def node(apiserver: RunningApiServer) -> Iterator[tuple[RunningApiServer, FakeRuntime]]:
    runtime = FakeRuntime()
    with short_tmp() as tmp:
        kubelet = NodeKubelet(apiserver.api, NODE, tmp / "kubelet", DRIVER, runtime=runtime, node_address=NODE_IP)
        kubelet.start()
        try:
            yield apiserver, runtime
        finally:
            kubelet.stop()


def _wait(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return got


def _status(apiserver: RunningApiServer, name: str) -> dict[str, Any]:
    return apiserver.api.get("Pod", name, namespace="default").get("status") or {}


def _conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions") or []}


def _pod(apiserver: RunningApiServer, name: str, containers: list[dict[str, Any]],
         init: list[dict[str, Any]] | None = None) -> None:
    spec: dict[str, Any] = {"nodeName": NODE, "containers": containers}
    if init:
        spec["initContainers"] = init
    apiserver.api.create("Pod", {"metadata": {"name": name, "namespace": "default"}, "spec": spec}, namespace="default")


MISSING_KEY = [{"name": "M", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "m"}}}]


def test_status_keeps_start_time_and_transition_times_and_names_the_nodes_ip(
        node: tuple[RunningApiServer, FakeRuntime]) -> None:
    apiserver, runtime = node
    apiserver.api.create("ConfigMap", {"metadata": {"name": "cfg"}, "data": {"other": "1"}}, namespace="default")
    _pod(apiserver, "p", [{"name": "main", "image": "busybox", "env": [
        *MISSING_KEY, {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]}])
    first = _wait("the first status", lambda: (s := _status(apiserver, "p")).get("containerStatuses") and s)
    # The ConfigMap lacks the key: the container waits in CreateContainerConfigError, after the sandbox was made.
    assert first["phase"] == "Pending"
    assert first["containerStatuses"][0]["state"]["waiting"] == {
        "reason": "CreateContainerConfigError", "message": "couldn't find key m in ConfigMap default/cfg"}
    assert [c["type"] for c in first["conditions"]] == ORDER
    assert _conditions(first)["PodReadyToStartContainers"]["status"] == "True" and first["podIP"].startswith("10.244.")
    assert first["hostIP"] == NODE_IP and first["hostIPs"] == [{"ip": NODE_IP}] and first["startTime"]
    time.sleep(1.1)  # the next status is written a second later (RFC 3339 times have seconds)
    apiserver.api.patch("ConfigMap", "cfg", {"data": {"m": "1"}}, namespace="default")
    running = _wait("the pod running", lambda: (s := _status(apiserver, "p")).get("phase") == "Running" and s)
    assert running["startTime"] == first["startTime"] and running["hostIP"] == NODE_IP
    before, after = _conditions(first), _conditions(running)
    assert after["Ready"]["status"] == "True" and after["Ready"]["lastTransitionTime"] > before["Ready"]["lastTransitionTime"]
    for kind in ("PodReadyToStartContainers", "Initialized", "PodScheduled"):
        assert after[kind]["lastTransitionTime"] == before[kind]["lastTransitionTime"], kind
    # The downward API's status.hostIP is the node's InternalIP too.
    (request,) = [r for r in runtime.requests if "_p_" in r.name]
    assert request.env["HOST"] == NODE_IP


def test_a_container_that_cannot_be_created_waits_with_its_error(node: tuple[RunningApiServer, FakeRuntime]) -> None:
    apiserver, _ = node
    # An init container whose env names a missing ConfigMap key: it waits in CreateContainerConfigError, the app
    # container in PodInitializing; startTime is set already.
    _pod(apiserver, "init", [{"name": "main", "image": "busybox"}],
         init=[{"name": "setup", "image": "busybox", "env": MISSING_KEY}])
    status = _wait("the init container's status", lambda: (s := _status(apiserver, "init")).get(
        "initContainerStatuses") and s)
    assert status["phase"] == "Pending" and status["startTime"]
    assert status["initContainerStatuses"][0]["state"]["waiting"] == {
        "reason": "CreateContainerConfigError", "message": 'configmap "cfg" not found'}
    assert status["containerStatuses"][0]["state"]["waiting"] == {"reason": "PodInitializing"}
    assert _conditions(status)["Initialized"]["status"] == "False"
    # The runtime refuses to create the container: CreateContainerError with the runtime's message.
    _pod(apiserver, "broken", [{"name": "main", "image": "broken"}])
    status = _wait("the refused container's status", lambda: (s := _status(apiserver, "broken")).get(
        "containerStatuses") and s)
    waiting = status["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == "CreateContainerError" and "image not known" in waiting["message"], waiting
    assert status["phase"] == "Pending" and status["hostIP"] == NODE_IP
    events = apiserver.api.list("Event", namespace="default")[0]
    assert any(e["reason"] == "Failed" and e["involvedObject"]["name"] == "init"
               and e["message"] == 'Error: configmap "cfg" not found' for e in events)


def test_a_failed_restart_shows_its_error_then_the_back_off(node: tuple[RunningApiServer, FakeRuntime]) -> None:
    apiserver, runtime = node
    apiserver.api.create("ConfigMap", {"metadata": {"name": "cfg"}, "data": {"m": "1"}}, namespace="default")
    _pod(apiserver, "r", [{"name": "main", "image": "busybox", "env": MISSING_KEY}])
    _wait("the pod running", lambda: _status(apiserver, "r").get("phase") == "Running")
    apiserver.api.patch("ConfigMap", "cfg", {"data": {"m": None}}, namespace="default")
    (first,) = [r.name for r in runtime.requests if "_r_" in r.name]
    stop = threading.Event()
    timer = threading.Timer(30, stop.set)
    timer.start()
    seen: list[dict[str, Any]] = []
    try:
        runtime.exited.add(first)  # the container exits; its restart cannot build its env any more
        for _, pod in apiserver.api.watch("Pod", namespace="default", stop=stop):
            if pod["metadata"]["name"] != "r":
                continue
            seen += (pod.get("status") or {}).get("containerStatuses") or []
            if any("CrashLoopBackOff" in str(s["state"]) for s in seen):
                break
    finally:
        timer.cancel()
    failed = [s for s in seen if (s["state"].get("waiting") or {}).get("reason") == "CreateContainerConfigError"]
    assert failed, seen
    assert failed[0]["state"]["waiting"]["message"] == "couldn't find key m in ConfigMap default/cfg"
    assert failed[0]["lastState"]["terminated"]["exitCode"] == 1 and failed[0]["restartCount"] == 0
    # Then the restart's back-off, as the kubelet reports each sync's outcome.
    assert seen[-1]["state"]["waiting"]["reason"] == "CrashLoopBackOff"
