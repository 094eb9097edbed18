"""Kubernetes' resource.k8s.io validation as one admission callable: the interface between the validation rules
(shared by `gpu-dra validate`, the webhook and the embedded control plane) and whoever admits objects."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from gpudra.validation import validate_object, validate_update
from gpudra.validation.common import CelChecker, OpaqueValidators

# (object, the stored object on an update or None on a create) -> error texts, empty when admitted.
Admission = Callable[[dict[str, Any], "dict[str, Any] | None"], list[str]]


def validating_admission(cel: CelChecker | None, opaque: OpaqueValidators, kubernetes_version: str = "1.37") -> Admission:
    """An admission callable running `gpudra.validation.validate_object` on a create and `validate_update` on
    an update (Kubernetes' update strategies), with the given CEL checker and opaque config validators (the
    caller supplies them: the shared package knows neither the CEL engine nor a driver)."""
    # The CEL checker caches compiled environments; one validation at a time keeps that cache consistent.
    lock = threading.Lock()

    def admit(obj: dict[str, Any], old: dict[str, Any] | None) -> list[str]:
        with lock:
            if old is None:
                errors = validate_object(obj, cel=cel, opaque=opaque, kubernetes_version=kubernetes_version)
            else:
                errors = validate_update(obj, old, cel=cel, opaque=opaque, kubernetes_version=kubernetes_version)
            return [str(e) for e in errors]

    return admit
