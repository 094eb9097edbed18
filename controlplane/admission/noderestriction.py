"""The NodeRestriction admission plugin for kubelets (`system:node:<name>`): what the Node authorizer allows
by verb, limited to the node's own objects by content."""

from __future__ import annotations

from typing import Any

from controlplane import status as st
from controlplane.admission.request import AdmissionRequest

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


def _forbid(req: AdmissionRequest, message: str) -> st.StatusError:
    return st.forbidden(req.rt, req.name, message)


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
