"""Structured `key=value` log lines (logfmt) for long-running loops on either side (controller, node plugin)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

# Attributes every LogRecord has; anything else on a record came from `extra=` and is a field.
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()) | {"message", "asctime"}


def quote(value: object) -> str:
    """Render one value so that a logfmt parser reads it back unchanged."""
    text = "" if value is None else str(value)
    if text and not any(c in text for c in ' "=\\\n\t'):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{escaped}"'


def format_fields(fields: Mapping[str, object]) -> str:
    """`key=value ...` in the mapping's order."""
    return " ".join(f"{key}={quote(value)}" for key, value in fields.items())


class LogfmtFormatter(logging.Formatter):
    """`ts=... level=... logger=... msg=... key=value...`; fields come from `extra=`."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRS and not key.startswith("_"):
                fields[key] = value
        if record.exc_info:
            fields["error"] = self.formatException(record.exc_info)
        return format_fields(fields)


def configure(level: int = logging.INFO) -> None:
    """Route the root logger to stderr in logfmt (called once by the command entry point)."""
    handler = logging.StreamHandler()
    handler.setFormatter(LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # urllib3 logs every connection retry of every request; our loops log one line per backoff step instead.
    logging.getLogger("urllib3").setLevel(max(level, logging.ERROR))
