"""API work of the embedded scheduler that runs beside its placement loop.

Each write is a round trip to the API server. Done one after another on the scheduling thread, the controller
and the server take turns and each idles while the other works. kube-scheduler overlaps them the same way: its
scheduling cycle places one pod at a time and hands the pod's binding (PreBind writes, Bind) to a goroutine.
Here placement stays on the scheduling thread, one pod at a time in queue order (placements do not depend on
timing), while a pool runs the writes: a pod's binding behind its placement, and the next pods' template
expansion ahead of theirs.

`InFlight` tracks the binding jobs of one pass: at most `limit` at once, each with the claims it writes, so that
a pod sharing a claim with a binding still in flight waits for it (and then sees its result) instead of racing it.
Jobs catch their own failures and return them as results, so that every finished job is accounted for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from typing import Generic, TypeVar

T = TypeVar("T")


class InFlight(Generic[T]):
    def __init__(self, pool: Executor, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit {limit}: at least one job must be allowed in flight")
        self._pool = pool
        self._limit = limit
        self._jobs: dict[Future[T], frozenset[str]] = {}

    def __len__(self) -> int:
        return len(self._jobs)

    def submit(self, job: Callable[[], T], claims: Iterable[str]) -> list[T]:
        """Start `job`; returns the results of jobs that finished, after waiting for one while `limit` run."""
        results = self.finished()
        while len(self._jobs) >= self._limit:
            wait(self._jobs, return_when=FIRST_COMPLETED)
            results += self.finished()
        self._jobs[self._pool.submit(job)] = frozenset(claims)
        return results

    def touching(self, claims: Iterable[str]) -> bool:
        wanted = set(claims)
        return any(keys & wanted for keys in self._jobs.values())

    def finished(self, *, claims: Iterable[str] = (), everything: bool = False) -> list[T]:
        """The results of the jobs done so far, after waiting for every job (`everything`) or for those writing
        any of `claims`. Jobs report their failures in their results: an exception here is a bug in a job."""
        wanted = set(claims)
        must = [f for f, keys in self._jobs.items() if everything or keys & wanted]
        if must:
            wait(must)
        done = [f for f in self._jobs if f.done()]
        for future in done:
            del self._jobs[future]
        return [f.result() for f in done]
