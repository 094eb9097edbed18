"""Which claims a pass's release and orphan checks must look at, from the caches' change sets.

Whether a claim's reservations, allocation or existence must change depends only on the claim itself and on the
pods it reserves or is owned by. So a pass looks at the claims changed since the last pass and the claims that
reserve, or are owned by, a pod that changed or went since; and at every claim once per `full_every` seconds (a
write that failed is retried then). Looking at fewer claims can only delay a release, never cause one: the
checks themselves decide on the claim and the pods as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from controller import objects as o
from controller.informer import Store
from controller.objects import Obj


class ClaimWatchlist:
    def __init__(self, pods: Store, claims: Store, *, full_every: float, clock: Callable[[], float]) -> None:
        self._pods = pods
        self._claims = claims
        self._pod_changes = pods.track()
        self._claim_changes = claims.track()
        self._full_every = full_every
        self._clock = clock
        self._last_full = float("-inf")
        self._reserving: dict[str, set[str]] = {}  # pod key -> keys of the claims that reserve it
        self._owned: dict[str, set[str]] = {}  # owner pod UID -> keys of the claims it owns
        self._refs: dict[str, tuple[frozenset[str], str]] = {}  # claim key -> (pod keys reserved, owner UID)
        self._pod_uids: dict[str, str] = {}  # pod key -> UID, for pods that are gone

    def claims_to_check(self, claims: Mapping[str, Obj]) -> list[Obj]:
        """The claims of `claims` (the pass's view, by key) that the release and orphan checks must look at."""
        wanted: set[str] = set()
        for key in self._claims.drain(self._claim_changes):
            self._index_claim(key, self._claims.get(key))
            wanted.add(key)
        for key in self._pods.drain(self._pod_changes):
            pod = self._pods.get(key)
            for uid in {self._pod_uids.get(key, ""), o.uid(pod) if pod is not None else ""} - {""}:
                wanted.update(self._owned.get(uid, ()))
            wanted.update(self._reserving.get(key, ()))
            if pod is not None and o.uid(pod):
                self._pod_uids[key] = o.uid(pod)
            else:
                self._pod_uids.pop(key, None)
        now = self._clock()
        if now - self._last_full >= self._full_every:
            self._last_full = now
            return list(claims.values())
        return [claims[k] for k in sorted(wanted) if k in claims]

    def _index_claim(self, key: str, claim: Mapping[str, Any] | None) -> None:
        old = self._refs.pop(key, None)
        if old is not None:
            for pod_key in old[0]:
                self._drop(self._reserving, pod_key, key)
            if old[1]:
                self._drop(self._owned, old[1], key)
        if claim is None:
            return
        ns = o.namespace(claim)
        reserved = frozenset(f"{ns}/{r.get('name')}" for r in o.reserved_for(claim) if r.get("resource") == "pods")
        owner = o.controller_owner_uid(claim) or ""
        self._refs[key] = (reserved, owner)
        for pod_key in reserved:
            self._reserving.setdefault(pod_key, set()).add(key)
        if owner:
            self._owned.setdefault(owner, set()).add(key)

    @staticmethod
    def _drop(index: dict[str, set[str]], at: str, key: str) -> None:
        keys = index.get(at)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del index[at]
