"""sim.roles.inflight: the scheduler's bindings in flight, bounded, and ordered by the claims they write."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from sim.roles.inflight import InFlight


def test_jobs_are_bounded_and_a_shared_claim_waits_for_its_writer() -> None:
    release = {name: threading.Event() for name in ("a", "b", "c")}
    running: list[str] = []

    def job(name: str) -> str:
        running.append(name)
        release[name].wait(10)
        return name

    with ThreadPoolExecutor(4) as pool:
        flight: InFlight[str] = InFlight(pool, limit=2)
        assert flight.submit(lambda: job("a"), ["ns/c1"]) == []
        assert flight.submit(lambda: job("b"), ["ns/c2"]) == []
        assert len(flight) == 2 and flight.touching(["ns/c2", "ns/x"]) and not flight.touching(["ns/x"])
        # A third job waits for a slot; releasing "b" frees one and its result comes back with the submit.
        threading.Timer(0.05, release["b"].set).start()
        assert flight.submit(lambda: job("c"), ["ns/c3"]) == ["b"]
        # Waiting for claim c1 returns a's result (and whatever else finished), not c's while it runs.
        release["a"].set()
        assert flight.finished(claims=["ns/c1"]) == ["a"]
        release["c"].set()
        assert flight.finished(everything=True) == ["c"] and len(flight) == 0


def test_a_limit_below_one_is_refused() -> None:
    with ThreadPoolExecutor(1) as pool, pytest.raises(ValueError, match="at least one job"):
        InFlight(pool, limit=0)
