"""The log backend (--audit-log-path): events are queued by the request threads and encoded and appended as
JSON lines by one writer thread, so a request pays for building its event's dict and nothing of the I/O.
`-` writes to standard output. Like kube-apiserver's default (blocking) mode, no event is dropped: the queue
is unbounded and stop() writes what is queued before it closes the file."""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

_STOP: Any = object()
# The writer waits this long after an event before it writes what has come by then, in one write(): one
# wake-up and one system call per batch rather than per event (kube-apiserver's batch mode waits up to 1 s).
_LINGER_S = 0.05


class LogBackend:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._out: IO[str]
        if self.path == "-":
            self._out, self._close = sys.stdout, False
        else:
            target = Path(self.path)
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            except OSError as exc:
                raise OSError(exc.errno, f"{target}: {exc.strerror or exc}") from None
            self._out, self._close = os.fdopen(fd, "a", encoding="utf-8"), True
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="apiserver-audit", daemon=True)
        self._thread.start()

    def emit(self, event: dict[str, Any]) -> None:
        """Queue one event; it must not be changed afterwards."""
        self._queue.put(event)

    def _run(self) -> None:
        encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
        while True:
            batch = [self._queue.get()]
            if batch[0] is not _STOP:
                time.sleep(_LINGER_S)
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = any(e is _STOP for e in batch)
            lines = "".join(encode(e) + "\n" for e in batch if e is not _STOP)
            try:
                if lines:
                    self._out.write(lines)
                    self._out.flush()
            except (OSError, ValueError) as exc:  # a full disk must not take the server down; say so once a batch
                print(f"level=error component=apiserver msg=\"audit log {self.path}: {exc}\"", file=sys.stderr)
            if stop:
                return

    def stop(self) -> None:
        """Write every queued event, then close the log."""
        self._queue.put(_STOP)
        self._thread.join(timeout=30)
        if self._close:
            self._out.close()
