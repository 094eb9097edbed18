"""The embedded Kubernetes-compatible control plane: in-memory, loopback-only, optionally persisted."""

from controlplane.server import EmbeddedApiServer, check_loopback
from gpudra.validation.admission import Admission

__all__ = ["Admission", "EmbeddedApiServer", "check_loopback"]
