"""Watch events sent by the writing threads (Store.push_to): in order, once, past slow clients, to the end."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import pytest

from controlplane import EmbeddedApiServer
from gpudra.kubeapi import KubeApi

LEASES = "/apis/coordination.k8s.io/v1/namespaces/default/leases"


class RawWatch:
    """A watch read by hand from a socket, so that the test decides when (and whether) it is read."""

    def __init__(self, srv: EmbeddedApiServer, query: str = "", rcvbuf: int | None = None) -> None:
        u = urlsplit(srv.url)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(60)
        self.sock.connect((u.hostname, u.port))
        self.sock.sendall(b"GET " + LEASES.encode() + b"?watch=true" + query.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        self.buf = b""
        head = self._until(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        self.ended = False

    def _until(self, sep: bytes) -> bytes:
        while sep not in self.buf:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise EOFError(f"the stream ended before {sep!r}")
            self.buf += chunk
        out, _, self.buf = self.buf.partition(sep)
        return out

    def _exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise EOFError("the stream ended inside a chunk")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def events(self, count: int) -> list[dict[str, Any]]:
        """The next `count` events (a chunk may hold several)."""
        out: list[dict[str, Any]] = []
        while len(out) < count:
            size = int(self._until(b"\r\n"), 16)
            if size == 0:
                self.ended = True
                break
            data = self._exactly(size)
            assert self._exactly(2) == b"\r\n"
            out += [json.loads(line) for line in data.splitlines() if line]
        return out

    def close(self) -> None:
        self.sock.close()


def _lease(name: str, filler: int = 0) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if filler:
        meta["annotations"] = {"filler": "x" * filler}
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": {"holderIdentity": "a"}}


def test_concurrent_writers_reach_every_watch_in_order_once(server: EmbeddedApiServer) -> None:
    watches = [RawWatch(server) for _ in range(3)]
    apis = [KubeApi.connect(url=server.url) for _ in range(4)]
    try:
        def write(api: KubeApi, w: int) -> None:
            for i in range(25):
                api.create("Lease", _lease(f"w{w}-{i}"), "default")

        threads = [threading.Thread(target=write, args=(api, w)) for w, api in enumerate(apis)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for watch in watches:
            got = watch.events(100)
            rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in got]
            assert [e["type"] for e in got] == ["ADDED"] * 100
            assert rvs == sorted(rvs) and len(set(rvs)) == 100
            assert {e["object"]["metadata"]["name"] for e in got} == {f"w{w}-{i}" for w in range(4) for i in range(25)}
    finally:
        for api in apis:
            api.close()
        for watch in watches:
            watch.close()


@pytest.mark.slow
def test_a_client_that_does_not_read_holds_up_no_writer_and_misses_nothing(server: EmbeddedApiServer) -> None:
    slow = RawWatch(server, rcvbuf=4096)
    fast = RawWatch(server)
    api = KubeApi.connect(url=server.url)
    count, filler = 120, 100_000  # ~12 MB of events: far more than the socket buffers hold
    try:
        started = time.monotonic()
        for i in range(count):
            api.create("Lease", _lease(f"l{i:03d}", filler), "default")
        # Every write was answered although one watcher has read nothing (a writer never waits for it): that
        # watch's own thread holds what did not fit.
        assert time.monotonic() - started < 120
        lease_rt = server.registry.by_kind("Lease")
        assert lease_rt is not None
        assert any(w.stalled or w.delivery.locked() for w in server.store._pushed[lease_rt])
        assert [e["object"]["metadata"]["name"] for e in fast.events(count)] == [f"l{i:03d}" for i in range(count)]
        api.delete("Lease", "l000", "default")
        got = slow.events(count + 1)
        assert [e["object"]["metadata"]["name"] for e in got] == [f"l{i:03d}" for i in range(count)] + ["l000"]
        assert [e["type"] for e in got] == ["ADDED"] * count + ["DELETED"]
        assert fast.events(1)[0]["type"] == "DELETED"
    finally:
        api.close()
        slow.close()
        fast.close()


@pytest.mark.slow
def test_pushed_watch_ends_at_its_timeout_and_on_shutdown() -> None:
    srv = EmbeddedApiServer()
    srv.start()
    try:
        timed = RawWatch(srv, "&timeoutSeconds=1")
        assert timed.events(1) == [] and timed.ended  # the terminating chunk, after about a second
        open_watch = RawWatch(srv)
        api = KubeApi.connect(url=srv.url)
        api.create("Lease", _lease("before-stop"), "default")
        assert open_watch.events(1)[0]["object"]["metadata"]["name"] == "before-stop"
        api.close()
    finally:
        srv.stop()
    # The server stopped: the stream ends (the final chunk, or the connection closed).
    try:
        rest = open_watch.events(1)
        assert rest == [] and open_watch.ended
    except (EOFError, OSError):
        pass
    finally:
        timed.close()
        open_watch.close()


def test_bookmarks_still_come_when_idle() -> None:
    srv = EmbeddedApiServer(bookmark_interval=0.5)
    srv.start()
    try:
        watch = RawWatch(srv, "&allowWatchBookmarks=true")
        got = watch.events(1)
        assert got[0]["type"] == "BOOKMARK" and got[0]["object"]["metadata"]["resourceVersion"]
        watch.close()
    finally:
        srv.stop()
