"""Kubernetes' DRA CEL environment on cel-expr-python.

``CelEnvironment(strict=False).compile(expr) -> Selector``; ``Selector.matches(DeviceView) -> bool``.
"""

from controller.cel.check import check
from controller.cel.device import DeviceView
from controller.cel.environment import COST_LIMIT, CelEnvironment, Selector
from controller.cel.errors import CelCompileError, CelRuntimeError, selector_error

__all__ = ["COST_LIMIT", "CelCompileError", "CelEnvironment", "CelRuntimeError", "DeviceView", "Selector", "check",
           "selector_error"]
