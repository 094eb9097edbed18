"""Where the embedded API server finds container logs for the pods/log subresource (`kubectl logs`).

The API server has no containers of its own: a testbed that runs containers registers a `PodLogSource` on the
server instance (`EmbeddedApiServer.pod_logs`). `PodLogsDir` is the usual one: the kubelet's /var/log/pods
layout, `<root>/<namespace>_<pod>_<uid>/<container>/<restartCount>.log`, each file in the CRI log format
(`<RFC3339Nano time> <stdout|stderr> <P|F> <text>`, P marking a partial line the next entry continues), which is
what podman's k8s-file log driver and containerd write. `gpu-dra apiserver --pod-logs-dir DIR` registers one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class PodLogSource(Protocol):
    def log_file(self, namespace: str, pod: str, uid: str, container: str, previous: bool) -> Path | None:
        """The CRI-format log of the container's current (or previous) run, None when there is none."""


@dataclass(frozen=True)
class PodLogsDir:
    root: Path

    def log_file(self, namespace: str, pod: str, uid: str, container: str, previous: bool) -> Path | None:
        d = self.root / f"{namespace}_{pod}_{uid}" / container
        try:
            runs = sorted((int(p.stem), p) for p in d.glob("*.log") if p.stem.isdigit())
        except OSError:
            return None
        if previous:
            return runs[-2][1] if len(runs) > 1 else None
        return runs[-1][1] if runs else None


@dataclass(frozen=True)
class LogLine:
    timestamp: str
    stream: str
    text: str  # with its newline unless the entry is a partial line


def parse_cri_log(raw: str) -> Iterator[LogLine]:
    for line in raw.splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 3:
            continue
        text = parts[3] if len(parts) == 4 else ""
        yield LogLine(parts[0], parts[1], text if parts[2] == "P" else text + "\n")
