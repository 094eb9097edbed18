"""ResourceClaims shared by a pod group (KEP-5729, DRAWorkloadResourceClaims: alpha 1.36, beta and off in 1.37),
for embedded mode.

A PodGroup's `spec.resourceClaims` names claims the whole group shares. A pod uses one by listing, in its own
`spec.resourceClaims`, an entry that matches the group's exactly (same name, same `resourceClaimName` or
`resourceClaimTemplateName`). Then:

- a template entry becomes one ResourceClaim for the group (generateName `<podgroup>-<claim>-`, owned by the
  PodGroup, so it goes with it), recorded in `podgroup.status.resourceClaimStatuses`; the pods get that claim in
  their `status.resourceClaimStatuses` instead of a claim of their own;
- the claim is reserved for the PodGroup (`reservedFor: {apiGroup: scheduling.k8s.io, resource: podgroups}`)
  rather than for each pod, and stays allocated while the group exists.

The planning is pure; `PodGroupClaims.sync` writes through the controller's Writer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from controller import objects as o
from controller.claims import generate_name
from controller.objects import Obj
from controller.podgroups import pod_group_name
from controller.view import View
from controller.writes import Writer

log = logging.getLogger("gpudra.sim.roles.podgroupclaims")

GROUP = "scheduling.k8s.io"
_SOURCES = ("resourceClaimName", "resourceClaimTemplateName")


def _group_entry(group: Mapping[str, Any], pod_entry: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for entry in o.list_field(o.section(group, "spec"), "resourceClaims"):
        if isinstance(entry, Mapping) and entry.get("name") == pod_entry.get("name") and all(
                entry.get(k) == pod_entry.get(k) for k in _SOURCES):
            return entry
    return None


def _group_status_claims(group: Mapping[str, Any]) -> dict[str, str]:
    return {str(s.get("name")): str(s["resourceClaimName"])
            for s in o.list_field(o.section(group, "status"), "resourceClaimStatuses")
            if isinstance(s, Mapping) and s.get("resourceClaimName")}


def group_of(pod: Mapping[str, Any], view: View) -> Obj | None:
    name = pod_group_name(pod)
    return view.pod_groups.get(f"{o.namespace(pod)}/{name}") if name else None


def shared_claims(pod: Mapping[str, Any], view: View) -> tuple[dict[str, str], bool]:
    """(pod claim name -> the group's ResourceClaim name, whether some shared template claim is still missing)."""
    group = group_of(pod, view)
    if group is None:
        return {}, False
    made = _group_status_claims(group)
    out: dict[str, str] = {}
    missing = False
    for entry in o.list_field(o.section(pod, "spec"), "resourceClaims"):
        if not isinstance(entry, Mapping) or _group_entry(group, entry) is None:
            continue
        name = str(entry.get("name"))
        claim = entry.get("resourceClaimName") or made.get(name)
        if claim:
            out[name] = str(claim)
        else:
            missing = True
    return out, missing


def consumer_for(claim: Mapping[str, Any], pod: Mapping[str, Any], view: View) -> Obj:
    """Whom the scheduler reserves `claim` for: the pod's PodGroup when it is the group's shared claim."""
    group = group_of(pod, view)
    if group is not None and o.name(claim) in shared_claims(pod, view)[0].values():
        return {"kind": "PodGroup", "metadata": dict(o.meta(group))}
    return dict(pod)


def claim_for_group(group: Mapping[str, Any], entry: Mapping[str, Any], template: Mapping[str, Any]) -> Obj:
    tspec = o.section(template, "spec")
    tmeta = o.section(tspec, "metadata")
    metadata: dict[str, Any] = {
        "generateName": generate_name(o.name(group), str(entry.get("name"))),
        "namespace": o.namespace(group),
        "ownerReferences": [{"apiVersion": f"{GROUP}/v1beta1", "kind": "PodGroup", "name": o.name(group),
                             "uid": o.uid(group), "controller": True, "blockOwnerDeletion": True}],
    }
    if tmeta.get("labels"):
        metadata["labels"] = dict(tmeta["labels"])
    if tmeta.get("annotations"):
        metadata["annotations"] = dict(tmeta["annotations"])
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": metadata,
            "spec": dict(tspec.get("spec") or {})}


class PodGroupClaims:
    def __init__(self, writer: Writer) -> None:
        self._writer = writer

    def sync(self, view: View) -> tuple[int, set[str]]:
        """Create the groups' template claims, point member pods at them. Returns (claims created, keys of pods
        whose shared claims do not exist yet: the per-pod template expansion must leave them alone)."""
        created = 0
        for group in view.pod_groups.values():
            made = _group_status_claims(group)
            wanted: list[dict[str, str]] = [{"name": k, "resourceClaimName": v} for k, v in made.items()]
            for entry in o.list_field(o.section(group, "spec"), "resourceClaims"):
                if not isinstance(entry, Mapping) or not entry.get("resourceClaimTemplateName"):
                    continue
                name = str(entry.get("name"))
                if name in made:
                    continue
                template = view.templates.get(f"{o.namespace(group)}/{entry['resourceClaimTemplateName']}")
                if template is None:
                    continue
                stored = self._writer.create("ResourceClaim", claim_for_group(group, entry, template))
                if stored is None:
                    continue
                created += 1
                wanted.append({"name": name, "resourceClaimName": o.name(stored)})
                log.info("claim created for pod group", extra={"podGroup": o.key(group), "claim": o.name(stored)})
            if len(wanted) != len(made):
                self._writer.patch_status("PodGroup", group, {"status": {"resourceClaimStatuses": wanted}})
        held: set[str] = set()
        for pod in view.pods.values():
            if o.pod_done(pod) or o.deleting(pod):
                continue
            shared, missing = shared_claims(pod, view)
            if missing:
                held.add(o.key(pod))
            current = {str(s.get("name")): s.get("resourceClaimName")
                       for s in o.list_field(o.section(pod, "status"), "resourceClaimStatuses") if isinstance(s, Mapping)}
            templated = {k: v for k, v in shared.items() if _is_template_entry(pod, k)}
            if templated and any(current.get(k) != v for k, v in templated.items()):
                merged = {**current, **templated}
                self._writer.patch_status("Pod", pod, {"status": {"resourceClaimStatuses": [
                    {"name": k, "resourceClaimName": v} for k, v in merged.items() if v]}})
        return created, held


def _is_template_entry(pod: Mapping[str, Any], name: str) -> bool:
    return any(isinstance(e, Mapping) and e.get("name") == name and e.get("resourceClaimTemplateName")
               for e in o.list_field(o.section(pod, "spec"), "resourceClaims"))
