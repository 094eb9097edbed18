"""Child processes of the demo: started with their output in log files, stopped with SIGTERM and then SIGKILL.

Every child gets its own process group so that a Ctrl-C in the terminal reaches only the demo, which then stops
the children in reverse start order (node agents before the control plane they talk to).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

# The packages live beside `gpudra/`; children import them from there whether or not the project is installed.
PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent


class ChildFailed(RuntimeError):
    """A child process exited or did not come up; the message names it and ends with its log's tail."""


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(PROJECT_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def gpu_dra_command(*args: str) -> list[str]:
    """`gpu-dra ARGS` run by this interpreter (works in a checkout and when installed)."""
    return [sys.executable, "-m", "cli.main", *args]


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one owned by another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    tier: int = 1  # stopped after every child of a higher tier (the API server is tier 0: stopped last)
    _log: IO[bytes] | None = None
    signalled: bool = False

    def alive(self) -> bool:
        return self.process.poll() is None

    def failure(self, what: str) -> ChildFailed:
        code = self.process.poll()
        state = "still running" if code is None else f"exited with code {code}"
        return ChildFailed(f"{self.name} ({state}): {what}; last lines of {self.log_path}:\n{log_tail(self.log_path)}")

    def terminate(self) -> None:
        """SIGTERM once: a second one could land while the child's interpreter is finalizing, after its handler
        is gone, and kill it mid-cleanup."""
        if self.signalled or self.process.poll() is not None:
            return
        self.signalled = True
        try:
            self.process.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass

    def stop(self, grace: float) -> int | None:
        """SIGTERM, wait up to `grace` seconds, then SIGKILL. Returns the exit code."""
        if self.process.poll() is None:
            self.terminate()
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.process.returncode


@dataclass
class ChildGroup:
    """The children of one demo run; `stop_all` is safe to call more than once and on partial starts."""

    log_dir: Path
    children: list[Child] = field(default_factory=list)

    def start(self, name: str, argv: Sequence[str], *, stdout_pipe: bool = False,
              env: dict[str, str] | None = None, tier: int = 1) -> Child:
        self.log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        # Logs are the user's alone: a component's log may quote objects (Secrets) or tokens.
        log = os.fdopen(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb")
        os.chmod(log_path, 0o600)  # one left by an earlier run
        try:
            process = subprocess.Popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if stdout_pipe else log, stderr=log,
                env=child_env(env), cwd=str(PROJECT_ROOT), start_new_session=True,
            )
        except OSError:
            log.close()
            raise
        child = Child(name, process, log_path, tier, log)
        self.children.append(child)
        return child

    def check_alive(self) -> None:
        for child in self.children:
            if not child.alive():
                raise child.failure("exited while the demo was running")

    def stop_all(self, grace: float = 5.0) -> dict[str, int | None]:
        """Stop tier by tier, highest first; within a tier all children are signalled at once, then awaited."""
        codes: dict[str, int | None] = {}
        for tier in sorted({c.tier for c in self.children}, reverse=True):
            group = [c for c in reversed(self.children) if c.tier == tier]
            for child in group:
                child.terminate()
            deadline = time.monotonic() + grace
            for child in group:
                codes[child.name] = child.stop(max(0.1, deadline - time.monotonic()))
        self.children.clear()
        return codes
