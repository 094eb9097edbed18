"""The admission chain in kube-apiserver's plugin order: the mutating plugins (MutatingAdmissionWebhook) on the
object before it is validated, then the validating ones: NodeRestriction, the resource.k8s.io strategy rules
that need a lookup or the authorizer (DRAAdminAccess, granular claim status), Pod validation,
ValidatingAdmissionPolicy, ValidatingAdmissionWebhook."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from controlplane.admission.request import AdmissionRequest, Plugin
from controlplane.objects import replace_content
from controlplane.resources import ResourceType


class Mutator(Protocol):
    def configured(self) -> bool: ...

    def mutate(self, req: AdmissionRequest, obj: dict[str, Any] | None, old: dict[str, Any] | None,
               warnings: list[str]) -> bool: ...


class AdmissionChain:
    def __init__(self, plugins: Sequence[Plugin], mutators: Sequence[Mutator] = ()) -> None:
        self.plugins = tuple(plugins)
        self.mutators = tuple(mutators)

    def mutate(self, req: AdmissionRequest, obj: dict[str, Any] | None, old: dict[str, Any] | None,
               warnings: list[str]) -> bool:
        changed = False
        for mutator in self.mutators:
            changed = mutator.mutate(req, obj, old, warnings) or changed
        return changed

    def admit(self, req: AdmissionRequest, obj: dict[str, Any] | None, old: dict[str, Any] | None,
              warnings: list[str]) -> None:
        for plugin in self.plugins:
            plugin.admit(req, obj, old, warnings)


class RequestAdmission:
    """One request's admission, as the store runs it on each object the request writes (mutate, then the
    store's own validation, then the validating plugins) and the handler on a delete."""

    __slots__ = ("_chain", "_request", "_warnings")

    def __init__(self, chain: AdmissionChain, request: Callable[[ResourceType, str], AdmissionRequest],
                 warnings: Callable[[], list[str]]) -> None:
        self._chain = chain
        self._request = request
        self._warnings = warnings

    def _mutating(self) -> bool:
        return any(m.configured() for m in self._chain.mutators)

    def mutate(self, rt: ResourceType, name: str, obj: dict[str, Any], old: dict[str, Any] | None) -> bool:
        if not self._mutating():
            return False
        req = self._request(rt, name)
        if not self._chain.mutate(req, obj, old, self._warnings()):
            return False
        if req.subresource == "status" and old is not None:
            # The status strategy runs after admission: a status write changes nothing but the status.
            kept = {k: v for k, v in old.items() if k != "status"}
            replace_content(obj, {**kept, "status": obj["status"]} if "status" in obj else kept)
        return True

    def __call__(self, rt: ResourceType, name: str, obj: dict[str, Any] | None, old: dict[str, Any] | None) -> None:
        req = self._request(rt, name)
        if obj is None and self._mutating():  # a delete: its mutating webhooks may refuse it too
            self._chain.mutate(req, None, old, self._warnings())
        self._chain.admit(req, obj, old, self._warnings())
