"""The RBAC authorizer (plugin/pkg/auth/authorizer/rbac): Roles, ClusterRoles (with aggregation, as
kube-controller-manager's clusterrole-aggregation controller fills them) and their bindings, read from what was
applied. The rules are indexed once per change of any RBAC object, not per request."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from controlplane.authn import SA_PREFIX, UserInfo
from controlplane.authz.attributes import NO_OPINION, Attributes, Decision, Verdict
from gpudra.labelselector import selects


@dataclass(frozen=True)
class Rule:
    verbs: frozenset[str]
    api_groups: frozenset[str]
    resources: frozenset[str]
    resource_names: frozenset[str]
    non_resource_urls: tuple[str, ...]

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> Rule:
        return cls(frozenset(raw.get("verbs") or ()), frozenset(raw.get("apiGroups") or ()),
                   frozenset(raw.get("resources") or ()), frozenset(raw.get("resourceNames") or ()),
                   tuple(raw.get("nonResourceURLs") or ()))

    def allows(self, a: Attributes) -> bool:
        """rbac.RuleAllows."""
        if "*" not in self.verbs and a.verb not in self.verbs:
            return False
        if not a.resource_request:
            return any(u == "*" or u == a.path or (u.endswith("*") and a.path.startswith(u[:-1]))
                       for u in self.non_resource_urls)
        if "*" not in self.api_groups and a.api_group not in self.api_groups:
            return False
        if a.subresource:
            combined = f"{a.resource}/{a.subresource}"
            if not ({"*", combined, f"*/{a.subresource}"} & self.resources):
                return False
        elif "*" not in self.resources and a.resource not in self.resources:
            return False
        return not self.resource_names or a.name in self.resource_names


def _rules(raw: Any) -> tuple[Rule, ...]:
    return tuple(Rule.parse(r) for r in raw or () if isinstance(r, dict))


def _subject_matches(subject: dict[str, Any], user: UserInfo, binding_namespace: str) -> bool:
    """rbac.appliesToUser."""
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return bool(name == user.name)
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return bool(namespace) and user.name == f"{SA_PREFIX}{namespace}:{name}"
    return False


@dataclass(frozen=True)
class _Binding:
    namespace: str  # "" for a ClusterRoleBinding
    subjects: tuple[dict[str, Any], ...]
    rules: tuple[Rule, ...]
    # `ClusterRoleBinding "b" of ClusterRole "r"`, `RoleBinding "b/ns" of Role "r"`: what an allow names.
    source: str = ""

    def reason(self, subject: dict[str, Any]) -> str:
        """The allow's reason, as the RBAC authorizer's describers write it."""
        kind, name = subject.get("kind"), subject.get("name")
        if kind == "ServiceAccount":
            name = f"{name}/{subject.get('namespace') or self.namespace}"
        return f'RBAC: allowed by {self.source} to {kind} "{name}"'


class RbacIndex:
    """Every binding with the rules of the role it references (absent roles grant nothing)."""

    def __init__(self, roles: Iterable[dict[str, Any]], cluster_roles: Iterable[dict[str, Any]],
                 role_bindings: Iterable[dict[str, Any]], cluster_role_bindings: Iterable[dict[str, Any]]) -> None:
        crs = {(c.get("metadata") or {}).get("name"): c for c in cluster_roles}
        cluster_rules = {name: self._cluster_role_rules(c, crs) for name, c in crs.items()}
        role_rules = {((r.get("metadata") or {}).get("namespace"), (r.get("metadata") or {}).get("name")):
                      _rules(r.get("rules")) for r in roles}
        bindings: list[_Binding] = []
        for b in cluster_role_bindings:
            ref = b.get("roleRef") or {}
            if ref.get("kind") == "ClusterRole" and ref.get("name") in cluster_rules:
                source = f'ClusterRoleBinding "{(b.get("metadata") or {}).get("name")}" of ClusterRole "{ref["name"]}"'
                bindings.append(_Binding("", tuple(b.get("subjects") or ()), cluster_rules[ref["name"]], source))
        for b in role_bindings:
            ns = (b.get("metadata") or {}).get("namespace") or ""
            ref = b.get("roleRef") or {}
            rules = (cluster_rules.get(ref.get("name")) if ref.get("kind") == "ClusterRole"
                     else role_rules.get((ns, ref.get("name"))))
            if rules:
                source = (f'RoleBinding "{(b.get("metadata") or {}).get("name")}/{ns}" of {ref.get("kind")} '
                          f'"{ref.get("name")}"')
                bindings.append(_Binding(ns, tuple(b.get("subjects") or ()), rules, source))
        self.bindings = tuple(bindings)

    @staticmethod
    def _cluster_role_rules(role: dict[str, Any], all_roles: dict[Any, dict[str, Any]]) -> tuple[Rule, ...]:
        aggregation = role.get("aggregationRule")
        if not isinstance(aggregation, dict):
            return _rules(role.get("rules"))
        out: list[Rule] = []
        for selector in aggregation.get("clusterRoleSelectors") or ():
            for other in all_roles.values():
                if other is role or other.get("aggregationRule"):
                    continue
                if selects(selector, (other.get("metadata") or {}).get("labels") or {}):
                    out.extend(r for r in _rules(other.get("rules")) if r not in out)
        return tuple(out)

    def allowed_by(self, user: UserInfo, namespace: str, a: Attributes) -> str | None:
        """The reason of the first binding whose rules allow `a`, None when none does."""
        for b in self.bindings:
            if b.namespace and b.namespace != namespace:
                continue
            subject = next((s for s in b.subjects if _subject_matches(s, user, b.namespace)), None)
            if subject is not None and any(rule.allows(a) for rule in b.rules):
                return b.reason(subject)
        return None

    def rules_for(self, user: UserInfo, namespace: str) -> Iterable[Rule]:
        for b in self.bindings:
            if b.namespace and b.namespace != namespace:
                continue
            if any(_subject_matches(s, user, b.namespace) for s in b.subjects):
                yield from b.rules


# () -> (a key that changes whenever any RBAC object changes, roles, cluster roles, role bindings, cluster
# role bindings).
RbacSource = Callable[[], "tuple[Any, list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]"]
RbacVersion = Callable[[], Any]


class RbacAuthorizer:
    def __init__(self, version: RbacVersion, load: RbacSource) -> None:
        self._version = version
        self._load = load
        self._lock = threading.Lock()
        self._key: Any = object()
        self._index = RbacIndex((), (), (), ())
        # Decisions by the request's attributes, for the current index: components repeat the same few requests.
        self._decisions: dict[tuple[Any, ...], Verdict] = {}

    def index(self) -> RbacIndex:
        key = self._version()
        if key != self._key:
            with self._lock:
                if key != self._key:
                    _, roles, crs, rbs, crbs = self._load()
                    self._index = RbacIndex(roles, crs, rbs, crbs)
                    self._decisions = {}
                    self._key = key
        return self._index

    def authorize(self, a: Attributes) -> Verdict:
        index = self.index()
        decisions = self._decisions
        u = a.user
        key = (u.name, u.groups, a.verb, a.resource_request, a.api_group, a.resource, a.subresource, a.namespace,
               a.name, a.path)
        verdict = decisions.get(key)
        if verdict is None:
            reason = index.allowed_by(u, a.namespace if a.resource_request else "", a)
            verdict = Verdict(Decision.ALLOW, reason) if reason is not None else NO_OPINION
            if len(decisions) > 50000:
                decisions.clear()
            decisions[key] = verdict
        return verdict
