"""The embedded control plane under the failures of a long-running server: a watch history bounded by bytes and
age (410 Gone past it), health that reports a store that cannot write, int64 resourceVersions, a versioned
schema, clear start-up errors for a bad --state, and validators that never crash on odd opaque parameters."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from controlplane import EmbeddedApiServer
from controlplane.backend import MAX_RESOURCE_VERSION, Change, HistoryLimits, StorageError
from controlplane.persistence import SqliteLog, StateFileError
from controlplane.store import Filter
from controller.validationhooks import validation_admission
from gpudra.kubeapi import ApiError, KubeApi

ROOT = Path(__file__).resolve().parent.parent


def _lease(name: str, payload: str = "") -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {
        "name": name, "annotations": {"payload": payload}}, "spec": {"holderIdentity": "x"}}


def _big_updates(server: EmbeddedApiServer, count: int, size: int) -> list[int]:
    api = KubeApi.connect(url=server.url)
    try:
        rvs = [int(api.create("Lease", _lease("big", "a" * size), "default")["metadata"]["resourceVersion"])]
        for i in range(count):
            patch = {"metadata": {"annotations": {"payload": str(i % 10) * size}}}
            rvs.append(int(api.patch("Lease", "big", patch, "default")["metadata"]["resourceVersion"]))
        return rvs
    finally:
        api.close()


def _watch_status(server: EmbeddedApiServer, rv: int) -> dict[str, Any]:
    url = (f"{server.url}/apis/coordination.k8s.io/v1/namespaces/default/leases?watch=1&resourceVersion={rv}"
           "&timeoutSeconds=1")
    try:
        with urllib.request.urlopen(url) as resp:
            first = resp.readline()
    except urllib.error.HTTPError as err:
        return {"code": err.code, **json.loads(err.read())}
    event = json.loads(first) if first else {}
    return {"code": 200, "event": event}


def test_history_is_bounded_by_bytes_and_an_old_watch_gets_410() -> None:
    with EmbeddedApiServer(history_bytes=1 << 20) as server:
        rvs = _big_updates(server, 60, 100_000)  # 60 versions of a 100 kB object: 12 MB of events, 1 MiB kept
        store = server.store
        kept = store._history_bytes
        assert kept <= 2 << 20, kept
        # The history's columns stay aligned, and the floor is exactly below what is kept.
        assert len(store._history) == len(store._history_rvs) == len(store._history_sizes) > 1
        assert sum(store._history_sizes) == kept
        assert [e.rv for e in store._history] == store._history_rvs
        assert store._floor < store._history_rvs[0] and store._history_rvs[-1] == rvs[-1]
        gone = _watch_status(server, rvs[1])
        if gone["code"] == 200:
            assert gone["event"]["type"] == "ERROR" and gone["event"]["object"]["code"] == 410
            message = gone["event"]["object"]["message"]
        else:
            assert gone["code"] == 410
            message = gone["message"]
        assert "too old resource version" in message
        recent = _watch_status(server, rvs[-2])
        assert recent["code"] == 200 and recent["event"]["type"] == "MODIFIED"


def test_history_is_bounded_by_age() -> None:
    with EmbeddedApiServer(history_age_s=0.5) as server:
        rvs = _big_updates(server, 3, 10)
        time.sleep(1.1)
        api = KubeApi.connect(url=server.url)
        try:
            api.patch("Lease", "big", {"metadata": {"labels": {"x": "y"}}}, "default")  # a write compacts by age
        finally:
            api.close()
        with pytest.raises(Exception, match="too old resource version"):
            server.store.watch(Filter(server.registry.by_kind("Lease"), "default"), rvs[0], False)  # type: ignore[arg-type]


def test_a_restart_reads_only_the_history_within_the_limits(tmp_path: Path) -> None:
    state = tmp_path / "state.db"
    with EmbeddedApiServer(state_file=state, history_bytes=1 << 20) as server:
        _big_updates(server, 40, 100_000)
    conn = sqlite3.connect(state)
    on_disk = conn.execute("SELECT COALESCE(SUM(length(data) + COALESCE(length(old), 0)), 0) FROM events").fetchone()[0]
    conn.close()
    assert on_disk <= 2 << 20
    log = SqliteLog(state, HistoryLimits(bytes=1 << 20))
    loaded = log.open()
    try:
        assert sum(e[5] for e in loaded.events) <= 1 << 20
        assert loaded.floor > 0 and all(e[0] > loaded.floor for e in loaded.events)
    finally:
        log.close()


def test_health_reports_a_store_that_can_no_longer_write(tmp_path: Path) -> None:
    with EmbeddedApiServer(state_file=tmp_path / "state.db") as server:
        for endpoint in ("healthz", "livez", "readyz"):
            with urllib.request.urlopen(f"{server.url}/{endpoint}") as resp:
                assert (resp.status, resp.read()) == (200, b"ok")
        log = server.store._log
        assert log is not None

        def full_disk(batch: list[Change]) -> None:
            raise OSError(28, "No space left on device")

        log._write_batch = full_disk  # type: ignore[method-assign]
        url = f"{server.url}/apis/coordination.k8s.io/v1/namespaces/default/leases"
        codes = []
        for name in ("a", "b"):
            req = urllib.request.Request(url, data=json.dumps(_lease(name)).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(req)
            codes.append(err.value.code)
        assert codes == [500, 503]
        for endpoint in ("healthz", "livez", "readyz"):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(f"{server.url}/{endpoint}?verbose")
            body = err.value.read().decode()
            assert err.value.code == 500
            assert "[-]etcd failed" in body and "[+]ping ok" in body and f"{endpoint} check failed" in body


def test_resource_versions_stay_within_int64(tmp_path: Path) -> None:
    with EmbeddedApiServer() as server:
        server.store._rv = MAX_RESOURCE_VERSION - 1
        api = KubeApi.connect(url=server.url)
        try:
            assert api.create("Lease", _lease("last"), "default")["metadata"]["resourceVersion"] == str(MAX_RESOURCE_VERSION)
            with pytest.raises(ApiError) as err:
                api.create("Lease", _lease("past"), "default")
            assert err.value.status == 500 and "int64" in str(err.value)
            assert api.get("Lease", "last", "default")["metadata"]["name"] == "last"  # reads still served
        finally:
            api.close()
    # A change past int64 that reaches the committer fails the store cleanly instead of killing its thread.
    log = SqliteLog(tmp_path / "state.db", HistoryLimits())
    log.open()
    try:
        log.submit(Change(MAX_RESOURCE_VERSION + 10, "Lease", "default", "x", b"{}", "ADDED", b"{}", None))
        with pytest.raises(StorageError):
            log.wait_durable(MAX_RESOURCE_VERSION + 10)
        assert log.failure() is not None
    finally:
        log.close()
    # A database whose counter is past int64 is refused at start with the reason.
    conn = sqlite3.connect(tmp_path / "state.db")
    conn.execute("UPDATE meta SET value=? WHERE key='rv'", (str(MAX_RESOURCE_VERSION - 5),))
    conn.commit()
    conn.close()
    with pytest.raises(StateFileError, match="int64"):
        SqliteLog(tmp_path / "state.db", HistoryLimits()).open()


def _db(tmp_path: Path) -> Path:
    path = tmp_path / "state.db"
    with EmbeddedApiServer(state_file=path):
        pass
    return path


def test_the_schema_is_checked_at_start(tmp_path: Path) -> None:
    path = _db(tmp_path)
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE objects")
    conn.commit()
    conn.close()
    with pytest.raises(StateFileError, match="missing table objects"):
        EmbeddedApiServer(state_file=path).start()
    other = _db(tmp_path / "v9")
    conn = sqlite3.connect(other)
    conn.execute("UPDATE meta SET value='9' WHERE key='schema'")
    conn.commit()
    conn.close()
    with pytest.raises(StateFileError, match="schema version '9' is not supported"):
        EmbeddedApiServer(state_file=other).start()


def test_a_version_1_database_is_upgraded(tmp_path: Path) -> None:
    path = _db(tmp_path)
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE event_times")
    conn.execute("UPDATE meta SET value='1' WHERE key='schema'")
    conn.commit()
    conn.close()
    with EmbeddedApiServer(state_file=path) as server:
        assert server.store.get(server.registry.by_kind("Namespace"), "", "default")  # type: ignore[arg-type]
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()[0] == "2"
    conn.close()


@pytest.mark.process
@pytest.mark.parametrize("where", ["/proc/1/no-such-dir/state.db", "/sys/state.db", "DIR"])
def test_a_bad_state_path_is_one_clear_line(tmp_path: Path, where: str) -> None:
    path = str(tmp_path) if where == "DIR" else where
    done = subprocess.run([sys.executable, "-m", "cli.main", "apiserver", "--state", path], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr and path in lines[0], done.stderr


@pytest.mark.parametrize("kind", [5, ["GpuConfig"], {"a": 1}, None])
def test_odd_opaque_kinds_are_field_errors_not_crashes(kind: Any) -> None:
    with EmbeddedApiServer(admission=validation_admission()) as server:
        api = KubeApi.connect(url=server.url)
        params: dict[str, Any] = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": kind}
        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
                 "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
                                      "config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": params}}]}}}
        try:
            with pytest.raises(ApiError) as err:
                api.create("ResourceClaim", claim, "default")
        finally:
            api.close()
        assert err.value.status == 422, str(err.value)
        assert "Internal error" not in str(err.value) and "kind" in str(err.value)


def test_the_store_is_readable_by_its_user_only(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with EmbeddedApiServer(state_file=path) as server:
        KubeApi.connect(url=server.url).create("Secret", {"metadata": {"name": "s"}, "data": {"k": "dg=="}}, "default")
        files = [p for p in tmp_path.iterdir() if p.name.startswith("state.db")]
        assert {p.name for p in files} >= {"state.db", "state.db-wal"}
        assert {p.name: p.stat().st_mode & 0o777 for p in files} == {p.name: 0o600 for p in files}
    path.chmod(0o644)  # one an earlier version left readable is made private when opened
    with EmbeddedApiServer(state_file=path):
        assert path.stat().st_mode & 0o777 == 0o600
