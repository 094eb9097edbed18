"""Graceful pod deletion as kube-apiserver does it (controlplane.gracefuldelete): a bound, running pod stays
Terminating for its grace period until its kubelet deletes it with a grace period of 0; a later delete only
shortens the period; a pod that never ran or has finished goes at once; other kinds are unaffected."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from typing import Any

from controlplane.gracefuldelete import decide, pod_grace_period
from gpudra.timestamps import parse_rfc3339
from sim.kubelet.pods import kill_grace_seconds
from tests.conftest import RunningApiServer

NOW = datetime(2026, 12, 2, 6, 0, 0, tzinfo=timezone.utc)


def _pod(node: str | None = "n1", phase: str = "Running", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "default", "uid": "u", "generation": 1},
            "spec": {**({"nodeName": node} if node else {}), **spec}, "status": {"phase": phase}}


def test_the_grace_period_is_the_requests_else_the_pods_and_zero_for_a_pod_that_is_not_running() -> None:
    assert pod_grace_period(_pod(), None) == 30
    assert pod_grace_period(_pod(terminationGracePeriodSeconds=5), None) == 5
    assert pod_grace_period(_pod(terminationGracePeriodSeconds=5), 12) == 12
    assert pod_grace_period(_pod(), -3) == 1
    assert pod_grace_period(_pod(node=None), 60) == 0  # never scheduled
    assert pod_grace_period(_pod(phase="Succeeded"), None) == 0
    assert pod_grace_period(_pod(phase="Failed"), None) == 0


def test_a_first_delete_marks_the_pod_and_a_later_one_only_shortens() -> None:
    first = decide("Pod", _pod(), {}, NOW)
    assert not first.remove and first.metadata is not None
    assert first.metadata["deletionTimestamp"] == "2026-12-02T06:00:30Z"
    assert first.metadata["deletionGracePeriodSeconds"] == 30 and first.metadata["generation"] == 2
    marked = {**_pod(), "metadata": first.metadata}
    assert decide("Pod", marked, {}, NOW + timedelta(seconds=3)) == decide("Pod", marked, {"gracePeriodSeconds": 45})
    assert decide("Pod", marked, {"gracePeriodSeconds": 45}).metadata is None
    shorter = decide("Pod", marked, {"gracePeriodSeconds": 10})
    assert shorter.metadata is not None and not shorter.remove
    # Counted from when the deletion began, not from the second request.
    assert (shorter.metadata["deletionTimestamp"], shorter.metadata["deletionGracePeriodSeconds"]) == (
        "2026-12-02T06:00:10Z", 10)
    final = decide("Pod", marked, {"gracePeriodSeconds": 0})
    assert final.remove and final.metadata is not None and final.metadata["deletionGracePeriodSeconds"] == 0


def test_other_kinds_and_pods_that_never_ran_are_removed_at_once() -> None:
    assert decide("ConfigMap", {"metadata": {"name": "c"}}, {"gracePeriodSeconds": 30}).remove
    unscheduled = decide("Pod", _pod(node=None), {}, NOW)
    assert unscheduled.remove and unscheduled.metadata is not None
    assert unscheduled.metadata["deletionGracePeriodSeconds"] == 0


def _delete(server: RunningApiServer, name: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    req = urllib.request.Request(f"{server.url}/api/v1/namespaces/default/pods/{name}", method="DELETE",
                                 data=json.dumps(body or {}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as resp:
        assert resp.status == 200
        return json.loads(resp.read())  # type: ignore[no-any-return]


def test_through_the_api_a_bound_pod_is_terminating_until_deleted_with_grace_zero(apiserver: RunningApiServer) -> None:
    api = apiserver.api
    api.create("Pod", {"metadata": {"name": "web", "namespace": "default"}, "spec": {
        "nodeName": "n1", "terminationGracePeriodSeconds": 20, "containers": [{"name": "c", "image": "busybox"}]}},
        namespace="default")
    before = datetime.now(timezone.utc).replace(microsecond=0)
    answer = _delete(apiserver, "web")
    assert answer["kind"] == "Pod" and answer["metadata"]["deletionGracePeriodSeconds"] == 20
    due = parse_rfc3339(answer["metadata"]["deletionTimestamp"])
    assert due is not None and before + timedelta(seconds=19) <= due <= before + timedelta(seconds=22)
    # Its kubelet's status writes do not remove it; a second delete changes nothing.
    api.patch("Pod", "web", {"status": {"phase": "Failed"}}, namespace="default", subresource="status")
    assert _delete(apiserver, "web", {"gracePeriodSeconds": 25})["metadata"]["deletionTimestamp"] == \
        answer["metadata"]["deletionTimestamp"]
    pod = api.get("Pod", "web", namespace="default")
    assert pod["metadata"]["deletionGracePeriodSeconds"] == 20
    assert api.delete("Pod", "web", namespace="default", uid=pod["metadata"]["uid"], grace_period_seconds=0)
    assert api.try_get("Pod", "web", namespace="default") is None


def test_through_the_api_an_unscheduled_pod_goes_at_once_and_finalizers_still_hold(apiserver: RunningApiServer) -> None:
    api = apiserver.api
    api.create("Pod", {"metadata": {"name": "pending", "namespace": "default"}, "spec": {
        "containers": [{"name": "c", "image": "busybox"}]}}, namespace="default")
    api.delete("Pod", "pending", namespace="default")
    assert api.try_get("Pod", "pending", namespace="default") is None
    api.create("Pod", {"metadata": {"name": "held", "namespace": "default", "finalizers": ["example.com/hold"]},
                       "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]}},
               namespace="default")
    api.delete("Pod", "held", namespace="default")
    api.delete("Pod", "held", namespace="default", grace_period_seconds=0)  # its kubelet is done ...
    held = api.get("Pod", "held", namespace="default")
    assert held["metadata"]["deletionGracePeriodSeconds"] == 0  # ... and the finalizer still holds it
    api.patch("Pod", "held", {"metadata": {"finalizers": None}}, namespace="default")
    assert api.try_get("Pod", "held", namespace="default") is None


def test_the_kubelet_stops_containers_with_the_probes_else_the_deletions_else_the_pods_grace_at_least_2_s() -> None:
    pod = _pod(terminationGracePeriodSeconds=45)
    assert kill_grace_seconds(pod) == 45
    assert kill_grace_seconds({**pod, "metadata": {"deletionGracePeriodSeconds": 10}}) == 10
    assert kill_grace_seconds({**pod, "metadata": {"deletionGracePeriodSeconds": 0}}) == 2  # --force
    assert kill_grace_seconds(pod, probe_grace=5) == 5
    assert kill_grace_seconds(_pod()) == 30


def test_delete_options_given_as_query_parameters_are_honoured(apiserver: RunningApiServer) -> None:
    """A force delete by URL (`DELETE .../pods/web?gracePeriodSeconds=0`, no body), as kube-apiserver decodes it."""
    api = apiserver.api
    api.create("Pod", {"metadata": {"name": "web", "namespace": "default"}, "spec": {
        "nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]}}, namespace="default")
    url = f"{apiserver.url}/api/v1/namespaces/default/pods/web"
    request = urllib.request.Request(url + "?gracePeriodSeconds=abc", method="DELETE")
    try:
        urllib.request.urlopen(request)
        raise AssertionError("a gracePeriodSeconds that is not a number was accepted")
    except urllib.error.HTTPError as exc:
        assert exc.code == 400 and 'parsing "abc": invalid syntax' in json.loads(exc.read())["message"]
    with urllib.request.urlopen(urllib.request.Request(url + "?gracePeriodSeconds=0", method="DELETE")) as resp:
        assert resp.status == 200
    assert api.try_get("Pod", "web", namespace="default") is None
