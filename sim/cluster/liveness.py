"""The supervisor's liveness probe of the control plane, as kubeadm's static pod manifest gives kube-apiserver one
(an HTTPS GET of /livez every 10 s, restarted after 8 failures in a row): a server that is up but cannot serve
(its store failed on a full disk: /livez fails its etcd check) is restarted like one that exited."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass

PERIOD_S = 10.0
TIMEOUT_S = 5.0
FAILURE_THRESHOLD = 8


def livez(server: str, ca_pem: str | None, timeout: float = TIMEOUT_S) -> str | None:
    """None when the server's /livez answers 200 (anonymously, as a kubelet's probe asks); else why not."""
    context = ssl.create_default_context(cadata=ca_pem) if ca_pem and server.startswith("https:") else None
    try:
        with urllib.request.urlopen(f"{server}/livez", timeout=timeout, context=context) as resp:
            return None if resp.status == 200 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        body = exc.read(512).decode(errors="replace").strip().splitlines()
        return f"HTTP {exc.code}" + (f": {body[-1]}" if body else "")
    except (OSError, ValueError) as exc:
        return str(getattr(exc, "reason", None) or exc)


@dataclass
class Liveness:
    """Consecutive probe failures of one process; `record` says when it is to be restarted."""

    period_s: float = PERIOD_S
    threshold: int = FAILURE_THRESHOLD
    failures: int = 0
    last: str | None = None
    next_at: float = 0.0

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def record(self, now: float, failure: str | None) -> bool:
        """Note one probe's outcome; True when the threshold is reached (the count starts again)."""
        self.next_at = now + self.period_s
        if failure is None:
            self.failures, self.last = 0, None
            return False
        self.failures += 1
        self.last = failure
        if self.failures < self.threshold:
            return False
        self.failures = 0
        return True

    def restarted(self, now: float) -> None:
        """A new process: probe it after a period, with a clean count (kubeadm's initialDelaySeconds)."""
        self.failures, self.last, self.next_at = 0, None, now + self.period_s
