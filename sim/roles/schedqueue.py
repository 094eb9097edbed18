"""The embedded scheduler's queue: pending pods ordered by priority, bounded.

Order: priority (`sim.roles.priority.pod_priority`, highest first), then creation time, then namespace/name.
At most `capacity` pods are held; a pod that ranks above the last one held takes its place (the one pushed out
is still pending in the caches and comes back on the next pass), a pod that ranks below is left for the next
pass.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Mapping
from typing import Any

from controller import objects as o
from controller.objects import Obj
from sim.roles.priority import pod_priority

SortKey = tuple[int, str, str]


class SchedulingQueue:
    def __init__(self, priority_values: Mapping[str, int], default_priority: int, capacity: int) -> None:
        self._values = priority_values
        self._default = default_priority
        self.capacity = max(1, capacity)
        self._entries: list[tuple[SortKey, int]] = []  # sorted; the int indexes _pods
        self._pods: dict[int, Obj] = {}
        self._keys: set[str] = set()
        self._next = 0

    def sort_key(self, pod: Mapping[str, Any]) -> SortKey:
        return (-pod_priority(pod, self._values, self._default), str(o.meta(pod).get("creationTimestamp") or ""), o.key(pod))

    def push(self, pod: Obj) -> bool:
        """Queue the pod unless it is queued already or ranks below every held pod of a full queue."""
        key = o.key(pod)
        if key in self._keys:
            return False
        entry = (self.sort_key(pod), self._next)
        if len(self._entries) >= self.capacity:
            if entry >= self._entries[-1]:
                return False
            _, dropped = self._entries.pop()
            self._keys.discard(o.key(self._pods.pop(dropped)))
        self._next += 1
        insort(self._entries, entry)
        self._pods[entry[1]] = pod
        self._keys.add(key)
        return True

    def outranks(self, key: SortKey) -> bool:
        """Whether the first queued pod ranks above a pod of sort key `key`."""
        return bool(self._entries) and self._entries[0][0] < key

    def pop(self) -> Obj | None:
        if not self._entries:
            return None
        _, index = self._entries.pop(0)
        pod = self._pods.pop(index)
        self._keys.discard(o.key(pod))
        return pod

    def __len__(self) -> int:
        return len(self._entries)
