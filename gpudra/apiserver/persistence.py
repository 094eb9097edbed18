"""The embedded API server's state file: written crash-safe, read back with errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpudra.atomicfile import atomic_write


def atomic_write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(value, separators=(",", ":")).encode())


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
