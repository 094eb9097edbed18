"""Reconciles a node's ResourceSlices with the API: create missing, update changed, delete stale.

The diff is a pure function (`plan_publish`); `SlicePublisher` does the I/O around it. Rules:
- Only slices with spec.driver == our driver and spec.nodeName == our node are ours. The list call
  filters on both fields and the code checks them again, so a server that ignores field selectors
  can never make us touch another node's or another driver's slices.
- Any change to the pool's content (devices, counters, taints, slice count) writes every slice with
  a new pool generation (max seen + 1), creates and updates first and deletes last, so the scheduler
  always sees a complete pool of the newest generation. Identical content writes nothing.
- Owner reference to the Node (when the Node exists) is metadata only: fixing it does not bump the
  generation.
- Our own slices are watched: when one we wrote is deleted (the kubelet wipes a driver's slices 30 s after its
  plugin unregistered, e.g. across a slow agent restart, and keeps doing so until the plugin registers again)
  or changed by someone else, the pool is reconciled at once instead of at the next resync.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from driver.slices import node_owner_reference
from gpudra.kubeapi import AlreadyExists, Conflict, KubeApi, NotFound
from gpudra.timestamps import rfc3339_in

log = logging.getLogger("gpudra.publisher")


class PublishError(RuntimeError):
    """The pool could not be reconciled (after re-reading on conflicts)."""


@dataclass(frozen=True)
class PublishPlan:
    creates: tuple[dict[str, Any], ...] = ()
    updates: tuple[dict[str, Any], ...] = ()  # carry the existing resourceVersion
    deletes: tuple[tuple[str, str], ...] = ()  # (name, resourceVersion) of stale slices
    generation: int | None = None  # the pool generation written; None when the pool content is unchanged

    @property
    def empty(self) -> bool:
        return not (self.creates or self.updates or self.deletes)


@dataclass(frozen=True)
class PublishResult:
    created: int = 0
    updated: int = 0
    deleted: int = 0
    generation: int | None = None
    attempts: int = 1
    slices: tuple[str, ...] = field(default_factory=tuple)


# --- pure diff -----------------------------------------------------------------------------


def _prune(value: Any) -> Any:
    """Drop empty lists/maps and None, as the API server's omitempty round trip does."""
    if isinstance(value, Mapping):
        out = {k: _prune(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, [], {})}
    if isinstance(value, list):
        return [_prune(v) for v in value]
    return value


def _without_time_added(spec: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(spec))
    for device in out.get("devices") or ():
        for taint in device.get("taints") or ():
            taint.pop("timeAdded", None)
    return out


def comparable_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A slice spec reduced to what we control: no pool generation, no server-set taint times."""
    out = _prune(_without_time_added(spec))
    pool = dict(out.get("pool", {}))
    pool.pop("generation", None)
    out["pool"] = pool
    return out


def _carry_taint_times(desired: dict[str, Any], existing: Mapping[str, Any] | None) -> None:
    """Keep timeAdded of taints that are still present, so an update does not reset them."""
    if not existing:
        return
    old: dict[tuple[str, str, str, str], str] = {}
    for device in existing.get("spec", {}).get("devices") or ():
        for t in device.get("taints") or ():
            if t.get("timeAdded"):
                old[(device["name"], t["key"], t.get("value", ""), t.get("effect", ""))] = t["timeAdded"]
    for device in desired["spec"].get("devices") or ():
        for t in device.get("taints") or ():
            when = old.get((device["name"], t["key"], t.get("value", ""), t.get("effect", "")))
            if when and "timeAdded" not in t:
                t["timeAdded"] = when


def plan_publish(
    desired: Sequence[Mapping[str, Any]],
    existing: Sequence[Mapping[str, Any]],
    owner: dict[str, Any] | None,
    stored_as: Mapping[str, tuple[dict[str, Any], dict[str, Any]]] | None = None,
) -> PublishPlan:
    """What to write so that `existing` (our slices as read) becomes `desired` (build_slices output).

    `owner` is the Node owner reference to set (None: leave owner references as they are).
    `stored_as` maps a slice name to (comparable desired spec, comparable spec the server stored) of
    our last write: a server that drops fields of disabled alpha features (taints without
    DRADeviceTaints) stores something else than we sent, and that must not count as a change forever.
    """
    current = {s["metadata"]["name"]: s for s in existing}
    wanted = {s["metadata"]["name"]: s for s in desired}
    generations = {int(s["spec"].get("pool", {}).get("generation", 0)) for s in existing}
    remembered = stored_as or {}

    def same(name: str) -> bool:
        want, have = comparable_spec(wanted[name]["spec"]), comparable_spec(current[name]["spec"])
        return want == have or remembered.get(name) == (want, have)

    content_changed = set(current) != set(wanted) or len(generations) > 1 or not all(same(n) for n in wanted)
    generation = (max(generations, default=0) + 1) if content_changed else None

    creates: list[dict[str, Any]] = []
    updates: list[dict[str, Any]] = []
    for name, want in wanted.items():
        have = current.get(name)
        obj = copy.deepcopy(dict(want))
        obj["spec"]["pool"]["generation"] = (
            generation if generation is not None else int(have["spec"]["pool"]["generation"]) if have else 0
        )
        meta = obj.setdefault("metadata", {})
        if owner is not None:
            meta["ownerReferences"] = [owner]
        elif have is not None and have["metadata"].get("ownerReferences"):
            meta["ownerReferences"] = have["metadata"]["ownerReferences"]
        else:
            meta.pop("ownerReferences", None)
        if have is None:
            creates.append(obj)
            continue
        _carry_taint_times(obj, have)
        owner_changed = (have["metadata"].get("ownerReferences") or []) != (meta.get("ownerReferences") or [])
        if generation is not None or owner_changed:
            # Keep labels/annotations others may have added; replace only what we own.
            merged = copy.deepcopy(dict(have))
            merged["spec"] = obj["spec"]
            merged["metadata"] = {**merged["metadata"], **{k: v for k, v in meta.items() if k != "ownerReferences"}}
            if meta.get("ownerReferences"):
                merged["metadata"]["ownerReferences"] = meta["ownerReferences"]
            else:
                merged["metadata"].pop("ownerReferences", None)
            updates.append(merged)
    deletes = tuple(
        (n, str(current[n]["metadata"].get("resourceVersion") or "")) for n in sorted(current) if n not in wanted
    )
    return PublishPlan(tuple(creates), tuple(updates), deletes, generation)


# --- I/O -----------------------------------------------------------------------------------


class SlicePublisher:
    def __init__(
        self,
        api: KubeApi,
        driver_name: str,
        node_name: str,
        *,
        resync_seconds: float = 60.0,
        max_attempts: int = 5,
        backoff_seconds: float = 1.0,
        max_backoff_seconds: float = 60.0,
        conflict_backoff_seconds: float = 0.05,
        watch: bool = True,
    ) -> None:
        self.api = api
        self.driver_name = driver_name
        self.node_name = node_name
        self.resync_seconds = resync_seconds
        self.max_attempts = max_attempts
        self.backoff_seconds = backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.conflict_backoff_seconds = conflict_backoff_seconds
        self.watch = watch
        # Slice name -> (what we sent, what the server stored), both comparable; see plan_publish.
        self._stored_as: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        # Slice name -> comparable spec of the write in flight: its watch event may arrive before the write returns.
        self._inflight: dict[str, dict[str, Any]] = {}

    def _ours(self, obj: Mapping[str, Any]) -> bool:
        spec = obj.get("spec") or {}
        return spec.get("driver") == self.driver_name and spec.get("nodeName") == self.node_name

    @property
    def _field_selector(self) -> str:
        return f"spec.nodeName={self.node_name},spec.driver={self.driver_name}"

    def existing(self) -> list[dict[str, Any]]:
        items, _ = self.api.list("ResourceSlice", field_selector=self._field_selector)
        return [s for s in items if self._ours(s)]

    def lost(self, event: str, obj: Mapping[str, Any]) -> bool:
        """Whether a watch event says a slice we wrote is gone or no longer what the server stored for us."""
        if not self._ours(obj):
            return False
        remembered = self._stored_as.get(str((obj.get("metadata") or {}).get("name")))
        if remembered is None:
            return False  # not one we wrote (or one we deleted ourselves)
        if event == "DELETED":
            return True
        if event != "MODIFIED":
            return False
        spec = comparable_spec(obj.get("spec") or {})
        return spec != remembered[1] and spec != self._inflight.get(str(obj["metadata"]["name"]))

    def watch_own(self, changed: threading.Event, stop: threading.Event, *, retry_seconds: float = 1.0) -> None:
        """Set `changed` whenever a slice we wrote is deleted or altered by someone else, until `stop`."""
        while not stop.is_set():
            try:
                for event, obj in self.api.watch("ResourceSlice", field_selector=self._field_selector, stop=stop):
                    if stop.is_set():
                        return
                    if self.lost(event, obj):
                        log.info(
                            "own slice %s by someone else, republishing node=%s driver=%s slice=%s",
                            "deleted" if event == "DELETED" else "changed", self.node_name, self.driver_name,
                            obj.get("metadata", {}).get("name"),
                        )
                        changed.set()
            except Exception as err:  # noqa: BLE001 - the watch only speeds things up; the resync still runs
                log.warning("slice watch failed node=%s driver=%s error=%r", self.node_name, self.driver_name, str(err))
            stop.wait(retry_seconds)

    def _owner(self) -> dict[str, Any] | None:
        node = self.api.try_get("Node", self.node_name)
        uid = (node or {}).get("metadata", {}).get("uid")
        return node_owner_reference(self.node_name, uid) if uid else None

    def _check_desired(self, desired: Sequence[Mapping[str, Any]]) -> None:
        for s in desired:
            if not self._ours(s):
                spec = s.get("spec") or {}
                raise PublishError(
                    f"ResourceSlice {s.get('metadata', {}).get('name')}: spec.driver={spec.get('driver')!r} "
                    f"spec.nodeName={spec.get('nodeName')!r}; this publisher only writes "
                    f"driver={self.driver_name!r} nodeName={self.node_name!r}"
                )

    def publish(self, desired: Sequence[Mapping[str, Any]]) -> PublishResult:
        """Make the node's slices equal to `desired`; re-reads and retries on Conflict/AlreadyExists."""
        self._check_desired(desired)
        last: Exception | None = None
        for attempt in range(1, self.max_attempts + 1):
            plan = plan_publish(desired, self.existing(), self._owner(), self._stored_as)
            try:
                for obj in plan.creates:
                    self._inflight[obj["metadata"]["name"]] = comparable_spec(obj["spec"])
                    self._remember(obj, self._create(obj))
                for obj in plan.updates:
                    self._inflight[obj["metadata"]["name"]] = comparable_spec(obj["spec"])
                    self._remember(obj, self.api.replace("ResourceSlice", obj))
                for name, version in plan.deletes:
                    # Forgotten first: our own delete's watch event must not look like someone else's.
                    self._stored_as.pop(name, None)
                    # Precondition: a slice changed since we read it is re-read, not deleted blindly.
                    self.api.delete("ResourceSlice", name, resource_version=version or None)
            except (Conflict, AlreadyExists) as err:
                last = err
                log.info(
                    "slice write raced, re-reading node=%s driver=%s attempt=%d error=%r",
                    self.node_name, self.driver_name, attempt, str(err),
                )
                if attempt < self.max_attempts:
                    # Another writer is active: back off a little so that we do not race it again at once.
                    time.sleep(min(self.conflict_backoff_seconds * 2 ** (attempt - 1), 1.0))
                continue
            result = PublishResult(
                created=len(plan.creates),
                updated=len(plan.updates),
                deleted=len(plan.deletes),
                generation=plan.generation,
                attempts=attempt,
                slices=tuple(s["metadata"]["name"] for s in desired),
            )
            if not plan.empty:
                log.info(
                    "slices published node=%s driver=%s generation=%s created=%d updated=%d deleted=%d slices=%d",
                    self.node_name, self.driver_name, plan.generation, result.created, result.updated,
                    result.deleted, len(desired),
                )
            return result
        raise PublishError(
            f"ResourceSlices of node {self.node_name} (driver {self.driver_name}): still conflicting after "
            f"{self.max_attempts} attempts: {last}"
        )

    def _remember(self, sent: Mapping[str, Any], stored: Mapping[str, Any]) -> None:
        want, have = comparable_spec(sent["spec"]), comparable_spec(stored.get("spec") or {})
        name = sent["metadata"]["name"]
        self._stored_as[name] = (want, have)
        if want != have:
            dropped = sorted(
                {k for d in want.get("devices", []) for k in d}
                - {k for d in have.get("devices", []) for k in d}
            ) or sorted(set(want) - set(have))
            log.warning(
                "server stored a different slice than sent node=%s driver=%s slice=%s dropped=%s "
                "hint=%r",
                self.node_name, self.driver_name, name, ",".join(dropped) or "values",
                "alpha fields (taints: DRADeviceTaints, counters: DRAPartitionableDevices) are dropped "
                "when their feature gate is off",
            )

    def _create(self, obj: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.api.create("ResourceSlice", obj)
        except AlreadyExists as exists:
            name = obj["metadata"]["name"]
            try:
                taken = self.api.get("ResourceSlice", name)
            except NotFound:
                raise exists from None  # it went away again: the caller re-reads and retries
            if not self._ours(taken):
                spec = taken.get("spec") or {}
                raise PublishError(
                    f"ResourceSlice {name}: the name is taken by a slice of driver {spec.get('driver')!r} "
                    f"on node {spec.get('nodeName')!r}; it is left alone and this node's pool stays incomplete"
                ) from None
            raise

    def run(
        self,
        get_desired: Callable[[], Sequence[Mapping[str, Any]]],
        changed: threading.Event,
        stop: threading.Event,
        *,
        poll_seconds: float = 0.2,
        gate: Callable[[], AbstractContextManager[bool]] | None = None,
    ) -> None:
        """Publish now, then whenever `changed` is set, and every `resync_seconds` (re-verify), until `stop`.

        Never raises: failures are logged and retried with exponential backoff. With `watch`, a thread watches
        our slices meanwhile and sets `changed` when one is deleted or altered by someone else. With `gate`
        (driver.publisherseat), each round publishes only when the gate says so, inside it: an agent instance that
        a newer one on the node replaced writes nothing, and so never answers the newer one's writes with its own.
        """
        watcher: threading.Thread | None = None
        if self.watch:
            watcher = threading.Thread(
                target=self.watch_own, args=(changed, stop), daemon=True, name=f"slice-watch-{self.node_name}"
            )
            watcher.start()
        failures = 0
        while not stop.is_set():
            changed.clear()  # cleared before reading, so a change during publish triggers another round
            try:
                if gate is None:
                    self.publish(get_desired())
                else:
                    with gate() as ours:
                        if ours:
                            self.publish(get_desired())
                failures = 0
                wait = self.resync_seconds
            except Exception as err:  # noqa: BLE001 - the loop must survive any failure and retry
                failures += 1
                wait = min(self.backoff_seconds * 2 ** (failures - 1), self.max_backoff_seconds)
                # One line per backoff step, with the server and when the next try is.
                log.warning(
                    "slice publish failed node=%s driver=%s url=%s failures=%d retry_in=%.1fs next_retry=%s error=%r",
                    self.node_name, self.driver_name, getattr(self.api, "host", "-"), failures, wait,
                    rfc3339_in(wait), str(err),
                )
            if stop.is_set():
                break
            # Wake on a change or stop; `stop` is checked every poll_seconds since one wait cannot watch both.
            remaining = wait
            while remaining > 0 and not stop.is_set():
                step = min(poll_seconds, remaining)
                if changed.wait(step):
                    break
                remaining -= step
        if watcher is not None:
            watcher.join(timeout=5)
        log.info("slice publisher stopped node=%s driver=%s", self.node_name, self.driver_name)

    def delete_all(self) -> int:
        """Remove every slice of this node and driver (e.g. on uninstall); returns how many."""
        return sum(1 for s in self.existing() if self.api.delete("ResourceSlice", s["metadata"]["name"]))
