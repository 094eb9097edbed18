"""Serving a watch (`?watch=true`): initial events, bookmarks, timeouts, Table rows, and the pushed path in which
writers send events to a plain JSON watch themselves (Store.push_to). A watch leaves the worker pool for its own
thread; this holds what that thread does, apart from the request handler."""

from __future__ import annotations

import select
import socket
import time
from typing import Any

from controlplane import status as st
from controlplane.handlers import reads
from controlplane.params import bool_param, int_param
from controlplane.routing import Responder, Route, encode, start_chunked
from controlplane.store import Event, Watcher
from controlplane.tables import to_table, wants_table

_WATCH_POLL_S = 1.0  # how often an idle watch checks for shutdown, its deadline and a vanished client


class WatchStream:
    """One watch, written to the handler's connection."""

    def __init__(self, handler: Responder) -> None:
        self.h = handler
        self.ctx = handler.ctx
        self.wfile = handler.wfile
        self.connection = handler.connection

    def serve(self, r: Route, query: dict[str, str]) -> None:
        flt = reads.selection(r, query)
        rv = int_param(query, "resourceVersion") or None
        send_initial = bool_param(query, "sendInitialEvents")
        initial = rv is None or send_initial
        bookmarks = bool_param(query, "allowWatchBookmarks")
        timeout_s = int_param(query, "timeoutSeconds")
        table = wants_table(self.h.headers.get("Accept"))
        include = reads.include_object(query) if table else ""
        watcher = self.ctx.store.watch(flt, rv, initial)
        self.ctx.store.await_durable(watcher.pos)
        start_chunked(self.h, "application/json", "too many watches are open; retry later")
        started = time.monotonic()
        # Like kube-apiserver, a watch asked for as a Table sends each event's object as a one-row Table, with
        # the column definitions on the first event only.
        first = [True]

        def send(etype: str, obj: dict[str, Any]) -> None:
            if table:
                rv_text = (obj.get("metadata") or {}).get("resourceVersion", "")
                self._chunk(etype, to_table(r.rt, [obj], rv_text, include, r.shown, headers=first[0]))
                first[0] = False
            else:
                line = b'{"type":"%s","object":%b}\n' % (etype.encode(), self.ctx.store.json_of(r.shown(obj)))
                self._chunk_line(line)

        # Plain JSON in the storage version (every agent's watch) sends each event's shared encoding.
        shared = not table and not r.converts

        for etype, obj in watcher.initial_events():
            send(etype, obj)
        if send_initial and bookmarks:
            self._bookmark(r, watcher.pos, initial_end=True)
        if shared and self.ctx.store.pushes:
            self._pushed_watch(r, watcher, started, timeout_s, bookmarks)
            return
        last_sent = time.monotonic()
        try:
            while not self.ctx.stopping:
                wait = self._watch_wait(started, timeout_s, last_sent if bookmarks else None)
                if wait is None:
                    break
                try:
                    events = watcher.next_events(wait)
                except st.StatusError as err:
                    self._chunk("ERROR", err.body())
                    break
                if events and shared:
                    # One write (one chunk) for everything that arrived; a gone client fails it at once.
                    self._chunk_line(b"".join(ev.line(etype) for etype, ev in events))
                elif events:
                    for etype, ev in events:
                        send(etype, ev.obj)
                if events:
                    last_sent = time.monotonic()
                elif self._client_gone():
                    return  # nothing to say to a client that left: drop the watch now
                elif bookmarks and time.monotonic() - last_sent >= self.ctx.bookmark_interval:
                    self._bookmark(r, watcher.pos)
                    last_sent = time.monotonic()
            self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the client went away or stopped reading
            return

    def _watch_wait(self, started: float, timeout_s: int | None, last_sent: float | None) -> float | None:
        """How long a watch may wait for events now: until its timeout, its next bookmark (`last_sent`: when it
        last sent something, None without bookmarks) or the next look at the client; None once it timed out."""
        now = time.monotonic()
        if timeout_s is not None and now - started >= timeout_s:
            return None
        wait = _WATCH_POLL_S
        if timeout_s is not None:
            wait = min(wait, timeout_s - (now - started))
        if last_sent is not None:
            wait = min(wait, max(0.0, self.ctx.bookmark_interval - (now - last_sent)))
        return max(wait, 0.0)

    def _pushed_watch(self, r: Route, watcher: Watcher, started: float, timeout_s: int | None,
                      bookmarks: bool) -> None:
        """The rest of a plain JSON watch whose events the writing threads send (Store.push_to). This thread
        sends what they could not (a client slow to read), bookmarks and the end, and notices a client that
        left; it wakes only for that."""
        unsent = [b""]

        def push(events: list[tuple[str, Event]]) -> bool:
            data = self._chunk_bytes(b"".join(ev.line(etype) for etype, ev in events))
            view = memoryview(data)
            sent = 0
            while sent < len(view):
                try:
                    sent += self.connection.send(view[sent:])
                except (BlockingIOError, InterruptedError):
                    unsent[0] = bytes(view[sent:])
                    return False
                except OSError:
                    return False  # gone: this thread notices on its next write or look at the connection
            watcher.pushed_at = time.monotonic()
            return True

        store = self.ctx.store
        watcher.pushed_at = time.monotonic()
        watcher.poked.set()  # events since the watch began are sent by the first pass
        store.push_to(watcher, push)
        try:
            while not self.ctx.stopping:
                wait = self._watch_wait(started, timeout_s, watcher.pushed_at if bookmarks else None)
                if wait is None:
                    break
                watcher.poked.wait(wait)
                watcher.poked.clear()
                with watcher.delivery:
                    watcher.dirty = False
                    if unsent[0]:
                        self.wfile.write(unsent[0])
                        unsent[0] = b""
                    watcher.stalled = False
                    try:
                        events = watcher.ready_events()
                        if events is None:
                            events = watcher.next_events(0.0)  # raises the 410
                    except st.StatusError as err:
                        self._chunk("ERROR", err.body())
                        break
                    if events:
                        self._chunk_line(b"".join(ev.line(etype) for etype, ev in events))
                        watcher.pushed_at = time.monotonic()
                    elif self._client_gone():
                        return
                    elif bookmarks and time.monotonic() - watcher.pushed_at >= self.ctx.bookmark_interval:
                        self._bookmark(r, watcher.pos)
                        watcher.pushed_at = time.monotonic()
                if watcher.dirty:
                    watcher.poked.set()  # a writer came while this thread was sending: another pass at once
            store.stop_pushing(watcher)
            with watcher.delivery:
                if unsent[0]:
                    self.wfile.write(unsent[0])
                self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the client went away or stopped reading
            return
        finally:
            store.stop_pushing(watcher)

    def _bookmark(self, r: Route, rv: int, initial_end: bool = False) -> None:
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        self._chunk("BOOKMARK", {"kind": r.rt.kind, "apiVersion": r.rt.api_version_at(r.version or r.rt.version),
                                 "metadata": meta})

    def _chunk(self, etype: str, obj: dict[str, Any]) -> None:
        self._chunk_line(encode({"type": etype, "object": obj}) + b"\n")

    def _chunk_line(self, line: bytes) -> None:
        self.wfile.write(self._chunk_bytes(line))

    @staticmethod
    def _chunk_bytes(line: bytes) -> bytes:
        return b"%x\r\n%b\r\n" % (len(line), line)

    def _client_gone(self) -> bool:
        """Whether the watching client closed its end (it sends nothing on a watch, so EOF means gone)."""
        try:
            poller = select.poll()
            poller.register(self.connection.fileno(), select.POLLIN)
            if not poller.poll(0):
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except (OSError, ValueError):
            return True
