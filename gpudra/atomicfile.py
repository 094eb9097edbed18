"""Whole-file replacement that readers and crashes never see half done: temp file, optional fsync, rename."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make a rename or create inside `directory` survive power loss (the entry lives in the directory)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name(path: Path) -> Path:
    """The temp file beside `path`; its `.<name>.tmp-` prefix lets owners of a directory sweep leftovers."""
    # pid and thread id: two writers of one target (two processes, or threads of one) never share a temp file.
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")


def atomic_write(path: Path, data: bytes, mode: int = 0o600, *, durable: bool = True) -> None:
    """Write a file so that a crash leaves either the old or the new content, never a mix.

    `durable=False` skips the fsyncs: still atomic for readers and across process crashes, not across power loss.
    """
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        # A failed write (disk full, EIO) must not leave a temp file behind for every retry.
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)
