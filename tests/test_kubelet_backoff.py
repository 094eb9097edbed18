"""The kubelet simulator's container restart back-off and the statuses and conditions it reports (pure parts)."""

from __future__ import annotations

from sim.kubelet.backoff import RestartBackoff, duration_text
from sim.kubelet.pods import ContainerRun, container_status, pod_conditions


def test_backoff_starts_at_10s_doubles_to_300s_and_resets_after_ten_minutes_up() -> None:
    b = RestartBackoff()
    key = "uid/main"
    # The first exit restarts at once and starts the back-off at 10 s.
    assert not b.in_backoff_since(key, finished_at=0.0, now=0.0)
    b.next(key, 0.0, 0.0)
    assert b.get(key) == 10.0
    # The second exit (at 1 s) waits 10 s from its finish: CrashLoopBackOff until 11 s.
    assert b.in_backoff_since(key, 1.0, 5.0) and b.remaining(key, 1.0, 5.0) == 6.0
    assert not b.in_backoff_since(key, 1.0, 11.0)
    b.next(key, 1.0, 11.0)
    assert b.get(key) == 20.0
    finished, now = 12.0, 12.0
    for _ in range(10):
        b.next(key, finished, now)
    assert b.get(key) == 300.0  # capped
    assert b.in_backoff_since(key, now + 1, now + 200)
    # A container that ran for more than 10 min (twice the maximum) since the last restart starts again at 10 s.
    long_run = now + 601
    assert not b.in_backoff_since(key, long_run, long_run)
    b.next(key, long_run, long_run)
    assert b.get(key) == 10.0
    b.forget("uid/")
    assert b.get(key) == 0.0
    assert [duration_text(s) for s in (10, 40, 80, 160, 300)] == ["10s", "40s", "1m20s", "2m40s", "5m0s"]


def test_crash_looping_container_is_waiting_not_ready_and_so_is_the_pod() -> None:
    crashed = ContainerRun("main", "k8s_main_p_ns_u_3", 3, (), "t0", running=False, exit_code=1, finished_at="t1",
                           waiting_message="back-off 40s restarting failed container=main pod=p_ns(u)")
    running = ContainerRun("side", "k8s_side_p_ns_u_0", 0, (), "t0")
    status = container_status(crashed)
    assert status["state"] == {"waiting": {"reason": "CrashLoopBackOff",
                                           "message": "back-off 40s restarting failed container=main pod=p_ns(u)"}}
    assert status["lastState"]["terminated"]["exitCode"] == 1 and status["lastState"]["terminated"]["reason"] == "Error"
    assert status["ready"] is False and status["started"] is False and status["restartCount"] == 3
    assert container_status(running)["ready"] is True
    conditions = {c["type"]: c for c in pod_conditions([status, container_status(running)], "now")}
    assert conditions["Ready"]["status"] == "False" and conditions["ContainersReady"]["status"] == "False"
    assert conditions["Ready"]["reason"] == "ContainersNotReady"
    assert conditions["Ready"]["message"] == "containers with unready status: [main]"
    assert conditions["Initialized"]["status"] == "True"
    ok = {c["type"]: c["status"] for c in pod_conditions([container_status(running)], "now")}
    assert ok == {"PodReadyToStartContainers": "True", "PodScheduled": "True", "Initialized": "True",
                  "ContainersReady": "True", "Ready": "True"}
    # A restarted, running container shows its previous run in lastState.
    again = ContainerRun("main", "k8s_main_p_ns_u_4", 4, (), "t2",
                         last_state={"exitCode": 1, "reason": "Error", "startedAt": "t0", "finishedAt": "t1"})
    assert container_status(again)["lastState"]["terminated"]["exitCode"] == 1
    done = {c["type"]: c for c in pod_conditions([container_status(crashed)], "now", terminated="Failed")}
    assert (done["Ready"]["status"], done["Ready"]["reason"], done["ContainersReady"]["reason"]) == (
        "False", "PodFailed", "PodFailed")
    succeeded = {c["type"]: c for c in pod_conditions([container_status(crashed)], "now", terminated="Succeeded")}
    assert [(succeeded[t]["status"], succeeded[t]["reason"]) for t in ("Initialized", "Ready", "ContainersReady")] == [
        ("True", "PodCompleted"), ("False", "PodCompleted"), ("False", "PodCompleted")]
