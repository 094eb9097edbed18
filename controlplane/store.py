"""The in-memory object store: versioned writes, Kubernetes' update semantics, watch history.

Stored object dicts are never mutated after they are stored (every write stores a fresh dict), so readers
can serialize them without copying and without holding the lock.
"""

from __future__ import annotations

import bisect
import builtins
import contextlib
import functools
import json
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol, TypeVar

from controlplane import gracefuldelete, namespaces
from controlplane import objects as o
from controlplane import jobstrategy, quota, services
from gpudra.validation import schema
from controlplane import status as st
from controlplane import patchmeta
from controlplane.gatedfields import GatedFields
from controlplane.patch import CopyLimitExceeded, PatchError, TooManyOperations, json_patch, merge_patch
from controlplane.strategicmerge import strategic_merge
from controlplane.backend import MAX_RESOURCE_VERSION, Backend, Change, HistoryLimits, StorageError
from controlplane.persistence import SqliteLog
from controlplane.resources import Registry, ResourceType
from controlplane.selectors import FieldSelector, LabelSelector, labels_of
from gpudra.defaults import apply_defaults
from gpudra.features import Features
from gpudra.jsoncopy import copy_json
from controlplane.crds import definition as crd_definition
from gpudra.validation.admission import Admission
from gpudra.validation.workloads import KINDS as WORKLOAD_KINDS
from gpudra.validation.workloads import validate_workload_api_object
from gpudra.timestamps import rfc3339

ObjKey = tuple[ResourceType, str, str]  # (type, namespace or "", name)
Codec = tuple[Callable[[dict[str, Any]], dict[str, Any]], Callable[[dict[str, Any]], dict[str, Any]]]

PROTECTED_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})
_PATCH_RETRIES = 50
# etcd's default request limit (--max-request-bytes, 1.5 MiB): kube-apiserver cannot store a larger object.
MAX_OBJECT_BYTES = 1536 * 1024
FIELD_VALIDATION = ("Ignore", "Warn", "Strict")

F = TypeVar("F", bound=Callable[..., Any])


# One encoder for every write (json.dumps with options builds a new one per call).
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _encode(value: Any) -> bytes:
    return _ENCODER.encode(value).encode()


@dataclass(frozen=True)
class Event:
    rv: int
    rt: ResourceType
    type: str  # ADDED, MODIFIED, DELETED
    obj: dict[str, Any]
    old: dict[str, Any] | None
    # The object's JSON, encoded once at commit (or lazily for history read back from disk) for all watchers.
    obj_json: bytes | None = field(default=None, compare=False, repr=False)

    def line(self, etype: str) -> bytes:
        """`{"type":..,"object":..}` and a newline: one watch event as every watcher of it sends it. The type is
        per watcher (a selector may turn MODIFIED into ADDED or DELETED); the object is never re-encoded."""
        body = self.obj_json
        if body is None:
            body = _encode(self.obj)
            object.__setattr__(self, "obj_json", body)
        return b'{"type":"%s","object":%b}\n' % (etype.encode(), body)


@dataclass
class FieldPolicy:
    """How one request treats unknown and duplicate fields (`fieldValidation`), and the warnings it produced."""

    mode: str = "Ignore"  # Ignore, Warn or Strict
    duplicates: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _durable(method: F) -> F:
    """Return only once every change the call made is committed (a no-op for in-memory stores)."""

    @functools.wraps(method)
    def wrapper(self: Store, *args: Any, **kwargs: Any) -> Any:
        self._tls.rv = 0
        self._tls.published = published = set[ResourceType]()
        try:
            result = method(self, *args, **kwargs)
        finally:
            self._tls.published = None
            for rt in published:
                self._push(rt)
        if self._log is not None and self._tls.rv:
            try:
                self._log.wait_durable(self._tls.rv)
            except StorageError as exc:
                raise st.StatusError(500, "InternalError", str(exc)) from exc
        return result

    return wrapper  # type: ignore[return-value]


@dataclass(frozen=True)
class Filter:
    """What one list or watch selects: a type, optionally a namespace, label and field selectors."""

    rt: ResourceType
    namespace: str | None = None
    labels: LabelSelector = field(default_factory=lambda: LabelSelector(()))
    fields: FieldSelector = field(default_factory=lambda: FieldSelector(()))

    def matches(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        if self.namespace and (obj.get("metadata") or {}).get("namespace") != self.namespace:
            return False
        if not self.labels.empty and not self.labels.matches(labels_of(obj)):
            return False
        return self.fields.empty or self.fields.matches(lambda f: self.rt.field_value(obj, f))


class RequestAdmission(Protocol):
    """A request's admission chain (controlplane.admission.chain.RequestAdmission)."""

    def mutate(self, rt: ResourceType, name: str, obj: dict[str, Any], old: dict[str, Any] | None) -> bool:
        """Change `obj` in place (mutating admission); True when it changed."""

    def __call__(self, rt: ResourceType, name: str, obj: dict[str, Any] | None, old: dict[str, Any] | None) -> None:
        """Raise a StatusError to refuse (validating admission); `obj` None for a delete."""


class ChangeCounter:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


class _TypeCondition(threading.Condition):
    """What a type's watch threads wait on (under the store's lock), and how many wait: most watches are pushed,
    so most writes have no thread to wake."""

    def __init__(self, lock: threading.Lock) -> None:
        super().__init__(lock)
        self.waiting = 0


class _ThreadState(threading.local):
    """What a store knows of the thread writing through it; the class attributes are each thread's start."""

    admit: RequestAdmission | None = None  # the request's admission (Store.admitting)
    dry_run = False  # inside Store.dry_run()
    rv = 0  # the newest resourceVersion this thread's call wrote
    published: set[ResourceType] | None = None  # the types whose pushed watchers the call must feed


class _Admitting:
    __slots__ = ("_tls", "_admit")

    def __init__(self, tls: _ThreadState, admit: RequestAdmission) -> None:
        self._tls, self._admit = tls, admit

    def __enter__(self) -> None:
        self._tls.admit = self._admit

    def __exit__(self, *exc: object) -> None:
        self._tls.admit = None


class Store:
    def __init__(self, registry: Registry, admission: Admission | None = None, history: HistoryLimits | None = None,
                 gated: GatedFields | None = None) -> None:
        self.registry = registry
        self._admission = admission
        self._gated = gated or GatedFields(Features())
        self._limits = history or HistoryLimits()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # the garbage collector's queue and shutdown
        # Watchers wait per resource type and are woken only by events of their type.
        self._rt_conds = {rt: _TypeCondition(self._lock) for rt in registry.types}
        self._rt_visible = dict.fromkeys(registry.types, 0)  # newest event of each type watchers may see
        self._pushed: dict[ResourceType, set[Watcher]] = {}
        self._counters: dict[ResourceType, list[ChangeCounter]] = {}  # watchers sent to by writing threads (push_to)
        self._visible = 0  # every event up to here is visible to watchers (committed, when durable)
        self._log: Backend | None = None
        # resourceVersions after the last commit before a restart and before where it continued: a reader may
        # have seen them on objects that were then lost with the process, so a watch resuming from one is 410
        # (the client relists and drops what it saw), never silently continued.
        self._lost_rvs = range(0)
        self._tls = _ThreadState()
        self._objects: dict[ResourceType, dict[tuple[str, str], dict[str, Any]]] = {rt: {} for rt in registry.types}
        self._by_uid: dict[str, ObjKey] = {}
        # The JSON of each stored object, by id(): encoded once at commit, reused by GET, list and watch.
        self._json: dict[int, bytes] = {}
        self._dependents: dict[str, set[ObjKey]] = {}
        self._rv = 0
        self._history: list[Event] = []
        self._history_rvs: list[int] = []
        # Per history event: the bytes it holds (its encoded object, and the old one) and when it was written.
        self._history_sizes: list[int] = []
        self._history_times: list[float] = []
        self._history_bytes = 0
        self._aged_at = 0.0  # when the history was last compacted by age (at most once a second)
        # Every event with rv > _floor is still in the history; older ones were compacted.
        self._floor = 0
        self._closed = False
        self._gc_queue: list[str] = []  # owner uids and "ns:NAME" markers for the collector thread
        self._rng = random.Random()

    # ----- reading -------------------------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    def change_counter(self, rts: tuple[ResourceType, ...]) -> ChangeCounter:
        """A counter of the visible changes of `rts`' objects: caches of them (RBAC rules, policies, accounts)
        compare one int per request instead of looking up each type."""
        counter = ChangeCounter()
        with self._lock:
            for rt in rts:
                self._counters.setdefault(rt, []).append(counter)
        return counter

    def get(self, rt: ResourceType, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            obj = self._objects[rt].get((namespace, name))
        if obj is None:
            raise st.not_found(rt, name)
        return obj

    def list(self, flt: Filter) -> tuple[list[dict[str, Any]], int]:
        with self._lock:
            items = list(self._objects[flt.rt].items())
            rv = self._rv
        items.sort(key=lambda kv: kv[0])
        return [obj for _, obj in items if flt.matches(obj)], rv

    def await_durable(self, rv: int | str | None) -> None:
        """Return once every change up to `rv` is committed: a reader is never answered with a change that a
        crash could still lose (writes reach the in-memory state just before their commit)."""
        if self._log is None or not rv:
            return
        try:
            self._log.wait_durable(int(rv))
        except StorageError as exc:
            raise st.StatusError(500, "InternalError", str(exc)) from exc
        except ValueError:
            return

    @property
    def _dry_run(self) -> bool:
        return self._tls.dry_run

    @property
    def in_dry_run(self) -> bool:
        """Whether this thread's writes are inside `dry_run()`."""
        return self._dry_run

    @contextlib.contextmanager
    def dry_run(self, enabled: bool = True) -> Iterator[None]:
        """Writes made by this thread inside the block are checked and answered but not stored (`dryRun=All`)."""
        self._tls.dry_run = enabled
        try:
            yield
        finally:
            self._tls.dry_run = False

    def json_of(self, obj: dict[str, Any]) -> bytes:
        """The JSON encoding of `obj`: the one made when it was stored, or a fresh one for any other dict."""
        cached = self._json.get(id(obj))
        return cached if cached is not None else _encode(obj)

    # ----- writing -------------------------------------------------------------------------------------------

    def _next_uid(self) -> str:
        # Random (RFC 4122 version 4) as kube-apiserver's: never derived from a counter that a crash could rewind.
        while True:
            uid = str(uuid.uuid4())
            if uid not in self._by_uid:
                return uid

    def clean_fields(self, rt: ResourceType, obj: dict[str, Any], policy: FieldPolicy | None,
                     version: str | None = None) -> dict[str, Any]:
        """`obj` (in `version`, default the storage version) without unknown fields, as a new value the caller
        owns (it shares no dict or list with `obj`); Strict refuses unknown or duplicate ones, Warn records
        warnings; a value of the wrong type is 400 in every mode."""
        version = version or rt.version
        if rt.custom is not None:
            # Custom resources: defaulted and pruned by their CRD's structural schema (controlplane.crds).
            pruned, unknown, type_errors = rt.custom.decode(obj)
        else:
            model = schema.model_name(rt.group, version, rt.kind)
            if model is None:
                return copy_json(obj)
            report = schema.check_fields(model, obj)
            pruned, unknown, type_errors = report.pruned, report.unknown, report.type_errors
            if rt.kind == crd_definition.KIND and rt.group == crd_definition.GROUP:
                crd_definition.default_definition(pruned)
        if type_errors:
            raise st.bad_request(f'{rt.kind} in version "{version}" cannot be handled as a {rt.kind}: json: '
                                 f"{type_errors[0]}")
        policy = policy or FieldPolicy()
        problems = [f'unknown field "{p}"' for p in unknown] + [f'duplicate field "{p}"'
                                                                for p in policy.duplicates]
        if problems and policy.mode == "Strict":
            raise st.bad_request(f'{rt.kind} in version "{version}" cannot be handled as a {rt.kind}: '
                                 f"strict decoding error: {', '.join(problems)}")
        if policy.mode == "Warn":
            policy.warnings.extend(p for p in problems if p not in policy.warnings)
        return pruned

    def _admits(self, rt: ResourceType) -> bool:
        # resource.k8s.io, and NVIDIA's ComputeDomains once their CRD serves them (gpudra.computedomain).
        return self._admission is not None and (rt.group == "resource.k8s.io" or (
            rt.custom is not None and rt.group == "resource.nvidia.com" and rt.kind == "ComputeDomain"))

    def admitting(self, admit: RequestAdmission) -> _Admitting:
        """A context in which writes made by this thread also pass `admit` (the request's admission chain, which
        knows who asks), after the strategy's validation and before the commit. (A class, not a generator:
        every write request enters one.)"""
        return _Admitting(self._tls, admit)

    def _admit(self, rt: ResourceType, name: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        request_admission = self._tls.admit
        # Mutating admission comes first, and what it changed is decoded and defaulted again, as kube-apiserver
        # decodes a webhook's patched object.
        if request_admission is not None and request_admission.mutate(rt, name, obj, old):
            o.replace_content(obj, self.clean_fields(rt, obj, FieldPolicy("Ignore")))
            apply_defaults(rt.group, rt.kind, obj)
        errors = o.metadata_errors(obj)
        if old is not None:
            errors.extend(o.immutability_errors(rt, obj, old))
        if rt.group == "scheduling.k8s.io" and rt.kind in WORKLOAD_KINDS:
            errors.extend(str(e) for e in validate_workload_api_object(obj, old))
        if rt.custom is not None:
            errors.extend(rt.custom.validate(obj, old))
        elif rt.kind == crd_definition.KIND and rt.group == crd_definition.GROUP:
            errors.extend(crd_definition.validate_definition(obj, old))
        admission = self._admission
        if admission is not None and self._admits(rt):
            try:
                errors.extend(admission(obj, old))
            except Exception as exc:  # a broken validator must not take the server down
                raise st.StatusError(500, "InternalError",
                                     f'{rt.qualified_kind} "{name}": admission failed: {type(exc).__name__}: {exc}') from exc
        if errors:
            # A rule both the generic metadata checks and a kind's validation apply (annotation size) counts once.
            raise st.invalid(rt, name, list(dict.fromkeys(str(e) for e in errors)))
        if request_admission is not None:
            request_admission(rt, name, obj, old)

    def _commit(self, rt: ResourceType, key: tuple[str, str], new: dict[str, Any] | None, event_type: str,
                old: dict[str, Any] | None) -> dict[str, Any]:
        """Store (or remove, when `new` is None) one object and record its event; caller holds the lock."""
        rv = self._rv + 1
        if rv > MAX_RESOURCE_VERSION:
            raise st.StatusError(500, "InternalError", f"resourceVersion {rv} would exceed Kubernetes' int64 "
                                                       f"resourceVersions ({MAX_RESOURCE_VERSION}); nothing is stored")
        obj_json: bytes | None = None
        if new is not None:
            o.meta(new)["resourceVersion"] = str(rv)
            obj_json = _encode(new)
            if len(obj_json) > MAX_OBJECT_BYTES:
                o.meta(new)["resourceVersion"] = (old or {}).get("metadata", {}).get("resourceVersion")
                raise st.StatusError(413, "RequestEntityTooLarge",
                                     f"Request entity too large: {rt.kind} {key[1]!r} is {len(obj_json)} bytes "
                                     f"encoded; etcdserver: request is too large (limit {MAX_OBJECT_BYTES} bytes)")
        if self._dry_run:
            # Everything was checked; nothing is stored, no resourceVersion is used, no event is sent.
            if new is None:
                assert old is not None
                return old
            if old is None:
                o.meta(new).pop("resourceVersion", None)
            else:
                o.meta(new)["resourceVersion"] = old["metadata"].get("resourceVersion")
            return new
        if self._log is not None:
            try:
                self._log.check_writable()
            except StorageError as exc:
                raise st.StatusError(503, "ServiceUnavailable", str(exc)) from exc
        self._rv = rv
        table = self._objects[rt]
        if old is not None:
            self._json.pop(id(table.get(key)), None)
        if new is not None:
            assert obj_json is not None
            self._json[id(new)] = obj_json
            table[key] = new
            uid = new["metadata"]["uid"]
            self._by_uid[uid] = (rt, key[0], key[1])
            old_owners = set(o.owner_uids(old)) if old else set()
            new_owners = set(o.owner_uids(new))
            for owner in old_owners - new_owners:
                self._dependents.get(owner, set()).discard((rt, key[0], key[1]))
            for owner in new_owners:
                self._dependents.setdefault(owner, set()).add((rt, key[0], key[1]))
            if new_owners and not any(u in self._by_uid for u in new_owners):
                self._enqueue_gc_locked(next(iter(new_owners)))
            event_obj = new
        else:
            assert old is not None
            table.pop(key, None)
            uid = old["metadata"]["uid"]
            self._by_uid.pop(uid, None)
            for owner in o.owner_uids(old):
                deps = self._dependents.get(owner)
                if deps is not None:
                    deps.discard((rt, key[0], key[1]))
                    if not deps:
                        del self._dependents[owner]
            if uid in self._dependents:
                self._enqueue_gc_locked(uid)
            if rt.namespaced:
                ns = self._objects[self.registry.by_kind("Namespace")].get(("", key[0]))  # type: ignore[index]
                if ns is not None and (ns.get("metadata") or {}).get("deletionTimestamp"):
                    self._enqueue_gc_locked("ns-empty:" + key[0])  # gone once empty; content waits for "ns:"
            # The DELETED event carries the final state with the deletion's resourceVersion, as Kubernetes does.
            event_obj = {**old, "metadata": {**old["metadata"], "resourceVersion": str(self._rv)}}
        event = Event(self._rv, rt, event_type, event_obj, old, obj_json if new is not None else _encode(event_obj))
        self._remember(event, len(event.obj_json or b"") * (2 if old is not None else 1))
        self._tls.rv = self._rv
        if self._log is None:
            self._publish_locked(self._rv, (rt,))
        else:
            assert event.obj_json is not None
            self._log.submit(Change(self._rv, rt.kind, key[0], key[1], obj_json, event_type, event.obj_json,
                                    _encode(old) if old is not None else None))
        return event_obj

    def _remember(self, event: Event, size: int) -> None:
        """Add one event to the watch history and compact what is past the limits (amortized: at twice the
        count or bytes, down to the limits; by age, at most once a second)."""
        now = time.monotonic()
        history = self._history
        history.append(event)
        self._history_rvs.append(event.rv)
        self._history_sizes.append(size)
        self._history_times.append(now)
        self._history_bytes += size
        limits = self._limits
        drop = 0
        if len(history) > 2 * limits.events or self._history_bytes > 2 * limits.bytes:
            kept_bytes, keep = 0, 0
            for size_i in reversed(self._history_sizes):
                if keep >= limits.events or kept_bytes + size_i > limits.bytes:
                    break
                kept_bytes += size_i
                keep += 1
            drop = len(self._history) - keep
        elif now - self._aged_at > 1.0:
            self._aged_at = now
            if self._history_times[0] < now - limits.age_s:
                drop = bisect.bisect_left(self._history_times, now - limits.age_s)
        if drop:
            self._floor = self._history_rvs[drop - 1]
            self._history_bytes -= sum(self._history_sizes[:drop])
            column: list[Any]
            for column in (self._history, self._history_rvs, self._history_sizes, self._history_times):
                del column[:drop]

    def _publish_locked(self, rv: int, rts: Any) -> None:
        """Make events up to `rv` visible to watchers and wake the watchers of the types in `rts`. Pushed
        watchers (push_to) get them from the writing thread once its call returns (see _durable), or are
        woken when there is no such thread (the durable log's, the garbage collector's)."""
        self._visible = max(self._visible, rv)
        published = self._tls.published
        for rt in set(rts):
            self._rt_visible[rt] = max(self._rt_visible[rt], rv)
            cond = self._rt_conds[rt]
            if cond.waiting:
                cond.notify_all()
            counters = self._counters.get(rt)
            if counters:
                for counter in counters:
                    counter.value += 1
            pushed = self._pushed.get(rt)
            if pushed:
                if published is not None:
                    published.add(rt)
                else:
                    for watcher in tuple(pushed):
                        watcher.poked.set()

    @property
    def pushes(self) -> bool:
        """Whether writes send pushed watchers their events themselves: in memory, where an event is visible
        once written. A durable store publishes from its log's thread, which wakes each watch instead."""
        return self._log is None

    def push_to(self, watcher: Watcher, push: Callable[[builtins.list[tuple[str, Event]]], bool]) -> None:
        """Deliver `watcher`'s events from the threads that write them: `push(events)` sends them without
        blocking (False when it could not send them all). A watch thread wakes for each event it is to send;
        a write that sends it itself saves that wake-up (and its thread switches) for every watcher.
        The watch's own thread still sends what a push could not, with `watcher.delivery` held."""
        watcher.push = push
        with self._lock:
            self._pushed.setdefault(watcher.flt.rt, set()).add(watcher)

    def stop_pushing(self, watcher: Watcher) -> None:
        with self._lock:
            self._pushed.get(watcher.flt.rt, set()).discard(watcher)
        watcher.push = None

    def _push(self, rt: ResourceType) -> None:
        """Send the new events of `rt` to its pushed watchers, from this (writing) thread.

        Whoever holds a watcher's `delivery` looks at `dirty` again after releasing it: a writer that found it
        held only marks it, and the holder (another writer, or the watch's thread) sends its events too."""
        for watcher in tuple(self._pushed.get(rt, ())):
            watcher.dirty = True
            while watcher.dirty and watcher.delivery.acquire(blocking=False):
                try:
                    watcher.dirty = False
                    push = watcher.push
                    if push is None or watcher.stalled:
                        watcher.poked.set()
                        continue
                    events = watcher.ready_events()
                    if events is None:
                        watcher.poked.set()  # compacted: its thread reports it
                    elif events and not push(events):
                        watcher.stalled = True  # a slow client: its thread sends the rest, and what follows
                        watcher.poked.set()
                finally:
                    watcher.delivery.release()

    def _on_durable(self, rv: int, batch: builtins.list[Change]) -> None:
        with self._lock:
            self._publish_locked(rv, [rt for ch in batch if (rt := self.registry.by_kind(ch.kind)) is not None])

    def _check_namespace(self, rt: ResourceType, namespace: str, name: str) -> None:
        if not rt.namespaced:
            return
        ns_rt = self.registry.by_kind("Namespace")
        assert ns_rt is not None
        ns = self._objects[ns_rt].get(("", namespace))
        if ns is None:
            raise st.namespace_not_found(namespace)
        if (ns.get("metadata") or {}).get("deletionTimestamp"):
            err = st.forbidden(rt, name, f"unable to create new content in namespace {namespace} because it is "
                                         "being terminated")
            assert err.details is not None
            err.details["causes"] = [{"reason": "NamespaceTerminating", "message": f"namespace {namespace} is being "
                                                                                   "terminated",
                                      "field": "metadata.namespace"}]
            raise err

    @_durable
    def create(self, rt: ResourceType, namespace: str, body: Any, fields: FieldPolicy | None = None) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise st.bad_request(f"the body of a {rt.kind} create must be a JSON object")
        check_type_meta(rt, body)
        # apiVersion and kind first, as Kubernetes serializes them.
        obj = {"apiVersion": rt.api_version, "kind": rt.kind, **self.clean_fields(rt, body, fields)}
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        m = o.meta(obj)
        body_ns = m.get("namespace")
        if rt.namespaced:
            if body_ns and namespace and body_ns != namespace:
                raise st.bad_request(f"the namespace of the provided object ({body_ns}) does not match the "
                                     f"namespace sent on the request ({namespace})")
            namespace = namespace or body_ns or "default"
            m["namespace"] = namespace
        else:
            m.pop("namespace", None)
            namespace = ""
        for server_field in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
                             "deletionGracePeriodSeconds", "generation", "managedFields"):
            m.pop(server_field, None)
        name = m.get("name") or ""
        generate = m.get("generateName") or ""
        if not name and not generate:
            raise st.invalid(rt, "", ["metadata.name: Required value: name or generateName is required"])
        o.prepare_create(rt, obj)
        if errors := o.spec_errors(rt, obj):
            raise st.invalid(rt, name or generate, errors)
        apply_defaults(rt.group, rt.kind, obj)
        self._gated.drop_disabled(rt.group, rt.kind, obj, None)
        # Objects that go through admission have their names checked there, together with everything else,
        # so that one 422 lists all of an object's errors as Kubernetes does.
        if not self._admits(rt):
            if not name:
                # Validate the prefix with a representative suffix so the error names the prefix's problem.
                errors = o.name_errors(rt, generate[:58] + "xxxxx")
                if errors:
                    raise st.invalid(rt, generate, [e.replace("metadata.name", "metadata.generateName") for e in errors])
            else:
                errors = o.name_errors(rt, name)
                if errors:
                    raise st.invalid(rt, name, errors)
        self._admit(rt, name or generate, obj, None)
        with self._lock:
            self._check_namespace(rt, namespace, name or generate)
            if not name:
                for _ in range(16):
                    candidate = generate[:58] + "".join(self._rng.choice(o.GENERATE_ALPHABET) for _ in range(5))
                    if (namespace, candidate) not in self._objects[rt]:
                        name = candidate
                        break
                else:
                    raise st.already_exists(rt, generate)
                m["name"] = name
            if (namespace, name) in self._objects[rt]:
                raise st.already_exists(rt, name)
            charges = self._admit_quota_locked(rt, namespace, name, obj) if rt.kind in quota.QUOTA_KINDS else []
            if rt.kind == "Service" and not rt.group:  # controlplane.services: its IP and node ports, atomically
                errors = services.assign(obj, *services.allocated(self._objects[rt].values()))
                if errors:
                    raise st.invalid(rt, name, errors)
            m["uid"] = self._next_uid()
            if rt.group == "batch" and rt.kind == "Job":  # controlplane.jobstrategy: its selector needs name and uid
                errors = jobstrategy.prepare_create(obj)
                if errors:
                    raise st.invalid(rt, name, errors)
            m["creationTimestamp"] = rfc3339()
            m["generation"] = 1
            created = self._commit(rt, (namespace, name), obj, "ADDED", None)
            for charged, used in charges:
                self._charge_quota_locked(charged, used)
            return created

    def _admit_quota_locked(self, rt: ResourceType, namespace: str, name: str,
                            obj: dict[str, Any]) -> builtins.list[tuple[dict[str, Any], dict[str, str]]]:
        """controlplane.quota's admission of a create, atomic with it: the quotas to charge and their new usage."""
        quota_rt = self.registry.by_kind("ResourceQuota")
        if quota_rt is None:
            return []
        quotas = [q for key, q in self._objects[quota_rt].items() if key[0] == namespace]
        if not quotas:
            return []  # the common case costs one scan of the (few) quotas
        existing = {}
        for kind in quota.QUOTA_KINDS:
            kind_rt = self.registry.by_kind(kind)
            if kind_rt is not None:
                existing[kind] = [v for key, v in self._objects[kind_rt].items() if key[0] == namespace]
        return quota.admit(rt, name, obj, quotas, existing)

    def _charge_quota_locked(self, stored: dict[str, Any], used: dict[str, str]) -> None:
        """Record a create's usage in its (stored) quota's status.used at once, as kube-apiserver's quota admission
        does (`kubectl describe quota` right after the create shows it); the quota controller recounts later."""
        status = stored.get("status") or {}
        hard = dict((stored.get("spec") or {}).get("hard") or {})
        if status.get("used") == used and status.get("hard") == hard:
            return
        quota_rt = self.registry.by_kind("ResourceQuota")
        assert quota_rt is not None
        meta = stored["metadata"]
        key = (str(meta.get("namespace") or ""), str(meta.get("name")))
        self._commit(quota_rt, key, {**stored, "metadata": dict(meta), "status": {**status, "hard": hard, "used": used}},
                     "MODIFIED", stored)

    def _merge_update(self, rt: ResourceType, old: dict[str, Any], body: dict[str, Any],
                      subresource: str | None) -> dict[str, Any]:
        """The object a PUT of `body` produces from `old`, honouring status isolation and server fields.

        `body` is the caller's to give away (a fresh value from clean_fields). The result shares the parts it
        keeps from `old` with it: stored objects are never modified, and only the result's own top level and
        metadata dict are written to after this."""
        if rt.kind == "Namespace" and subresource == "finalize":  # controlplane.namespaces: spec.finalizers only
            return namespaces.finalized(old, body)  # validated with any update, in _write
        if subresource == "status":
            new = {**old, "metadata": dict(old["metadata"])}
            if "status" in body:
                new["status"] = body["status"]
            else:
                new.pop("status", None)
            return new
        new = body
        new["apiVersion"] = rt.api_version
        new["kind"] = rt.kind
        if rt.has_status:
            if "status" in old:
                new["status"] = old["status"]
            else:
                new.pop("status", None)
        m = o.meta(new)
        om = old["metadata"]
        for server_field in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                             "generation", "namespace", "name"):
            if server_field in om:
                m[server_field] = om[server_field]
            else:
                m.pop(server_field, None)
        m.pop("managedFields", None)
        o.prepare_update(rt, new, old)
        if rt.kind == "Service" and not rt.group:
            errors = services.keep_allocated(new, old)
            if errors:
                raise st.invalid(rt, str(m.get("name")), errors)
        if o.spec_part(rt, new) != o.spec_part(rt, old):
            m["generation"] = int(om.get("generation", 1)) + 1
        return new

    @_durable
    def update(self, rt: ResourceType, namespace: str, name: str, body: Any,
               subresource: str | None = None, fields: FieldPolicy | None = None) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise st.bad_request(f"the body of a {rt.kind} update must be a JSON object")
        check_type_meta(rt, body)
        body = self.clean_fields(rt, body, fields)
        if subresource != "status":  # a status write keeps all but the status from `old`, and no default is in it
            apply_defaults(rt.group, rt.kind, body)
        bm = body.get("metadata")
        if not isinstance(bm, dict):
            bm = {}
        if bm.get("name") != name:  # an omitted name does not match either, as in kube-apiserver
            raise st.bad_request(f'the name of the object ({bm.get("name") or ""}) does not match the name on the URL ({name})')
        if rt.namespaced and bm.get("namespace") and bm["namespace"] != namespace:
            raise st.bad_request(f"the namespace of the provided object ({bm['namespace']}) does not match the "
                                 f"namespace sent on the request ({namespace})")
        want_rv = bm.get("resourceVersion")
        old = self.get(rt, namespace, name)
        if want_rv and want_rv != old["metadata"].get("resourceVersion"):
            raise st.conflict(rt, name)
        _check_uid(rt, name, bm, old)
        new = self._merge_update(rt, old, body, subresource)
        return self._write(rt, namespace, name, old, new, want_rv or None)

    def _write(self, rt: ResourceType, namespace: str, name: str, old: dict[str, Any], new: dict[str, Any],
               want_rv: str | None) -> dict[str, Any]:
        """Admit and commit an update computed from `old`; conflicts when `old` is no longer current."""
        om, nm = old["metadata"], o.meta(new)
        if om.get("deletionTimestamp"):
            added = set(nm.get("finalizers") or []) - set(om.get("finalizers") or [])
            if added:
                raise st.invalid(rt, name, [f"metadata.finalizers: Forbidden: no new finalizers can be added if the "
                                            f"object is being deleted, found new finalizers {sorted(added)}"])
        if errors := o.spec_errors(rt, new):
            raise st.invalid(rt, name, errors)
        # Parts of `new` shared with `old` lose nothing here: a gate's fields are kept when `old` has them.
        self._gated.drop_disabled(rt.group, rt.kind, new, old)
        self._admit(rt, name, new, old)
        with self._lock:
            current = self._objects[rt].get((namespace, name))
            if current is None:
                raise st.not_found(rt, name)
            if current is not old:
                raise st.conflict(rt, name)
            nm["resourceVersion"] = om.get("resourceVersion")
            if new == old:
                # A no-op write keeps the resourceVersion and emits no event, as Kubernetes does.
                return old
            # Removed once nothing holds it and its grace period is over (a Terminating pod waits for its kubelet).
            if om.get("deletionTimestamp") and not om.get("deletionGracePeriodSeconds") and not nm.get("finalizers") \
                    and (rt.kind != "Namespace" or namespaces.is_finalized(new)):
                return self._commit(rt, (namespace, name), None, "DELETED", new)
            return self._commit(rt, (namespace, name), new, "MODIFIED", old)

    @_durable
    def patch(self, rt: ResourceType, namespace: str, name: str, patch_type: str, body: Any,
              subresource: str | None = None, codec: Codec | None = None,
              fields: FieldPolicy | None = None, version: str | None = None) -> dict[str, Any]:
        """`patch_type` is "json", "merge" or "strategic". `codec` (to the request's version, back to storage)
        applies the patch to the object as the request's API version (`version`) shows it, as Kubernetes
        patches in the version the client speaks."""
        type_name = strategic_type(rt, version or rt.version) if patch_type == "strategic" else None
        for _ in range(_PATCH_RETRIES):
            old = self.get(rt, namespace, name)
            view = codec[0](old) if codec else old
            try:
                if patch_type == "json":
                    patched = json_patch(view, body)
                elif not isinstance(body, dict):
                    raise st.bad_request(f"a {patch_type} merge patch body must be a JSON object")
                elif type_name is not None:
                    patched = strategic_merge(view, body, patchmeta.load(), type_name)
                else:
                    patched = merge_patch(view, body)
            except TooManyOperations as exc:
                raise st.StatusError(413, "RequestEntityTooLarge", f"Request entity too large: {exc}") from exc
            except CopyLimitExceeded as exc:
                # kube-apiserver answers json-patch's error as a generic 422, the text in its cause.
                raise st.StatusError(422, "Invalid", "the server rejected our request due to an error in our request",
                                     {"causes": [{"reason": "UnexpectedServerResponse", "message": str(exc)}]}) from exc
            except PatchError as exc:
                raise st.StatusError(422, "Invalid", f'{rt.qualified_kind} "{name}" is invalid: {exc}') from exc
            if not isinstance(patched, dict):
                raise st.bad_request(f"the patch for {rt.kind} {name!r} must produce a JSON object")
            if codec:
                patched = codec[1](patched)
            check_type_meta(rt, patched)
            patched = self.clean_fields(rt, patched, fields)
            if subresource != "status":  # as in update: what defaulting would set, the status write discards
                apply_defaults(rt.group, rt.kind, patched)
            _check_uid(rt, name, o.meta(patched), old)
            # The patched object carries the stored resourceVersion; only one the patch itself wrote is a
            # precondition (so a patch without one is reapplied after a concurrent write, not refused).
            want_rv = (patched.get("metadata") or {}).get("resourceVersion")
            if want_rv == old["metadata"].get("resourceVersion") and not _sets_resource_version(body):
                want_rv = None
            if want_rv and want_rv != old["metadata"].get("resourceVersion"):
                raise st.conflict(rt, name)
            pm = o.meta(patched)
            if pm.get("name") != name or (rt.namespaced and pm.get("namespace") != namespace):
                raise st.bad_request(f"a patch may not change metadata.name or metadata.namespace of {rt.kind} "
                                     f"{name!r}")
            new = self._merge_update(rt, old, patched, subresource)
            try:
                return self._write(rt, namespace, name, old, new, want_rv)
            except st.StatusError as err:
                # Someone wrote in between: a patch without a resourceVersion precondition is simply reapplied.
                if err.code != 409 or want_rv:
                    raise
        raise st.conflict(rt, name, "too many concurrent writers; please retry")

    @_durable
    def bind(self, namespace: str, name: str, body: Any) -> dict[str, Any]:
        rt = self.registry.by_kind("Pod")
        assert rt is not None
        if not isinstance(body, dict):
            raise st.bad_request("the body of a pod binding must be a Binding object")
        target = body.get("target")
        if not isinstance(target, dict):
            target = {}
        node = target.get("name")
        if not node:
            raise st.invalid(rt, name, ["target.name: Required value: the node to bind to"])
        old = self.get(rt, namespace, name)
        if (old.get("spec") or {}).get("nodeName"):
            raise st.conflict(rt, name, f"pod {name} is already assigned to node "
                                        f"\"{old['spec']['nodeName']}\"")
        if old["metadata"].get("deletionTimestamp"):
            raise st.conflict(rt, name, f"pod {name} is being deleted, cannot be assigned to a host")
        want_uid = (body.get("metadata") or {}).get("uid")
        if want_uid and want_uid != old["metadata"]["uid"]:
            raise st.conflict(rt, name, "Precondition failed: UID in precondition does not match")
        # Only what changes is new; the rest is shared with `old` (stored objects are never modified).
        status = old.get("status")
        if not isinstance(status, dict):
            status = {}
        conditions = [c for c in (status.get("conditions") or []) if c.get("type") != "PodScheduled"]
        conditions.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                           "lastTransitionTime": rfc3339()})
        spec = old.get("spec")
        if not isinstance(spec, dict):
            spec = {}
        new = {**old, "metadata": dict(old["metadata"]), "spec": {**spec, "nodeName": node},
               "status": {**status, "conditions": conditions}}
        self._write(rt, namespace, name, old, new, None)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    @_durable
    def delete(self, rt: ResourceType, namespace: str, name: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
        options = options or {}
        if rt.kind == "Namespace" and name in PROTECTED_NAMESPACES:
            raise st.forbidden(rt, name, "this namespace may not be deleted")
        pre = options.get("preconditions") or {}
        propagation = options.get("propagationPolicy") or ("Orphan" if options.get("orphanDependents") else "Background")
        with self._lock:
            old = self._objects[rt].get((namespace, name))
            if old is None:
                raise st.not_found(rt, name)
            om = old["metadata"]
            if pre.get("uid") and pre["uid"] != om["uid"]:
                raise st.conflict(rt, name, f"Precondition failed: UID in precondition: {pre['uid']}, UID in "
                                            f"object meta: {om['uid']}")
            if pre.get("resourceVersion") and pre["resourceVersion"] != om.get("resourceVersion"):
                raise st.conflict(rt, name, f"Precondition failed: ResourceVersion in precondition: "
                                            f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                                            f"{om.get('resourceVersion')}")
            if propagation == "Orphan":
                self._orphan_dependents_locked(om["uid"])
            held = bool(om.get("finalizers")) or rt.kind == "Namespace" and not namespaces.is_finalized(old)
            decision = gracefuldelete.decide(rt.kind, old, options)
            if decision.metadata is not None:  # a pod's graceful deletion starts, or is shortened
                marked = {**old, "metadata": decision.metadata}
                if decision.remove and not held:
                    return self._commit(rt, (namespace, name), None, "DELETED", marked)
                return self._commit(rt, (namespace, name), marked, "MODIFIED", old)
            if om.get("deletionTimestamp"):
                if decision.remove and not held:
                    return self._commit(rt, (namespace, name), None, "DELETED", old)
                return old
            if held:
                new = copy_json(old)
                nm = new["metadata"]
                nm["deletionTimestamp"] = rfc3339()
                nm["deletionGracePeriodSeconds"] = 0
                nm["generation"] = int(om.get("generation", 1)) + 1
                if rt.kind == "Namespace":  # controlplane.namespaces: Terminating, content deleted after a delay
                    new["status"] = namespaces.terminating(new.get("status"))
                    self._enqueue_gc_later("ns:" + name, namespaces.CONTENT_DELETION_DELAY_S)
                return self._commit(rt, (namespace, name), new, "MODIFIED", old)
            return self._commit(rt, (namespace, name), None, "DELETED", old)

    def _orphan_dependents_locked(self, owner_uid: str) -> None:
        for rt, ns, name in list(self._dependents.get(owner_uid, ())):
            dep = self._objects[rt].get((ns, name))
            if dep is None:
                continue
            new = copy_json(dep)
            refs = [r for r in new["metadata"].get("ownerReferences") or [] if r.get("uid") != owner_uid]
            if refs:
                new["metadata"]["ownerReferences"] = refs
            else:
                new["metadata"].pop("ownerReferences", None)
            self._commit(rt, (ns, name), new, "MODIFIED", dep)

    # ----- garbage collection -----------------------------------------------------------------------------------

    def _enqueue_gc_locked(self, item: str) -> None:
        if self._dry_run:
            return
        self._gc_queue.append(item)
        self._cond.notify_all()

    def _enqueue_gc_later(self, item: str, delay: float) -> None:
        if self._dry_run:
            return

        def enqueue() -> None:
            with self._lock:
                self._enqueue_gc_locked(item)

        timer = threading.Timer(delay, enqueue)
        timer.daemon = True
        timer.start()

    def collect_garbage_once(self, timeout: float) -> bool:
        """Process the pending collection work; returns False once the store is closed."""
        with self._lock:
            if not self._gc_queue and not self._closed:
                self._cond.wait(timeout)
            if self._closed:
                return False
            work, self._gc_queue = self._gc_queue, []
        for item in work:
            if item.startswith("ns:"):
                self._collect_namespace(item[3:])
            elif item.startswith("ns-empty:"):
                self._collect_namespace(item[9:], delete_content=False)
            else:
                self._collect_dependents(item)
        return True

    def _collect_dependents(self, owner_uid: str) -> None:
        with self._lock:
            if owner_uid in self._by_uid:
                return
            doomed = [key for key in self._dependents.get(owner_uid, ())
                      if not any(u in self._by_uid for u in o.owner_uids(self._objects[key[0]].get((key[1], key[2]))
                                                                           or {}))]
        for rt, ns, name in doomed:
            try:
                self.delete(rt, ns, name)
            except st.StatusError:
                pass  # already gone, or protected: nothing to collect

    def _collect_namespace(self, namespace: str, delete_content: bool = True) -> None:
        """The namespace controller's pass over a Terminating namespace (controlplane.namespaces)."""
        ns_rt = self.registry.by_kind("Namespace")
        assert ns_rt is not None
        with self._lock:
            ns = self._objects[ns_rt].get(("", namespace))
            if ns is None or not ns["metadata"].get("deletionTimestamp") \
                    or namespaces.KUBERNETES not in namespaces.spec_finalizers(ns):
                return
            contents = [(rt, key[1]) for rt in self.registry.types if rt.namespaced
                        for key in self._objects[rt] if key[0] == namespace] if delete_content else []
        for rt, name in contents:
            try:
                self.delete(rt, namespace, name)
            except st.StatusError:
                pass  # deleted meanwhile
        with self._lock:
            current = self._objects[ns_rt].get(("", namespace))
            if current is None or namespaces.KUBERNETES not in namespaces.spec_finalizers(current):
                return
            if not delete_content and any(key[0] == namespace for rt in self.registry.types if rt.namespaced
                                          for key in self._objects[rt]):
                return  # a deletion that left content: the controller's own passes recount it
            remaining: dict[str, int] = {}
            held_by: dict[str, int] = {}
            for rt in self.registry.types:
                if not rt.namespaced:
                    continue
                for key, obj in self._objects[rt].items():
                    if key[0] == namespace:
                        remaining[f"{rt.plural}.{rt.group}"] = remaining.get(f"{rt.plural}.{rt.group}", 0) + 1
                        for f in obj["metadata"].get("finalizers") or []:
                            held_by[f] = held_by.get(f, 0) + 1
            status = namespaces.controller_status(current.get("status"), remaining, held_by, rfc3339())
            if remaining:
                if status != current.get("status"):
                    self._commit(ns_rt, ("", namespace), {**current, "metadata": dict(current["metadata"]),
                                                          "status": status}, "MODIFIED", current)
                # The controller requeues a namespace whose content remains (ResourcesRemainingError).
                self._enqueue_gc_later("ns:" + namespace, namespaces.REMAINING_RETRY_S)
                return
            new = namespaces.without_kubernetes(current, status)
            if namespaces.is_finalized(new):
                self._commit(ns_rt, ("", namespace), None, "DELETED", new)
            else:
                self._commit(ns_rt, ("", namespace), new, "MODIFIED", current)

    # ----- watching ------------------------------------------------------------------------------------------

    def watch(self, flt: Filter, resource_version: int | None, initial: bool) -> Watcher:
        with self._lock:
            start = self._rv if resource_version is None else resource_version
            if resource_version is not None and (resource_version < self._floor or
                                                 resource_version in self._lost_rvs):
                raise st.expired(resource_version, self._floor)
            if resource_version is not None and resource_version > self._rv:
                raise st.StatusError(504, "Timeout", f"Too large resource version: {resource_version}, current: "
                                                     f"{self._rv}")
            snapshot = [obj for key, obj in sorted(self._objects[flt.rt].items()) if flt.matches(obj)] if initial else []
        return Watcher(self, flt, start, snapshot)

    def _events_after(self, rt: ResourceType, pos: int) -> tuple[builtins.list[Event], int] | None:
        """Visible events of `rt` after `pos` and the new position; None when `pos` was compacted (lock held)."""
        if pos < self._floor or rt not in self._rt_visible:
            # A type no longer served (its CRD was deleted) ends its watches as a compaction does: 410, and the
            # client's relist then gets the 404.
            return None
        visible = self._visible
        if self._rt_visible[rt] <= pos:
            return [], max(pos, visible)
        lo = bisect.bisect_right(self._history_rvs, pos)
        hi = bisect.bisect_right(self._history_rvs, visible, lo)
        # By route, not identity: a watch started before its CRD changed (new columns or schema) still gets the
        # events written under the type that replaced it.
        return [ev for ev in self._history[lo:hi] if ev.rt is rt or ev.rt == rt], max(pos, visible)

    def wait_events(self, rt: ResourceType, pos: int, timeout: float) -> tuple[builtins.list[Event], int] | None:
        """Events of `rt` after `pos`, waiting up to `timeout` for one; only `rt`'s events wake the wait."""
        with self._lock:
            if self._rt_visible.get(rt, pos + 1) <= pos and not self._closed:
                cond = self._rt_conds[rt]
                cond.waiting += 1
                try:
                    cond.wait(timeout)
                finally:
                    cond.waiting -= 1
            return self._events_after(rt, pos)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._cond.notify_all()
            for cond in self._rt_conds.values():
                cond.notify_all()
            for pushed in self._pushed.values():
                for watcher in pushed:
                    watcher.poked.set()
        if self._log is not None:
            self._log.close()

    # ----- custom resource types (controlplane.crds.manager) ------------------------------------------------

    def serve_type(self, rt: ResourceType) -> None:
        """Serve `rt` (a type a CRD defines), or take the new definition of one already served. Objects stored
        at another storage version are rewritten to this one (conversion strategy None changes apiVersion)."""
        with self._lock:
            self._serve_type_locked(rt)

    def _serve_type_locked(self, rt: ResourceType) -> None:
        current = self.registry.by_route(rt.group, rt.version, rt.plural)
        if current is not None and _same_definition(current, rt):
            # The CRD controller re-establishes every definition on each pass: an unchanged one keeps its type.
            return
        old = self.registry.serve(rt)
        if old is not None and old in self._objects:
            objects = self._objects.pop(old)
            self._rt_conds[rt] = self._rt_conds.pop(old)
            self._rt_visible[rt] = self._rt_visible.pop(old)
            if old.version != rt.version:
                for key, obj in list(objects.items()):
                    moved = {**obj, "apiVersion": rt.api_version}
                    self._json.pop(id(obj), None)
                    self._json[id(moved)] = _encode(moved)
                    objects[key] = moved
            self._objects[rt] = objects
        else:
            self._objects.setdefault(rt, {})
            self._rt_conds.setdefault(rt, _TypeCondition(self._lock))
            self._rt_visible.setdefault(rt, self._visible)

    def withdraw_type(self, rt: ResourceType) -> None:
        """Stop serving a CRD's type (its objects were deleted first)."""
        with self._lock:
            self.registry.withdraw(rt)
            for key in (k for k in self._objects.get(rt, {})):
                self._json.pop(id(self._objects[rt][key]), None)
            self._objects.pop(rt, None)
            cond = self._rt_conds.pop(rt, None)
            self._rt_visible.pop(rt, None)
            if cond is not None:
                cond.notify_all()

    # ----- persistence ---------------------------------------------------------------------------------------

    def storage_failure(self) -> str | None:
        """Why the durable store can no longer write (health checks report it), or None."""
        return self._log.failure() if self._log is not None else None

    def storage_stats(self) -> dict[str, int] | None:
        """Commits and writes so far of the durable store (writes/commits: how well group commit works)."""
        return self._log.stats() if self._log is not None else None

    def open_durable(self, path: str | Path) -> builtins.list[str]:
        """Load the state database at `path` (created when missing) and commit every later write to it before
        the write returns. Returns a description of each stored object that could not be loaded."""
        log: Backend = SqliteLog(path, self._limits, on_durable=self._on_durable)
        state = log.open()
        problems: list[str] = []
        if state.migrated_from is not None:
            problems.append(f"migrated the JSON state file of an earlier version into the database {path}; "
                            f"the JSON file is kept as {state.migrated_from}")
        with self._lock:
            self._rv = self._visible = state.rv
            self._floor = state.floor
            self._lost_rvs = range(state.committed_rv + 1, state.rv)
            # Definitions first: the types of the custom resources stored after them are served from them.
            objects = sorted(state.objects, key=lambda item: not _is_definition(item[0]))
            for obj, raw in objects:
                if _is_definition(obj) and crd_definition.established(obj):
                    self._serve_type_locked(crd_definition.served_type(obj))
                rt = self.registry.by_kind(obj.get("kind", "")) if isinstance(obj, dict) else None
                m = obj.get("metadata") if isinstance(obj, dict) else None
                if rt is None or not isinstance(m, dict) or not m.get("name") or not m.get("uid"):
                    problems.append(f"skipped unreadable object {json.dumps(obj)[:120]}")
                    continue
                key = (m.get("namespace", "") if rt.namespaced else "", m["name"])
                self._objects[rt][key] = obj
                self._json[id(obj)] = raw
                self._by_uid[m["uid"]] = (rt, key[0], key[1])
                for owner in o.owner_uids(obj):
                    self._dependents.setdefault(owner, set()).add((rt, key[0], key[1]))
            for rv, kind, etype, obj, old, size in state.events:
                rt = self.registry.by_kind(kind)
                if rt is None:
                    continue
                self._remember(Event(rv, rt, etype, obj, old), size)
                self._rt_visible[rt] = rv
            for owner in self._dependents:
                if owner not in self._by_uid:
                    self._gc_queue.append(owner)
            ns_rt = self.registry.by_kind("Namespace")
            if ns_rt is not None:  # the namespace controller resumes its passes over Terminating namespaces
                self._gc_queue += ["ns:" + key[1] for key, ns in self._objects[ns_rt].items()
                                   if ns["metadata"].get("deletionTimestamp")]
            self._log = log
            for counters in self._counters.values():
                for counter in counters:
                    counter.value += 1  # everything was just loaded
        return problems


def _same_definition(a: ResourceType, b: ResourceType) -> bool:
    """Whether two types are the same in every field (ResourceType's own equality compares the route only)."""
    return all(getattr(a, f.name) == getattr(b, f.name) for f in fields(ResourceType))


def _is_definition(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("kind") == crd_definition.KIND and obj.get(
        "apiVersion") == f"{crd_definition.GROUP}/v1"


def strategic_type(rt: ResourceType, version: str) -> str:
    """The API type a strategic merge patch of `rt` in `version` is applied with. Kinds the built-in API does
    not define (custom resources) have no patch strategies: kube-apiserver answers 415 for them."""
    type_name = patchmeta.load().type_of(rt.group, version, rt.kind)
    if type_name is None:
        raise st.StatusError(415, "UnsupportedMediaType",
                             "the body of the request was in an unknown format - accepted media types include: "
                             "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml")
    return type_name


def check_type_meta(rt: ResourceType, body: dict[str, Any]) -> None:
    """A body's apiVersion and kind, when given, must be the URL's, as kube-apiserver's decoder insists."""
    api_version, kind = body.get("apiVersion"), body.get("kind")
    if api_version not in (None, "") and api_version != rt.api_version:
        raise st.bad_request(f"the API version in the data ({api_version}) does not match the expected API version "
                             f"({rt.api_version})")
    if kind not in (None, "") and kind != rt.kind:
        raise st.bad_request(f"the kind in the data ({kind}) does not match the expected kind ({rt.kind}) of "
                             f"{rt.qualified}")


def _check_uid(rt: ResourceType, name: str, new_meta: dict[str, Any], old: dict[str, Any]) -> None:
    """metadata.uid may be omitted on update (the stored one is kept) but never changed, as Kubernetes validates."""
    uid = new_meta.get("uid")
    if uid and uid != old["metadata"]["uid"]:
        raise st.invalid(rt, name, [f"metadata.uid: Invalid value: {json.dumps(uid)}: field is immutable"])


class Watcher:
    """One watch: initial events, then translated history events, with Kubernetes' selector semantics."""

    def __init__(self, store: Store, flt: Filter, start: int, initial: list[dict[str, Any]]) -> None:
        self.store = store
        self.flt = flt
        self.pos = start
        self.initial = initial
        # Pushed delivery (Store.push_to): whoever sends this watch's events holds `delivery`, so that they
        # go out in order and once; `poked` wakes the watch's thread to send what writers could not.
        self.push: Callable[[list[tuple[str, Event]]], bool] | None = None
        self.delivery = threading.Lock()
        self.poked = threading.Event()
        self.stalled = False
        self.dirty = False  # events may be waiting: set before trying `delivery`, read after releasing it
        self.pushed_at = 0.0  # when events were last sent (for the bookmark interval)

    def initial_events(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for obj in self.initial:
            yield "ADDED", obj
        self.initial = []

    def next_events(self, timeout: float) -> list[tuple[str, Event]]:
        """Events since the last call (waiting up to `timeout` for one); raises StatusError(410) when compacted.

        Each is (type for this watch, event); `event.line(type)` is its encoded form, shared by all watchers."""
        got = self.store.wait_events(self.flt.rt, self.pos, timeout)
        if got is None:
            raise st.expired(self.pos, self.store._floor)
        return self._translate(*got)

    def ready_events(self) -> list[tuple[str, Event]] | None:
        """next_events without waiting; None (instead of raising) when compacted."""
        with self.store._lock:
            got = self.store._events_after(self.flt.rt, self.pos)
        return None if got is None else self._translate(*got)

    def _translate(self, events: list[Event], newest: int) -> list[tuple[str, Event]]:
        out: list[tuple[str, Event]] = []
        flt = self.flt
        for ev in events:
            now = flt.matches(ev.obj) if ev.type != "DELETED" else False
            before = flt.matches(ev.old) if ev.old is not None else False
            if ev.type == "DELETED":
                if before or flt.matches(ev.obj):
                    out.append(("DELETED", ev))
            elif now and before:
                out.append(("MODIFIED", ev))
            elif now:
                out.append(("ADDED", ev))
            elif before:
                # The object left the selection: Kubernetes reports it as deleted for this watch.
                out.append(("DELETED", ev))
        self.pos = newest
        return out


def _sets_resource_version(body: Any) -> bool:
    """Whether a patch body names a resourceVersion (kube-apiserver's precondition for a patch)."""
    if isinstance(body, dict):
        meta = body.get("metadata")
        return isinstance(meta, dict) and meta.get("resourceVersion") is not None
    if isinstance(body, list):
        for op in body:
            if not isinstance(op, dict) or op.get("op") not in ("add", "replace", "copy", "move"):
                continue
            path, value = op.get("path"), op.get("value")
            if path == "/metadata/resourceVersion" or (
                    path == "/metadata" and isinstance(value, dict) and "resourceVersion" in value):
                return True
    return False
