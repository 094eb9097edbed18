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
        # (group, kind) -> the plugins that act on it, in chain order: every write passes the chain, and most
        # plugins concern one or two kinds.
        self._by_kind: dict[tuple[str, str], tuple[Plugin, ...]] = {}

    def _plugins_for(self, rt: ResourceType) -> tuple[Plugin, ...]:
        key = (rt.group, rt.kind)
        found = self._by_kind.get(key)
        if found is None:
            found = tuple(p for p in self.plugins if p.kinds is None or key in p.kinds)
            self._by_kind[key] = found
        return found

    def mutate(self, req: AdmissionRequest, obj: dict[str, Any] | None, old: dict[str, Any] | None,
               warnings: list[str]) -> bool:
        changed = False
        for mutator in self.mutators:
            changed = mutator.mutate(req, obj, old, warnings) or changed
        return changed

    def admit(self, req: AdmissionRequest, obj: dict[str, Any] | None, old: dict[str, Any] | None,
              warnings: list[str]) -> None:
        for plugin in self._plugins_for(req.rt):
            plugin.admit(req, obj, old, warnings)


class RequestAdmission:
    """One request's admission, as the store runs it on each object the request writes (mutate, then the
    store's own validation, then the validating plugins) and the handler on a delete."""

    __slots__ = ("_chain", "_request_of", "_warnings", "_mutators", "_last")

    def __init__(self, chain: AdmissionChain, request: Callable[[ResourceType, str], AdmissionRequest],
                 warnings: Callable[[], list[str]]) -> None:
        self._chain = chain
        self._request_of = request
        self._warnings = warnings
        self._mutators: bool | None = None
        self._last: AdmissionRequest | None = None

    def _request(self, rt: ResourceType, name: str) -> AdmissionRequest:
        # Mutation and validation of one object see the same request; a request usually writes one object.
        last = self._last
        if last is None or last.rt is not rt or last.name != name:
            last = self._last = self._request_of(rt, name)
        return last

    def _mutating(self) -> bool:
        # Whether any mutating webhook is configured, read once per request (the configuration a request
        # starts with is the one it is admitted by, as kube-apiserver's informer-fed plugins read it).
        if self._mutators is None:
            self._mutators = any(m.configured() for m in self._chain.mutators)
        return self._mutators

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
