"""Leader election on a Lease, failover between two controllers, and optimistic-concurrency conflicts."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from controller.leader import LeaderElector, LeaseTimings
from controller.metrics import ControllerMetrics
from controller.writes import NotLeader, Writer
from controller_helpers import claims_of, create_all, devices_of, gpu_class, gpu_slice, manager, node, node_of, pod, roles, template


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _elector(api: Any, identity: str, clock: FakeClock) -> LeaderElector:
    return LeaderElector(api, namespace="kube-system", name="gpu-dra-controller", identity=identity,
                         timings=LeaseTimings(15, 10, 2), monotonic=clock)


def test_lease_acquire_renew_expire_and_takeover(apiserver: Any) -> None:
    api = apiserver.api
    clock = FakeClock()
    a, b = _elector(api, "a", clock), _elector(api, "b", clock)
    assert a.try_acquire_or_renew() and a.is_leader()
    assert not b.try_acquire_or_renew() and not b.is_leader()
    lease = api.get("Lease", "gpu-dra-controller", "kube-system")
    assert lease["spec"]["holderIdentity"] == "a" and lease["spec"]["leaseDurationSeconds"] == 15

    clock.now += 5
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # b sees a changed record: its expiry clock restarts now
    clock.now += 14
    assert not b.try_acquire_or_renew()  # 14 s since b last saw a change: not expired yet
    clock.now += 2
    assert not a.is_leader()  # a has not renewed within its 10 s renew deadline: it stops writing
    assert b.try_acquire_or_renew() and b.is_leader()
    lease = api.get("Lease", "gpu-dra-controller", "kube-system")
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1
    assert not a.try_acquire_or_renew()


def test_release_hands_over_at_once(apiserver: Any) -> None:
    api = apiserver.api
    clock = FakeClock()
    a, b = _elector(api, "a", clock), _elector(api, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert a.release() and not a.is_leader()
    assert api.get("Lease", "gpu-dra-controller", "kube-system")["spec"]["holderIdentity"] == ""
    assert b.try_acquire_or_renew() and b.is_leader()


def test_timings_are_validated() -> None:
    with pytest.raises(ValueError, match="--lease-duration"):
        LeaseTimings(5, 10, 2).validate()
    with pytest.raises(ValueError, match="--renew-deadline"):
        LeaseTimings(15, 2, 2).validate()


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_failover_between_two_controllers_never_allocates_a_device_twice(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [gpu_class(), template("one", 1)])
    for n in ("node-a", "node-b"):
        create_all(api, [node(n), gpu_slice(n, [(f"g{i}", "nvl") for i in range(4)])])
    first = manager(api, leader_elect=True, identity="first")
    second = manager(api, leader_elect=True, identity="second")
    first.start()
    second.start()
    try:
        _wait(lambda: first.is_leader() or second.is_leader(), "a leader")
        leader, standby = (first, second) if first.is_leader() else (second, first)
        assert not standby.is_leader()
        create_all(api, [pod(f"before-{i}", templates={"gpu": "one"}) for i in range(4)])
        _wait(lambda: all(api.get("Pod", f"before-{i}", "default")["spec"].get("nodeName") for i in range(4)),
              "the leader to bind the first pods")

        leader.stop(release=False)  # a crash: the lease stays held until it expires
        _wait(standby.is_leader, "the standby to take over")
        create_all(api, [pod(f"after-{i}", templates={"gpu": "one"}) for i in range(4)])
        _wait(lambda: all(api.get("Pod", f"after-{i}", "default")["spec"].get("nodeName") for i in range(4)),
              "the new leader to bind the remaining pods")
        lease = api.get("Lease", "gpu-dra-controller", "kube-system")
        assert lease["spec"]["holderIdentity"] == standby.config.identity
        assert lease["spec"]["leaseTransitions"] >= 1
    finally:
        first.stop()
        second.stop()
    claims = claims_of(api).values()
    held = [(node_of(c), d) for c in claims for d in devices_of(c)]
    assert len(held) == 8 and len(set(held)) == 8
    # A clean stop released the lease.
    assert api.get("Lease", "gpu-dra-controller", "kube-system")["spec"]["holderIdentity"] == ""


def test_standby_never_writes(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [gpu_class(), node("node-a"), gpu_slice("node-a", [("g0", "nvl")]),
                     template("one", 1), pod("p", templates={"gpu": "one"})])
    clock = FakeClock()
    holder = _elector(api, "someone-else", clock)
    assert holder.try_acquire_or_renew()
    standby = manager(api, leader_elect=True, identity="standby")
    report = standby.step()
    assert not report.ran
    assert claims_of(api) == {} and not api.get("Pod", "p", "default")["spec"].get("nodeName")
    with pytest.raises(NotLeader):
        standby.writer.check()


def test_conflicting_writer_is_reread_and_retried(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                      "metadata": {"name": "c", "namespace": "default"},
                      "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "x"}}]}}}])
    stale = api.get("ResourceClaim", "c", "default")
    # A concurrent writer bumps the resourceVersion after we read.
    api.patch("ResourceClaim", "c", {"metadata": {"labels": {"other": "writer"}}}, "default")
    metrics = ControllerMetrics()
    writer = Writer(api, metrics, may_write=lambda: True, observe=lambda k, o: None, forget=lambda k, o: None)
    seen: list[str] = []

    def add_annotation(fresh: dict[str, Any]) -> dict[str, Any]:
        seen.append(fresh["metadata"]["resourceVersion"])
        fresh["metadata"].setdefault("annotations", {})["ours"] = "yes"
        return fresh

    stored = writer.update("ResourceClaim", stale, add_annotation)
    assert stored is not None
    assert stored["metadata"]["labels"] == {"other": "writer"}  # the other write survived
    assert stored["metadata"]["annotations"] == {"ours": "yes"}
    assert len(seen) == 2 and seen[0] != seen[1]
    assert metrics.conflicts._value.get() == 1


def test_allocation_never_overwrites_a_concurrent_allocation(apiserver: Any) -> None:
    api = apiserver.api
    create_all(api, [gpu_class(), node("node-a"), gpu_slice("node-a", [("g0", "nvl"), ("g1", "nvl")]),
                     {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                      "metadata": {"name": "c", "namespace": "default"},
                      "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}])
    m = manager(api)
    stale = api.get("ResourceClaim", "c", "default")
    other = {"devices": {"results": [{"request": "gpus", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "g1"}]}}
    fresh = api.get("ResourceClaim", "c", "default")
    fresh["status"] = {"allocation": other}
    api.replace_status("ResourceClaim", fresh)
    ours = {"devices": {"results": [{"request": "gpus", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "g0"}]}}
    assert roles(m).scheduler._committer.allocate(stale, ours, None) is None
    assert devices_of(api.get("ResourceClaim", "c", "default")) == ["g1"]


def test_leader_loss_mid_pass_stops_writes(apiserver: Any) -> None:
    api = apiserver.api
    leading = threading.Event()
    leading.set()
    writer = Writer(api, ControllerMetrics(), may_write=leading.is_set, observe=lambda k, o: None, forget=lambda k, o: None)
    writer.create("ResourceClaimTemplate", template("t", 1))
    leading.clear()
    with pytest.raises(NotLeader):
        writer.create("ResourceClaimTemplate", template("u", 1))
    items, _ = api.list("ResourceClaimTemplate", "default")
    assert [i["metadata"]["name"] for i in items] == ["t"]
