"""What every admission plugin sees of one write (admission.Attributes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from controlplane.authn import UserInfo
from controlplane.authz.attributes import Attributes, Verdict
from controlplane.resources import ResourceType


class Authorize(Protocol):
    def authorize(self, a: Attributes) -> Verdict: ...


class AuditAnnotations(Protocol):
    def annotate(self, key: str, value: str, level: str = "Metadata") -> None:
        """Add an annotation to the request's audit event (kept only at `level` or above; the first value
        of a key wins, as audit.AddAuditAnnotation keeps it)."""


@dataclass(slots=True)
class AdmissionRequest:
    user: UserInfo
    operation: str  # CREATE, UPDATE, DELETE
    rt: ResourceType
    namespace: str
    name: str
    subresource: str
    verb: str  # the authorization verb of the request (create, update, patch, delete)
    dry_run: bool
    authorizer: Authorize
    version: str = ""  # the API version the request was made in (matchPolicy: Exact)
    audit: AuditAnnotations | None = None  # the request's audit event, when one is recorded

    def annotate(self, key: str, value: str, level: str = "Metadata") -> None:
        if self.audit is not None:
            self.audit.annotate(key, value, level)

    @property
    def resource(self) -> str:
        return f"{self.rt.plural}/{self.subresource}" if self.subresource else self.rt.plural


class Plugin(Protocol):
    # The (group, kind)s the plugin acts on; None: every kind. The chain calls it for those only.
    kinds: frozenset[tuple[str, str]] | None

    def admit(self, req: AdmissionRequest, obj: dict[str, Any] | None, old: dict[str, Any] | None,
              warnings: list[str]) -> None:
        """Raise a StatusError to refuse; append to `warnings` to warn."""
