"""The embedded API server's durable state: an SQLite database (WAL), written by one group-committing thread.

Like k3s' embedded datastore, every acknowledged write is in the database: the store hands each change to
`SqliteLog.submit` while it holds its lock (so changes reach the log in resourceVersion order), then the
request thread waits in `wait_durable` until a commit that includes its change has been fsync'd. One
committer thread takes everything submitted so far into one transaction, so concurrent writers share an
fsync (group commit).

Tables: `objects` (the current state), `events` (the watch history kept for resume, trimmed to the store's
history limit; resuming from older is 410 as before) and `meta` (resourceVersion, history floor).

On open, the resourceVersion continues `MAX_IN_FLIGHT` past the last committed one: changes submitted but
not yet committed when the process died were visible to readers (GET, list) with their resourceVersions, so
those numbers are never handed out again.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from controlplane.backend import MAX_RESOURCE_VERSION, Change, HistoryLimits, LoadedState, StorageError

_log = logging.getLogger("gpu-dra.apiserver")

MAX_IN_FLIGHT = 4096  # changes submitted and not yet committed; writers wait beyond this (back-pressure)
_SQLITE_MAGIC = b"SQLite format 3\x00"
# 2: event_times (when each commit's events were written, so that the history is also cut by age).
_SCHEMA_VERSION = "2"


class StateFileError(ValueError):
    """The state database cannot be used; the message names the file, the problem and what to do."""


def _make_private(path: Path) -> None:
    """The database (every Secret is in it) and its WAL and shared-memory files readable by this user only:
    created 0600 before SQLite opens it (SQLite gives its -wal and -shm files the database's mode), and an
    existing one made so."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            if file.exists():
                os.chmod(file, 0o600)
    except OSError as exc:
        raise StateFileError(f"state database {path}: cannot create it or make it private: {exc.strerror}") from None


def _connect(path: Path) -> sqlite3.Connection:
    try:
        conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=0.5)
    except sqlite3.Error as exc:
        raise StateFileError(f"state database {path}: cannot open it: {exc} (is the directory writable?); pass "
                             "another --state path") from None
    try:
        # EXCLUSIVE: a second apiserver on the same file fails here instead of diverging from the first.
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StateFileError(f"state database {path}: cannot switch to WAL mode (got {mode})")
        # FULL: the WAL is fsync'd at every commit, so a commit that returned survives power loss and kill -9.
        conn.execute("PRAGMA synchronous=FULL")
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables:
            _create_schema(conn)
        else:
            _check_schema(conn, path, tables)
    except StateFileError:
        conn.close()
        raise
    except sqlite3.OperationalError as exc:
        conn.close()
        if "locked" in str(exc):
            raise StateFileError(f"state database {path}: in use by another process (another `gpu-dra apiserver "
                                 "--state` on the same file?); stop it or pass another path") from None
        raise StateFileError(f"state database {path}: {exc}") from None
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise StateFileError(f"state database {path}: not a usable SQLite database ({exc}); move it away or pass "
                             "another --state path") from None
    return conn


def _create_schema(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN")
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("CREATE TABLE objects (kind TEXT NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL, "
                 "rv INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (kind, namespace, name))")
    conn.execute("CREATE TABLE events (rv INTEGER PRIMARY KEY, kind TEXT NOT NULL, type TEXT NOT NULL, "
                 "data BLOB NOT NULL, old BLOB)")
    conn.execute("CREATE TABLE event_times (rv INTEGER PRIMARY KEY, at REAL NOT NULL)")
    conn.execute("INSERT INTO meta VALUES ('schema', ?)", (_SCHEMA_VERSION,))
    conn.execute("COMMIT")


def _check_schema(conn: sqlite3.Connection, path: Path, tables: set[str]) -> None:
    """An existing database must be one of ours, at the schema version this code reads (version 1, which had
    no event_times, is upgraded in place)."""
    missing = sorted({"meta", "objects", "events"} - tables)
    if missing:
        raise StateFileError(f"state database {path}: not a gpu-dra apiserver database (missing table "
                             f"{', '.join(missing)}); move it away or pass another --state path")
    row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
    if row is not None and row[0] == "1":
        conn.execute("BEGIN")
        conn.execute("CREATE TABLE IF NOT EXISTS event_times (rv INTEGER PRIMARY KEY, at REAL NOT NULL)")
        conn.execute("UPDATE meta SET value=? WHERE key='schema'", (_SCHEMA_VERSION,))
        conn.execute("COMMIT")
        return
    if row is None or row[0] != _SCHEMA_VERSION or "event_times" not in tables:
        found = "none" if row is None else repr(row[0])
        raise StateFileError(f"state database {path}: schema version {found} is not supported (this gpu-dra reads "
                             f"version {_SCHEMA_VERSION}); use the gpu-dra that wrote it, or move it away")


def _meta(conn: sqlite3.Connection, key: str, default: int = 0) -> int:
    row = conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
    return int(row[0]) if row else default


def _read_legacy_json(path: Path, raw: bytes) -> dict[str, Any]:
    try:
        state = json.loads(raw)
    except ValueError as exc:
        raise StateFileError(f"state file {path}: neither an SQLite database nor the JSON state file of earlier "
                             f"versions (not valid JSON: {exc}); move it away or pass another --state path") from None
    if not isinstance(state, dict) or not isinstance(state.get("objects", []), list):
        raise StateFileError(f"state file {path}: a JSON file but not an apiserver state file (expected an object "
                             "with an 'objects' list); move it away or pass another --state path")
    return state


def _migrate_legacy(path: Path, raw: bytes) -> Path:
    """Convert an earlier version's JSON state file into a database at `path`; the JSON is kept as a backup."""
    state = _read_legacy_json(path, raw)
    backup = path.with_name(path.name + ".json-backup")
    if backup.exists():
        raise StateFileError(f"state file {path}: is an old JSON state file, and {backup} (where migration keeps "
                             "it) already exists; move one of them away")
    tmp = path.with_name(path.name + ".migrating")
    tmp.unlink(missing_ok=True)
    conn = _connect(tmp)
    try:
        rv = int(state.get("resourceVersion", 0))
        conn.execute("BEGIN")
        for obj in state.get("objects") or []:
            m = obj.get("metadata") if isinstance(obj, dict) else None
            if not isinstance(m, dict) or not m.get("name") or not isinstance(obj.get("kind"), str):
                continue
            conn.execute("INSERT OR REPLACE INTO objects VALUES (?,?,?,?,?)",
                         (obj["kind"], m.get("namespace") or "", m["name"], int(m.get("resourceVersion") or 0),
                          json.dumps(obj, separators=(",", ":")).encode()))
        conn.execute("INSERT OR REPLACE INTO meta VALUES ('rv', ?)", (str(rv),))
        conn.execute("INSERT OR REPLACE INTO meta VALUES ('floor', ?)", (str(rv),))
        conn.execute("COMMIT")
    finally:
        conn.close()
    for suffix in ("-wal", "-shm"):
        Path(str(tmp) + suffix).unlink(missing_ok=True)
    os.link(path, backup)
    os.replace(tmp, path)
    return backup


class SqliteLog:
    """The durable half of the store: loads the state once, then commits submitted changes in groups."""

    def __init__(self, path: str | Path, history: HistoryLimits,
                 on_durable: Callable[[int, list[Change]], None] | None = None) -> None:
        self.path = Path(path)
        self._history = history
        self._on_durable = on_durable
        self._mu = threading.Condition()
        self._pending: list[Change] = []
        self._submitted = 0
        self._durable = 0
        self._failed: str | None = None
        self._closing = False
        self._commits = 0
        self._writes = 0
        self._event_count = 0
        self._event_bytes = 0
        self._conn: sqlite3.Connection | None = None
        self._thread: threading.Thread | None = None

    # ----- opening -------------------------------------------------------------------------------------------

    def open(self) -> LoadedState:
        """Open (creating, or migrating an old JSON state file) and read the objects and the newest history within
        the limits; starts the committer."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StateFileError(f"state database {self.path}: cannot create its directory {self.path.parent}: "
                                 f"{exc.strerror}") from None
        if self.path.is_dir():
            raise StateFileError(f"state database {self.path}: is a directory; pass a file path (e.g. "
                                 f"{self.path / 'state.db'})")
        migrated: Path | None = None
        try:
            with open(self.path, "rb") as f:
                head = f.read(len(_SQLITE_MAGIC))
        except FileNotFoundError:
            head = None
        except OSError as exc:
            raise StateFileError(f"state database {self.path}: cannot read: {exc.strerror}") from None
        if head is not None and head != _SQLITE_MAGIC and head:
            migrated = _migrate_legacy(self.path, self.path.read_bytes())
        _make_private(self.path)
        conn = _connect(self.path)
        self._conn = conn
        try:
            stored_rv = max(_meta(conn, "rv"), conn.execute("SELECT COALESCE(MAX(rv), 0) FROM events").fetchone()[0])
            if stored_rv + MAX_IN_FLIGHT > MAX_RESOURCE_VERSION:
                raise StateFileError(f"state database {self.path}: its resourceVersion {stored_rv} is beyond what "
                                     f"Kubernetes' int64 resourceVersions allow ({MAX_RESOURCE_VERSION}); the "
                                     "database cannot be written to any more: move it away")
            floor = _meta(conn, "floor")
            state = LoadedState(rv=stored_rv, floor=floor, committed_rv=stored_rv, migrated_from=migrated)
            for (data,) in conn.execute("SELECT data FROM objects ORDER BY kind, namespace, name"):
                state.objects.append((json.loads(data), bytes(data)))
            state.floor, state.events = self._read_history(conn, floor)
            self._event_count = len(state.events)
            # Skip past anything that was handed out but not committed before the last stop (see module doc).
            state.rv = stored_rv + MAX_IN_FLIGHT
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('rv', ?)", (str(state.rv),))
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StateFileError(f"state database {self.path}: cannot read: {exc}; move it away or pass another "
                                 "--state path") from None
        self._submitted = self._durable = state.rv
        self._thread = threading.Thread(target=self._commit_loop, name="apiserver-commit", daemon=True)
        self._thread.start()
        return state

    def _read_history(self, conn: sqlite3.Connection,
                      floor: int) -> tuple[int, list[tuple[int, str, str, dict[str, Any], dict[str, Any] | None, int]]]:
        """The newest events within the history limits (newest first, so that a large history is not all read),
        and the floor below which a watch is 410."""
        limits = self._history
        oldest = time.time() - limits.age_s
        events: list[tuple[int, str, str, dict[str, Any], dict[str, Any] | None, int]] = []
        total = 0
        for rv, kind, etype, data, old, at in conn.execute(
                "SELECT e.rv, e.kind, e.type, e.data, e.old, COALESCE(t.at, 0) FROM events e "
                "LEFT JOIN event_times t ON t.rv = e.rv WHERE e.rv > ? ORDER BY e.rv DESC", (floor,)):
            size = len(data) + (len(old) if old else 0)
            if len(events) >= limits.events or total + size > limits.bytes or (at and at < oldest):
                floor = rv
                break
            total += size
            events.append((rv, kind, etype, json.loads(data), json.loads(old) if old else None, size))
        events.reverse()
        self._event_bytes = total
        return floor, events

    # ----- writing -------------------------------------------------------------------------------------------

    def submit(self, change: Change) -> None:
        """Queue one change; called in resourceVersion order (under the store's lock)."""
        with self._mu:
            if self._failed is not None:
                raise StorageError(self._failed)
            while len(self._pending) >= MAX_IN_FLIGHT and self._failed is None and not self._closing:
                self._mu.wait(1.0)
            self._pending.append(change)
            self._submitted = change.rv
            self._mu.notify_all()

    def check_writable(self) -> None:
        with self._mu:
            if self._failed is not None:
                raise StorageError(self._failed)

    def failure(self) -> str | None:
        with self._mu:
            return self._failed

    def wait_durable(self, rv: int) -> None:
        """Block until the change with resourceVersion `rv` (and all before it) is committed to disk."""
        with self._mu:
            while self._durable < rv:
                if self._failed is not None:
                    raise StorageError(self._failed)
                if self._closing and self._thread is None:
                    raise StorageError("the store was closed before the write was committed")
                self._mu.wait(1.0)

    def _commit_loop(self) -> None:
        while True:
            with self._mu:
                while not self._pending and not self._closing:
                    self._mu.wait()
                if not self._pending:
                    return
                batch, self._pending = self._pending, []
                self._mu.notify_all()
            try:
                self._write_batch(batch)
            except Exception as exc:  # noqa: BLE001 - whatever failed, the thread must record it, never die
                # Clients are told why without the database's path (a host path is the operator's to know,
                # and the server's log names it).
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                _log.error("event=state-commit-failed path=%s error=%r", self.path, str(exc))
                with self._mu:
                    self._failed = (f"the state database cannot be written: commit failed: {reason}; the last writes "
                                    "are not durable and the server accepts no more writes; restart it")
                    self._mu.notify_all()
                return
            newest = batch[-1].rv
            with self._mu:
                self._durable = newest
                self._commits += 1
                self._writes += len(batch)
                self._mu.notify_all()
            if self._on_durable is not None:
                self._on_durable(newest, batch)

    def _write_batch(self, batch: list[Change]) -> None:
        conn = self._conn
        assert conn is not None
        conn.execute("BEGIN")
        try:
            for ch in batch:
                if ch.obj_json is None:
                    conn.execute("DELETE FROM objects WHERE kind=? AND namespace=? AND name=?",
                                 (ch.kind, ch.namespace, ch.name))
                else:
                    conn.execute("INSERT OR REPLACE INTO objects VALUES (?,?,?,?,?)",
                                 (ch.kind, ch.namespace, ch.name, ch.rv, ch.obj_json))
                conn.execute("INSERT OR REPLACE INTO events VALUES (?,?,?,?,?)",
                             (ch.rv, ch.kind, ch.event_type, ch.event_json, ch.old_json))
                self._event_bytes += len(ch.event_json) + len(ch.old_json or b"")
            now = time.time()
            # One timestamp per batch (the first change's rv) is enough to cut the history by age.
            conn.execute("INSERT OR REPLACE INTO event_times VALUES (?, ?)", (batch[0].rv, now))
            self._event_count += len(batch)
            newest = batch[-1].rv
            conn.execute("UPDATE meta SET value=? WHERE key='rv' AND CAST(value AS INTEGER) < ?",
                         (str(newest), newest))
            limits = self._history
            if self._event_count > 2 * limits.events or self._event_bytes > 2 * limits.bytes:
                self._trim(conn)
            elif self._commits % 256 == 0:
                self._trim_age(conn, now - limits.age_s)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _trim(self, conn: sqlite3.Connection) -> None:
        """Drop the oldest events past the limits (amortized: called at twice the limits, trims to them)."""
        kept = total = 0
        cutoff = None
        for rv, size in conn.execute("SELECT rv, length(data) + COALESCE(length(old), 0) FROM events ORDER BY rv DESC"):
            if kept >= self._history.events or total + size > self._history.bytes:
                cutoff = rv
                break
            kept += 1
            total += size
        if cutoff is not None:
            self._drop_through(conn, cutoff)
        self._event_count, self._event_bytes = kept, total

    def _trim_age(self, conn: sqlite3.Connection, oldest: float) -> None:
        row = conn.execute("SELECT MAX(rv) FROM event_times WHERE at < ?", (oldest,)).fetchone()
        if row is not None and row[0] is not None:
            # Events of the batch that started at row[0] may be newer than `oldest`; keep those (rv < row[0]).
            self._drop_through(conn, row[0] - 1)
            self._event_count, self._event_bytes = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(length(data) + COALESCE(length(old), 0)), 0) FROM events").fetchone()

    @staticmethod
    def _drop_through(conn: sqlite3.Connection, rv: int) -> None:
        conn.execute("DELETE FROM events WHERE rv <= ?", (rv,))
        conn.execute("DELETE FROM event_times WHERE rv <= ?", (rv,))
        conn.execute("INSERT OR REPLACE INTO meta VALUES ('floor', ?)", (str(rv),))

    # ----- figures and closing -------------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        with self._mu:
            return {"commits": self._commits, "writes": self._writes}

    def close(self, timeout: float = 10.0) -> None:
        """Commit what is pending, stop the committer and close the database."""
        with self._mu:
            self._closing = True
            self._mu.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        deadline = time.monotonic() + timeout
        with self._mu:
            self._thread = None
            self._mu.notify_all()
        if self._conn is not None and time.monotonic() <= deadline:
            try:
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:
                pass  # the WAL is replayed on the next open; a checkpoint is only tidiness
            self._conn.close()
            self._conn = None
