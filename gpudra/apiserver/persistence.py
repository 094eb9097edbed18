"""Crash-safe state files: write a temp file, fsync it, rename it over the target, fsync the directory."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: Path, data: bytes) -> None:
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_json(path: Path, value: Any) -> None:
    atomic_write_bytes(path, json.dumps(value, separators=(",", ":")).encode())


class StateFileError(ValueError):
    """The state file exists but cannot be read; the message names the file and the problem."""


def read_state(path: Path) -> dict[str, Any] | None:
    """The persisted state, or None when the file does not exist."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateFileError(f"state file {path}: cannot read: {exc.strerror}") from exc
    try:
        state = json.loads(raw)
    except ValueError as exc:
        raise StateFileError(f"state file {path}: not valid JSON ({exc}); expected the object the apiserver "
                             "writes with --state") from exc
    if not isinstance(state, dict) or not isinstance(state.get("objects", []), list):
        raise StateFileError(f"state file {path}: expected an object with an 'objects' list")
    return state
