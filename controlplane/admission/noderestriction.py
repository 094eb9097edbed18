"""The NodeRestriction admission plugin for kubelets (`system:node:<name>`): what the Node authorizer allows
by verb, limited to the node's own objects by content."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from controlplane import status as st
from controlplane.admission.request import AdmissionRequest
from controlplane.resources import ResourceType

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
# The labels a kubelet may set on its own Node (k8s.io/kubelet's well-known labels and label namespaces); other
# kubernetes.io and k8s.io labels, and node-restriction.kubernetes.io ones, are the cluster admin's.
NODE_RESTRICTION_NAMESPACE = "node-restriction.kubernetes.io"
KUBELET_LABELS = frozenset({
    "kubernetes.io/hostname", "topology.kubernetes.io/zone", "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type", "node.kubernetes.io/instance-type", "kubernetes.io/os",
    "kubernetes.io/arch", "beta.kubernetes.io/os", "beta.kubernetes.io/arch"})
KUBELET_LABEL_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")


def _forbid(req: AdmissionRequest, message: str) -> st.StatusError:
    return st.forbidden(req.rt, req.name, message)


def _in_namespace(namespace: str, parent: str) -> bool:
    return namespace == parent or namespace.endswith("." + parent)


def forbidden_labels(labels: dict[str, Any], old: dict[str, Any]) -> list[str]:
    """The labels a node added, changed or removed on itself that it may not (sorted, as upstream lists them)."""
    modified = {k for k in set(labels) | set(old) if labels.get(k) != old.get(k) or (k in labels) != (k in old)}
    out = []
    for key in modified:
        namespace = key.split("/", 1)[0] if "/" in key else ""
        kubernetes = _in_namespace(namespace, "kubernetes.io") or _in_namespace(namespace, "k8s.io")
        kubelet = key in KUBELET_LABELS or any(_in_namespace(namespace, n) for n in KUBELET_LABEL_NAMESPACES)
        if _in_namespace(namespace, NODE_RESTRICTION_NAMESPACE) or (kubernetes and not kubelet):
            out.append(key)
    return sorted(out)


def _labels(obj: dict[str, Any] | None) -> dict[str, Any]:
    return dict(((obj or {}).get("metadata") or {}).get("labels") or {})


def check_token_request(node: str, account: ResourceType, name: str, body: Any,
                        get: Callable[[str], dict[str, Any] | None]) -> None:
    """NodeRestriction on serviceaccounts/token: a node may only mint tokens bound to a pod (by name and uid)
    that runs on it, as a kubelet asks for its pods' projected tokens. `get(name)` reads a pod of the account's
    namespace."""
    spec = (body.get("spec") if isinstance(body, dict) else None) or {}
    ref = spec.get("boundObjectRef") if isinstance(spec, dict) else None
    ref = ref if isinstance(ref, dict) else {}
    if ref.get("apiVersion") != "v1" or ref.get("kind") != "Pod" or not ref.get("name"):
        raise st.forbidden(account, name, "node requested token not bound to a pod")
    if not ref.get("uid"):
        raise st.forbidden(account, name, "node requested token with a pod binding without a uid")
    pod = get(str(ref["name"]))
    if pod is None:
        return  # the token request itself answers NotFound, as the pod lookup does upstream
    if ref["uid"] != (pod.get("metadata") or {}).get("uid"):
        raise st.forbidden(account, name, f"the UID in the bound object reference ({ref['uid']}) does not match the "
                                          "UID in record. The object might have been deleted and then recreated")
    if (pod.get("spec") or {}).get("nodeName") != node:
        raise st.forbidden(account, name, "node requested token bound to a pod scheduled on a different node")


class NodeRestrictionPlugin:
    kinds = frozenset({("", "Node"), ("", "Pod"), ("coordination.k8s.io", "Lease"),
                       ("resource.k8s.io", "ResourceSlice")})

    def admit(self, req: AdmissionRequest, obj: dict[str, Any] | None, old: dict[str, Any] | None,
              warnings: list[str]) -> None:
        node = req.user.node_name
        if node is None:
            return
        kind = req.rt.kind if req.rt.group in ("", "coordination.k8s.io", "resource.k8s.io") else ""
        current = obj if obj is not None else old
        if kind == "Node":
            if req.name != node:
                raise _forbid(req, f'node "{node}" is not allowed to modify node "{req.name}"')
            if req.operation == "CREATE" and (labels := forbidden_labels(_labels(obj), {})):
                raise _forbid(req, f'node "{node}" is not allowed to set the following labels: {", ".join(labels)}')
            if req.operation == "UPDATE" and (labels := forbidden_labels(_labels(obj), _labels(old))):
                raise _forbid(req, f"is not allowed to modify labels: {', '.join(labels)}")
        elif kind == "Pod":
            bound = ((current or {}).get("spec") or {}).get("nodeName")
            if req.subresource == "status":
                if bound != node:
                    raise _forbid(req, f'node "{node}" can only update pod status for pods with spec.nodeName '
                                       "set to itself")
            elif req.operation == "CREATE":
                annotations = ((obj or {}).get("metadata") or {}).get("annotations") or {}
                if MIRROR_ANNOTATION not in annotations:
                    raise _forbid(req, f'pod does not have "{MIRROR_ANNOTATION}" annotation, node "{node}" can '
                                       "only create mirror pods")
                if bound != node:
                    raise _forbid(req, f'node "{node}" can only create pods with spec.nodeName set to itself')
            elif req.operation == "DELETE" and bound != node:
                raise _forbid(req, f'node "{node}" can only delete pods with spec.nodeName set to itself')
        elif kind == "Lease" and req.operation == "CREATE" and req.name != node:
            raise _forbid(req, "can only access node lease with the same name as the requesting node")
        elif kind == "ResourceSlice":
            for candidate in (obj, old):
                owner = ((candidate or {}).get("spec") or {}).get("nodeName")
                if candidate is not None and owner != node:
                    raise _forbid(req, f'node "{node}" can only {req.verb} ResourceSlices with spec.nodeName set '
                                       f'to itself, not "{owner or ""}"')
