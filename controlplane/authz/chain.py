"""kube-apiserver's authorizer union: system:masters first (the privileged-group authorizer every server
has), then Node, then RBAC; the first decision that is not "no opinion" wins, and the reasons of those that had
none are joined into the refusal, as union.Authorize does."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from controlplane.authn import MASTERS_GROUP
from controlplane.authz.attributes import ALLOW, NO_OPINION, Attributes, Decision, Verdict, forbidden


class Authorizer(Protocol):
    def authorize(self, a: Attributes) -> Verdict: ...


class AuthorizerChain:
    def __init__(self, authorizers: Sequence[Authorizer]) -> None:
        self._authorizers = tuple(authorizers)

    def authorize(self, a: Attributes) -> Verdict:
        if MASTERS_GROUP in a.user.groups:
            return ALLOW
        reasons: list[str] | None = None
        for authz in self._authorizers:
            verdict = authz.authorize(a)
            if verdict.decision is not Decision.NO_OPINION:
                return verdict
            if verdict.reason:
                reasons = [*(reasons or ()), verdict.reason]
        return Verdict(Decision.NO_OPINION, ", ".join(reasons)) if reasons else NO_OPINION

    def require(self, a: Attributes) -> None:
        """Raise kube-apiserver's 403 unless `a` is allowed."""
        verdict = self.authorize(a)
        if not verdict.allowed:
            raise forbidden(a, verdict.reason)

