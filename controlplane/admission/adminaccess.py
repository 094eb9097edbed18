"""DRAAdminAccess: a claim or claim template asking for adminAccess is only valid in a namespace labelled
`resource.kubernetes.io/admin-access: "true"` (the resource.k8s.io strategies' AuthorizedForAdmin)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from controlplane import status as st
from controlplane.admission.request import AdmissionRequest

ADMIN_NAMESPACE_LABEL = "resource.kubernetes.io/admin-access"
_MESSAGE = (f"admin access to devices requires the `{ADMIN_NAMESPACE_LABEL}: true` label on the containing "
            "namespace")

NamespaceLookup = Callable[[str], "dict[str, Any] | None"]


def admin_access_errors(spec: Any, path: str, namespace_labels: dict[str, str]) -> list[str]:
    if namespace_labels.get(ADMIN_NAMESPACE_LABEL) == "true":
        return []
    requests = ((spec or {}).get("devices") or {}).get("requests") or [] if isinstance(spec, dict) else []
    errors = []
    for i, request in enumerate(requests):
        exactly = request.get("exactly") if isinstance(request, dict) else None
        if isinstance(exactly, dict) and exactly.get("adminAccess") is True:
            errors.append(f"{path}.devices.requests[{i}].exactly.adminAccess: Forbidden: {_MESSAGE}")
    return errors


class AdminAccessPlugin:
    kinds = frozenset({("resource.k8s.io", "ResourceClaim"), ("resource.k8s.io", "ResourceClaimTemplate")})

    def __init__(self, namespace: NamespaceLookup, enabled: bool) -> None:
        self._namespace = namespace
        self._enabled = enabled

    def admit(self, req: AdmissionRequest, obj: dict[str, Any] | None, old: dict[str, Any] | None,
              warnings: list[str]) -> None:
        if not self._enabled or obj is None or req.rt.group != "resource.k8s.io" or req.subresource:
            return
        if req.rt.kind == "ResourceClaim":
            spec, path = obj.get("spec"), "spec"
        elif req.rt.kind == "ResourceClaimTemplate":
            spec, path = (obj.get("spec") or {}).get("spec"), "spec.spec"
        else:
            return
        if req.operation == "UPDATE" and old is not None and old.get("spec") == obj.get("spec"):
            return  # the spec is immutable; an unchanged one was checked when it was created
        if not admin_access_errors(spec, path, {}):
            return  # no request asks for admin access: the namespace is not looked up
        ns = self._namespace(req.namespace) or {}
        errors = admin_access_errors(spec, path, (ns.get("metadata") or {}).get("labels") or {})
        if errors:
            raise st.invalid(req.rt, req.name, errors)
