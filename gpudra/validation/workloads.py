"""Kubernetes 1.37's validation of the Workload API (`scheduling.k8s.io/v1beta1` Workload and PodGroup, KEP-4671),
from the declarative rules on the v1beta1 types: what the embedded control plane checks on create and update.

- Workload: `podGroupTemplates` 1..8, names unique DNS labels; `compositePodGroupTemplates` (CompositePodGroup,
  alpha, off) forbidden; `controllerRef` kind and name required; templates can be neither added nor removed and
  `controllerRef` is immutable.
- PodGroupTemplate and PodGroup: `schedulingPolicy` exactly one of `basic` / `gang`, `gang.minCount` > 0;
  `resourceClaims` (DRAWorkloadResourceClaims) at most 4, names unique DNS labels, each exactly one of
  `resourceClaimName` / `resourceClaimTemplateName`; `disruptionMode` exactly one of `single` / `all`;
  `priority` at most 1000000000; `schedulingConstraints` (TopologyAwareWorkloadScheduling, alpha, off) forbidden.
- Updates: the policy cannot switch between basic and gang; of a PodGroup's spec only `gang.minCount` changes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from gpudra.validation.errors import FieldError, child, duplicate, forbidden, index, invalid, not_supported, required, too_many
from gpudra.validation.fields import dns_label, dns_subdomain, get_int, get_list, get_map, get_str

API_VERSION = "scheduling.k8s.io/v1beta1"
KINDS = ("Workload", "PodGroup")
MAX_POD_GROUP_TEMPLATES = 8
MAX_POD_GROUP_RESOURCE_CLAIMS = 4
HIGHEST_USER_DEFINABLE_PRIORITY = 1_000_000_000
PREEMPTION_POLICIES = ("Never", "PreemptLowerPriority")

Errors = list[FieldError]


def validate_workload_api_object(obj: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> Errors:
    """Spec (and update) errors of a Workload or PodGroup; metadata is checked by the caller."""
    kind = obj.get("kind")
    errs: Errors = []
    spec = get_map(obj.get("spec"), "spec", errs)
    if errs:
        return errs
    if kind == "Workload":
        errs.extend(_workload_spec(spec, "spec"))
        if old is not None:
            errs.extend(_workload_update(spec, (old.get("spec") or {}), "spec"))
    elif kind == "PodGroup":
        errs.extend(_pod_group_spec(spec, "spec"))
        if old is not None:
            errs.extend(_pod_group_update(spec, (old.get("spec") or {}), "spec"))
    return errs


def _workload_spec(spec: Mapping[str, Any], path: str) -> Errors:
    errs: Errors = []
    if spec.get("compositePodGroupTemplates"):
        errs.append(forbidden(child(path, "compositePodGroupTemplates"),
                              "disabled by feature-gate CompositePodGroup"))
    templates_path = child(path, "podGroupTemplates")
    templates = get_list(spec.get("podGroupTemplates"), templates_path, errs)
    if not templates:
        errs.append(required(templates_path, "exactly one of podGroupTemplates or compositePodGroupTemplates is "
                                             "required"))
    elif len(templates) > MAX_POD_GROUP_TEMPLATES:
        errs.append(too_many(templates_path, len(templates), MAX_POD_GROUP_TEMPLATES))
    for item_path, template in _named_items(templates[:MAX_POD_GROUP_TEMPLATES], templates_path, errs):
        errs.extend(_group_fields(template, item_path))
    ref = spec.get("controllerRef")
    if ref is not None:
        ref_path = child(path, "controllerRef")
        ref_map = get_map(ref, ref_path, errs)
        for field in ("kind", "name"):
            value = get_str(ref_map.get(field), child(ref_path, field), errs)
            if not value:
                errs.append(required(child(ref_path, field)))
            else:
                errs.extend(_path_segment(value, child(ref_path, field)))
        group = get_str(ref_map.get("apiGroup"), child(ref_path, "apiGroup"), errs)
        if group:
            errs.extend(dns_subdomain(group, child(ref_path, "apiGroup")))
    return errs


def _pod_group_spec(spec: Mapping[str, Any], path: str) -> Errors:
    errs: Errors = []
    if spec.get("parentCompositePodGroupName") is not None:
        errs.append(forbidden(child(path, "parentCompositePodGroupName"), "disabled by feature-gate CompositePodGroup"))
    ref = spec.get("workloadRef")
    if ref is not None:
        ref_path = child(path, "workloadRef")
        ref_map = get_map(ref, ref_path, errs)
        workload = get_str(ref_map.get("workloadName"), child(ref_path, "workloadName"), errs)
        if not workload:
            errs.append(required(child(ref_path, "workloadName")))
        else:
            errs.extend(dns_subdomain(workload, child(ref_path, "workloadName")))
        template = get_str(ref_map.get("templateName"), child(ref_path, "templateName"), errs)
        if not template:
            errs.append(required(child(ref_path, "templateName")))
        else:
            errs.extend(dns_label(template, child(ref_path, "templateName")))
    errs.extend(_group_fields(spec, path))
    return errs


def _group_fields(group: Mapping[str, Any], path: str) -> Errors:
    """What a PodGroupTemplate and a PodGroupSpec share."""
    errs: Errors = []
    policy_path = child(path, "schedulingPolicy")
    if group.get("schedulingPolicy") is None:
        errs.append(required(policy_path))
    else:
        policy = get_map(group.get("schedulingPolicy"), policy_path, errs)
        chosen = [k for k in ("basic", "gang") if policy.get(k) is not None]
        if len(chosen) != 1:
            errs.append(invalid(policy_path, "{" + ", ".join(chosen) + "}" if chosen else "{}",
                                "must specify exactly one of: `basic`, `gang`"))
        if policy.get("gang") is not None:
            gang_path = child(policy_path, "gang")
            gang = get_map(policy.get("gang"), gang_path, errs)
            count = get_int(gang.get("minCount"), child(gang_path, "minCount"), errs)
            if gang.get("minCount") is None:
                errs.append(required(child(gang_path, "minCount")))
            elif count is not None and count <= 0:
                errs.append(invalid(child(gang_path, "minCount"), count, "must be greater than zero"))
    if group.get("schedulingConstraints") is not None:
        errs.append(forbidden(child(path, "schedulingConstraints"),
                              "disabled by feature-gate TopologyAwareWorkloadScheduling"))
    errs.extend(_resource_claims(group.get("resourceClaims"), child(path, "resourceClaims")))
    if group.get("disruptionMode") is not None:
        mode_path = child(path, "disruptionMode")
        mode = get_map(group.get("disruptionMode"), mode_path, errs)
        chosen = [k for k in ("single", "all") if mode.get(k) is not None]
        if len(chosen) != 1:
            errs.append(invalid(mode_path, "{" + ", ".join(chosen) + "}" if chosen else "{}",
                                "must specify exactly one of: `single`, `all`"))
    name = get_str(group.get("priorityClassName"), child(path, "priorityClassName"), errs)
    if name:
        errs.extend(dns_subdomain(name, child(path, "priorityClassName")))
    if group.get("priority") is not None:
        priority = get_int(group.get("priority"), child(path, "priority"), errs)
        if priority is not None and priority > HIGHEST_USER_DEFINABLE_PRIORITY:
            errs.append(invalid(child(path, "priority"), priority,
                                f"must be less than or equal to {HIGHEST_USER_DEFINABLE_PRIORITY}"))
    preemption = group.get("preemptionPolicy")
    if preemption is not None and preemption not in PREEMPTION_POLICIES:
        errs.append(not_supported(child(path, "preemptionPolicy"), preemption, list(PREEMPTION_POLICIES)))
    return errs


def _resource_claims(value: Any, path: str) -> Errors:
    errs: Errors = []
    claims = get_list(value, path, errs)
    if len(claims) > MAX_POD_GROUP_RESOURCE_CLAIMS:
        errs.append(too_many(path, len(claims), MAX_POD_GROUP_RESOURCE_CLAIMS))
    for item_path, claim in _named_items(claims[:MAX_POD_GROUP_RESOURCE_CLAIMS], path, errs):
        sources = [k for k in ("resourceClaimName", "resourceClaimTemplateName") if claim.get(k) is not None]
        if len(sources) != 1:
            errs.append(invalid(item_path, claim, "must specify one of: `resourceClaimName`, "
                                                  "`resourceClaimTemplateName`"))
        for k in sources:
            text = get_str(claim.get(k), child(item_path, k), errs)
            errs.extend(dns_subdomain(text, child(item_path, k)) if text else [required(child(item_path, k))])
    return errs


def _named_items(items: list[Any], path: str, errs: Errors) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Each item of a list keyed by `name` (a required DNS label, unique in the list), with its path; problems with
    the names go into `errs`."""
    seen: set[str] = set()
    for i, item in enumerate(items):
        item_path = index(path, i)
        entry = get_map(item, item_path, errs)
        name = get_str(entry.get("name"), child(item_path, "name"), errs)
        if not name:
            errs.append(required(child(item_path, "name")))
        else:
            errs.extend(dns_label(name, child(item_path, "name")))
            if name in seen:
                errs.append(duplicate(item_path, name))
            seen.add(name)
        yield item_path, entry


def _path_segment(value: str, path: str) -> Errors:
    if value in (".", ".."):
        return [invalid(path, value, f"may not be '{value}'")]
    for bad in ("/", "%"):
        if bad in value:
            return [invalid(path, value, f"may not contain '{bad}'")]
    return []


def _policy_kind(group: Mapping[str, Any]) -> str | None:
    policy = group.get("schedulingPolicy") or {}
    return "gang" if policy.get("gang") is not None else ("basic" if policy.get("basic") is not None else None)


def _workload_update(new: Mapping[str, Any], old: Mapping[str, Any], path: str) -> Errors:
    errs: Errors = []
    if new.get("controllerRef") != old.get("controllerRef"):
        errs.append(invalid(child(path, "controllerRef"), new.get("controllerRef"), "field is immutable"))
    old_templates = {t.get("name"): t for t in old.get("podGroupTemplates") or [] if isinstance(t, Mapping)}
    new_templates = {t.get("name"): t for t in new.get("podGroupTemplates") or [] if isinstance(t, Mapping)}
    if set(old_templates) != set(new_templates):
        errs.append(forbidden(child(path, "podGroupTemplates"), "items may not be added or removed"))
    for i, t in enumerate(new.get("podGroupTemplates") or []):
        before = old_templates.get(t.get("name")) if isinstance(t, Mapping) else None
        if before is not None and _policy_kind(before) != _policy_kind(t):
            errs.append(invalid(child(index(child(path, "podGroupTemplates"), i), "schedulingPolicy"),
                                _policy_kind(t), "field is immutable"))
    return errs


def _pod_group_update(new: Mapping[str, Any], old: Mapping[str, Any], path: str) -> Errors:
    def without_min_count(spec: Mapping[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in spec.items() if k != "schedulingPolicy"}
        out["policy"] = _policy_kind(spec)
        return out

    if without_min_count(new) != without_min_count(old):
        return [invalid(path, "", "field is immutable except schedulingPolicy.gang.minCount")]
    return []
