"""The device health the DRAResourceHealth stream reports: a versioned board that streams wait on."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

MAX_MESSAGE = 1024


@dataclass(frozen=True)
class DeviceHealthEntry:
    pool_name: str
    device_name: str
    healthy: bool | None  # None: unknown
    message: str = ""


class HealthBoard:
    """The complete device list with health; every `update` wakes all open streams."""

    def __init__(self, entries: Iterable[DeviceHealthEntry] = ()) -> None:
        self._cond = threading.Condition()
        self._entries: tuple[DeviceHealthEntry, ...] = tuple(entries)
        self._version = 0
        self._updated = int(time.time())
        self._closed = False

    def update(self, entries: Iterable[DeviceHealthEntry]) -> None:
        with self._cond:
            new = tuple(entries)
            if new == self._entries and self._version > 0:
                return
            self._entries = new
            self._version += 1
            self._updated = int(time.time())
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def snapshot(self) -> tuple[int, int, tuple[DeviceHealthEntry, ...]]:
        with self._cond:
            return self._version, self._updated, self._entries

    def wait_newer(self, version: int, timeout: float) -> tuple[int, int, tuple[DeviceHealthEntry, ...]] | None:
        """The next snapshot after `version`, or None on timeout or close."""
        with self._cond:
            self._cond.wait_for(lambda: self._version != version or self._closed, timeout)
            if self._closed or self._version == version:
                return None
            return self._version, self._updated, self._entries

    @property
    def closed(self) -> bool:
        return self._closed


def truncate_message(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."
