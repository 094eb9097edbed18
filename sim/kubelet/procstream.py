"""A runtime process (`podman exec` or `podman attach`) bridged to the kubelet's WebSocket channel protocol
(controlplane.wsstream): stdin from channel 0, stdout and stderr to channels 1 and 2, resize messages from channel 4,
and the final metav1.Status on channel 3.

With a TTY the process runs on a pseudo-terminal of ours, in raw mode so that the container's own terminal is
the only line discipline; its size follows the client's resize messages (TIOCSWINSZ, then SIGWINCH to podman,
which resizes the container's terminal), and everything it prints comes on channel 1, as the kubelet sends a TTY
session's output."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import termios
import threading
import tty as ttymode
from collections.abc import Callable
from typing import IO

from controlplane import wsstream as ws

log = logging.getLogger("sim.kubelet.stream")

# In TTY mode kubectl sends the terminal's size first; the process is started once it is there (or after this).
FIRST_RESIZE_WAIT_S = 1.0
EOT = b"\x04"


class _Process:
    """The process and its ends: pipes, or one pty master for all three streams."""

    def __init__(self, argv: list[str], *, tty: bool, size: tuple[int, int] | None) -> None:
        self.master: int | None = None
        if tty:
            master, slave = os.openpty()
            ttymode.setraw(slave)
            if size is not None:
                _set_size(master, *size)
            try:
                self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
            finally:
                os.close(slave)
            self.master = master
        else:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._stdin_closed = False

    def outputs(self) -> list[tuple[Callable[[], bytes], int]]:
        if self.master is not None:
            master = self.master

            def read_pty() -> bytes:
                try:
                    return os.read(master, 65536)
                except OSError:  # EIO once every holder of the terminal is gone
                    return b""
            return [(read_pty, ws.STDOUT)]
        assert self.proc.stdout is not None and self.proc.stderr is not None
        out: IO[bytes] = self.proc.stdout
        err: IO[bytes] = self.proc.stderr
        return [(lambda: out.read1(65536), ws.STDOUT), (lambda: err.read1(65536), ws.STDERR)]  # type: ignore[attr-defined]

    def write(self, data: bytes) -> None:
        if self._stdin_closed:
            return
        if self.master is not None:
            os.write(self.master, data)
        elif self.proc.stdin is not None:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()

    def close_stdin(self) -> None:
        if self._stdin_closed:
            return
        if self.master is not None:
            os.write(self.master, EOT)  # end of input, as the container's terminal reads it
        elif self.proc.stdin is not None:
            self.proc.stdin.close()
        self._stdin_closed = True

    def resize(self, cols: int, rows: int) -> None:
        if self.master is None:
            return
        _set_size(self.master, cols, rows)
        try:
            self.proc.send_signal(signal.SIGWINCH)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()

    def close(self) -> None:
        if self.master is not None:
            os.close(self.master)
            self.master = None


def _set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _parse_resize(payload: bytes) -> tuple[int, int] | None:
    try:
        size = json.loads(payload)
        cols, rows = int(size.get("Width") or 0), int(size.get("Height") or 0)
    except (ValueError, TypeError, AttributeError):
        return None
    return (cols, rows) if 0 < cols < 65536 and 0 < rows < 65536 else None


class _Session:
    """One stream: the client's messages (which may come before the process is started: its first terminal size
    among them) delivered to the process, its output sent back."""

    def __init__(self, sock: socket.socket, *, stdin: bool) -> None:
        self.sock = sock
        self.stdin = stdin
        self.send_lock = threading.Lock()
        self.state_lock = threading.Lock()
        self.process: _Process | None = None
        self.pending: list[tuple[int, bytes]] = []  # client messages from before the process started
        self.size: tuple[int, int] | None = None
        self.first_size = threading.Event()
        self.gone = threading.Event()

    def send(self, opcode: int, payload: bytes) -> None:
        with self.send_lock:
            self.sock.sendall(ws.frame(opcode, payload))

    def started(self, p: _Process, size: tuple[int, int] | None) -> None:
        """`p` was started with `size`; a resize that came after it was read is applied now (kubectl attach sends
        the size plus one, then the size, so the last one is the one that counts)."""
        with self.state_lock:
            self.process, early, self.pending, latest = p, self.pending, [], self.size
        if latest is not None and latest != size:
            p.resize(*latest)
        if not self.stdin:
            p.close_stdin()
        for channel, data in early:
            self._deliver(p, channel, data)

    def _deliver(self, p: _Process, channel: int, data: bytes) -> None:
        if channel == ws.STDIN and self.stdin:
            p.write(data)
        elif channel == ws.CLOSE and data[:1] == bytes([ws.STDIN]):
            p.close_stdin()

    def _message(self, channel: int, data: bytes) -> None:
        with self.state_lock:
            p = self.process
            if p is None:
                if channel == ws.RESIZE:
                    self.size = _parse_resize(data) or self.size
                    self.first_size.set()
                else:
                    self.pending.append((channel, data))
                return
        if channel == ws.RESIZE:
            if (size := _parse_resize(data)) is not None:
                p.resize(*size)
        else:
            self._deliver(p, channel, data)

    def read_client(self, detach_on_close: bool) -> None:
        """The client's side until it closes; then stdin is closed (exec) or the process stopped (attach)."""
        try:
            while True:
                op, data = ws.read_message(self.sock)
                if op == ws.OP_CLOSE:
                    break
                if op == ws.OP_PING:
                    self.send(ws.OP_PONG, data)
                elif op == ws.OP_BINARY and data:
                    self._message(data[0], data[1:])
        except (ws.WsError, OSError, ValueError):
            pass
        self.gone.set()
        self.first_size.set()
        with self.state_lock:
            p = self.process
        if p is None:
            return
        try:
            if detach_on_close:
                p.stop()
            else:
                p.close_stdin()
        except OSError:
            pass


def serve(sock: socket.socket, argv: list[str], *, stdin: bool, tty: bool,
          result: Callable[[int], bytes], detach_on_close: bool = False) -> int | None:
    """Run `argv` streamed over the WebSocket `sock` (its handshake done); `result(exit code)` is the final
    channel-3 message. With `detach_on_close` (attach) the process is stopped when the client goes away.
    Returns the exit code (None when the process could not start)."""
    session = _Session(sock, stdin=stdin)
    threading.Thread(target=session.read_client, args=(detach_on_close,), daemon=True).start()
    if tty:
        session.first_size.wait(FIRST_RESIZE_WAIT_S)
    size = session.size
    try:
        p = _Process(argv, tty=tty, size=size)
    except OSError as exc:
        session.send(ws.OP_BINARY, ws.status_message(None, f"starting the command failed: {exc}"))
        return None
    session.started(p, size)
    if session.gone.is_set() and detach_on_close:
        p.stop()

    def pump(read: Callable[[], bytes], channel: int) -> None:
        while chunk := read():
            try:
                session.send(ws.OP_BINARY, bytes([channel]) + chunk)
            except OSError:
                return

    pumps = [threading.Thread(target=pump, args=o, daemon=True) for o in p.outputs()]
    for t in pumps:
        t.start()
    code = p.proc.wait()
    for t in pumps:
        t.join(timeout=5)
    p.close()
    try:
        session.send(ws.OP_BINARY, result(code))
        session.send(ws.OP_CLOSE, b"\x03\xe8")
    except OSError:
        pass
    return code
