"""A runtime process (`podman exec` or `podman attach`) bridged to the kubelet's WebSocket channel protocol
(gpudra.wsstream): stdin from channel 0, stdout and stderr to channels 1 and 2, resize messages from channel 4,
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

from gpudra import wsstream as ws

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


def serve(sock: socket.socket, argv: list[str], *, stdin: bool, tty: bool,
          result: Callable[[int], bytes], detach_on_close: bool = False) -> int | None:
    """Run `argv` streamed over the WebSocket `sock` (its handshake done); `result(exit code)` is the final
    channel-3 message. With `detach_on_close` (attach) the process is stopped when the client goes away.
    Returns the exit code (None when the process could not start)."""
    send_lock = threading.Lock()

    def send(payload: bytes) -> None:
        with send_lock:
            sock.sendall(ws.frame(ws.OP_BINARY, payload))

    first_size = threading.Event()
    pending: list[tuple[int, bytes]] = []  # client messages that came before the process started
    process: list[_Process] = []
    gone = threading.Event()
    state_lock = threading.Lock()
    size: list[tuple[int, int]] = []

    def on_message(channel: int, data: bytes) -> None:
        if channel == ws.RESIZE:
            parsed = _parse_resize(data)
            if parsed is None:
                return
            with state_lock:
                if not process:
                    size[:] = [parsed]
                    first_size.set()
                    return
            process[0].resize(*parsed)
            return
        with state_lock:
            if not process:
                pending.append((channel, data))
                return
        deliver(process[0], channel, data)

    def deliver(p: _Process, channel: int, data: bytes) -> None:
        if channel == ws.STDIN and stdin:
            p.write(data)
        elif channel == ws.CLOSE and data[:1] == bytes([ws.STDIN]):
            p.close_stdin()

    def read_client() -> None:
        try:
            while True:
                op, data = ws.read_message(sock)
                if op == ws.OP_CLOSE:
                    break
                if op == ws.OP_PING:
                    with send_lock:
                        sock.sendall(ws.frame(ws.OP_PONG, data))
                    continue
                if op == ws.OP_BINARY and data:
                    try:
                        on_message(data[0], data[1:])
                    except OSError:
                        break
        except (ws.WsError, OSError, ValueError):
            pass
        gone.set()
        first_size.set()
        with state_lock:
            p = process[0] if process else None
        if p is not None:
            if detach_on_close:
                p.stop()
            else:
                try:
                    p.close_stdin()
                except OSError:
                    pass

    threading.Thread(target=read_client, daemon=True).start()
    if tty:
        first_size.wait(FIRST_RESIZE_WAIT_S)
    try:
        with state_lock:
            p = _Process(argv, tty=tty, size=size[0] if size else None)
            process.append(p)
            early, pending[:] = list(pending), []
        if not stdin:
            p.close_stdin()
        for channel, data in early:
            deliver(p, channel, data)
    except OSError as exc:
        send(ws.status_message(None, f"starting the command failed: {exc}"))
        return None
    if gone.is_set() and detach_on_close:
        p.stop()

    def pump(read: Callable[[], bytes], channel: int) -> None:
        while chunk := read():
            try:
                send(bytes([channel]) + chunk)
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
        send(result(code))
        with send_lock:
            sock.sendall(ws.frame(ws.OP_CLOSE, b"\x03\xe8"))
    except OSError:
        pass
    return code
