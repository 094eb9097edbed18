"""driver.publisher: the pure diff, and reconciliation against the embedded API server."""

from __future__ import annotations

import copy
import threading
from dataclasses import replace
from typing import Any

import pytest

from driver.inventory import Gpu, Health
from driver.publisher import PublishError, SlicePublisher, comparable_spec, plan_publish
from driver.slices import SliceSettings, build_slices, gpu_device_name
from gpudra.kubeapi import Conflict, KubeApi
from tests.gpu_fixtures import h100, inventory, t4

NODE = "node-a"
DRIVER = "gpu.nvidia.com"


def desired(gpus: list[Gpu], **kw: Any) -> list[dict[str, Any]]:
    return build_slices(inventory(gpus), SliceSettings(node_name=kw.pop("node_name", NODE), **kw))


def many(n: int) -> list[Gpu]:
    return [replace(t4(i), uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000", pci_bus_id=f"0000:{i // 32:02x}:{i % 32:02x}.0") for i in range(n)]


def stored(api: KubeApi, node: str = NODE, driver: str = DRIVER) -> dict[str, dict[str, Any]]:
    items, _ = api.list("ResourceSlice")
    return {
        s["metadata"]["name"]: s
        for s in items
        if s["spec"]["nodeName"] == node and s["spec"]["driver"] == driver
    }


def generations(slices: dict[str, dict[str, Any]]) -> set[int]:
    return {s["spec"]["pool"]["generation"] for s in slices.values()}


def versions(slices: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {n: s["metadata"]["resourceVersion"] for n, s in slices.items()}


def taints(slices: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {d["name"]: d.get("taints", []) for s in slices.values() for d in s["spec"].get("devices", [])}


def create_node(api: KubeApi, name: str = NODE) -> str:
    node = api.create("Node", {"metadata": {"name": name}})
    return str(node["metadata"]["uid"])


# --- pure diff -------------------------------------------------------------------------------


def as_stored(slices: list[dict[str, Any]], generation: int) -> list[dict[str, Any]]:
    out = copy.deepcopy(slices)
    for i, s in enumerate(out):
        s["spec"]["pool"]["generation"] = generation
        s["metadata"]["resourceVersion"] = str(100 + i)
    return out


def test_plan_is_empty_when_content_matches() -> None:
    want = desired([h100(0), h100(1)])
    plan = plan_publish(want, as_stored(want, 3), None)
    assert plan.empty and plan.generation is None


def test_plan_first_publish_creates_with_generation_one() -> None:
    want = desired(many(200))
    plan = plan_publish(want, [], None)
    assert [c["metadata"]["name"] for c in plan.creates] == [s["metadata"]["name"] for s in want]
    assert plan.generation == 1 and {c["spec"]["pool"]["generation"] for c in plan.creates} == {1}
    assert not plan.updates and not plan.deletes


def test_plan_change_rewrites_whole_pool_and_deletes_stale() -> None:
    before = as_stored(desired(many(200)), 5)
    after = desired(many(100))
    plan = plan_publish(after, before, None)
    assert plan.generation == 6
    assert [u["metadata"]["name"] for u in plan.updates] == [f"{NODE}-{DRIVER}-0"]
    assert plan.updates[0]["metadata"]["resourceVersion"] == "100"
    assert plan.deletes == ((f"{NODE}-{DRIVER}-1", "101"),)


def test_plan_mixed_generations_are_repaired() -> None:
    want = desired(many(200))
    have = as_stored(want, 2)
    have[1]["spec"]["pool"]["generation"] = 1
    plan = plan_publish(want, have, None)
    assert plan.generation == 3 and len(plan.updates) == 2


def test_plan_keeps_taint_times_and_ignores_them_in_comparison() -> None:
    want = desired([replace(h100(0), health=Health(xids=(79,)))])
    have = as_stored(want, 1)
    have[0]["spec"]["devices"][0]["taints"][0]["timeAdded"] = "2026-01-01T00:00:00Z"
    assert plan_publish(want, have, None).empty
    # A content change elsewhere keeps the time the still-present taint was added.
    want2 = desired([replace(h100(0), health=Health(xids=(79,))), h100(1)])
    (update,) = plan_publish(want2, have, None).updates
    assert update["spec"]["devices"][0]["taints"][0]["timeAdded"] == "2026-01-01T00:00:00Z"


def test_plan_owner_change_does_not_bump_generation() -> None:
    want = desired([h100(0)])
    owner = {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "u-1", "controller": True}
    plan = plan_publish(want, as_stored(want, 4), owner)
    assert plan.generation is None
    (update,) = plan.updates
    assert update["metadata"]["ownerReferences"] == [owner]
    assert update["spec"]["pool"]["generation"] == 4


def test_comparable_spec_ignores_generation_and_empty_fields() -> None:
    a = desired([])[0]["spec"]
    b = copy.deepcopy(a)
    b["pool"]["generation"] = 9
    del b["devices"]  # the server's omitempty drops an empty list
    assert comparable_spec(a) == comparable_spec(b)


# --- against the API server ------------------------------------------------------------------


def test_first_publish_then_no_churn(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    pub = SlicePublisher(api, DRIVER, NODE)
    want = desired(many(200))
    result = pub.publish(want)
    assert (result.created, result.updated, result.deleted, result.generation) == (2, 0, 0, 1)
    got = stored(api)
    assert set(got) == {f"{NODE}-{DRIVER}-0", f"{NODE}-{DRIVER}-1"}
    assert generations(got) == {1}
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in got.values()} == {2}
    for s in want:
        assert comparable_spec(got[s["metadata"]["name"]]["spec"]) == comparable_spec(s["spec"])
    again = pub.publish(want)
    assert (again.created, again.updated, again.deleted, again.generation) == (0, 0, 0, None)
    assert versions(stored(api)) == versions(got)


def test_restarted_publisher_does_not_churn(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    want = desired([h100(0), replace(h100(1), health=Health(xids=(79,)))], partitionable=True)
    SlicePublisher(api, DRIVER, NODE).publish(want)
    before = versions(stored(api))
    # A new process rebuilds the same desired state from scratch.
    fresh = desired([h100(0), replace(h100(1), health=Health(xids=(79,)))], partitionable=True)
    result = SlicePublisher(api, DRIVER, NODE).publish(fresh)
    assert result.created == result.updated == result.deleted == 0
    assert versions(stored(api)) == before


def test_health_change_adds_and_removes_taint_with_generation_bump(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    pub = SlicePublisher(api, DRIVER, NODE)
    gpus = [h100(0), h100(1)]
    pub.publish(desired(gpus))
    name = gpu_device_name(gpus[1])
    assert taints(stored(api))[name] == []

    sick = [gpus[0], replace(gpus[1], health=Health(xids=(79,)))]
    assert pub.publish(desired(sick)).generation == 2
    got = stored(api)
    assert generations(got) == {2}
    assert [(t["key"], t.get("value"), t["effect"]) for t in taints(got)[name]] == [("gpu.nvidia.com/xid", "79", "NoSchedule")]
    assert taints(got)[gpu_device_name(gpus[0])] == []

    assert pub.publish(desired(gpus)).generation == 3
    got = stored(api)
    assert generations(got) == {3} and taints(got)[name] == []


def test_inventory_change_grows_and_shrinks_pool(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    pub = SlicePublisher(api, DRIVER, NODE)
    pub.publish(desired(many(10)))
    assert len(stored(api)) == 1
    grown = pub.publish(desired(many(300)))
    assert (grown.created, grown.updated, grown.generation) == (2, 1, 2)
    got = stored(api)
    assert len(got) == 3 and generations(got) == {2}
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in got.values()} == {3}
    shrunk = pub.publish(desired(many(5)))
    assert (shrunk.updated, shrunk.deleted, shrunk.generation) == (1, 2, 3)
    got = stored(api)
    assert list(got) == [f"{NODE}-{DRIVER}-0"]
    assert len(got[f"{NODE}-{DRIVER}-0"]["spec"]["devices"]) == 5
    assert got[f"{NODE}-{DRIVER}-0"]["spec"]["pool"] == {"name": NODE, "generation": 3, "resourceSliceCount": 1}


@pytest.mark.slow
def test_slice_deleted_by_someone_else_is_recreated(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    pub = SlicePublisher(api, DRIVER, NODE)
    want = desired(many(200))
    pub.publish(want)
    api.delete("ResourceSlice", f"{NODE}-{DRIVER}-1")
    result = pub.publish(want)
    assert (result.created, result.updated, result.generation) == (1, 1, 2)
    got = stored(api)
    assert len(got) == 2 and generations(got) == {2}


def test_slice_edited_by_someone_else_is_restored(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    pub = SlicePublisher(api, DRIVER, NODE)
    want = desired([h100(0)])
    pub.publish(want)
    edited = stored(api)[f"{NODE}-{DRIVER}-0"]
    edited["spec"]["devices"][0]["attributes"]["productName"] = {"string": "tampered"}
    edited["metadata"].setdefault("labels", {})["team"] = "x"
    api.replace("ResourceSlice", edited)
    assert pub.publish(want).generation == 2
    got = stored(api)[f"{NODE}-{DRIVER}-0"]
    assert comparable_spec(got["spec"]) == comparable_spec(want[0]["spec"])
    assert got["metadata"]["labels"] == {"team": "x"}  # others' labels survive


def _foreign(name: str, node: str, driver: str) -> dict[str, Any]:
    s = build_slices(inventory([h100(7)], node=node), SliceSettings(node_name=node, driver_name=driver))[0]
    s["metadata"]["name"] = name
    return s


def test_other_nodes_and_drivers_are_untouched(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    api.create("ResourceSlice", _foreign("other-node-slice", "node-b", DRIVER))
    api.create("ResourceSlice", _foreign("other-driver-slice", NODE, "nic.example.com"))
    api.create("ResourceSlice", _foreign("node-b-gpu.nvidia.com-0", "node-b", DRIVER))
    before = {n: s["metadata"]["resourceVersion"] for n, s in ((s["metadata"]["name"], s) for s in api.list("ResourceSlice")[0])}
    pub = SlicePublisher(api, DRIVER, NODE)
    pub.publish(desired(many(200)))
    pub.publish(desired(many(3)))  # shrinking deletes only our stale slice
    assert pub.delete_all() == 1
    after = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in api.list("ResourceSlice")[0]}
    assert after == before


def test_name_taken_by_a_foreign_slice_is_reported_not_overwritten(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    api.create("ResourceSlice", _foreign(f"{NODE}-{DRIVER}-0", "node-b", DRIVER))
    with pytest.raises(PublishError, match=rf"ResourceSlice {NODE}-{DRIVER}-0: the name is taken .*node-b"):
        SlicePublisher(api, DRIVER, NODE).publish(desired([h100(0)]))
    assert api.get("ResourceSlice", f"{NODE}-{DRIVER}-0")["spec"]["nodeName"] == "node-b"


def test_refuses_to_write_slices_of_another_node(apiserver: Any) -> None:
    with pytest.raises(PublishError, match="spec.nodeName='node-b'.*only writes"):
        SlicePublisher(apiserver.api, DRIVER, NODE).publish(desired([h100(0)], node_name="node-b"))


def test_owner_reference_to_node(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    pub = SlicePublisher(api, DRIVER, NODE)
    pub.publish(desired([h100(0)]))
    assert "ownerReferences" not in stored(api)[f"{NODE}-{DRIVER}-0"]["metadata"]
    uid = create_node(api)
    result = pub.publish(desired([h100(0)]))
    assert result.updated == 1 and result.generation is None  # metadata only: no generation bump
    got = stored(api)[f"{NODE}-{DRIVER}-0"]
    assert got["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": uid, "controller": True}
    ]
    assert got["spec"]["pool"]["generation"] == 1
    assert pub.publish(desired([h100(0)])).updated == 0


class RacingApi:
    """Delegates to a KubeApi; the first replace is preceded by someone else's write to the same slice."""

    def __init__(self, api: KubeApi) -> None:
        self._api = api
        self.raced = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    def replace(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        if not self.raced:
            self.raced = True
            other = self._api.get(kind, obj["metadata"]["name"])
            other["metadata"].setdefault("annotations", {})["touched"] = "yes"
            self._api.replace(kind, other)
        return self._api.replace(kind, obj)


def test_conflict_is_resolved_by_rereading(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    SlicePublisher(api, DRIVER, NODE).publish(desired([h100(0)]))
    racing = RacingApi(api)
    result = SlicePublisher(racing, DRIVER, NODE).publish(desired([replace(h100(0), health=Health(lost=True))]))  # type: ignore[arg-type]
    assert racing.raced and result.attempts == 2 and result.generation == 2
    got = stored(api)[f"{NODE}-{DRIVER}-0"]
    assert got["metadata"]["annotations"] == {"touched": "yes"}
    assert got["spec"]["devices"][0]["taints"][0]["key"] == "gpu.nvidia.com/gpu-lost"


class AlwaysConflicting(RacingApi):
    def replace(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        raise Conflict(409, "Conflict", f"{kind} {obj['metadata']['name']}: the object has been modified")


def test_persistent_conflict_gives_up_with_error(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    SlicePublisher(api, DRIVER, NODE).publish(desired([h100(0)]))
    pub = SlicePublisher(AlwaysConflicting(api), DRIVER, NODE, max_attempts=3)  # type: ignore[arg-type]
    with pytest.raises(PublishError, match="still conflicting after 3 attempts"):
        pub.publish(desired([h100(1)]))


# --- background loop -------------------------------------------------------------------------


class FlakyApi(RacingApi):
    """Fails the first list call, as a dropped connection would."""

    def __init__(self, api: KubeApi) -> None:
        super().__init__(api)
        self.failed = False

    def list(self, *args: Any, **kwargs: Any) -> Any:
        if not self.failed:
            self.failed = True
            raise ConnectionError("connection refused")
        return self._api.list(*args, **kwargs)

    def replace(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        return self._api.replace(kind, obj)


def test_run_loop_republishes_on_change_and_recovers_from_errors(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    flaky = FlakyApi(api)
    pub = SlicePublisher(flaky, DRIVER, NODE, resync_seconds=3600, backoff_seconds=0)  # type: ignore[arg-type]
    changed, stop = threading.Event(), threading.Event()
    states = [many(3), many(3), many(200), many(200)]
    calls: list[threading.Event] = [threading.Event() for _ in states]
    proceed: list[threading.Event] = [threading.Event() for _ in states]

    def get_desired() -> list[dict[str, Any]]:
        n = sum(e.is_set() for e in calls)
        calls[n].set()
        if n == len(states) - 1:
            stop.set()
        if n >= 2:
            proceed[n].wait(30)
        return desired(states[n])

    thread = threading.Thread(target=pub.run, args=(get_desired, changed, stop))
    thread.start()
    # Call 0 fails (list refused) and is retried at once (backoff 0): call 1 publishes 3 devices.
    assert calls[1].wait(30)
    # Wait for call 1's publish: the loop then blocks until signalled; signal a change to 200 devices.
    changed.set()
    assert calls[2].wait(30)
    assert len(stored(api)) == 1  # call 1's publish is done before call 2 began
    proceed[2].set()
    # Someone deletes a slice; the next signal (as a resync would) recreates it.
    assert flaky.failed
    changed.set()
    assert calls[3].wait(30)
    got = stored(api)
    assert len(got) == 2
    api.delete("ResourceSlice", f"{NODE}-{DRIVER}-1")
    proceed[3].set()
    thread.join(30)
    assert not thread.is_alive()
    got = stored(api)
    assert set(got) == {f"{NODE}-{DRIVER}-0", f"{NODE}-{DRIVER}-1"}
    assert generations(got) == {3}


class TaintDroppingApi(RacingApi):
    """A server with DRADeviceTaints off: it drops device taints on write, as Kubernetes drops disabled fields."""

    @staticmethod
    def _strip(obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        for d in obj["spec"].get("devices", []):
            d.pop("taints", None)
        return obj

    def create(self, kind: str, obj: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        return self._api.create(kind, self._strip(obj))

    def replace(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        return self._api.replace(kind, self._strip(obj))


def test_fields_dropped_by_the_server_do_not_cause_endless_updates(apiserver: Any, caplog: pytest.LogCaptureFixture) -> None:
    api: KubeApi = apiserver.api
    pub = SlicePublisher(TaintDroppingApi(api), DRIVER, NODE)  # type: ignore[arg-type]
    sick = desired([replace(h100(0), health=Health(xids=(79,)))])
    with caplog.at_level("WARNING", logger="gpudra.publisher"):
        assert pub.publish(sick).created == 1
    assert "dropped=taints" in caplog.text
    assert taints(stored(api))[gpu_device_name(h100(0))] == []
    before = versions(stored(api))
    again = pub.publish(sick)
    assert (again.updated, again.generation) == (0, None)
    assert versions(stored(api)) == before
    # A real change is still published.
    assert pub.publish(desired([h100(0), h100(1)])).generation == 2


@pytest.mark.slow
def test_slices_wiped_by_the_kubelet_are_republished_at_once_not_at_resync(apiserver: Any) -> None:
    """The kubelet deletes a driver's slices after its plugin unregistered; the watch brings them back promptly."""
    api: KubeApi = apiserver.api
    pub = SlicePublisher(api, DRIVER, NODE, resync_seconds=3600)
    changed, stop = threading.Event(), threading.Event()
    want = desired(many(200))
    thread = threading.Thread(target=pub.run, args=(lambda: want, changed, stop))
    thread.start()
    try:
        _wait_for(lambda: len(stored(api)) == 2)
        first = {s["metadata"]["uid"] for s in stored(api).values()}
        # What the kubelet's DRA manager does: delete every slice of the driver on this node.
        for name in list(stored(api)):
            api.delete("ResourceSlice", name)
        _wait_for(lambda: len(stored(api)) == 2)  # long before the 3600 s resync
        assert not first & {s["metadata"]["uid"] for s in stored(api).values()}  # recreated
        # Someone edits a device: restored too. (Re-read on a conflict: the republish may still be writing.)
        def tamper() -> None:
            edited = stored(api)[f"{NODE}-{DRIVER}-0"]
            edited["spec"]["devices"][0]["attributes"]["productName"] = {"string": "tampered"}
            api.replace("ResourceSlice", edited)

        api.retry_on_conflict(tamper)
        _wait_for(lambda: stored(api)[f"{NODE}-{DRIVER}-0"]["spec"]["devices"][0]["attributes"]["productName"]
                  != {"string": "tampered"})
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()


def test_watch_ignores_our_own_writes_and_foreign_slices() -> None:
    pub = SlicePublisher(None, DRIVER, NODE, watch=False)  # type: ignore[arg-type]
    ours = desired([h100(0)])[0]
    pub._remember(ours, ours)
    assert not pub.lost("MODIFIED", ours) and not pub.lost("ADDED", ours)
    assert pub.lost("DELETED", ours)
    assert not pub.lost("DELETED", desired([h100(0)], node_name="node-b")[0])
    # The event of a write still in flight (it arrives before the write returns) is ours too.
    newer = desired([h100(0), h100(1)])[0]
    pub._inflight[newer["metadata"]["name"]] = comparable_spec(newer["spec"])
    assert not pub.lost("MODIFIED", newer)
    tampered = copy.deepcopy(newer)
    tampered["spec"]["devices"][0]["attributes"]["productName"] = {"string": "tampered"}
    assert pub.lost("MODIFIED", tampered)


def _wait_for(predicate: Any, timeout: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")
