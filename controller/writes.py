"""Every write the controller makes goes through one Writer.

- Writes happen only while this instance may write (the leader, or any instance without leader election):
  otherwise `NotLeader` aborts the pass, so a standby or a deposed leader never allocates.
- Updates are optimistic: a mutation function is applied to the object; on a resourceVersion conflict the
  object is re-read and the function applied again (it may decide that nothing is left to do).
- What the API returns is fed back into the informer caches at once, so the next decision in the same pass
  sees this write even before the watch event arrives (kube-scheduler's "assume" step).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from controller import objects as o
from controller.metrics import ControllerMetrics
from controller.objects import Obj
from gpudra.jsoncopy import copy_json
from gpudra.kubeapi import AlreadyExists, ApiError, Conflict, KubeApi, NotFound

log = logging.getLogger("gpudra.controller.writes")

# Conflicts are retried this many times in a row before the pass gives up on the object (the next pass retries).
MAX_CONFLICT_RETRIES = 8

Mutation = Callable[[Obj], Obj | None]


class NotLeader(Exception):
    """This instance lost (or never had) the right to write; the current pass stops."""


class Writer:
    def __init__(
        self,
        api: KubeApi,
        metrics: ControllerMetrics,
        *,
        may_write: Callable[[], bool],
        observe: Callable[[str, Obj], None],
        forget: Callable[[str, Obj], None],
    ) -> None:
        self.api = api
        self._metrics = metrics
        self._may_write = may_write
        self._observe = observe
        self._forget = forget

    def check(self) -> None:
        if not self._may_write():
            raise NotLeader("not the leader: writes are disabled")

    def read(self, kind: str, obj: Mapping[str, Any]) -> Obj | None:
        try:
            fresh = self.api.get(kind, o.name(obj), namespace=o.namespace(obj) or None)
        except NotFound:
            self._forget(kind, dict(obj))
            return None
        self._observe(kind, fresh)
        return fresh

    def create(self, kind: str, body: Obj, *, refused: Callable[[ApiError], None] | None = None) -> Obj | None:
        """The created object, or None (it exists, or the server refused it: `refused` is told why)."""
        self.check()
        try:
            created = self.api.create(kind, body, namespace=o.namespace(body) or None)
        except AlreadyExists:
            return None
        except ApiError as err:
            log.warning("create failed", extra={"kind": kind, "object": o.key(body) or o.meta(body).get("generateName"), "error": str(err)})
            if refused is not None:
                refused(err)
            return None
        self._observe(kind, created)
        return created

    def update(self, kind: str, obj: Mapping[str, Any], mutate: Mutation) -> Obj | None:
        """PUT the object after `mutate`; returns the stored object, or None when nothing was written."""
        return self._update(kind, obj, mutate, status=False)

    def update_status(self, kind: str, obj: Mapping[str, Any], mutate: Mutation) -> Obj | None:
        """PUT the status subresource after `mutate` (metadata and spec changes are ignored by the server)."""
        return self._update(kind, obj, mutate, status=True)

    def _update(self, kind: str, obj: Mapping[str, Any], mutate: Mutation, *, status: bool) -> Obj | None:
        current: Obj | None = _deep_copy(obj)
        for _ in range(MAX_CONFLICT_RETRIES):
            if current is None:
                return None
            desired = mutate(current)
            if desired is None:
                return None
            self.check()
            try:
                if status:
                    stored = self.api.replace_status(kind, desired)
                else:
                    stored = self.api.replace(kind, desired)
            except Conflict:
                self._metrics.conflicts.inc()
                log.info("write conflict, re-reading", extra={"kind": kind, "object": o.key(obj)})
                current = self.read(kind, obj)
                current = _deep_copy(current) if current is not None else None
                continue
            except NotFound:
                self._forget(kind, dict(obj))
                return None
            except ApiError as err:
                log.warning("update failed", extra={"kind": kind, "object": o.key(obj), "status": status, "error": str(err)})
                return None
            self._observe(kind, stored)
            return stored
        log.warning("update gave up after repeated conflicts", extra={"kind": kind, "object": o.key(obj)})
        return None

    def patch_status(self, kind: str, obj: Mapping[str, Any], patch: Obj) -> Obj | None:
        """A merge patch of the status subresource (no resourceVersion: the patch says exactly what to set)."""
        self.check()
        try:
            stored = self.api.patch(kind, o.name(obj), patch, namespace=o.namespace(obj) or None, subresource="status")
        except NotFound:
            self._forget(kind, dict(obj))
            return None
        except ApiError as err:
            log.warning("status patch failed", extra={"kind": kind, "object": o.key(obj), "error": str(err)})
            return None
        self._observe(kind, stored)
        return stored

    def patch(self, kind: str, obj: Mapping[str, Any], patch: Obj) -> Obj | None:
        self.check()
        try:
            stored = self.api.patch(kind, o.name(obj), patch, namespace=o.namespace(obj) or None)
        except NotFound:
            self._forget(kind, dict(obj))
            return None
        except ApiError as err:
            log.warning("patch failed", extra={"kind": kind, "object": o.key(obj), "error": str(err)})
            return None
        self._observe(kind, stored)
        return stored

    def delete(self, kind: str, obj: Mapping[str, Any]) -> None:
        """Delete (only the object of this UID); a missing object is not an error."""
        self.check()
        try:
            self.api.delete(kind, o.name(obj), namespace=o.namespace(obj) or None, uid=o.uid(obj) or None)
        except Conflict:
            return  # a newer object of the same name: not the one we meant
        # With finalizers the object lingers with a deletionTimestamp; the watch brings that version.
        fresh = self.read(kind, obj)
        if fresh is None:
            self._forget(kind, dict(obj))


def _deep_copy(obj: Mapping[str, Any] | None) -> Obj | None:
    return None if obj is None else copy_json(dict(obj))


def bind_pod(writer: Writer, pod: Mapping[str, Any], node: str, *, refresh: bool = True) -> bool:
    """POST pods/binding; False when the pod is gone or already bound (the next pass sees why). With `refresh`
    the bound pod is read back into the cache; a caller that remembers the binding itself (the scheduler's
    assumed pods) saves that round trip and lets the watch bring it."""
    writer.check()
    try:
        writer.api.bind_pod(o.namespace(pod) or "default", o.name(pod), node, uid=o.uid(pod) or None)
    except (NotFound, Conflict) as err:
        log.info("bind refused", extra={"pod": o.key(pod), "node": node, "error": str(err)})
        return False
    except ApiError as err:
        log.warning("bind failed", extra={"pod": o.key(pod), "node": node, "error": str(err)})
        return False
    if refresh:
        writer.read("Pod", pod)
    return True
