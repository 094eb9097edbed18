"""Dialing a TCP port inside a container's network namespace, as the CRI runtime does for port-forward (containerd
enters the sandbox's netns and connects to localhost:PORT). setns(2) on a network namespace moves only the
calling thread, so a short-lived thread enters the namespace, connects, and ends; the socket keeps the namespace
it was made in."""

from __future__ import annotations

import ctypes
import os
import socket
import threading

CLONE_NEWNET = 0x40000000
CONNECT_TIMEOUT_S = 10.0


class DialError(Exception):
    """The port could not be reached inside the namespace; the message says why, in the runtime's words."""


def dial(pid: int, port: int, host: str = "127.0.0.1", timeout: float = CONNECT_TIMEOUT_S) -> socket.socket:
    """A connected socket to host:port in the network namespace of process `pid` (`timeout` bounds the connect)."""
    result: list[socket.socket | BaseException] = []

    def enter_and_connect() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns: {os.strerror(err)}")
            finally:
                os.close(fd)
            sock = socket.create_connection((host, port), timeout=timeout)
            sock.settimeout(None)
            result.append(sock)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            result.append(exc)

    t = threading.Thread(target=enter_and_connect, name=f"netns-dial-{pid}", daemon=True)
    t.start()
    t.join()
    outcome = result[0] if result else DialError("the dialing thread ended without a result")
    if isinstance(outcome, socket.socket):
        return outcome
    if isinstance(outcome, ConnectionRefusedError):
        raise DialError(f"dial tcp4 {host}:{port}: connect: connection refused") from outcome
    raise DialError(f"dial tcp4 {host}:{port}: {outcome}") from outcome
