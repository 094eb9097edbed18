"""One lock per ResourceClaim, held across the whole prepare or unprepare of that claim.

The node-wide lock (driver.checkpoint.NodeLock) covers state changes only: a prepare releases it while it waits
for an MPS control daemon, with its claim recorded as PrepareStarted. The claim's own lock keeps everyone else
off that half-prepared claim meanwhile: a retried prepare or an unprepare of the same claim waits for it, and an
agent starting beside it (a rolling update) leaves it alone instead of rolling it back. Other claims are not
held up by it.

An flock on `<directory>/<uid>.lock`: released by the kernel when its holder dies, so a crashed prepare never
leaves its claim locked, and the next start rolls the claim back. Separate opens conflict with each other, so
it excludes threads of one process as well as other processes. The file is removed when the claim is gone;
a holder checks after locking that the path is still the file it locked (else it locks the new one).
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


class ClaimLocks:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, uid: str) -> Path:
        if not _UID.match(uid) or uid in (".", ".."):
            raise ValueError(f"claim uid {uid!r}: not usable as a lock name")
        return self.directory / f"{uid}.lock"

    def _open_locked(self, uid: str, blocking: bool) -> int | None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._path(uid)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            try:
                same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)  # removed (and maybe recreated) by the holder before us: lock the current file

    @contextmanager
    def held(self, uid: str) -> Iterator[None]:
        """Wait for the claim's lock and hold it."""
        fd = self._open_locked(uid, blocking=True)
        assert fd is not None
        try:
            yield
        finally:
            os.close(fd)

    @contextmanager
    def try_held(self, uid: str) -> Iterator[bool]:
        """Hold the claim's lock if nobody does; yields whether it is held."""
        fd = self._open_locked(uid, blocking=False)
        try:
            yield fd is not None
        finally:
            if fd is not None:
                os.close(fd)

    def forget(self, uid: str) -> None:
        """Remove the claim's lock file; call with its lock held, once the claim is gone from the checkpoint."""
        self._path(uid).unlink(missing_ok=True)
