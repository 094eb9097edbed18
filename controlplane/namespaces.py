"""Namespace deletion as kube-apiserver and the namespace controller do it: the namespace goes Terminating with the
controller's status conditions, its content is deleted once the controller has discovered every namespaced
resource type (a first pass that takes it a moment, which is why `kubectl delete -f` of a file holding a
namespace and its objects finds those objects still there), and the namespace is removed when it is empty."""

from __future__ import annotations

from typing import Any

# The namespace controller's first pass (discovery of every namespaced resource, then one list per type) before
# any content is deleted.
CONTENT_DELETION_DELAY_S = 2.0


def terminating_status(now: str) -> dict[str, Any]:
    """status of a namespace being deleted: phase Terminating and the controller's conditions."""
    def cond(kind: str, status: str, reason: str, message: str) -> dict[str, Any]:
        return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": now}

    return {"phase": "Terminating", "conditions": [
        cond("NamespaceDeletionDiscoveryFailure", "False", "ResourcesDiscovered", "All resources successfully discovered"),
        cond("NamespaceDeletionGroupVersionParsingFailure", "False", "ParsedGroupVersions",
             "All legacy kube types successfully parsed"),
        cond("NamespaceDeletionContentFailure", "False", "ContentDeleted", "All content successfully deleted, may be "
                                                                             "waiting on finalization"),
        cond("NamespaceContentRemaining", "False", "ContentRemoved", "All content successfully removed"),
        cond("NamespaceFinalizersRemaining", "False", "ContentHasNoFinalizers", "All content-preserving finalizers "
                                                                                  "finished"),
    ]}
