"""The narrow interface between the store and its durable backend (as k3s' kine puts SQLite behind one): the
store hands every change over in resourceVersion order and waits for it to be durable; the backend loads the
state once at open. `persistence.SqliteLog` is the one implementation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

MAX_RESOURCE_VERSION = 2**63 - 1  # resourceVersions are int64 in Kubernetes (and in SQLite's INTEGER)


class StorageError(RuntimeError):
    """A commit failed (disk full, I/O error): the change is not durable and the store accepts no more writes."""


@dataclass
class Change:
    """One committed-in-order change: the object's new state (None when deleted) and its event."""

    rv: int
    kind: str
    namespace: str
    name: str
    obj_json: bytes | None  # the object's new stored JSON, None for a deletion
    event_type: str
    event_json: bytes  # the event's object JSON
    old_json: bytes | None


@dataclass
class LoadedState:
    rv: int  # where the resourceVersion continues (past anything handed out before the last stop)
    floor: int
    committed_rv: int = 0  # the newest committed change
    objects: list[tuple[dict[str, Any], bytes]] = field(default_factory=list)  # (object, its stored JSON)
    # (rv, kind, type, object, old, encoded size) oldest first
    events: list[tuple[int, str, str, dict[str, Any], dict[str, Any] | None, int]] = field(default_factory=list)
    migrated_from: Path | None = None


@dataclass(frozen=True)
class HistoryLimits:
    """How much watch history is kept (in memory and on disk): at most `events` events, `bytes` bytes of their
    encoded objects, none older than `age_s` seconds, as etcd keeps revisions until compaction (kube-apiserver
    compacts every 5 minutes). A watch from before what is kept gets 410 Gone."""

    events: int = 20000
    bytes: int = 32 * 1024 * 1024
    age_s: float = 300.0


class Backend(Protocol):
    def open(self) -> LoadedState:
        """Read what is stored (objects, and the history within the limits) and start accepting changes."""
        ...

    def submit(self, change: Change) -> None:
        """Queue one change (in resourceVersion order); StorageError once the backend cannot write."""
        ...

    def check_writable(self) -> None:
        """StorageError when the backend can no longer write (so a write is refused before it is made)."""
        ...

    def failure(self) -> str | None:
        """Why the backend can no longer write, or None while it can (health checks report it)."""
        ...

    def wait_durable(self, rv: int) -> None:
        """Block until the change with resourceVersion `rv` and all before it are durable."""
        ...

    def stats(self) -> dict[str, int]: ...

    def close(self, timeout: float = 10.0) -> None: ...
