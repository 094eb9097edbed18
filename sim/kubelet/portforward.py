"""The kubelet's port-forward protocol (portforward.k8s.io over SPDY/3.1, controlplane.spdy), server side: for each
forwarded connection the client opens an error stream and a data stream, both with headers `streamtype`
(error|data), `port` and `requestid`; every stream is answered with a SYN_REPLY. Once a request's two streams are
there, the port is dialed in the pod's network namespace and bytes are copied both ways; a dial failure is
written on the error stream in the kubelet's words. Both streams are closed (FIN) when forwarding ends."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

from controlplane import spdy

log = logging.getLogger("sim.kubelet.portforward")

# port -> a socket connected to it inside the pod (raises with the runtime's message when it cannot).
Dial = Callable[[int], socket.socket]


@dataclass
class _Pair:
    port: int
    data_id: int = 0
    error_id: int = 0
    conn: socket.socket | None = None
    closed: bool = False
    started: bool = False


class PortForwardSession:
    """One SPDY connection's streams. `serve()` returns when the client goes away."""

    def __init__(self, recv: Callable[[int], bytes], send: Callable[[bytes], None], dial: Dial, pod: str,
                 uid: str) -> None:
        self._reader = spdy.Reader(recv)
        self._writer = spdy.Writer()
        self._send_raw = send
        self._dial = dial
        self._pod, self._uid = pod, uid
        self._lock = threading.Lock()  # frames are encoded and sent in one order (the compressor's)
        self._pairs: dict[str, _Pair] = {}  # requestid -> its streams
        self._by_stream: dict[int, str] = {}
        self._last_stream = 0

    def _send(self, encode: Callable[[spdy.Writer], bytes]) -> None:
        with self._lock:
            self._send_raw(encode(self._writer))

    def serve(self) -> None:
        try:
            while True:
                frame = self._reader.read()
                self._handle(frame)
        except (EOFError, OSError):
            pass
        except spdy.SpdyError as exc:
            log.warning("event=portforward-protocol-error pod=%s error=%r", self._pod, str(exc))
            try:
                self._send(lambda w: w.goaway(self._last_stream, 1))
            except OSError:
                pass
        finally:
            with self._lock:
                pairs = list(self._pairs.values())
            for p in pairs:
                self._close_conn(p)

    def _handle(self, frame: spdy.Frame) -> None:
        if frame.kind == spdy.SYN_STREAM:
            self._last_stream = max(self._last_stream, frame.stream_id)
            self._open(frame)
        elif frame.kind == 0:
            self._data(frame)
        elif frame.kind == spdy.RST_STREAM:
            request = self._by_stream.get(frame.stream_id)
            if request is not None and request in self._pairs:
                self._close_conn(self._pairs[request])
        elif frame.kind == spdy.PING:
            self._send(lambda w: w.ping(frame.ping_id))  # the peer's ping, echoed
        elif frame.kind == spdy.GOAWAY:
            raise EOFError("the client went away")

    def _open(self, frame: spdy.Frame) -> None:
        sid, headers = frame.stream_id, frame.headers
        kind, port_text, request = headers.get("streamtype", ""), headers.get("port", ""), headers.get("requestid", "")
        port = int(port_text) if port_text.isdigit() else 0
        if kind not in ("data", "error") or not 0 < port < 65536:
            log.warning("event=portforward-bad-stream pod=%s streamtype=%r port=%r", self._pod, kind, port_text)
            self._send(lambda w: w.rst_stream(sid, spdy.RST_PROTOCOL_ERROR))
            return
        self._send(lambda w: w.syn_reply(sid))
        pair = self._pairs.setdefault(request, _Pair(port))
        self._by_stream[sid] = request
        if kind == "data":
            pair.data_id = sid
        else:
            pair.error_id = sid
        if pair.data_id and pair.error_id and not pair.started:
            pair.started = True
            self._connect(pair)

    def _connect(self, pair: _Pair) -> None:
        try:
            pair.conn = self._dial(pair.port)
        except Exception as exc:  # noqa: BLE001 - any dial failure is the client's to read
            message = f"error forwarding port {pair.port} to pod {self._pod}, uid {self._uid}: {exc}"
            log.info("event=portforward-dial-failed pod=%s port=%d error=%r", self._pod, pair.port, str(exc))
            self._send(lambda w: w.data(pair.error_id, message.encode()))
            self._finish(pair)
            return
        threading.Thread(target=self._pump, args=(pair,), name=f"portforward-{pair.port}", daemon=True).start()

    def _data(self, frame: spdy.Frame) -> None:
        request = self._by_stream.get(frame.stream_id)
        pair = self._pairs.get(request) if request is not None else None
        if pair is None or frame.stream_id != pair.data_id:
            return  # the client's error stream (it only closes it) or a stream already gone
        conn = pair.conn
        if conn is None:
            return
        try:
            if frame.data:
                conn.sendall(frame.data)
            if frame.fin:
                conn.shutdown(socket.SHUT_WR)  # the client sends no more; the pod's answer still comes back
        except OSError:
            self._close_conn(pair)

    def _pump(self, pair: _Pair) -> None:
        conn = pair.conn
        assert conn is not None
        try:
            while chunk := conn.recv(65536):
                self._send(lambda w: w.data(pair.data_id, chunk))
        except OSError:
            pass
        self._finish(pair)

    def _finish(self, pair: _Pair) -> None:
        """FIN on both streams (what the kubelet's deferred Close() of each stream sends)."""
        if pair.closed:
            return
        pair.closed = True
        try:
            self._send(lambda w: w.data(pair.data_id, b"", fin=True) + w.data(pair.error_id, b"", fin=True))
        except OSError:
            pass
        self._close_conn(pair)

    @staticmethod
    def _close_conn(pair: _Pair) -> None:
        conn, pair.conn = pair.conn, None
        if conn is not None:
            try:
                conn.close()
            except OSError:
                pass
