"""ResourceQuota admission as kube-apiserver's does it for the objects this project creates (pods, ResourceClaims
and Services): the usage a new object adds is checked against every quota of its namespace, and a create that
would exceed any `spec.hard` is refused (403 `exceeded quota: NAME, requested: ..., used: ..., limited: ...`).
`usage_of` also gives the quota controller its `status.used`.

What is counted (the core and DRA quota evaluators): for a pod that has not terminated, `pods` and `count/pods`,
`requests.cpu|memory|ephemeral-storage` (also as bare `cpu`, `memory`, `ephemeral-storage`) and
`limits.cpu|memory|ephemeral-storage` (the larger of the containers' sum and any one init container; a request
defaults to its limit), and `requests.<extended resource>`; for a ResourceClaim, `count/resourceclaims.
resource.k8s.io` and `<class>.deviceclass.resource.k8s.io/devices` per request (`count`, default 1; allocation
mode All counts as 32, the most a claim may get; a request with firstAvailable as its largest subrequest); for a
Service, `services` and `count/services`, `services.nodeports` (its ports, as NodePort or LoadBalancer) and
`services.loadbalancers`.

Scopes (`spec.scopes`, and `spec.scopeSelector` with In/NotIn/Exists/DoesNotExist) as the pod evaluator matches
them: Terminating / NotTerminating (activeDeadlineSeconds set or not), BestEffort / NotBestEffort (no cpu or memory
request or limit in any container, nor at pod level), PriorityClass (the pod's priorityClassName, matched as the
label `PriorityClass`: Exists means non-empty) and CrossNamespacePodAffinity (an affinity term naming namespaces
or a namespace selector). A scoped quota counts pods only. `spec_errors` is kube-apiserver's validation of the
scopes against the hard resources they may limit.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from controlplane import status as st
from controlplane.resources import ResourceType
from gpudra.quantity import Quantity, QuantityError
from gpudra.timestamps import parse_rfc3339

QUOTA_KINDS = ("Pod", "ResourceClaim", "Service")
DEVICE_SUFFIX = ".deviceclass.resource.k8s.io/devices"
ALL_DEVICES = 32
_COMPUTE = ("cpu", "memory", "ephemeral-storage")
_ZERO = Quantity.parse("0")


def _q(raw: Any) -> Quantity | None:
    try:
        return Quantity.parse(str(raw))
    except QuantityError:
        return None


def _add(total: dict[str, Quantity], key: str, value: Quantity) -> None:
    total[key] = total.get(key, _ZERO) + value


def _container_totals(containers: Iterable[Any], part: str) -> dict[str, Quantity]:
    out: dict[str, Quantity] = {}
    for c in containers:
        if not isinstance(c, Mapping):
            continue
        resources = c.get("resources") or {}
        values = dict(resources.get("limits") or {}) if part == "requests" else {}
        values.update(resources.get(part) or {})  # a request defaults to its limit
        for name, raw in values.items():
            q = _q(raw)
            if q is not None:
                _add(out, str(name), q)
    return out


def charged(pod: Mapping[str, Any], now: datetime | None = None) -> bool:
    """Whether quota counts the pod (QuotaV1Pod): not once it has finished, nor once it is stuck Terminating (a
    grace period past its deletionTimestamp, e.g. on a lost node), so that its replacement is not held back."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    meta = pod.get("metadata") or {}
    due, grace = parse_rfc3339(meta.get("deletionTimestamp")), meta.get("deletionGracePeriodSeconds")
    return due is None or not isinstance(grace, int) or \
        (now or datetime.now(timezone.utc)) <= due + timedelta(seconds=grace)


def pod_usage(pod: Mapping[str, Any], now: datetime | None = None) -> dict[str, Quantity]:
    if not charged(pod, now):
        return {}
    spec = pod.get("spec") or {}
    one = Quantity.parse("1")
    out: dict[str, Quantity] = {"pods": one, "count/pods": one}
    for part in ("requests", "limits"):
        total = _container_totals(spec.get("containers") or [], part)
        for init in spec.get("initContainers") or []:
            for name, q in _container_totals([init], part).items():
                if q > total.get(name, _ZERO):
                    total[name] = q
        for name, q in total.items():
            if name in _COMPUTE:
                out[f"{part}.{name}"] = q
                if part == "requests":
                    out[name] = q
            elif part == "requests" and "/" in name:
                out[f"requests.{name}"] = q
    return out


def claim_usage(claim: Mapping[str, Any]) -> dict[str, Quantity]:
    out: dict[str, Quantity] = {"count/resourceclaims.resource.k8s.io": Quantity.parse("1")}
    for req in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        if not isinstance(req, Mapping):
            continue
        options = [req["exactly"]] if isinstance(req.get("exactly"), Mapping) else \
            [s for s in req.get("firstAvailable") or [] if isinstance(s, Mapping)]
        per_class: dict[str, int] = {}
        for option in options:
            cls = str(option.get("deviceClassName") or "")
            n = ALL_DEVICES if option.get("allocationMode") == "All" else option.get("count", 1)
            n = n if isinstance(n, int) else 1
            per_class[cls] = max(per_class.get(cls, 0), n)
        for cls, n in per_class.items():
            if cls:
                _add(out, cls + DEVICE_SUFFIX, Quantity.parse(str(n)))
    return out


SCOPES = ("Terminating", "NotTerminating", "BestEffort", "NotBestEffort", "PriorityClass",
          "CrossNamespacePodAffinity", "VolumeAttributesClass")
_EXISTS_ONLY = ("Terminating", "NotTerminating", "BestEffort", "NotBestEffort", "CrossNamespacePodAffinity")
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
_CONFLICTS = (("BestEffort", "NotBestEffort"), ("Terminating", "NotTerminating"))
# What a scope may limit, among the standard quota resources (others, extended and count/ names, are not checked).
_STANDARD_QUOTA_RESOURCES = frozenset({
    "cpu", "memory", "ephemeral-storage", "requests.cpu", "requests.memory", "requests.storage",
    "requests.ephemeral-storage", "limits.cpu", "limits.memory", "limits.ephemeral-storage", "pods", "resourcequotas",
    "services", "replicationcontrollers", "secrets", "persistentvolumeclaims", "configmaps", "services.nodeports",
    "services.loadbalancers"})
_POD_COMPUTE = frozenset({"cpu", "memory", "limits.cpu", "limits.memory", "requests.cpu", "requests.memory"})
_PVC_RESOURCES = frozenset({"persistentvolumeclaims", "requests.storage"})


def _section(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def _standard(resource: str) -> bool:
    return resource in _STANDARD_QUOTA_RESOURCES or resource.startswith(("hugepages-", "requests.hugepages-"))


def _scope_allows(scope: str, resource: str) -> bool:
    if scope == "BestEffort":
        return resource == "pods"
    if scope == "VolumeAttributesClass":
        return resource in _PVC_RESOURCES
    if scope in SCOPES:
        return resource == "pods" or resource in _POD_COMPUTE
    return True


def _go_value(value: Any) -> str:
    # field.Invalid prints a non-string value as JSON; the internal types it validates have Go's field names.
    if isinstance(value, dict):
        value = {"MatchExpressions": [{"ScopeName": r.get("scopeName"), "Operator": r.get("operator"),
                                       "Values": r.get("values")} for r in value.get("matchExpressions") or []
                                      if isinstance(r, dict)]}
    return json.dumps(value, separators=(",", ":"))


def spec_errors(quota: Mapping[str, Any]) -> list[str]:
    """kube-apiserver's validation of a ResourceQuota's scopes and scope selector against its hard resources."""
    spec = _section(quota, "spec")
    hard = sorted(str(k) for k in (spec.get("hard") or {}))
    scopes = spec.get("scopes")
    errors: list[str] = []
    if isinstance(scopes, list) and scopes:
        shown = _go_value(scopes)
        for scope in scopes:
            if scope not in SCOPES:
                errors.append(f"spec.scopes: Invalid value: {shown}: unsupported scope")
            errors += [f"spec.scopes: Invalid value: {shown}: unsupported scope applied to resource"
                       for k in hard if _standard(k) and not _scope_allows(str(scope), k)]
        errors += [f"spec.scopes: Invalid value: {shown}: conflicting scopes"
                   for pair in _CONFLICTS if set(pair) <= set(scopes)]
    if not isinstance(spec.get("scopeSelector"), Mapping):
        return errors
    selector = _section(spec, "scopeSelector")
    at = "spec.scopeSelector.matchExpressions"
    named: set[str] = set()
    for req in selector.get("matchExpressions") or []:
        if not isinstance(req, Mapping):
            continue
        scope, op, values = str(req.get("scopeName") or ""), str(req.get("operator") or ""), req.get("values") or []
        if scope not in SCOPES:
            errors.append(f"{at}.scopeName: Invalid value: {json.dumps(scope)}: unsupported scope")
        errors += [f"{at}: Invalid value: {_go_value(selector)}: unsupported scope applied to resource"
                   for k in hard if _standard(k) and not _scope_allows(scope, k)]
        if scope in _EXISTS_ONLY and op != "Exists":
            errors.append(f"{at}.operator: Invalid value: {json.dumps(op)}: must be 'Exist' when scope is any of "
                          "ResourceQuotaScopeTerminating, ResourceQuotaScopeNotTerminating, ResourceQuotaScopeBestEffort, "
                          "ResourceQuotaScopeNotBestEffort or ResourceQuotaScopeCrossNamespacePodAffinity")
        if op in ("In", "NotIn") and not values:
            errors.append(f"{at}.values: Required value: must be at least one value when `operator` is 'In' or "
                          "'NotIn' for scope selector")
        elif op in ("Exists", "DoesNotExist") and values:
            errors.append(f"{at}.values: Invalid value: {_go_value(values)}: must be no value when `operator` is "
                          "'Exist' or 'DoesNotExist' for scope selector")
        elif op not in _OPERATORS:
            errors.append(f"{at}.operator: Invalid value: {json.dumps(op)}: not a valid selector operator")
        named.add(scope)
    errors += [f"{at}: Invalid value: {_go_value(scopes if scopes else None)}: conflicting scopes"
               for pair in _CONFLICTS if set(pair) <= named]
    return errors


def _scope_requirements(quota: Mapping[str, Any]) -> list[tuple[str, str, list[str]]]:
    spec = _section(quota, "spec")
    reqs: list[tuple[str, str, list[str]]] = [(str(s), "Exists", []) for s in spec.get("scopes") or []]
    selector = _section(spec, "scopeSelector")
    reqs += [(str(r.get("scopeName") or ""), str(r.get("operator") or ""), [str(v) for v in r.get("values") or []])
             for r in selector.get("matchExpressions") or [] if isinstance(r, Mapping)]
    return reqs


def _best_effort(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    holders = [c for part in ("containers", "initContainers") for c in spec.get(part) or [] if isinstance(c, Mapping)]
    holders.append(spec)  # pod-level resources (PodLevelResources)
    for holder in holders:
        resources = holder.get("resources") or {}
        for part in ("requests", "limits"):
            if any(name in ("cpu", "memory") for name in resources.get(part) or {}):
                return False
    return True


def _cross_namespace_affinity(pod: Mapping[str, Any]) -> bool:
    affinity = (pod.get("spec") or {}).get("affinity") or {}
    for kind in ("podAffinity", "podAntiAffinity"):
        rules = affinity.get(kind) or {}
        terms = list(rules.get("requiredDuringSchedulingIgnoredDuringExecution") or [])
        terms += [w.get("podAffinityTerm") or {} for w in rules.get("preferredDuringSchedulingIgnoredDuringExecution")
                  or [] if isinstance(w, Mapping)]
        if any(isinstance(t, Mapping) and (t.get("namespaces") or t.get("namespaceSelector") is not None)
               for t in terms):
            return True
    return False


def _pod_matches(scope: str, op: str, values: list[str], pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    if scope in ("Terminating", "NotTerminating"):
        deadline = spec.get("activeDeadlineSeconds")
        terminating = isinstance(deadline, int) and deadline >= 0
        return terminating == (scope == "Terminating")
    if scope in ("BestEffort", "NotBestEffort"):
        return _best_effort(pod) == (scope == "BestEffort")
    if scope == "CrossNamespacePodAffinity":
        return _cross_namespace_affinity(pod)
    if scope == "PriorityClass":
        name = str(spec.get("priorityClassName") or "")
        # As a label selector over {"PriorityClass": name}: the key is always there, Exists asks for a name.
        return {"Exists": name != "", "DoesNotExist": False, "In": name in values,
                "NotIn": name not in values}.get(op, False)
    return False


def matches(quota: Mapping[str, Any], kind: str, obj: Mapping[str, Any]) -> bool:
    """Whether `quota` counts `obj`: an unscoped quota counts everything, a scoped one pods matching every scope."""
    reqs = _scope_requirements(quota)
    if not reqs:
        return True
    return kind == "Pod" and all(_pod_matches(scope, op, values, obj) for scope, op, values in reqs)


def service_usage(svc: Mapping[str, Any]) -> dict[str, Quantity]:
    spec = svc.get("spec") or {}
    one = Quantity.parse("1")
    out: dict[str, Quantity] = {"services": one, "count/services": one}
    kind = spec.get("type") or "ClusterIP"
    if kind in ("NodePort", "LoadBalancer"):
        out["services.nodeports"] = Quantity.parse(str(len([p for p in spec.get("ports") or [] if isinstance(p, Mapping)])))
    if kind == "LoadBalancer":
        out["services.loadbalancers"] = one
    return out


def usage_of(kind: str, obj: Mapping[str, Any]) -> dict[str, Quantity]:
    if kind == "Pod":
        return pod_usage(obj)
    return claim_usage(obj) if kind == "ResourceClaim" else service_usage(obj) if kind == "Service" else {}


def used(quota: Mapping[str, Any], objects: Mapping[str, Iterable[Mapping[str, Any]]]) -> dict[str, str]:
    """status.used of `quota` over the namespace's objects (kind -> objects), for its spec.hard resources."""
    hard = (quota.get("spec") or {}).get("hard") or {}
    total: dict[str, Quantity] = {}
    for kind, items in objects.items():
        for obj in items:
            if not matches(quota, kind, obj):
                continue
            for name, q in usage_of(kind, obj).items():
                if name in hard:
                    _add(total, name, q)
    return {name: total.get(name, _ZERO).canonical() for name in hard}


def _listing(values: Mapping[str, Quantity]) -> str:
    return ",".join(f"{k}={v.canonical()}" for k, v in sorted(values.items()))


_Quota = TypeVar("_Quota", bound=Mapping[str, Any])


def missing_requests(pod: Mapping[str, Any], required: Iterable[str]) -> str | None:
    """What a quota tracking cpu or memory (`required`: its hard resources) needs every container of the pod to
    state and some do not (the pod evaluator's Constraints), as `requests.cpu for: a,b; ...`; None when all do."""
    needed = sorted(set(required) & _POD_COMPUTE)
    if not needed:
        return None
    spec = pod.get("spec") or {}
    missing: dict[str, list[str]] = {}
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        if not isinstance(c, Mapping):
            continue
        resources = c.get("resources") or {}
        limits, requests = resources.get("limits") or {}, {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for resource in needed:
            part, _, base = resource.rpartition(".")
            if base not in (limits if part == "limits" else requests):
                missing.setdefault(resource, []).append(str(c.get("name") or ""))
    if not missing:
        return None
    return "; ".join(f"{resource} for: {','.join(sorted(names))}" for resource, names in sorted(missing.items()))


def admit(rt: ResourceType, name: str, obj: Mapping[str, Any], quotas: Iterable[_Quota],
          existing: Mapping[str, Iterable[Mapping[str, Any]]]) -> list[tuple[_Quota, dict[str, str]]]:
    """Refuse the create of `obj` (403) when it takes any quota of the namespace past its spec.hard, or is a pod
    that does not state what a quota tracking cpu or memory needs; `existing`: the namespace's objects of the
    QUOTA_KINDS (kind -> objects). The quotas it is charged to, each with its status.used including `obj` (which
    kube-apiserver's quota admission writes before the create returns)."""
    adds = usage_of(rt.kind, obj)
    if not adds:
        return []
    charged_to: list[tuple[_Quota, dict[str, str]]] = []
    for quota in quotas:
        if not matches(quota, rt.kind, obj):
            continue
        qname = str((quota.get("metadata") or {}).get("name") or "")
        hard = {k: q for k, v in ((quota.get("spec") or {}).get("hard") or {}).items() if (q := _q(v)) is not None}
        if rt.kind == "Pod":
            missing = missing_requests(obj, hard)
            if missing is not None:
                raise st.forbidden(rt, name, f"failed quota: {qname}: must specify {missing}")
        requested = {k: v for k, v in adds.items() if k in hard}
        if not requested:
            continue
        now: dict[str, Quantity] = {}
        for kind, items in existing.items():
            for other in items:
                if not matches(quota, kind, other):
                    continue
                for k, v in usage_of(kind, other).items():
                    if k in hard:
                        _add(now, k, v)
        over = [k for k, v in requested.items() if now.get(k, _ZERO) + v > hard[k]]
        if over:
            raise st.forbidden(rt, name, f"exceeded quota: {qname}, requested: "
                                         f"{_listing({k: requested[k] for k in over})}, used: "
                                         f"{_listing({k: now.get(k, _ZERO) for k in over})}, limited: "
                                         f"{_listing({k: hard[k] for k in over})}")
        charged_to.append((quota, {k: (now.get(k, _ZERO) + requested.get(k, _ZERO)).canonical() for k in hard}))
    return charged_to
