"""Namespace quotas on DRA devices: ResourceQuota `spec.hard["<class>.deviceclass.resource.k8s.io/devices"]`.

Usage is counted from allocated claims in the namespace: each allocation result is one device of the class
its request (or subrequest) names. A placement is refused when it would take a class above the smallest
limit any quota in the namespace sets.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller import objects as o
from gpudra.quantity import Quantity

QUOTA_SUFFIX = ".deviceclass.resource.k8s.io/devices"


def quota_limits(quotas: Iterable[Mapping[str, Any]], namespace: str) -> dict[str, tuple[int, str]]:
    """class -> (limit, quota name), the tightest limit over the namespace's quotas."""
    limits: dict[str, tuple[int, str]] = {}
    for quota in quotas:
        if o.namespace(quota) != namespace:
            continue
        hard = o.section(o.section(quota, "spec"), "hard")
        for resource, raw in hard.items():
            if not str(resource).endswith(QUOTA_SUFFIX):
                continue
            limit = _count(raw)
            if limit is None:
                continue
            cls = str(resource)[: -len(QUOTA_SUFFIX)]
            if cls not in limits or limit < limits[cls][0]:
                limits[cls] = (limit, o.name(quota))
    return limits


def _count(raw: Any) -> int | None:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    try:
        quantity = Quantity.parse(str(raw))
        return quantity.as_int() if quantity.is_integer() else None
    except (ValueError, ArithmeticError):
        return None


def request_classes(claim: Mapping[str, Any]) -> dict[str, str]:
    """Request name ("req" and "req/sub") -> deviceClassName."""
    out: dict[str, str] = {}
    requests = o.list_field(o.section(o.section(claim, "spec"), "devices"), "requests")
    for req in requests:
        if not isinstance(req, Mapping):
            continue
        name = str(req.get("name") or "")
        exactly = req.get("exactly")
        if isinstance(exactly, Mapping) and exactly.get("deviceClassName"):
            out[name] = str(exactly["deviceClassName"])
        for sub in req.get("firstAvailable") or []:
            if isinstance(sub, Mapping) and sub.get("deviceClassName"):
                out[f"{name}/{sub.get('name')}"] = str(sub["deviceClassName"])
    return out


def devices_by_class(claim: Mapping[str, Any], allocation: Mapping[str, Any] | None = None) -> Counter[str]:
    """How many devices of each class the allocation (the claim's own by default) holds."""
    alloc = allocation if allocation is not None else o.allocation(claim)
    counts: Counter[str] = Counter()
    if alloc is None:
        return counts
    classes = request_classes(claim)
    for result in o.list_field(o.section(alloc, "devices"), "results"):
        if isinstance(result, Mapping):
            cls = classes.get(str(result.get("request") or ""))
            if cls:
                counts[cls] += 1
    return counts


def namespace_usage(claims: Iterable[Mapping[str, Any]], namespace: str) -> Counter[str]:
    used: Counter[str] = Counter()
    for claim in claims:
        if o.namespace(claim) == namespace:
            used.update(devices_by_class(claim))
    return used


@dataclass(frozen=True)
class QuotaVerdict:
    ok: bool
    message: str = ""


def check_quota(
    namespace: str,
    new_devices: Counter[str],
    claims: Iterable[Mapping[str, Any]],
    quotas: Iterable[Mapping[str, Any]],
) -> QuotaVerdict:
    limits = quota_limits(quotas, namespace)
    if not limits:
        return QuotaVerdict(True)
    used = namespace_usage(claims, namespace)
    for cls in sorted(new_devices):
        if cls not in limits:
            continue
        limit, quota_name = limits[cls]
        wanted = used[cls] + new_devices[cls]
        if wanted > limit:
            return QuotaVerdict(
                False,
                f"exceeded quota: ResourceQuota {namespace}/{quota_name}: spec.hard[{cls}{QUOTA_SUFFIX}] is {limit}, "
                f"{used[cls]} in use by allocated claims, this pod needs {new_devices[cls]} more",
            )
    return QuotaVerdict(True)
