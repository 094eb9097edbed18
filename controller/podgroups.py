"""Gangs the Workload API way (KEP-4671; `scheduling.k8s.io/v1beta1` in Kubernetes 1.37), beside our gang labels.

A pod joins a PodGroup through `spec.schedulingGroup.podGroupName` (same namespace). For the embedded
scheduler and the gang controller:

- a pod whose PodGroup does not exist waits (kube-scheduler gates such pods until the group appears);
- a `basic` group schedules its pods one by one, as if ungrouped;
- a `gang` group with `minCount` N waits until N live pods reference it; then the ResourceClaims of its pods
  (all of them, once they all exist) form one gang that the gang controller allocates all-or-nothing, exactly
  like claims labelled `<driver>/gang` (same planning, same "holds nothing, blocks nobody" rule); the pods are
  placed once their claims are allocated. A gang of pods without claims is placed once N pods exist.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controller import objects as o
from controller.ganggroups import Gang
from controller.objects import Obj
from controller.view import View

GANG_PREFIX = "podgroup/"  # the gang key of a PodGroup: podgroup/<name>, apart from label-named gangs


def pod_group_name(pod: Mapping[str, Any]) -> str | None:
    group = o.section(pod, "spec").get("schedulingGroup")
    if not isinstance(group, Mapping) or not group.get("podGroupName"):
        return None
    return str(group["podGroupName"])


def min_count(pod_group: Mapping[str, Any]) -> int | None:
    """The gang's minCount; None for a basic group (or an unreadable policy)."""
    gang = (o.section(pod_group, "spec").get("schedulingPolicy") or {}).get("gang")
    if not isinstance(gang, Mapping):
        return None
    try:
        count = int(gang["minCount"])
    except (KeyError, TypeError, ValueError):
        return None
    return count if count > 0 else None


def _members(view: View, namespace: str, name: str) -> list[Obj]:
    return sorted((p for p in view.pods.values()
                   if o.namespace(p) == namespace and pod_group_name(p) == name and not o.pod_done(p) and not o.deleting(p)),
                  key=o.name)


def _claim_names(pod: Mapping[str, Any]) -> tuple[list[str], bool]:
    """The pod's ResourceClaim names and whether all are known (a template's claim may not exist yet)."""
    generated = {str(s.get("name")): s.get("resourceClaimName")
                 for s in o.list_field(o.section(pod, "status"), "resourceClaimStatuses") if isinstance(s, Mapping)}
    names: list[str] = []
    complete = True
    for entry in o.list_field(o.section(pod, "spec"), "resourceClaims"):
        if not isinstance(entry, Mapping):
            continue
        claim = entry.get("resourceClaimName") or generated.get(str(entry.get("name")))
        if claim:
            names.append(str(claim))
        else:
            complete = False
    return names, complete


def pod_group_gangs(view: View) -> list[Gang]:
    """One gang per gang PodGroup whose minCount pods exist with all their claims (for the gang controller)."""
    gangs: list[Gang] = []
    for group in view.pod_groups.values():
        count = min_count(group)
        if count is None:
            continue
        ns, name = o.namespace(group), o.name(group)
        members = _members(view, ns, name)
        if len(members) < count:
            continue
        keys: set[str] = set()
        complete = True
        for pod in members:
            names, known = _claim_names(pod)
            complete = complete and known
            keys.update(f"{ns}/{n}" for n in names)
        claims = [view.claims[k] for k in sorted(keys) if k in view.claims]
        if not complete or len(claims) != len(keys) or not claims:
            continue
        gangs.append(Gang(ns, GANG_PREFIX + name, len(claims), tuple(claims)))
    return gangs


@dataclass(frozen=True)
class GroupWait:
    """Why a group's pod is not placed yet. `forming`: the group is still gathering its pods or claims, which is
    progress (a Normal event), not a failure."""

    message: str
    forming: bool


def wait_reason(pod: Mapping[str, Any], view: View, claims_by_key: Mapping[str, Mapping[str, Any]],
                verdict_annotation: str | None = None) -> GroupWait | None:
    """Why the scheduler must not place this pod yet because of its PodGroup; None when it may.
    `verdict_annotation`: the claims' explanation annotation, where the gang controller says why a gang whose
    claims all exist was not allocated (that is the reason then, not the wait)."""
    name = pod_group_name(pod)
    if name is None:
        return None
    ns = o.namespace(pod)
    group = view.pod_groups.get(f"{ns}/{name}")
    if group is None:
        return GroupWait(f'waiting for PodGroup "{name}" (spec.schedulingGroup.podGroupName) to exist in namespace {ns}', False)
    count = min_count(group)
    if count is None:
        return None
    members = _members(view, ns, name)
    if len(members) < count:
        return GroupWait(f"pod group {ns}/{name}: {len(members)} of minCount {count} pods exist; the gang is scheduled "
                         "all-or-nothing once they all do", True)
    names, complete = _claim_names(pod)
    pending = [n for n in names if (c := claims_by_key.get(f"{ns}/{n}")) is None or o.allocation(c) is None]
    if not pending and complete:
        return None
    missing = [n for n in pending if f"{ns}/{n}" not in claims_by_key]
    if missing or not complete:
        return GroupWait(f"pod group {ns}/{name}: its pods' ResourceClaims are allocated all-or-nothing once all of them "
                         f"exist (not yet created: {', '.join(sorted(set(missing))) or 'the claims of its templates'})", True)
    verdicts = sorted({text for n in pending
                       if verdict_annotation and (text := o.annotations(claims_by_key[f"{ns}/{n}"]).get(verdict_annotation))})
    if verdicts:
        return GroupWait(f"pod group {ns}/{name}: {'; '.join(verdicts)}", False)
    return GroupWait(f"pod group {ns}/{name}: its {len(set(pending))} pending ResourceClaims exist and are allocated "
                     "all-or-nothing by the gang controller (not yet tried)", True)
