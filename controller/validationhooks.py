"""The validation hooks gpu-dra installs: the CEL checker and our GpuConfig opaque-parameter check.

Every caller (`gpu-dra validate`, `allocate`/`explain`, the embedded API server's admission) gets the same hooks
from here, so an object is judged the same way offline and by the server.
"""

from __future__ import annotations

from gpudra import DEFAULT_DRIVER_NAME
from gpudra.apiserver.admission import validating_admission
from gpudra.apiserver.store import Admission
from gpudra.deviceconfig import validate_parameters
from gpudra.validation.common import CelChecker, OpaqueValidators
from controller.cel.check import Checker


def cel_checker() -> CelChecker:
    """A CEL compile/cost checker that reuses its environments across calls."""
    return Checker()


def opaque_validators(driver_name: str = DEFAULT_DRIVER_NAME) -> OpaqueValidators:
    """Our GpuConfig schema check for opaque parameters addressed to `driver_name`."""
    return {driver_name: validate_parameters}


def validation_admission(driver_name: str = DEFAULT_DRIVER_NAME, kubernetes_version: str = "1.37") -> Admission:
    """The embedded API server's admission: Kubernetes' validation (of that release) with both hooks."""
    return validating_admission(cel_checker(), opaque_validators(driver_name), kubernetes_version)
