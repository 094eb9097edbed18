"""Containers' termination messages, as the kubelet keeps them: each start gets an empty file of its own under
the pod's directory (containers/<name>/<run>), mounted at the container's `terminationMessagePath` (default
/dev/termination-log); when the container exits, what it wrote there (at most 4096 bytes) becomes
`state.terminated.message`. With `terminationMessagePolicy: FallbackToLogsOnError`, a container that failed and
wrote nothing gets the end of its log instead (at most 80 lines and 2048 bytes).

The container writes the file, so it is read as untrusted (sim.runtime.podman.read_untrusted): never through a
link, only if it is still a regular file, never more than the limit. The log is conmon's, on the host."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sim.kubelet.volumes import pod_dir
from sim.runtime.podman import read_untrusted

DEFAULT_PATH = "/dev/termination-log"
MAX_MESSAGE_BYTES = 4096
MAX_LOG_LINES = 80
MAX_LOG_BYTES = 2048


def message_file(kubelet_dir: Path, pod_uid: str, container: str, run: str) -> Path:
    """The empty file one start of `container` writes its termination message to (writable by any user the
    container may run as)."""
    directory = pod_dir(kubelet_dir, pod_uid) / "containers" / container
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / run
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666)
    os.close(fd)
    path.chmod(0o666)
    return path


def mount_path(container: Mapping[str, Any]) -> str:
    value = container.get("terminationMessagePath")
    return value if isinstance(value, str) and value.startswith("/") else DEFAULT_PATH


def _log_tail(log_path: Path) -> str:
    """The end of a container's log (CRI format: `<time> <stream> <tag> <text>` per line), as its output."""
    try:
        with log_path.open("rb") as f:
            f.seek(max(0, log_path.stat().st_size - MAX_LOG_BYTES * 4))
            lines = f.read(MAX_LOG_BYTES * 4).decode(errors="replace").splitlines()
    except OSError:
        return ""
    texts = [parts[3] if len(parts) == 4 else "" for parts in (line.split(" ", 3) for line in lines)]
    text = "\n".join(texts[-MAX_LOG_LINES:]) + ("\n" if texts else "")
    return text.encode()[-MAX_LOG_BYTES:].decode(errors="ignore")


def read_message(path: Path | None, container: Mapping[str, Any], exit_code: int | None, log_path: Path | None) -> str:
    """The termination message of a run that exited with `exit_code`."""
    message = (read_untrusted(path, MAX_MESSAGE_BYTES) or "") if path is not None else ""
    if (not message and exit_code not in (0, None) and log_path is not None
            and container.get("terminationMessagePolicy") == "FallbackToLogsOnError"):
        return _log_tail(log_path)
    return message


def remove(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()
