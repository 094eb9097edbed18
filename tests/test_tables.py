"""Table cells as kube-apiserver's printers format them (pure functions; the HTTP side is in
test_apiserver_versions.py and test_kubectl.py)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpudra.apiserver.resources import DEFAULT_REGISTRY
from gpudra.apiserver.tables import claim_state, human_duration, node_status_text, table_row


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
