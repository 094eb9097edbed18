"""Kubernetes' timestamps as JSON carries them: metav1.Time (RFC 3339, seconds, UTC 'Z') and MicroTime."""

from __future__ import annotations

import functools
import time
from datetime import datetime, timedelta, timezone
from typing import Any

_TIME = "%Y-%m-%dT%H:%M:%SZ"
_MICRO_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"


def _utc(moment: datetime | None) -> datetime:
    if moment is None:
        return datetime.now(timezone.utc)
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


@functools.lru_cache(maxsize=1)
def _second_text(second: int) -> str:
    # A server stamps many objects a second, and strftime costs more than the rest of a small write's
    # bookkeeping: each second is formatted once.
    return time.strftime(_TIME, time.gmtime(second))


def rfc3339(moment: datetime | None = None) -> str:
    """A metav1.Time value for `moment` (a naive datetime is read as UTC), or for now."""
    if moment is None:
        return _second_text(int(time.time()))
    return _utc(moment).strftime(_TIME)


def micro_rfc3339(moment: datetime | None = None) -> str:
    """A metav1.MicroTime value (microseconds; Leases, Events' eventTime) for `moment`, or for now."""
    return _utc(moment).strftime(_MICRO_TIME)


def rfc3339_in(seconds: float) -> str:
    """The metav1.Time `seconds` from now: when the next try is, in log lines that say so."""
    return rfc3339(datetime.now(timezone.utc) + timedelta(seconds=seconds))


def parse_rfc3339(text: Any) -> datetime | None:
    """An aware UTC datetime from a metav1.Time or MicroTime value; None when absent or malformed."""
    if not isinstance(text, str) or not text:
        return None
    for fmt in (_TIME, _MICRO_TIME):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
    return None
