"""The validating admission chain in kube-apiserver's plugin order: NodeRestriction, the resource.k8s.io
strategy rules that need a lookup or the authorizer (DRAAdminAccess, granular claim status), Pod validation,
ValidatingAdmissionPolicy, ValidatingAdmissionWebhook."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from controlplane.admission.request import AdmissionRequest, Plugin


class AdmissionChain:
    def __init__(self, plugins: Sequence[Plugin]) -> None:
        self.plugins = tuple(plugins)

    def admit(self, req: AdmissionRequest, obj: dict[str, Any] | None, old: dict[str, Any] | None,
              warnings: list[str]) -> None:
        for plugin in self.plugins:
            plugin.admit(req, obj, old, warnings)
