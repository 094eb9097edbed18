"""A wall-clock bound on one selector evaluation.

Kubernetes stops an evaluation at its runtime cost limit; cel-expr-python has no runtime cost hook and cannot be
interrupted from outside. The static cost estimate (cost.py) already refuses expressions whose worst case is over
the limit, so what is left is time spent in the functions we implement in Python (quantity, semver, regex, list
functions): each checks this deadline first and fails once it has passed, which ends the evaluation quickly
(every later call fails at once) and makes its result an error, never a match. One evaluation cannot then hold
the scheduler, and another tenant's pod, for longer than the bound plus what cel-cpp itself does (bounded by the
cost limit).
"""

from __future__ import annotations

import threading
import time

# Long enough for any selector within the cost limit on a loaded machine (a typical one takes ~15 µs), short
# enough that a pass over a node's devices is not held up by one hostile expression.
DEFAULT_EVALUATION_SECONDS = 0.25


def interrupted_message(seconds: float) -> str:
    """cel-go's text for an interrupted evaluation, with the bound that interrupted it."""
    return f"operation interrupted: the evaluation ran longer than {seconds:g} s"


class EvaluationDeadline:
    """The deadline of the evaluation in progress on each thread (evaluations of one environment may run on
    several threads)."""

    def __init__(self, seconds: float = DEFAULT_EVALUATION_SECONDS) -> None:
        self.seconds = seconds
        self._local = threading.local()

    def start(self) -> None:
        self._local.until = time.monotonic() + self.seconds
        self._local.expired = False

    def check(self) -> None:
        """Raise ValueError (a CEL error value) when the evaluation in progress is past its deadline."""
        until = getattr(self._local, "until", None)
        if until is not None and time.monotonic() > until:
            self._local.expired = True
            raise ValueError(interrupted_message(self.seconds))

    def finish(self) -> bool:
        """End the evaluation; True when it ran past its deadline inside one of our functions."""
        expired = bool(getattr(self._local, "expired", False))
        self._local.until = None
        self._local.expired = False
        return expired
