"""Unix sockets the node serves gRPC on: binding over a stale socket, and telling our socket from a replacement."""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

import grpc

# sun_path is 108 bytes including the terminating NUL, but gRPC refuses unix paths longer than 105 bytes.
MAX_UNIX_SOCKET_PATH = 105

SocketIdentity = tuple[int, int, int]


def socket_identity(path: Path) -> SocketIdentity | None:
    """A socket file's identity, None when `path` is missing or not a socket.

    With ctime, because a deleted socket's inode number is soon reused by the one that replaces it.
    """
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns) if stat.S_ISSOCK(st.st_mode) else None


def listen(server: grpc.Server, path: Path) -> None:
    """Make `server` listen on `path`, replacing a stale socket left by an earlier instance (never another file)."""
    size = len(os.fsencode(str(path)))
    if size > MAX_UNIX_SOCKET_PATH:
        raise RuntimeError(
            f"unix socket path {path} is {size} bytes; at most {MAX_UNIX_SOCKET_PATH} fit (use a shorter --kubelet-dir, "
            "driver name or resource name)"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        if socket_identity(path) is None:
            raise RuntimeError(f"{path} exists and is not a socket; refusing to replace it")
        path.unlink()
    if server.add_insecure_port(f"unix://{path}") == 0:
        raise RuntimeError(f"could not listen on unix socket {path}")


def listening(path: Path) -> bool:
    """Whether a process accepts connections on the unix socket at `path` (a file left by a dead one refuses)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError as exc:
            return exc.errno not in (errno.ECONNREFUSED, errno.ENOENT)
    return True
