"""The embedded Kubernetes-compatible control plane: in-memory, loopback-only, optionally persisted."""

from gpudra.apiserver.server import EmbeddedApiServer, check_loopback
from gpudra.apiserver.store import Admission

__all__ = ["Admission", "EmbeddedApiServer", "check_loopback"]
