"""The kubelet's container restart back-off (client-go flowcontrol.Backoff as kuberuntime uses it).

Facts (pkg/kubelet/kubelet.go, kuberuntime doBackOff): one entry per container (pod uid + container name); the
first exit restarts at once and sets the back-off to 10 s; while less than the back-off has passed since the
container finished, a restart is refused (CrashLoopBackOff) and retried on a later sync; each restart that goes
ahead doubles the back-off up to 300 s. An entry not touched for twice the maximum (10 min: the container ran that
long) has expired and starts again at 10 s. Pure: the caller passes the monotonic time in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

INITIAL_SECONDS = 10.0
MAX_SECONDS = 300.0


@dataclass
class _Entry:
    backoff: float
    last_update: float


@dataclass
class RestartBackoff:
    initial: float = INITIAL_SECONDS
    maximum: float = MAX_SECONDS
    _entries: dict[str, _Entry] = field(default_factory=dict)

    def _expired(self, entry: _Entry, event_time: float) -> bool:
        return event_time - entry.last_update > 2 * self.maximum

    def in_backoff_since(self, key: str, finished_at: float, now: float) -> bool:
        """Whether a container that finished at `finished_at` must still wait (IsInBackOffSince)."""
        entry = self._entries.get(key)
        if entry is None or self._expired(entry, finished_at):
            return False
        return now - finished_at < entry.backoff

    def remaining(self, key: str, finished_at: float, now: float) -> float:
        entry = self._entries.get(key)
        return 0.0 if entry is None else max(0.0, entry.backoff - (now - finished_at))

    def get(self, key: str) -> float:
        entry = self._entries.get(key)
        return 0.0 if entry is None else entry.backoff

    def next(self, key: str, finished_at: float, now: float) -> None:
        """A restart goes ahead: start the entry at `initial`, or double it (Next)."""
        entry = self._entries.get(key)
        if entry is None or self._expired(entry, finished_at):
            self._entries[key] = _Entry(self.initial, now)
        else:
            entry.backoff = min(entry.backoff * 2, self.maximum)
            entry.last_update = now

    def forget(self, prefix: str) -> None:
        """Drop the entries of a pod that is gone (the kubelet's GC of its back-off)."""
        for key in [k for k in self._entries if k.startswith(prefix)]:
            del self._entries[key]


def duration_text(seconds: float) -> str:
    """Go's time.Duration String() for the whole seconds and minutes the back-off takes: 10s, 1m20s, 5m0s."""
    whole = int(round(seconds))
    if whole < 60:
        return f"{whole}s"
    return f"{whole // 60}m{whole % 60}s"
