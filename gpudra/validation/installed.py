"""The validation hooks this installation provides: the CEL checker (controller side) and our GpuConfig
opaque-parameter check (driver side).

Both live in packages a node-only or cluster-only install may lack, so each is looked up at run time and
left out when its package is absent; every caller (`gpu-dra validate`, `allocate`/`explain`, the embedded
API server's admission) gets the same hooks from here.
"""

from __future__ import annotations

import importlib
from typing import Any

from gpudra import DEFAULT_DRIVER_NAME
from gpudra.validation.common import CelChecker, OpaqueValidators


def _optional(module: str, attr: str) -> Any:
    """`module.attr`, or None when that module is not part of this installation."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        # Only the module itself being absent means "not installed"; a missing dependency inside it is a bug.
        if exc.name is not None and (module == exc.name or module.startswith(exc.name + ".")):
            return None
        raise
    return getattr(mod, attr, None)


def cel_checker() -> CelChecker | None:
    """A CEL compile/cost checker that reuses its environments across calls, or None without controller.cel."""
    checker_cls = _optional("controller.cel.check", "Checker")
    return checker_cls() if checker_cls is not None else None


def opaque_validators(driver_name: str = DEFAULT_DRIVER_NAME) -> OpaqueValidators:
    """Our GpuConfig schema check for opaque parameters addressed to `driver_name`; empty without driver.config."""
    validate_parameters = _optional("driver.config", "validate_parameters")
    return {driver_name: validate_parameters} if validate_parameters is not None else {}
