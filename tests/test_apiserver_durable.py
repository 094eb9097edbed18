"""The embedded control plane's SQLite store: acknowledged writes survive kill -9, nothing is handed out twice."""

from __future__ import annotations

import http.client
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from controlplane import EmbeddedApiServer

ROOT = Path(__file__).resolve().parent.parent
LEASES = "/apis/coordination.k8s.io/v1/namespaces/default/leases"


def _start(state: Path) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "apiserver", "--state", str(state),
                             "--unauthenticated-as-admin"],  # durability, not authentication, is tested here
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:"), proc.stderr.read() if proc.stderr else ""
    return proc, url


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _conn(url: str) -> http.client.HTTPConnection:
    u = urlsplit(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=30)


def _call(conn: http.client.HTTPConnection, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    conn.request(method, path, body=json.dumps(body).encode() if body is not None else None,
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    raw = resp.read()
    return resp.status, json.loads(raw) if raw else None


def _lease(name: str, holder: str) -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name},
            "spec": {"holderIdentity": holder}}


@pytest.mark.process
def test_kill_9_under_concurrent_writers_loses_no_acknowledged_write(tmp_path: Path) -> None:
    state = tmp_path / "state.db"
    proc, url = _start(state)
    acked: dict[str, dict[str, Any]] = {}  # name -> metadata of the last acknowledged write
    seen_uids: set[str] = set()
    seen_rvs: set[int] = set()
    seen_by_readers: dict[str, str] = {}  # name -> uid, from lists
    lock = threading.Lock()
    stop = threading.Event()

    def writer(w: int) -> None:
        conn = _conn(url)
        i = 0
        try:
            while not stop.is_set():
                name = f"w{w}-{i}"
                code, obj = _call(conn, "POST", LEASES, _lease(name, "a"))
                if code == 201:
                    with lock:
                        acked[name] = obj["metadata"]
                if i % 3 == 0 and code == 201:
                    body = _lease(name, "b")
                    body["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
                    code, obj = _call(conn, "PUT", f"{LEASES}/{name}", body)
                    if code == 200:
                        with lock:
                            acked[name] = obj["metadata"]
                i += 1
        except (OSError, http.client.HTTPException):
            return  # the server was killed mid-request: that write was not acknowledged

    def reader() -> None:
        conn = _conn(url)
        try:
            while not stop.is_set():
                code, listed = _call(conn, "GET", LEASES)
                if code == 200:
                    with lock:
                        for item in listed["items"]:
                            seen_by_readers[item["metadata"]["name"]] = item["metadata"]["uid"]
                            seen_uids.add(item["metadata"]["uid"])
                            seen_rvs.add(int(item["metadata"]["resourceVersion"]))
        except (OSError, http.client.HTTPException):
            return

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)] + [threading.Thread(target=reader)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with lock:
                if len(acked) >= 150:
                    break
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)  # while the writers are still writing
        proc.wait(timeout=30)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
        _stop(proc)
    assert len(acked) >= 150
    for meta in acked.values():
        seen_uids.add(meta["uid"])
        seen_rvs.add(int(meta["resourceVersion"]))

    proc, url = _start(state)
    try:
        conn = _conn(url)
        code, listed = _call(conn, "GET", LEASES)
        assert code == 200
        stored = {item["metadata"]["name"]: item["metadata"] for item in listed["items"]}
        lost = [name for name in acked if name not in stored]
        assert not lost, f"{len(lost)} acknowledged objects lost, e.g. {lost[:5]}"
        # Nothing a reader was shown is gone either: readers are answered only with committed changes.
        phantoms = [name for name, uid in seen_by_readers.items() if stored.get(name, {}).get("uid") != uid]
        assert not phantoms, f"{len(phantoms)} objects seen by a reader are gone, e.g. {phantoms[:5]}"
        for name, meta in acked.items():
            # The stored object is the acknowledged write or a later one that raced with the kill.
            assert stored[name]["uid"] == meta["uid"]
            assert int(stored[name]["resourceVersion"]) >= int(meta["resourceVersion"])
        # A watch resumed from a resourceVersion that was only seen on an uncommitted change is 410 (relist);
        # one from the last acknowledged write continues.
        newest = max(int(meta["resourceVersion"]) for meta in acked.values())
        watch = _conn(url)
        watch.request("GET", f"{LEASES}?watch=true&resourceVersion={newest}&timeoutSeconds=1")
        resp = watch.getresponse()
        assert resp.status == 200 and b'"ERROR"' not in resp.read()
        watch.close()
        watch = _conn(url)
        watch.request("GET", f"{LEASES}?watch=true&resourceVersion={int(listed['metadata']['resourceVersion']) - 1}"
                             "&timeoutSeconds=1")
        resp = watch.getresponse()
        body = resp.read()
        assert resp.status == 410 or b'"code":410' in body
        watch.close()
        # New writes never reuse a UID or a resourceVersion that any client saw before the kill.
        for i in range(40):
            code, obj = _call(conn, "POST", LEASES, _lease(f"after-{i}", "c"))
            assert code == 201
            assert obj["metadata"]["uid"] not in seen_uids
            assert int(obj["metadata"]["resourceVersion"]) > max(seen_rvs)
            assert len(obj["metadata"]["uid"]) == 36 and obj["metadata"]["uid"][14] == "4"  # RFC 4122 version 4
        conn.close()
    finally:
        _stop(proc)


def test_watch_history_survives_restart_and_older_is_gone(tmp_path: Path) -> None:
    state = tmp_path / "state.db"
    with EmbeddedApiServer(state_file=state, history_limit=5) as first:
        conn = _conn(first.url)
        rvs = []
        for i in range(4):
            code, obj = _call(conn, "POST", LEASES, _lease(f"l{i}", "a"))
            assert code == 201
            rvs.append(obj["metadata"]["resourceVersion"])
        conn.close()
    with EmbeddedApiServer(state_file=state, history_limit=5) as second:
        conn = _conn(second.url)
        conn.request("GET", f"{LEASES}?watch=true&resourceVersion={rvs[1]}&timeoutSeconds=1")
        resp = conn.getresponse()
        assert resp.status == 200
        events = [json.loads(line) for line in resp.read().splitlines() if line.strip()]
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "l2"), ("ADDED", "l3")]
        conn.close()
        # Many writes compact the history: a resume from before what is kept is 410 Gone.
        conn = _conn(second.url)
        for i in range(20):
            assert _call(conn, "PUT", f"{LEASES}/l0", _lease("l0", f"h{i}"))[0] == 200
        conn.close()
    with EmbeddedApiServer(state_file=state, history_limit=5) as third:
        conn = _conn(third.url)
        conn.request("GET", f"{LEASES}?watch=true&resourceVersion={rvs[1]}&timeoutSeconds=1")
        resp = conn.getresponse()
        body = resp.read()
        if resp.status == 200:  # Kubernetes sends 410 as an ERROR event once the watch has started
            event = json.loads(body.splitlines()[0])
            assert event["type"] == "ERROR" and event["object"]["code"] == 410
        else:
            assert resp.status == 410
        conn.close()


def test_old_json_state_file_is_migrated_once(tmp_path: Path) -> None:
    state = tmp_path / "state"
    old = {"resourceVersion": 12, "uidPrefix": "abc", "uidCounter": 3, "objects": [
        {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
         "metadata": {"name": "old", "namespace": "default", "uid": "11111111-2222-4333-8444-555555555555",
                      "resourceVersion": "12", "creationTimestamp": "2025-01-01T00:00:00Z"},
         "spec": {"holderIdentity": "x"}}]}
    state.write_text(json.dumps(old))
    with EmbeddedApiServer(state_file=state) as srv:
        conn = _conn(srv.url)
        code, obj = _call(conn, "GET", f"{LEASES}/old")
        assert code == 200 and obj["metadata"]["uid"] == "11111111-2222-4333-8444-555555555555"
        code, new = _call(conn, "POST", LEASES, _lease("new", "y"))
        assert code == 201 and int(new["metadata"]["resourceVersion"]) > 12
        conn.close()
    backup = tmp_path / "state.json-backup"
    assert json.loads(backup.read_text()) == old
    assert state.read_bytes().startswith(b"SQLite format 3\x00")
    with sqlite3.connect(state) as db:
        assert {"old", "new"} <= {n for (n,) in db.execute("SELECT name FROM objects WHERE kind='Lease'")}
    # A second old file next to an existing backup is refused with what to do, not overwritten.
    other = tmp_path / "state"
    other.unlink()
    other.write_text(json.dumps(old))
    with pytest.raises(ValueError) as err:
        EmbeddedApiServer(state_file=other).start()
    assert "already exists; move one of them away" in str(err.value)


def test_second_server_on_the_same_database_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state.db"
    with EmbeddedApiServer(state_file=state):
        with pytest.raises(ValueError) as err:
            EmbeddedApiServer(state_file=state).start()
        assert "in use by another process" in str(err.value)


def test_writers_waiting_on_a_commit_share_the_next_one(tmp_path: Path) -> None:
    """Group commit: changes submitted while a commit is in progress go to disk together in the next one."""
    from controlplane.backend import Change, HistoryLimits
    from controlplane.persistence import SqliteLog

    log = SqliteLog(tmp_path / "state.db", HistoryLimits(events=100))
    state = log.open()
    first_commit_started = threading.Event()
    release = threading.Event()
    real_write = log._write_batch

    def slow_first(batch: list[Change]) -> None:
        if not first_commit_started.is_set():
            first_commit_started.set()
            assert release.wait(30)
        real_write(batch)

    log._write_batch = slow_first  # type: ignore[method-assign]
    rv = state.rv

    def change(n: int) -> Change:
        body = json.dumps({"kind": "Lease", "metadata": {"name": f"l{n}"}}).encode()
        return Change(rv + n, "Lease", "default", f"l{n}", body, "ADDED", body, None)

    log.submit(change(1))
    assert first_commit_started.wait(30)
    for n in range(2, 11):
        log.submit(change(n))
    release.set()
    log.wait_durable(rv + 10)
    assert log.stats() == {"commits": 2, "writes": 10}
    log.close()
    with sqlite3.connect(tmp_path / "state.db") as db:
        assert db.execute("SELECT COUNT(*) FROM objects").fetchone()[0] == 10
