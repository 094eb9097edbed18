"""Wiring Kubernetes' resource.k8s.io validation (gpudra.validation) into the embedded server's admission."""

from __future__ import annotations

import importlib
import threading
from typing import Any

from gpudra.apiserver.store import Admission

DEFAULT_DRIVER_NAME = "gpu.nvidia.com"


def _optional(module: str, attr: str) -> Any:
    """`module.attr`, or None when that module is not part of this installation."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module == exc.name or module.startswith(exc.name + ".")):
            return None
        raise
    return getattr(mod, attr, None)


def validation_admission(driver_name: str = DEFAULT_DRIVER_NAME) -> Admission | None:
    """An admission callable running `gpudra.validation.validate_object` (with the CEL checker and our opaque
    config validator when those are installed), or None when gpudra.validation is not available."""
    validate_object = _optional("gpudra.validation", "validate_object")
    if validate_object is None:
        return None
    checker_cls = _optional("controller.cel.check", "Checker")
    cel = checker_cls() if checker_cls is not None else None
    validate_parameters = _optional("driver.config", "validate_parameters")
    opaque = {driver_name: validate_parameters} if validate_parameters is not None else None
    # The CEL checker caches compiled environments; one validation at a time keeps that cache consistent.
    lock = threading.Lock()

    def admit(obj: dict[str, Any], old: dict[str, Any] | None) -> list[str]:
        with lock:
            return [str(e) for e in validate_object(obj, cel=cel, opaque=opaque)]

    return admit
