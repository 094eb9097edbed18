"""Informer-style caches: list, then watch, with a periodic relist (resync), over KubeApi.

Each Informer keeps one kind in a Store and calls `notify(kind)` whenever the cache changed, so that the
reconcile loop wakes up. The loop reads only from Stores; it never lists on its hot path.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from controller import objects as o
from controller.objects import Obj
from gpudra.kubeapi import ApiError, KubeApi
from gpudra.timestamps import rfc3339_in

log = logging.getLogger("gpudra.controller.informer")


MAX_BACKOFF_SECONDS = 30.0




class Store:
    """Thread-safe map key -> object for one kind; never goes back to an older resourceVersion."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._lock = threading.Lock()
        self._items: dict[str, Obj] = {}
        # Keys changed since each consumer last drained its set (consumers that keep state derived from the cache
        # update it from these deltas instead of rescanning every object).
        self._trackers: list[set[str]] = []

    def track(self) -> set[str]:
        """A change set for one consumer: every current key at first, then each key that changes or goes."""
        with self._lock:
            tracker = set(self._items)
            self._trackers.append(tracker)
            return tracker

    def drain(self, tracker: set[str]) -> set[str]:
        """The keys changed since the last drain of this tracker (and forget them)."""
        with self._lock:
            changed = set(tracker)
            tracker.clear()
            return changed

    def _touched(self, key: str) -> None:
        for tracker in self._trackers:
            tracker.add(key)

    def get(self, key: str) -> Obj | None:
        with self._lock:
            return self._items.get(key)

    def values(self) -> list[Obj]:
        with self._lock:
            return list(self._items.values())

    def by_key(self) -> dict[str, Obj]:
        with self._lock:
            return dict(self._items)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def upsert(self, obj: Obj) -> bool:
        k = o.key(obj)
        if not k:
            return False
        with self._lock:
            current = self._items.get(k)
            if current is not None and (current == obj or not o.rv_newer(obj, current)):
                return False
            # A different UID is a new object of the same name: always take it.
            self._items[k] = obj
            self._touched(k)
            return True

    def remove(self, obj: Mapping[str, Any]) -> bool:
        k = o.key(obj)
        with self._lock:
            current = self._items.get(k)
            if current is None:
                return False
            if o.uid(obj) and o.uid(current) and o.uid(obj) != o.uid(current):
                return False  # a newer object of the same name replaced the deleted one
            del self._items[k]
            self._touched(k)
            return True

    def replace(self, items: Iterable[Obj], list_rv: str = "") -> bool:
        """Merge a fresh list in; returns whether anything changed.

        Watch events may have been applied while the list was in flight: an object newer than the list is
        kept, and an object missing from the list is dropped only if it is not newer than the list itself.
        """
        fresh = {o.key(i): i for i in items if o.key(i)}
        marker: Obj = {"metadata": {"resourceVersion": list_rv}}
        changed = False
        with self._lock:
            for k, obj in fresh.items():
                current = self._items.get(k)
                if current is None or (current != obj and o.rv_newer(obj, current)):
                    self._items[k] = obj
                    self._touched(k)
                    changed = True
            for k in [k for k in self._items if k not in fresh]:
                if not list_rv or o.rv_newer(marker, self._items[k]):
                    del self._items[k]
                    self._touched(k)
                    changed = True
        return changed


class Informer:
    """Keeps one Store in step with the API server: list, then watch; `relist()` resyncs on demand."""

    def __init__(
        self,
        api: KubeApi,
        store: Store,
        notify: Callable[[str], None],
        *,
        namespace: str | None = None,
        backoff: float = 1.0,
    ) -> None:
        self._api = api
        self.store = store
        self._notify = notify
        self._namespace = namespace
        self._backoff = backoff
        self.synced = threading.Event()

    @property
    def kind(self) -> str:
        return self.store.kind

    def relist(self) -> str:
        items, resource_version = self._api.list(self.kind, namespace=self._namespace)
        changed = self.store.replace(list(items), str(resource_version))
        if changed or not self.synced.is_set():
            self.synced.set()
            self._notify(self.kind)
        return str(resource_version)

    def apply(self, event_type: str, obj: Obj) -> None:
        if event_type in ("ADDED", "MODIFIED"):
            changed = self.store.upsert(obj)
        elif event_type == "DELETED":
            changed = self.store.remove(obj)
        else:
            return  # BOOKMARK and anything newer carry no object change
        if changed:
            self._notify(self.kind)

    def run(self, stop: threading.Event) -> None:
        """List, then watch until `stop`; KubeApi's watch resumes dropped streams and relists on 410 itself.

        The periodic resync is `relist()`, called by the manager's loop every resync period.
        """
        failures = 0
        while not stop.is_set():
            try:
                resource_version = self.relist()
                failures = 0
                for event_type, obj in self._api.watch(
                    self.kind, namespace=self._namespace, resource_version=resource_version, stop=stop
                ):
                    self.apply(event_type, obj)
            except (ApiError, OSError) as err:
                # Exponential backoff, one line per step (not one per retry of every request): an API server that
                # is down for a minute costs a handful of lines, each saying where and when the next try is.
                failures += 1
                wait = min(self._backoff * 2 ** (failures - 1), MAX_BACKOFF_SECONDS)
                unreachable = isinstance(err, OSError) or err.status == 0  # status 0: no HTTP answer at all
                what = "API server unreachable" if unreachable else "list/watch failed"
                log.warning(what, extra={"kind": self.kind, "url": self._api.host, "failures": failures,
                                         "retryIn": f"{wait:.0f}s", "nextRetry": rfc3339_in(wait), "error": str(err)})
                stop.wait(wait)
