"""driver.publisherseat: which agent instance on a node publishes the pool."""

from __future__ import annotations

from pathlib import Path

from driver.publisherseat import SEAT_NAME, Holder, PublisherSeat


def _seat(tmp_path: Path, instance: str, started: int, alive: set[str]) -> PublisherSeat:
    return PublisherSeat(tmp_path, Holder(instance, started), lambda other: other in alive)


def _take(seat: PublisherSeat) -> bool:
    with seat.publishing() as ours:
        return ours


def test_the_newest_live_instance_holds_the_seat(tmp_path: Path) -> None:
    alive = {"old", "new"}
    old, new = _seat(tmp_path, "old", 100, alive), _seat(tmp_path, "new", 200, alive)
    assert _take(old) and old.holder() == Holder("old", 100)
    assert _take(new) and old.holder() == Holder("new", 200)
    # A kubelet restart registers both again: the older one does not take the seat back while the newer one serves.
    assert not _take(old)
    with old.publishing() as ours:
        assert not ours
    with new.publishing() as ours:
        assert ours
    # The newer one is gone (its sockets no longer answer): the older one publishes again.
    alive.discard("new")
    with old.publishing() as ours:
        assert ours
    assert new.holder() == Holder("old", 100)


def test_an_unreadable_seat_is_taken_anew(tmp_path: Path) -> None:
    (tmp_path / SEAT_NAME).write_text("{not json")
    seat = _seat(tmp_path, "a", 1, set())
    assert seat.holder() is None and _take(seat) and seat.holder() == Holder("a", 1)
