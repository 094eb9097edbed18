"""The HTTP serving loop: one selector thread holds every idle connection, a bounded pool serves requests.

The standard `ThreadingHTTPServer` gives each connection a thread that blocks reading it, with no timeout:
20,000 idle connections meant 20,000 threads, and the server stalled long after they were gone. Here:

- Idle connections (before their first request, and between kept-alive requests) cost one selector entry,
  not a thread. One that sends nothing is closed after `first_request_timeout` (before any request) or
  `keepalive_timeout` (between requests).
- A connection is handed to a worker only when bytes have arrived; the worker reads one request under a
  deadline (`request_timeout` for the request line, headers and body together), answers it, and gives the
  connection back to the selector (or serves the next pipelined request at once, or, while another worker is
  idle, waits up to `LINGER_S` for the client's next request: a busy client keeps its worker).
- Workers are a bounded pool. A watch is long-lived: its worker leaves the pool (a replacement is started)
  and ends when the watch ends; watches are bounded by `max_watches`.
- At `max_connections` (or when the process runs out of file descriptors) the connection idle the longest
  is closed to make room, so a flood of idle connections never stops a new client from being served.
"""

from __future__ import annotations

import collections
import errno
import io
import select
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

FIRST_REQUEST_TIMEOUT_S = 10.0
KEEPALIVE_TIMEOUT_S = 90.0
REQUEST_TIMEOUT_S = 30.0
WORKERS = 16
MAX_CONNECTIONS = 4096
MAX_WATCHES = 4096
_SWEEP_S = 0.5
# How long a worker waits on a kept-alive connection for the client's next request while another worker is idle.
# A busy client (a controller's write pool, a load generator) then keeps its worker: the selector thread's
# hand-offs (its wake-up, the dispatch, the worker's wake-up: three thread switches per request) cost about a
# sixth of the server's CPU per scheduled pod with 2 ms; a waiting worker costs nothing.
LINGER_S = 0.05


def wait_ready(sock: socket.socket, events: int, timeout: float | None) -> bool:
    """Whether `sock` becomes ready for `events` (select.POLLIN, POLLOUT) within `timeout` seconds (None: no
    limit). Connections stay non-blocking for good: switching a socket's mode or timeout is a system call
    (and a release of the GIL) each time, and a request made several of them."""
    poller = select.poll()
    poller.register(sock.fileno(), events)
    return bool(poller.poll(None if timeout is None else max(0.0, timeout) * 1000))


class DeadlineReader(io.RawIOBase):
    """A (non-blocking) socket's receiving side whose reads wait for data until the current request's
    deadline, and fail once it has passed."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.deadline: float | None = None
        self.nonblocking = False  # return None at once when nothing is there (a peek for pipelined requests)

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int | None:
        while True:
            try:
                return self.sock.recv_into(buf)
            except (BlockingIOError, InterruptedError):
                if self.nonblocking:
                    return None
            remaining = None
            if self.deadline is not None:
                remaining = self.deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("the request was not received in time")
            if not wait_ready(self.sock, select.POLLIN, remaining):
                raise TimeoutError("the request was not received in time")


@dataclass(eq=False)
class Connection:
    sock: socket.socket
    address: Any
    reader: DeadlineReader
    rfile: io.BufferedReader
    handler: Any = None  # the request handler, made on the first request and reused while kept alive
    served: int = 0
    idle_since: float = field(default_factory=time.monotonic)

    def has_buffered_request(self) -> bool:
        """Whether bytes of a next request are already here (pipelined), without blocking."""
        self.reader.nonblocking = True
        try:
            return bool(self.rfile.peek(1))
        except OSError:
            return False
        finally:
            self.reader.nonblocking = False


class PooledHttpServer:
    """Accepts on `listener`, parks idle connections in a selector and serves requests on a bounded pool.

    `make_handler(conn, server)` builds a request handler for a connection (once); `handler.serve_one()`
    handles one request and returns False when the connection must be closed."""

    def __init__(self, listener: socket.socket, make_handler: Any, *, workers: int = WORKERS,
                 max_connections: int = MAX_CONNECTIONS, max_watches: int = MAX_WATCHES,
                 first_request_timeout: float = FIRST_REQUEST_TIMEOUT_S,
                 keepalive_timeout: float = KEEPALIVE_TIMEOUT_S, request_timeout: float = REQUEST_TIMEOUT_S) -> None:
        self.listener = listener
        self.make_handler = make_handler
        self.workers = workers
        self.max_connections = max_connections
        self.max_watches = max_watches
        self.first_request_timeout = first_request_timeout
        self.keepalive_timeout = keepalive_timeout
        self.request_timeout = request_timeout
        self.linger_s = LINGER_S
        self._sel = selectors.DefaultSelector()
        self._idle: collections.OrderedDict[Connection, None] = collections.OrderedDict()  # oldest first
        self._returned: collections.deque[Connection] = collections.deque()  # back from workers, to re-park
        self._ready: collections.deque[Connection] = collections.deque()
        self._idle_workers = 0  # workers waiting for a connection (read without the lock: a hint)
        self._mu = threading.Condition()
        self._open = 0
        self._watches = 0
        self._stopping = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._threads: list[threading.Thread] = []
        self._tls = threading.local()

    # ----- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> None:
        self.listener.setblocking(False)
        self._sel.register(self.listener, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._spawn("apiserver-io", self._io_loop)
        for _ in range(self.workers):
            self._spawn("apiserver-worker", self._worker_loop)

    def _spawn(self, name: str, target: Any) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        with self._mu:
            self._stopping = True
            self._mu.notify_all()
        self._wake()
        for t in list(self._threads):
            t.join(timeout=5)
        for conn in list(self._idle):
            self._close(conn)
        self._idle.clear()
        self._sel.close()
        self.listener.close()
        self._wake_r.close()
        self._wake_w.close()

    def stats(self) -> dict[str, int]:
        with self._mu:
            return {"open": self._open, "idle": len(self._idle), "watches": self._watches, "queued": len(self._ready)}

    # ----- the selector thread -------------------------------------------------------------------------------

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass  # already woken (buffer full) or closing

    def _io_loop(self) -> None:
        last_sweep = time.monotonic()
        while not self._stopping:
            try:
                events = self._sel.select(_SWEEP_S)
            except OSError:
                continue
            for key, _ in events:
                if key.fileobj is self.listener:
                    self._accept()
                elif key.fileobj is self._wake_r:
                    try:
                        while self._wake_r.recv(4096):
                            pass
                    except OSError:
                        pass
                else:
                    conn: Connection = key.data
                    self._unpark(conn)
                    self._dispatch(conn)
            self._repark_returned()
            now = time.monotonic()
            if now - last_sweep >= _SWEEP_S:
                last_sweep = now
                self._sweep(now)

    def _accept(self) -> None:
        for _ in range(64):  # bounded per wake-up so that parked connections get their turn
            if self._open >= self.max_connections:
                self._evict_oldest_idle()
            try:
                sock, address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    if not self._evict_oldest_idle():
                        return
                    continue
                return
            sock.setblocking(False)  # for good: reads and writes wait with poll (wait_ready)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader = DeadlineReader(sock)
            conn = Connection(sock, address, reader, io.BufferedReader(reader, 65536))
            with self._mu:
                self._open += 1
            self._park(conn)

    def _park(self, conn: Connection) -> None:
        conn.idle_since = time.monotonic()
        try:
            self._sel.register(conn.sock, selectors.EVENT_READ, conn)
        except (ValueError, OSError):
            self._close(conn)
            return
        self._idle[conn] = None

    def _unpark(self, conn: Connection) -> None:
        self._idle.pop(conn, None)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass

    def _repark_returned(self) -> None:
        while True:
            try:
                conn = self._returned.popleft()
            except IndexError:
                return
            self._park(conn)

    def _evict_oldest_idle(self) -> bool:
        try:
            conn = next(iter(self._idle))
        except StopIteration:
            return False
        self._unpark(conn)
        self._close(conn)
        return True

    def _sweep(self, now: float) -> None:
        for conn in list(self._idle):
            limit = self.first_request_timeout if conn.served == 0 else self.keepalive_timeout
            if now - conn.idle_since >= limit:
                self._unpark(conn)
                self._close(conn)

    def _dispatch(self, conn: Connection) -> None:
        with self._mu:
            self._ready.append(conn)
            self._mu.notify()

    def _close(self, conn: Connection) -> None:
        try:
            conn.sock.close()
        except OSError:
            pass
        with self._mu:
            self._open -= 1

    # ----- workers -------------------------------------------------------------------------------------------

    def _worker_loop(self) -> None:
        self._tls.detached = False
        while True:
            with self._mu:
                while not self._ready and not self._stopping:
                    self._idle_workers += 1
                    self._mu.wait()
                    self._idle_workers -= 1
                if self._stopping:
                    return
                conn = self._ready.popleft()
            keep = self._serve(conn)
            if self._tls.detached:
                # This thread served a watch and left the pool (a replacement took its place).
                if keep:
                    self._returned.append(conn)
                    self._wake()
                else:
                    self._close(conn)
                with self._mu:
                    self._watches -= 1
                return
            if keep:
                self._returned.append(conn)
                self._wake()
            else:
                self._close(conn)

    def _serve(self, conn: Connection) -> bool:
        """Serve requests on `conn` while they are already here; True to keep the connection open."""
        try:
            if conn.handler is None:
                conn.handler = self.make_handler(conn, self)
            while True:
                conn.reader.deadline = time.monotonic() + self.request_timeout
                keep = conn.handler.serve_one()
                conn.reader.deadline = None
                conn.served += 1
                if not keep or self._stopping:
                    return False
                if self._tls.detached:
                    return False
                if not conn.has_buffered_request() and not self._next_request_soon(conn):
                    return True
        except Exception:  # a broken connection must never take a worker down
            return False

    def _next_request_soon(self, conn: Connection) -> bool:
        """Whether the client sends its next request within `linger_s`, when no other connection is waiting and
        another worker is idle: a busy client's requests then skip the round trip through the selector thread."""
        if self.linger_s <= 0 or self._ready or not self._idle_workers:
            return False  # someone else needs this worker, or could soon with none left idle
        poller = select.poll()
        poller.register(conn.sock.fileno(), select.POLLIN)
        return bool(poller.poll(self.linger_s * 1000))

    def detach_for_watch(self) -> bool:
        """Called by a worker about to serve a watch: leave the pool (starting a replacement) so that long
        watches never starve short requests. False when `max_watches` are already being served."""
        with self._mu:
            if self._watches >= self.max_watches:
                return False
            self._watches += 1
        self._tls.detached = True
        if not self._stopping:
            self._spawn("apiserver-worker", self._worker_loop)
            self._threads = [t for t in self._threads if t.is_alive()]
        return True
