"""Which requests a policy or webhook applies to: rules (groups, versions, resources, operations, scope),
namespaceSelector and objectSelector, as admission/plugin/{policy,webhook} match them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from controlplane.admission.request import AdmissionRequest
from controlplane.selectors import labels_of
from gpudra.labelselector import selects

NamespaceLookup = Callable[[str], "dict[str, Any] | None"]


def _rule_matches(rule: dict[str, Any], req: AdmissionRequest, exact: bool) -> bool:
    def has(values: Any, value: str) -> bool:
        return "*" in (values or ()) or value in (values or ())
    if not has(rule.get("apiGroups"), req.rt.group) or not has(rule.get("operations"), req.operation):
        return False
    versions = rule.get("apiVersions") or ()
    if "*" not in versions:
        served = {req.version or req.rt.version} if exact else set(req.rt.versions)
        if not served & set(versions):
            return False
    resources = rule.get("resources") or ()
    if req.subresource:
        if not {"*/*", f"{req.rt.plural}/{req.subresource}", f"*/{req.subresource}"} & set(resources):
            return False
    elif not {"*", req.rt.plural} & set(resources):
        return False
    scope = rule.get("scope") or "*"
    if scope == "Cluster" and req.rt.namespaced or scope == "Namespaced" and not req.rt.namespaced:
        return False
    names = rule.get("resourceNames")
    return not names or req.name in names


def rules_match(rules: Any, req: AdmissionRequest, match_policy: str = "Equivalent") -> bool:
    """`match_policy` Exact matches the request's own version only; Equivalent (the default), any version
    the resource is served in (the request is converted to the one the rule names)."""
    exact = match_policy == "Exact"
    return any(_rule_matches(r, req, exact) for r in rules or () if isinstance(r, dict))


def selectors_match(namespace_selector: Any, object_selector: Any, req: AdmissionRequest,
                    obj: dict[str, Any] | None, old: dict[str, Any] | None, namespace: NamespaceLookup) -> bool:
    if object_selector and not any(selects(object_selector, labels_of(o))
                                   for o in (obj, old) if o is not None):
        return False
    if namespace_selector and (namespace_selector.get("matchLabels") or namespace_selector.get("matchExpressions")):
        if req.rt.kind == "Namespace" and not req.rt.group:
            labels = labels_of(obj or old or {})
        elif req.rt.namespaced:
            labels = labels_of(namespace(req.namespace) or {})
        else:
            return True  # another cluster-scoped object: namespaceSelector never excludes it
        return selects(namespace_selector, labels)
    return True


def request_view(req: AdmissionRequest) -> dict[str, Any]:
    """The `request` of CEL and the AdmissionReview (admission.k8s.io/v1 AdmissionRequest)."""
    gvk = {"group": req.rt.group, "version": req.rt.version, "kind": req.rt.kind}
    gvr = {"group": req.rt.group, "version": req.rt.version, "resource": req.rt.plural}
    out: dict[str, Any] = {"kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
                           "name": req.name, "namespace": req.namespace, "operation": req.operation,
                           "userInfo": {"extra": {}, "uid": "", **req.user.as_api()}, "dryRun": req.dry_run}
    if req.subresource:
        out["subResource"] = out["requestSubResource"] = req.subresource
    return out
