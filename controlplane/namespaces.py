"""Namespaces as kube-apiserver and the namespace controller handle them.

- Create: status.phase Active and `spec.finalizers` holding `kubernetes` (appended to the client's own), each
  finalizer a standard name or domain-qualified.
- `spec.finalizers` changes only through PUT .../namespaces/<name>/finalize; an update or a status write keeps it.
- Delete: a namespace with no finalizers at all goes at once; otherwise it turns Terminating (phase only) and waits.
- The namespace controller, for a Terminating namespace still holding `kubernetes`: deletes its content (after a
  first pass that takes it a moment, which is why `kubectl delete -f` of a file holding a namespace and its
  objects finds those objects still there), reports in the status conditions what remains and which finalizers
  hold it, and once nothing remains removes `kubernetes`; the namespace is removed when no finalizer of either
  kind is left. Content of a namespace whose `kubernetes` finalizer someone else removed is not touched.

The functions here are pure: the store (controlplane.store) holds the objects and calls them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

KUBERNETES = "kubernetes"
STANDARD_FINALIZERS = (KUBERNETES, "orphan", "foregroundDeletion")
# The namespace controller's first pass (discovery of every namespaced resource, then one list per type) before
# any content is deleted.
CONTENT_DELETION_DELAY_S = 2.0
# How soon the controller passes again over a namespace whose content remains (its requeue after an estimate of 0).
REMAINING_RETRY_S = 1.0

# The conditions the namespace controller keeps, in its order, with their reason and message while all is well.
_CONDITIONS_OK = (
    ("NamespaceDeletionDiscoveryFailure", "ResourcesDiscovered", "All resources successfully discovered"),
    ("NamespaceDeletionGroupVersionParsingFailure", "ParsedGroupVersions", "All legacy kube types successfully parsed"),
    ("NamespaceDeletionContentFailure", "ContentDeleted", "All content successfully deleted, may be waiting on "
                                                          "finalization"),
    ("NamespaceContentRemaining", "ContentRemoved", "All content successfully removed"),
    ("NamespaceFinalizersRemaining", "ContentRemoved", "All content successfully removed"),
)


def spec_finalizers(ns: Mapping[str, Any]) -> list[str]:
    spec = ns.get("spec")
    finalizers = spec.get("finalizers") if isinstance(spec, dict) else None
    return [str(f) for f in finalizers] if isinstance(finalizers, list) else []


def prepare_create(obj: dict[str, Any]) -> None:
    obj["status"] = {"phase": "Active"}
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        spec = obj["spec"] = {}
    finalizers = spec.get("finalizers")
    if not isinstance(finalizers, list):
        finalizers = spec["finalizers"] = []
    if KUBERNETES not in finalizers:
        finalizers.append(KUBERNETES)


def spec_errors(obj: Mapping[str, Any]) -> list[str]:
    """Validation of spec.finalizers, in kube-apiserver's words."""
    spec = obj.get("spec")
    finalizers = spec.get("finalizers") if isinstance(spec, dict) else None
    if finalizers is None:
        return []
    if not isinstance(finalizers, list) or not all(isinstance(f, str) for f in finalizers):
        return ["spec.finalizers: Invalid value: must be a list of strings"]
    errors = []
    for name in finalizers:
        parts = name.split("/")
        if len(parts) > 2 or not all(parts) or len(parts[-1]) > 63:
            errors.append(f"spec.finalizers: Invalid value: {json.dumps(name)}: a qualified name must consist of "
                          "alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
                          "character, with an optional DNS subdomain prefix and '/'")
        elif len(parts) == 1 and name not in STANDARD_FINALIZERS:
            errors.append(f"spec.finalizers: Invalid value: {json.dumps(name)}: name is neither a standard finalizer "
                          "name nor is it fully qualified")
    return errors


def with_spec_of(new: dict[str, Any], old: Mapping[str, Any]) -> dict[str, Any]:
    """An update (not /finalize): spec.finalizers stays what it was."""
    spec = dict(new.get("spec") or {}) if isinstance(new.get("spec"), dict) else {}
    spec["finalizers"] = spec_finalizers(old)
    new["spec"] = spec
    return new


def finalized(old: Mapping[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """PUT /finalize: the stored namespace with the body's spec.finalizers (nothing else of the body is taken)."""
    return {**old, "metadata": dict(old["metadata"]), "spec": {**(old.get("spec") or {}),
                                                                "finalizers": spec_finalizers(body)}}


def is_finalized(ns: Mapping[str, Any]) -> bool:
    """Nothing holds the namespace any more: no spec finalizer and no metadata finalizer."""
    return not spec_finalizers(ns) and not (ns.get("metadata") or {}).get("finalizers")


def terminating(status: Any) -> dict[str, Any]:
    """status once the namespace is deleted: phase Terminating; the controller's conditions come with its pass."""
    return {**(status if isinstance(status, dict) else {}), "phase": "Terminating"}


def controller_status(status: Any, remaining: Mapping[str, int], held_by: Mapping[str, int],
                      now: str) -> dict[str, Any]:
    """The status the namespace controller writes after a pass: `remaining` counts content left per
    "<resource>.<group>", `held_by` the finalizers on it. lastTransitionTime moves only when a condition's status
    does, as the controller's updateConditions keeps it."""
    status = dict(status) if isinstance(status, dict) else {}
    failing: dict[str, tuple[str, str]] = {}
    counts = sorted(f"{gr} has {n} resource instances" for gr, n in remaining.items() if n)
    if counts:
        failing["NamespaceContentRemaining"] = ("SomeResourcesRemain", "Some resources are remaining: "
                                                + ", ".join(counts))
    holds = sorted(f"{f} in {n} resource instances" for f, n in held_by.items() if n)
    if holds:
        failing["NamespaceFinalizersRemaining"] = ("SomeFinalizerRemain", "Some finalizers are remaining: "
                                                   + ", ".join(holds))
    old = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, dict)}
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)
                  and c.get("type") not in {t for t, _, _ in _CONDITIONS_OK}]
    for kind, ok_reason, ok_message in _CONDITIONS_OK:
        reason, message = failing.get(kind, (ok_reason, ok_message))
        state = "True" if kind in failing else "False"
        before = old.get(kind) or {}
        since = before.get("lastTransitionTime") if before.get("status") == state else now
        conditions.append({"type": kind, "status": state, "lastTransitionTime": since or now, "reason": reason,
                           "message": message})
    status["conditions"] = conditions
    return status


def without_kubernetes(ns: Mapping[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """The controller's /finalize once the namespace is empty: `kubernetes` removed, others kept."""
    return {**ns, "metadata": dict(ns["metadata"]), "status": status,
            "spec": {**(ns.get("spec") or {}), "finalizers": [f for f in spec_finalizers(ns) if f != KUBERNETES]}}
