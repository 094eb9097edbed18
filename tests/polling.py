"""Waiting for a condition in end-to-end tests: poll until it holds, fail with what was awaited."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(what: str, check: Callable[[], T | None], timeout: float = 30.0, interval: float = 0.2) -> T:
    """The first truthy value `check` returns; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)
