"""The process `cluster up` detaches: it runs the supervisor (sim.cluster.supervisor) and starts it again if it
dies while the cluster is up (killed, crashed), with a backoff of 1 s doubling to 30 s; the new supervisor stops
what the old one left and brings the cluster back on the same URL with its store. A supervisor that stopped
(SIGTERM from `cluster down`, phase stopped) or failed to start (phase failed) ends the keeper too.

Run as `python -m sim.cluster.keeper STATE_DIR`; SIGTERM is passed on to the supervisor.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from sim.cluster.spec import ClusterPaths, read_json

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
STABLE_S = 60.0  # a supervisor up this long has its backoff reset


def _log(paths: ClusterPaths, text: str) -> None:
    with open(paths.logs / "supervisor.log", "a") as f:
        f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} keeper {text}\n")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m sim.cluster.keeper STATE_DIR", file=sys.stderr)
        return 2
    paths = ClusterPaths(Path(argv[0]))
    paths.keeper_pid.write_text(f"{os.getpid()}\n")
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    backoff = FIRST_BACKOFF_S
    while True:
        started = time.monotonic()
        with open(paths.logs / "supervisor.log", "ab") as log:
            child = subprocess.Popen([sys.executable, "-m", "sim.cluster.supervisor", str(paths.root)],
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        code = child.wait()
        status = read_json(paths.status)
        phase = status.get("phase") if isinstance(status, dict) else None
        if stopping or phase in ("stopped", "failed"):
            return code if code >= 0 else 1
        if time.monotonic() - started > STABLE_S:
            backoff = FIRST_BACKOFF_S
        _log(paths, f"event=supervisor-died code={code} phase={phase} restart_in_s={backoff:.0f}")
        deadline = time.monotonic() + backoff
        while time.monotonic() < deadline and not stopping:
            time.sleep(0.1)
        if stopping:
            return 0
        backoff = min(backoff * 2, MAX_BACKOFF_S)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
