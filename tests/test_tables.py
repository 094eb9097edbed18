"""Table cells as kube-apiserver's printers format them (pure functions; the HTTP side is in
test_apiserver_versions.py and test_kubectl.py)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from controlplane.resources import DEFAULT_REGISTRY
from controlplane.tables import claim_state, human_duration, node_status_text, table_row


@pytest.mark.parametrize(("seconds", "text"), [
    # apimachinery's pkg/util/duration TestHumanDuration
    (1, "1s"), (70, "70s"), (190, "3m10s"), (70 * 60, "70m"), (47 * 3600, "47h"), (49 * 3600, "2d1h"),
    ((8 * 24 + 2) * 3600, "8d"), (367 * 24 * 3600, "367d"), ((365 * 2 * 24 + 25) * 3600, "2y1d"),
    ((365 * 8 * 24 + 2) * 3600, "8y"),
    (-1, "0s"), (-5, "<invalid>"), (9 * 60, "9m"), (3 * 3600 + 600, "3h10m"),
])
def test_human_duration(seconds: int, text: str) -> None:
    assert human_duration(seconds) == text


def test_node_status() -> None:
    ready = {"status": {"conditions": [{"type": "MemoryPressure", "status": "False"},
                                       {"type": "Ready", "status": "True"}]}}
    assert node_status_text(ready) == "Ready"
    assert node_status_text({**ready, "spec": {"unschedulable": True}}) == "Ready,SchedulingDisabled"
    assert node_status_text({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}) == "NotReady"
    assert node_status_text({}) == "Unknown"


def test_claim_state() -> None:
    assert claim_state({}) == "pending"
    assert claim_state({"status": {"allocation": {}, "reservedFor": [{"name": "p"}]}}) == "allocated,reserved"
    assert claim_state({"metadata": {"deletionTimestamp": "x"}}) == "deleted"
    assert claim_state({"metadata": {"deletionTimestamp": "x"}, "status": {"allocation": {}}}) == "deleted,allocated"


def test_pod_cells_follow_the_container_states() -> None:
    rt = DEFAULT_REGISTRY.by_kind("Pod")
    assert rt is not None
    now = datetime(2026, 1, 1, 1, 0, 0, tzinfo=timezone.utc)
    pod = {"metadata": {"name": "p", "creationTimestamp": "2026-01-01T00:00:00Z"},
           "spec": {"nodeName": "n1", "containers": [{"name": "a"}, {"name": "b"}],
                    "readinessGates": [{"conditionType": "example.com/ready"}]},
           "status": {"phase": "Running", "podIP": "10.0.0.5",
                      "conditions": [{"type": "example.com/ready", "status": "True"}],
                      "containerStatuses": [
                          {"name": "a", "ready": True, "restartCount": 2, "state": {"running": {}},
                           "lastState": {"terminated": {"finishedAt": "2026-01-01T00:55:00Z"}}},
                          {"name": "b", "ready": False, "restartCount": 0,
                           "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}}
    cells = table_row(rt, pod, "None", now=now)["cells"]
    assert cells == ["p", "1/2", "CrashLoopBackOff", "2 (5m ago)", "60m", "10.0.0.5", "n1", "<none>", "1/1"]
    done = {**pod, "status": {"phase": "Succeeded"}}
    row = table_row(rt, done, "None", now=now)
    assert row["cells"][2] == "Succeeded" and row["conditions"][0]["type"] == "Completed"
    deleting = {**pod, "metadata": {**pod["metadata"], "deletionTimestamp": "2026-01-01T00:59:00Z"},
                "status": {"phase": "Running"}}
    assert table_row(rt, deleting, "None", now=now)["cells"][2] == "Terminating"


def test_pod_init_containers_and_sidecars() -> None:
    rt = DEFAULT_REGISTRY.by_kind("Pod")
    assert rt is not None
    now = datetime(2026, 1, 1, 1, 0, 0, tzinfo=timezone.utc)
    spec = {"initContainers": [{"name": "setup"}, {"name": "proxy", "restartPolicy": "Always"}],
            "containers": [{"name": "main"}]}
    waiting = {"metadata": {"name": "p"}, "spec": spec, "status": {"phase": "Pending", "initContainerStatuses": [
        {"name": "setup", "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}}
    cells = table_row(rt, waiting, "None", now=now)["cells"]
    assert cells[1:4] == ["0/2", "Init:CrashLoopBackOff", "1"]
    started = {"metadata": {"name": "p"}, "spec": spec, "status": {
        "phase": "Running", "conditions": [{"type": "Initialized", "status": "True"}],
        "initContainerStatuses": [
            {"name": "setup", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
            {"name": "proxy", "started": True, "ready": True, "restartCount": 3, "state": {"running": {}}}],
        "containerStatuses": [{"name": "main", "ready": True, "state": {"running": {}}}]}}
    assert table_row(rt, started, "None", now=now)["cells"][1:4] == ["2/2", "Running", "3"]


def test_quota_prints_what_the_quota_controller_recorded() -> None:
    rt = DEFAULT_REGISTRY.by_kind("ResourceQuota")
    assert rt is not None
    quota = {"metadata": {"name": "q", "creationTimestamp": "2026-01-01T00:00:00Z"},
             "spec": {"hard": {"pods": "10", "limits.memory": "8Gi"}},
             "status": {"hard": {"pods": "10", "limits.memory": "8Gi", "requests.cpu": "4"},
                        "used": {"pods": "2"}}}
    now = datetime(2026, 1, 1, 0, 0, 30, tzinfo=timezone.utc)
    assert table_row(rt, quota, "None", now=now)["cells"] == ["q", "pods: 2/10, requests.cpu: 0/4",
                                                              "limits.memory: 0/8Gi", "30s"]
    assert table_row(rt, {**quota, "status": {}}, "None", now=now)["cells"][1:3] == ["", ""]


def test_reserved_is_only_said_of_allocated_claims() -> None:
    assert claim_state({"status": {"reservedFor": [{"name": "p"}]}}) == "pending"
