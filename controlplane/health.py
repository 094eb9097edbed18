"""/healthz, /livez and /readyz as kube-apiserver answers them: `ok` (200) while every check passes; otherwise
500 with one `[+]name ok` / `[-]name failed: reason withheld` line per check and `<endpoint> check failed`.
`?verbose` lists the checks either way. The `etcd` check fails once the durable store can no longer write (a
commit failed: full disk, I/O error), so that a supervisor or load balancer takes the server out of service."""

from __future__ import annotations

from collections.abc import Callable

ENDPOINTS = ("healthz", "livez", "readyz")


def report(endpoint: str, storage_failure: Callable[[], str | None], verbose: bool) -> tuple[int, bytes]:
    checks = [("ping", None), ("etcd", storage_failure())]
    failed = any(reason is not None for _, reason in checks)
    if not failed and not verbose:
        return 200, b"ok"
    lines = [f"[+]{name} ok" if reason is None else f"[-]{name} failed: reason withheld" for name, reason in checks]
    lines.append(f"{endpoint} check failed" if failed else f"{endpoint} check passed")
    return (500 if failed else 200), ("\n".join(lines) + "\n").encode()
