"""The validation hook: does a selector compile and stay within the cost limit?"""

from __future__ import annotations

from dataclasses import dataclass, field

from controller.cel.environment import CelEnvironment


@dataclass
class Checker:
    """Holds one environment per strictness so repeated checks reuse compiled expressions."""

    _envs: dict[bool, CelEnvironment] = field(default_factory=dict)

    def __call__(self, expression: str, strict: bool) -> str | None:
        env = self._envs.get(strict)
        if env is None:
            env = self._envs[strict] = CelEnvironment(strict=strict)
        return env.check(expression)


def check(expression: str, strict: bool) -> str | None:
    """None when ``expression`` is a valid selector, else Kubernetes' error text.

    Builds a fresh environment per call; callers checking many expressions should keep a ``Checker``.
    """
    return CelEnvironment(strict=strict).check(expression)
