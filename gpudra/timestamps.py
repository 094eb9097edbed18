"""Kubernetes' timestamps as JSON carries them: metav1.Time (RFC 3339, seconds, UTC 'Z') and MicroTime."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

_TIME = "%Y-%m-%dT%H:%M:%SZ"
_MICRO_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"


def rfc3339(moment: datetime | None = None) -> str:
    """A metav1.Time value for `moment` (an aware datetime), or for now."""
    return (moment or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime(_TIME)


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
