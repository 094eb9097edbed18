"""The audit policy (audit.k8s.io/v1 Policy) as kube-apiserver reads and applies it: the first rule that matches
the request gives its level (None when no rule matches) and the stages to omit (the policy's and the rule's).

A rule matches when every list it has contains the request's value: users (the user name), userGroups (any of
the user's groups), verbs; then resources and namespaces only match resource requests ("" in namespaces is a
cluster-scoped one; resources name `resource`, `resource/subresource`, `*`, `*/subresource` or `resource/*`, in
a group, optionally with resourceNames), and nonResourceURLs only non-resource ones (a path, or a prefix ending
in `*`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

LEVELS = ("None", "Metadata", "Request", "RequestResponse")
STAGES = ("RequestReceived", "ResponseStarted", "ResponseComplete", "Panic")
_RULE_FIELDS = ("level", "users", "userGroups", "verbs", "resources", "namespaces", "nonResourceURLs",
                "omitStages", "omitManagedFields")
_GROUP_FIELDS = ("group", "resources", "resourceNames")


class PolicyError(ValueError):
    """A policy file that cannot be used; the message names the field."""


@dataclass(frozen=True)
class GroupResources:
    group: str
    resources: tuple[str, ...]
    resource_names: tuple[str, ...]


@dataclass(frozen=True)
class Rule:
    level: str
    users: tuple[str, ...] = ()
    user_groups: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ()
    resources: tuple[GroupResources, ...] = ()
    namespaces: tuple[str, ...] = ()
    non_resource_urls: tuple[str, ...] = ()
    omit_stages: tuple[str, ...] = ()
    omit_managed_fields: bool | None = None


@dataclass(frozen=True)
class RequestAttributes:
    """What a rule is matched against (authorizer attributes of the authenticated user, before impersonation)."""
    user: str
    groups: tuple[str, ...]
    verb: str
    resource_request: bool
    api_group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""


@dataclass(frozen=True)
class Decision:
    level: str
    omit_stages: frozenset[str]
    omit_managed_fields: bool


NONE = Decision("None", frozenset(), False)


@dataclass(frozen=True)
class Policy:
    rules: tuple[Rule, ...]
    omit_stages: tuple[str, ...] = ()
    omit_managed_fields: bool = False

    def evaluate(self, a: RequestAttributes) -> Decision:
        for rule in self.rules:
            if _matches(rule, a):
                omit = rule.omit_managed_fields if rule.omit_managed_fields is not None else self.omit_managed_fields
                return Decision(rule.level, frozenset((*self.omit_stages, *rule.omit_stages)), omit)
        return NONE


def _matches(rule: Rule, a: RequestAttributes) -> bool:
    if rule.users and a.user not in rule.users:
        return False
    if rule.user_groups and not set(rule.user_groups) & set(a.groups):
        return False
    if rule.verbs and a.verb not in rule.verbs:
        return False
    if rule.namespaces or rule.resources:
        return a.resource_request and _matches_resource(rule, a)
    if rule.non_resource_urls:
        return not a.resource_request and any(
            spec == "*" or spec == a.path or (spec.endswith("*") and a.path.startswith(spec.rstrip("*")))
            for spec in rule.non_resource_urls)
    return True


def _matches_resource(rule: Rule, a: RequestAttributes) -> bool:
    if rule.namespaces and a.namespace not in rule.namespaces:
        return False
    if not rule.resources:
        return True
    combined = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
    for gr in rule.resources:
        if gr.group != a.api_group:
            continue
        if not gr.resources:
            return True
        if gr.resource_names and a.name not in gr.resource_names:
            continue
        for res in gr.resources:
            if res in (combined, "*") or (a.subresource and res == f"*/{a.subresource}") \
                    or (res.endswith("/*") and res[:-2] == a.resource):
                return True
    return False


# ----- reading ---------------------------------------------------------------------------------------------


def _strings(value: Any, path: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PolicyError(f"{path}: Invalid value: {json.dumps(value)}: must be a list of strings")
    return tuple(value)


def _known(obj: dict[str, Any], fields: Sequence[str], path: str) -> None:
    for key in obj:
        if key not in fields:
            raise PolicyError(f"{path}{'.' if path else ''}{key}: unknown field (accepted: {', '.join(fields)})")


def _stages(value: Any, path: str) -> tuple[str, ...]:
    stages = _strings(value, path)
    for i, stage in enumerate(stages):
        if stage not in STAGES:
            raise PolicyError(f"{path}[{i}]: Unsupported value: {json.dumps(stage)}: supported values: "
                              + ", ".join(f'"{s}"' for s in STAGES))
    return stages


def _flag(value: Any, path: str) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise PolicyError(f"{path}: Invalid value: {json.dumps(value)}: must be true or false")
    return value


def _rule(raw: Any, path: str) -> Rule:
    if not isinstance(raw, dict):
        raise PolicyError(f"{path}: Invalid value: must be an object")
    _known(raw, _RULE_FIELDS, path)
    level = raw.get("level")
    if level in (None, ""):
        raise PolicyError(f"{path}.level: Required value")
    if level not in LEVELS:
        raise PolicyError(f"{path}.level: Unsupported value: {json.dumps(level)}: supported values: "
                          + ", ".join(f'"{v}"' for v in LEVELS))
    urls = _strings(raw.get("nonResourceURLs"), f"{path}.nonResourceURLs")
    for i, url in enumerate(urls):
        if not url.startswith("/") and url != "*":
            raise PolicyError(f"{path}.nonResourceURLs[{i}]: Invalid value: {json.dumps(url)}: non-resource URL "
                              "rules must begin with a '/' character")
        if "*" in url[:-1]:
            raise PolicyError(f"{path}.nonResourceURLs[{i}]: Invalid value: {json.dumps(url)}: non-resource URL "
                              "wildcards '*' must be the final character of the rule")
    groups = []
    raw_resources = raw.get("resources")
    if raw_resources is not None and not isinstance(raw_resources, list):
        raise PolicyError(f"{path}.resources: Invalid value: must be a list of group resources")
    for i, gr in enumerate(raw_resources or ()):
        gpath = f"{path}.resources[{i}]"
        if not isinstance(gr, dict):
            raise PolicyError(f"{gpath}: Invalid value: must be an object with group, resources, resourceNames")
        _known(gr, _GROUP_FIELDS, gpath)
        group = gr.get("group") or ""
        if not isinstance(group, str):
            raise PolicyError(f"{gpath}.group: Invalid value: {json.dumps(group)}: must be a string")
        resources = _strings(gr.get("resources"), f"{gpath}.resources")
        names = _strings(gr.get("resourceNames"), f"{gpath}.resourceNames")
        for j, res in enumerate(resources):
            if names and (res == "*" or res.startswith("*/")):
                raise PolicyError(f"{gpath}.resources[{j}]: Invalid value: {json.dumps(res)}: using resourceNames "
                                  "with wildcard resources is not allowed")
        groups.append(GroupResources(group, resources, names))
    namespaces = _strings(raw.get("namespaces"), f"{path}.namespaces")
    if urls and (groups or namespaces):
        raise PolicyError(f"{path}.nonResourceURLs: Invalid value: {json.dumps(list(urls))}: rules cannot apply to "
                          "both regular resources and non-resource URLs")
    return Rule(level, _strings(raw.get("users"), f"{path}.users"),
                _strings(raw.get("userGroups"), f"{path}.userGroups"), _strings(raw.get("verbs"), f"{path}.verbs"),
                tuple(groups), namespaces, urls, _stages(raw.get("omitStages"), f"{path}.omitStages"),
                _flag(raw.get("omitManagedFields"), f"{path}.omitManagedFields"))


def parse_policy(doc: Any) -> Policy:
    if not isinstance(doc, dict):
        raise PolicyError("not an audit.k8s.io/v1 Policy object")
    if doc.get("apiVersion") != "audit.k8s.io/v1":
        raise PolicyError(f"apiVersion: Unsupported value: {json.dumps(doc.get('apiVersion'))}: supported values: "
                          '"audit.k8s.io/v1"')
    if doc.get("kind") != "Policy":
        raise PolicyError(f"kind: Unsupported value: {json.dumps(doc.get('kind'))}: supported values: \"Policy\"")
    _known(doc, ("apiVersion", "kind", "metadata", "rules", "omitStages", "omitManagedFields"), "")
    rules = doc.get("rules")
    if not isinstance(rules, list) or not rules:
        # kube-apiserver refuses a policy without rules: it would log nothing.
        raise PolicyError("rules: Required value: the policy has no rules")
    return Policy(tuple(_rule(r, f"rules[{i}]") for i, r in enumerate(rules)),
                  _stages(doc.get("omitStages"), "omitStages"),
                  bool(_flag(doc.get("omitManagedFields"), "omitManagedFields")))


def load_policy(path: str | Path) -> Policy:
    """The policy in the YAML or JSON file `path`; PolicyError naming the file and the field otherwise."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise PolicyError(f"{path}: {exc.strerror or exc}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(f"{path}: not YAML or JSON: {str(exc).splitlines()[0]}") from None
    try:
        return parse_policy(doc)
    except PolicyError as exc:
        raise PolicyError(f"{path}: {exc}") from None
