"""Offline inputs for `gpu-dra allocate` / `explain`: what holds devices and what must be placed, in order.

Pods reference claims by `resourceClaimName`, or by `resourceClaimTemplateName`. A template's claim is the
one the resourceclaim controller made for the pod when the input has it (named in the pod's
status.resourceClaimStatuses, or owned by the pod with its pod-claim-name annotation); otherwise the claim
`<pod>-<entry name>` is generated from the template as that controller would (labels and annotations from the
template, spec copied). A pod that runs (a phase past Pending), or is bound with its claims recorded in its status,
never gets a claim generated: its claims exist in the cluster and hold their devices; a finished pod needs none. Claims
with `status.allocation` hold their devices. A pod's pending claims are placed together; a pending claim that
several pods reference is placed with the first of them and shared by the others (which then follow its
allocation's node selector). Deployments, ReplicaSets, StatefulSets, Jobs and CronJobs are first expanded into
their pods (controller.expand). Units keep the input order, except that claims no pod references come last
(`unreferenced`): no scheduler allocates those until a pod uses them.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.allocator.nodes import Node, NodeSelector
from controller.claims import GeneratedClaims, resolve_pod_claims
from controller.expand import WORKLOAD_KINDS, expand
from controller.extended import class_for_resource, dra_extended_requests, extended_resource_claim
from controller.objects import claim_key, pod_done, pod_scheduled
from controller.taintrules import apply_taint_rules

KINDS = ("Node", "DeviceClass", "ResourceSlice", "ResourceClaim", "ResourceClaimTemplate", "Pod", "DeviceTaintRule",
         *WORKLOAD_KINDS)



@dataclass
class Unit:
    """Claims placed together: a pod's pending claims, or one standalone claim."""

    owner: str  # "Pod ns/name" or "ResourceClaim ns/name"
    claims: list[dict[str, Any]]
    node_name: str | None = None  # a pod already bound to a node
    node_selector: dict[str, str] = field(default_factory=dict)  # pod spec.nodeSelector
    errors: list[tuple[str, str]] = field(default_factory=list)  # (claim key, message) for unresolvable references
    pinned: list[NodeSelector] = field(default_factory=list)  # nodeSelectors of the pod's already-allocated claims
    # Pending claims of this pod that an earlier unit places (a claim shared by several pods): this pod follows
    # wherever that allocation lands, and cannot start if it fails.
    shared: list[str] = field(default_factory=list)
    unreferenced: bool = False  # a standalone claim that no pod of the input references


@dataclass
class Workload:
    nodes: list[dict[str, Any]]
    classes: list[dict[str, Any]]
    slices: list[dict[str, Any]]
    allocated: list[dict[str, Any]]
    units: list[Unit]
    ignored: list[str]  # kinds we do not use, for a warning
    # The pods (their generated claims' names in status.resourceClaimStatuses, as the claim controller records
    # them) and the PodGroups (Workload API), for gangs.
    pods: list[dict[str, Any]] = field(default_factory=list)
    pod_groups: list[dict[str, Any]] = field(default_factory=list)

    def node_candidates(self, unit: Unit, all_nodes: Iterable[Node], extra_pins: Iterable[NodeSelector] = ()) -> list[str]:
        names = []
        pins = [*unit.pinned, *extra_pins]
        for node in all_nodes:
            if unit.node_name and node.name != unit.node_name:
                continue
            if any(node.labels.get(k) != v for k, v in unit.node_selector.items()):
                continue
            if any(not s.matches(node) for s in pins):
                continue
            names.append(node.name)
        return sorted(names)


def build_workload(objects: Iterable[Mapping[str, Any]], extended_resource: bool = False) -> Workload:
    """Raises controller.expand.ExpandError for a workload object that cannot be expanded. `extended_resource`: the
    DRAExtendedResource gate; pods asking for an extended resource that a DeviceClass backs get the special claim
    the scheduler would create (see controller/extended.py)."""
    nodes, classes, slices, claims, templates, pods, ignored = [], [], [], [], {}, [], []
    taint_rules: list[dict[str, Any]] = []
    pod_groups: list[dict[str, Any]] = []
    order: list[tuple[str, dict[str, Any]]] = []
    for obj in expand(objects):
        kind = obj.get("kind")
        if kind == "Node":
            nodes.append(dict(obj))
        elif kind == "DeviceClass":
            classes.append(dict(obj))
        elif kind == "ResourceSlice":
            slices.append(dict(obj))
        elif kind == "ResourceClaim":
            claims.append(dict(obj))
            order.append(("claim", claims[-1]))
        elif kind == "ResourceClaimTemplate":
            templates[claim_key(obj)] = obj
        elif kind == "Pod":
            pods.append(dict(obj))
            order.append(("pod", pods[-1]))
        elif kind == "DeviceTaintRule":
            taint_rules.append(dict(obj))
        elif kind == "PodGroup":
            pod_groups.append(dict(obj))
        else:
            ignored.append(f"{kind}/{claim_key(obj)}")
    by_key = {claim_key(c): c for c in claims}
    owned = GeneratedClaims(claims)  # the input's claims made for pods, by owner and pod claim name (indexed once)
    referenced: set[str] = set()
    units: list[Unit] = []
    generated: list[dict[str, Any]] = []
    placed_by: dict[str, str] = {}  # pending claim key -> owner of the unit that places it
    backing = class_for_resource(classes)
    for kind, obj in order:
        if kind != "pod":
            continue
        unit = _pod_unit(obj, by_key, owned, templates, referenced, generated, placed_by)
        _add_extended_claim(unit, obj, backing, extended_resource)
        obj["_unit"] = unit
    allocated = [c for c in [*claims, *generated] if (c.get("status") or {}).get("allocation")]
    for kind, obj in order:
        if kind == "pod":
            units.append(obj.pop("_unit"))
    units += [Unit(owner=f"ResourceClaim {claim_key(obj)}", claims=[obj], unreferenced=True) for kind, obj in order
              if kind == "claim" and claim_key(obj) not in referenced and not (obj.get("status") or {}).get("allocation")]
    return Workload(nodes, classes, apply_taint_rules(slices, taint_rules), allocated, units, ignored,
                    [_with_claim_statuses(p, owned) for p in pods], pod_groups)


def _with_claim_statuses(pod: Mapping[str, Any], owned: GeneratedClaims) -> dict[str, Any]:
    """The pod as the claim controller leaves it: each template entry's claim name in status.resourceClaimStatuses
    (the claim of the input it owns when there is one, as _pod_unit resolves it)."""
    name = str((pod.get("metadata") or {}).get("name", ""))
    entries = [e for e in (pod.get("spec") or {}).get("resourceClaims") or [] if e.get("resourceClaimTemplateName")]
    status = dict(pod.get("status") or {})
    recorded = {s.get("name") for s in status.get("resourceClaimStatuses") or []}
    made = {pc.pod_claim_name: pc.claim_name for pc in resolve_pod_claims(pod, owned)}
    status["resourceClaimStatuses"] = list(status.get("resourceClaimStatuses") or []) + [
        {"name": e.get("name"), "resourceClaimName": made.get(str(e.get("name"))) or f"{name}-{e.get('name')}"}
        for e in entries if e.get("name") not in recorded]
    return {**pod, "status": status}


def _pod_unit(pod: Mapping[str, Any], claims: dict[str, dict[str, Any]], owned: GeneratedClaims,
              templates: Mapping[str, Mapping[str, Any]],
              referenced: set[str], generated: list[dict[str, Any]], placed_by: dict[str, str]) -> Unit:
    meta = pod.get("metadata") or {}
    ns, name = meta.get("namespace") or "default", str(meta.get("name", ""))
    spec = pod.get("spec") or {}
    unit = Unit(owner=f"Pod {ns}/{name}", claims=[], node_name=spec.get("nodeName") or None,
                node_selector={str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()})
    if pod_done(pod):
        return unit  # finished: its claims are released, it needs none
    made = {pc.pod_claim_name: pc for pc in resolve_pod_claims(pod, owned)}
    recorded = {str(s.get("name")) for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
                if isinstance(s, Mapping)}
    # Running, or bound after the claim controller made its claims: what it uses was allocated before it got its
    # node, and nothing is made for it any more. (A hand-written pod with spec.nodeName only is pinned to that node.)
    settled = (pod.get("status") or {}).get("phase") not in (None, "", "Pending") or (pod_scheduled(pod) and bool(recorded))
    for i, entry in enumerate(spec.get("resourceClaims") or []):
        entry_name = str(entry.get("name", ""))
        if entry.get("resourceClaimName"):
            key = f"{ns}/{entry['resourceClaimName']}"
            claim = claims.get(key)
            if claim is None:
                if settled:
                    continue  # it holds the claim in the cluster; the input does not show it
                unit.errors.append((key, f"Pod {ns}/{name}: spec.resourceClaims[{i}].resourceClaimName: "
                                         f"ResourceClaim {key} is not in the input; give the claim or use a template"))
                continue
        elif entry.get("resourceClaimTemplateName"):
            found = made.get(entry_name)
            if found is not None and found.claim_name is None and entry_name in recorded:
                continue  # the claim controller recorded that this entry needs no claim
            key = f"{ns}/{found.claim_name if found is not None and found.claim_name else f'{name}-{entry_name}'}"
            claim = claims.get(key)
            if claim is None and settled:
                continue
            if claim is None:
                template = templates.get(f"{ns}/{entry['resourceClaimTemplateName']}")
                if template is None:
                    unit.errors.append((key, f"Pod {ns}/{name}: spec.resourceClaims[{i}].resourceClaimTemplateName: "
                                             f"ResourceClaimTemplate {ns}/{entry['resourceClaimTemplateName']} is not in the input"))
                    continue
                claim = claim_from_template(template, pod, entry_name, key.split("/", 1)[1])
                claims[key] = claim
                generated.append(claim)
        else:
            unit.errors.append((f"{ns}/{name}-{entry_name}", f"Pod {ns}/{name}: spec.resourceClaims[{i}]: exactly one of "
                                                              "resourceClaimName or resourceClaimTemplateName must be set"))
            continue
        referenced.add(key)
        alloc = (claim.get("status") or {}).get("allocation")
        if alloc:
            if alloc.get("nodeSelector"):
                unit.pinned.append(NodeSelector.parse(alloc["nodeSelector"], f"ResourceClaim {key}: status.allocation.nodeSelector"))
        elif key in placed_by and placed_by[key] != unit.owner:
            unit.shared.append(key)
        elif claim not in unit.claims:
            placed_by[key] = unit.owner
            unit.claims.append(claim)
    return unit


def _add_extended_claim(unit: Unit, pod: Mapping[str, Any], backing: Mapping[str, str], gate: bool) -> None:
    requests, _ = dra_extended_requests(pod, backing)
    if not requests:
        return
    meta = pod.get("metadata") or {}
    key = f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}-extended-resources"
    if not gate:
        resources = sorted({r["exactly"]["deviceClassName"] for r in requests})
        unit.errors.append((key, f"{unit.owner}: asks for an extended resource backed by DeviceClass(es) {', '.join(resources)} "
                                 "(DRAExtendedResource), but that feature gate is off; pass --feature DRAExtendedResource"))
        return
    # The scheduler's name is generated (`<pod>-extended-resources-xxxxx`); offline it is fixed, so output is stable.
    unit.claims.append(extended_resource_claim(pod, requests, key.split("/", 1)[1]))


def claim_from_template(template: Mapping[str, Any], pod: Mapping[str, Any], entry_name: str,
                        claim_name: str | None = None) -> dict[str, Any]:
    """The claim the resourceclaim controller makes for the pod's entry; `claim_name`: the name it recorded in the
    pod's status (the controller's names end in a random suffix), else `<pod>-<entry name>`."""
    pmeta = pod.get("metadata") or {}
    tmeta = (template.get("spec") or {}).get("metadata") or {}
    ns = pmeta.get("namespace") or "default"
    meta: dict[str, Any] = {
        "name": claim_name or f"{pmeta.get('name', '')}-{entry_name}",
        "namespace": ns,
        "annotations": {**(tmeta.get("annotations") or {}), "resource.kubernetes.io/pod-claim-name": entry_name},
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pmeta.get("name", ""),
                             "uid": pmeta.get("uid", ""), "controller": True, "blockOwnerDeletion": True}],
    }
    if tmeta.get("labels"):
        meta["labels"] = dict(tmeta["labels"])
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
            "spec": copy.deepcopy((template.get("spec") or {}).get("spec") or {})}
