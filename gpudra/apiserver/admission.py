"""Wiring Kubernetes' resource.k8s.io validation (gpudra.validation) into the embedded server's admission."""

from __future__ import annotations

import threading
from typing import Any

from gpudra import DEFAULT_DRIVER_NAME
from gpudra.apiserver.store import Admission
from gpudra.validation import validate_object
from gpudra.validation.installed import cel_checker, opaque_validators


def validation_admission(driver_name: str = DEFAULT_DRIVER_NAME) -> Admission:
    """An admission callable running `gpudra.validation.validate_object` with the CEL checker and our opaque
    config validator where those are installed."""
    cel = cel_checker()
    opaque = opaque_validators(driver_name)
    # The CEL checker caches compiled environments; one validation at a time keeps that cache consistent.
    lock = threading.Lock()

    def admit(obj: dict[str, Any], old: dict[str, Any] | None) -> list[str]:
        with lock:
            return [str(e) for e in validate_object(obj, cel=cel, opaque=opaque)]

    return admit
