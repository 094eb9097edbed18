"""ResourceQuota admission as kube-apiserver's does it for the objects this project creates (pods and
ResourceClaims): the usage a new object adds is checked against every quota of its namespace, and a create that
would exceed any `spec.hard` is refused (403 `exceeded quota: NAME, requested: ..., used: ..., limited: ...`).
`usage_of` also gives the quota controller its `status.used`.

What is counted (the core and DRA quota evaluators): for a pod that has not terminated, `pods` and `count/pods`,
`requests.cpu|memory|ephemeral-storage` (also as bare `cpu`, `memory`, `ephemeral-storage`) and
`limits.cpu|memory|ephemeral-storage` (the larger of the containers' sum and any one init container; a request
defaults to its limit), and `requests.<extended resource>`; for a ResourceClaim, `count/resourceclaims.
resource.k8s.io` and `<class>.deviceclass.resource.k8s.io/devices` per request (`count`, default 1; allocation
mode All counts as 32, the most a claim may get; a request with firstAvailable as its largest subrequest).
Quota scopes are not evaluated: every quota counts every object of its kind.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from controlplane import status as st
from controlplane.resources import ResourceType
from gpudra.quantity import Quantity, QuantityError

QUOTA_KINDS = ("Pod", "ResourceClaim")
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


def pod_usage(pod: Mapping[str, Any]) -> dict[str, Quantity]:
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
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


def usage_of(kind: str, obj: Mapping[str, Any]) -> dict[str, Quantity]:
    return pod_usage(obj) if kind == "Pod" else claim_usage(obj) if kind == "ResourceClaim" else {}


def used(quota: Mapping[str, Any], objects: Mapping[str, Iterable[Mapping[str, Any]]]) -> dict[str, str]:
    """status.used of `quota` over the namespace's objects (kind -> objects), for its spec.hard resources."""
    hard = (quota.get("spec") or {}).get("hard") or {}
    total: dict[str, Quantity] = {}
    for kind, items in objects.items():
        for obj in items:
            for name, q in usage_of(kind, obj).items():
                if name in hard:
                    _add(total, name, q)
    return {name: total.get(name, _ZERO).canonical() for name in hard}


def _listing(values: Mapping[str, Quantity]) -> str:
    return ",".join(f"{k}={v.canonical()}" for k, v in sorted(values.items()))


def admit(rt: ResourceType, name: str, obj: Mapping[str, Any], quotas: Iterable[Mapping[str, Any]],
          existing: Mapping[str, Iterable[Mapping[str, Any]]]) -> None:
    """Refuse the create of `obj` (403) when it takes any quota of the namespace past its spec.hard; `existing`:
    the namespace's objects of the QUOTA_KINDS (kind -> objects)."""
    adds = usage_of(rt.kind, obj)
    if not adds:
        return
    for quota in quotas:
        hard = {k: q for k, v in ((quota.get("spec") or {}).get("hard") or {}).items() if (q := _q(v)) is not None}
        requested = {k: v for k, v in adds.items() if k in hard}
        if not requested:
            continue
        now: dict[str, Quantity] = {}
        for kind, items in existing.items():
            for other in items:
                for k, v in usage_of(kind, other).items():
                    if k in requested:
                        _add(now, k, v)
        over = [k for k, v in requested.items() if now.get(k, _ZERO) + v > hard[k]]
        if over:
            qname = str((quota.get("metadata") or {}).get("name") or "")
            raise st.forbidden(rt, name, f"exceeded quota: {qname}, requested: "
                                         f"{_listing({k: requested[k] for k in over})}, used: "
                                         f"{_listing({k: now.get(k, _ZERO) for k in over})}, limited: "
                                         f"{_listing({k: hard[k] for k in over})}")
