"""A component process that is restarted when it exits, with a doubling back-off (up to 30 s), as a systemd unit
or a kubelet-managed container is; its output goes to its log file."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any


class Component:
    def __init__(self, role: str, argv: list[str], log_file: Path, node: str | None = None) -> None:
        self.role, self.argv, self.log_file, self.node = role, argv, log_file, node
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._next_start = 0.0

    def start(self) -> None:
        with self.log_file.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def check(self) -> None:
        """Restart after an exit, with a doubling back-off (up to 30 s), as a kubelet-managed or systemd unit is."""
        if self.proc is None or self.proc.poll() is None:
            return
        now = time.monotonic()
        if self._next_start == 0.0:
            self.restarts += 1
            self._next_start = now + min(30.0, 0.5 * 2 ** min(self.restarts, 6))
            with self.log_file.open("a") as out:
                out.write(f"--- supervisor: exited with {self.proc.returncode}; restart {self.restarts}\n")
        elif now >= self._next_start:
            self._next_start = 0.0
            self.start()

    def stop(self, grace: float) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def info(self) -> dict[str, Any]:
        return {"role": self.role, "node": self.node, "pid": self.proc.pid if self.proc else None,
                "running": self.proc is not None and self.proc.poll() is None, "restarts": self.restarts}
