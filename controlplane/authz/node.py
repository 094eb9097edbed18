"""The Node authorizer (plugin/pkg/auth/authorizer/node) for kubelets (`system:node:<name>`): reads scoped to
the node's own objects and the objects its pods reference, with AuthorizeNodeWithSelectors (on since 1.32, GA
1.34). Upstream keeps a graph updated by informers; the same relations are read here from the store when a
request needs them (pods bound to the node, their claims, secrets, config maps and service accounts)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from controlplane.authz.attributes import ALLOW, NO_OPINION, Attributes, Decision, Verdict
from controlplane.authz.bootstrap import NODE_RULES
from controlplane.authz.rbac import Rule

# (kind, namespace, name) -> the object or None; kind -> every object of it.
Get = Callable[[str, str, str], "dict[str, Any] | None"]
ListAll = Callable[[str], "list[dict[str, Any]]"]

_RULES = tuple(Rule.parse(r) for r in NODE_RULES)


def _refs(pod: dict[str, Any]) -> dict[str, set[str]]:
    """What a pod references, by kind (the graph's edges into the pod)."""
    spec = pod.get("spec") or {}
    out: dict[str, set[str]] = {"Secret": set(), "ConfigMap": set(), "ResourceClaim": set(), "ServiceAccount": set()}
    out["ServiceAccount"].add(spec.get("serviceAccountName") or "default")
    for ref in spec.get("imagePullSecrets") or ():
        out["Secret"].add(ref.get("name") or "")
    for vol in spec.get("volumes") or ():
        if (vol.get("secret") or {}).get("secretName"):
            out["Secret"].add(vol["secret"]["secretName"])
        if (vol.get("configMap") or {}).get("name"):
            out["ConfigMap"].add(vol["configMap"]["name"])
        for source in (vol.get("projected") or {}).get("sources") or ():
            if (source.get("secret") or {}).get("name"):
                out["Secret"].add(source["secret"]["name"])
            if (source.get("configMap") or {}).get("name"):
                out["ConfigMap"].add(source["configMap"]["name"])
    for part in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(part) or ():
            for env_from in c.get("envFrom") or ():
                if (env_from.get("secretRef") or {}).get("name"):
                    out["Secret"].add(env_from["secretRef"]["name"])
                if (env_from.get("configMapRef") or {}).get("name"):
                    out["ConfigMap"].add(env_from["configMapRef"]["name"])
            for env in c.get("env") or ():
                source = env.get("valueFrom") or {}
                if (source.get("secretKeyRef") or {}).get("name"):
                    out["Secret"].add(source["secretKeyRef"]["name"])
                if (source.get("configMapKeyRef") or {}).get("name"):
                    out["ConfigMap"].add(source["configMapKeyRef"]["name"])
    for rc in spec.get("resourceClaims") or ():
        if rc.get("resourceClaimName"):
            out["ResourceClaim"].add(rc["resourceClaimName"])
    for rcs in (pod.get("status") or {}).get("resourceClaimStatuses") or ():
        if rcs.get("resourceClaimName"):
            out["ResourceClaim"].add(rcs["resourceClaimName"])
    return out


class NodeAuthorizer:
    def __init__(self, get: Get, list_all: ListAll) -> None:
        self._get = get
        self._list = list_all

    def authorize(self, a: Attributes) -> Verdict:
        node = a.user.node_name
        if node is None:
            return NO_OPINION
        if not node:
            return Verdict(Decision.NO_OPINION, f'unknown node for user "{a.user.name}"')
        if a.resource_request:
            key = (a.api_group, a.resource)
            if key == ("", "secrets"):
                return self._read_namespaced(node, "Secret", a)
            if key == ("", "configmaps"):
                return self._read_namespaced(node, "ConfigMap", a)
            if key == ("resource.k8s.io", "resourceclaims"):
                if a.verb != "get":
                    return Verdict(Decision.NO_OPINION, "can only get individual resources of this type")
                if a.subresource:
                    return Verdict(Decision.NO_OPINION, "cannot get subresource")
                return self._related(node, "ResourceClaim", a)
            if key == ("", "serviceaccounts"):
                if a.verb != "create" or not a.name:
                    return Verdict(Decision.NO_OPINION, "can only create tokens for individual service accounts")
                if a.subresource != "token":
                    return Verdict(Decision.NO_OPINION, "can only create token subresource of serviceaccount")
                return self._related(node, "ServiceAccount", a)
            if key == ("coordination.k8s.io", "leases"):
                return self._lease(node, a)
            if key == ("resource.k8s.io", "resourceslices"):
                return self._slice(node, a)
            if key == ("", "nodes"):
                return self._node(node, a)
            if key == ("", "pods"):
                return self._pod(node, a)
        return ALLOW if any(r.allows(a) for r in _RULES) else NO_OPINION

    def _read_namespaced(self, node: str, kind: str, a: Attributes) -> Verdict:
        if a.verb not in ("get", "list", "watch"):
            return Verdict(Decision.NO_OPINION, "can only read resources of this type")
        if a.subresource:
            return Verdict(Decision.NO_OPINION, "cannot read subresource")
        if not a.namespace:
            return Verdict(Decision.NO_OPINION, "can only read namespaced object of this type")
        return self._related(node, kind, a)

    def _related(self, node: str, kind: str, a: Attributes) -> Verdict:
        if not a.name:
            return Verdict(Decision.NO_OPINION, "No Object name found")
        for pod in self._list("Pod"):
            if (pod.get("spec") or {}).get("nodeName") != node:
                continue
            if (pod.get("metadata") or {}).get("namespace") != a.namespace:
                continue
            if kind == "Pod" and pod["metadata"].get("name") == a.name:
                return ALLOW
            if kind != "Pod" and a.name in _refs(pod)[kind]:
                return ALLOW
        return Verdict(Decision.NO_OPINION, f"no relationship found between node '{node}' and this object")

    @staticmethod
    def _lease(node: str, a: Attributes) -> Verdict:
        if a.verb not in ("get", "create", "update", "patch", "delete"):
            return Verdict(Decision.NO_OPINION, "can only get, create, update, patch, or delete a node lease")
        if a.namespace != "kube-node-lease":
            return Verdict(Decision.NO_OPINION, 'can only access leases in the "kube-node-lease" system namespace')
        if a.verb != "create" and a.name != node:
            return Verdict(Decision.NO_OPINION, "can only access node lease with the same name as the requesting node")
        return ALLOW

    def _slice(self, node: str, a: Attributes) -> Verdict:
        if a.subresource:
            return Verdict(Decision.NO_OPINION, "cannot authorize ResourceSlice subresources")
        if a.verb == "create":
            return ALLOW  # NodeRestriction admission checks spec.nodeName
        if a.verb in ("get", "update", "patch", "delete"):
            found = self._get("ResourceSlice", "", a.name) if a.name else None
            if found is not None and (found.get("spec") or {}).get("nodeName") == node:
                return ALLOW
            return Verdict(Decision.NO_OPINION, f"no relationship found between node '{node}' and this object")
        if a.verb in ("watch", "list", "deletecollection"):
            if any(f in ("nodeName", "spec.nodeName") and v == node for f, v in a.field_equals):
                return ALLOW
            return Verdict(Decision.NO_OPINION,
                           "can only list/watch/deletecollection resourceslices with nodeName field selector")
        return Verdict(Decision.NO_OPINION, "only the following verbs are allowed for a ResourceSlice: get, watch, "
                                            "list, create, update, patch, delete, deletecollection")

    @staticmethod
    def _node(node: str, a: Attributes) -> Verdict:
        if not a.subresource:
            if a.verb in ("create", "update", "patch"):
                return ALLOW  # NodeRestriction admission limits it to its own Node
            if a.verb in ("get", "list", "watch"):
                if a.name == node:
                    return ALLOW
                if not a.name:
                    return Verdict(Decision.NO_OPINION, f"node '{node}' cannot read all nodes, only its own Node object")
                return Verdict(Decision.NO_OPINION, f"node '{node}' cannot read '{a.name}', only its own Node object")
        elif a.subresource == "status" and a.verb in ("update", "patch"):
            return ALLOW
        return NO_OPINION

    def _pod(self, node: str, a: Attributes) -> Verdict:
        if not a.subresource:
            if a.verb == "get":
                return self._related(node, "Pod", a)
            if a.verb in ("list", "watch"):
                if any(f == "spec.nodeName" and v == node for f, v in a.field_equals):
                    return ALLOW
                if a.name:
                    return self._related(node, "Pod", a)
                return Verdict(Decision.NO_OPINION, "can only list/watch pods with spec.nodeName field selector")
            if a.verb in ("create", "delete"):
                return ALLOW
        elif a.subresource == "status" and a.verb in ("update", "patch") or a.subresource == "eviction" and a.verb == "create":
            return ALLOW
        return NO_OPINION
