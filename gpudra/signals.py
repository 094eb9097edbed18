"""SIGTERM and SIGINT as a stop event: every long-running command ends the same way, on either signal."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable


def stop_on_signals(stop: threading.Event | None = None,
                    notify: Callable[[signal.Signals], None] | None = None) -> threading.Event:
    """Install handlers for SIGTERM and SIGINT that set `stop` (a new event if none is given) and return it.

    `notify` is called first with the signal, for a command that logs why it stops. Must be called from the main
    thread, as `signal.signal` requires."""
    event = stop if stop is not None else threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        if notify is not None:
            notify(signal.Signals(signum))
        event.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return event
