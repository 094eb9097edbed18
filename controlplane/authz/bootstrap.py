"""kube-apiserver's bootstrap RBAC policy (plugin/pkg/auth/authorizer/rbac/bootstrappolicy), the part that
matters here: stored at start when absent, labelled `kubernetes.io/bootstrapping: rbac-defaults` as upstream
reconciles them, so `kubectl get clusterroles` shows them and an applied change to them is kept."""

from __future__ import annotations

from typing import Any

_LABELS = {"kubernetes.io/bootstrapping": "rbac-defaults"}
_ANNOTATIONS = {"rbac.authorization.kubernetes.io/autoupdate": "true"}
_READ = ["get", "list", "watch"]
_WRITE = ["create", "delete", "deletecollection", "patch", "update"]
_AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"


def _rule(verbs: list[str], groups: list[str] | None = None, resources: list[str] | None = None,
          urls: list[str] | None = None) -> dict[str, Any]:
    if urls is not None:
        return {"verbs": verbs, "nonResourceURLs": urls}
    return {"apiGroups": groups or [""], "resources": resources or [], "verbs": verbs}


def _role(name: str, rules: list[dict[str, Any]], labels: dict[str, str] | None = None,
          aggregate_from: str | None = None) -> dict[str, Any]:
    role: dict[str, Any] = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                            "metadata": {"name": name, "labels": {**_LABELS, **(labels or {})},
                                         "annotations": dict(_ANNOTATIONS)}}
    if aggregate_from is not None:
        role["aggregationRule"] = {"clusterRoleSelectors": [{"matchLabels": {_AGGREGATE + aggregate_from: "true"}}]}
        role["rules"] = []
    else:
        role["rules"] = rules
    return role


def _binding(name: str, role: str, groups: list[str]) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": dict(_LABELS), "annotations": dict(_ANNOTATIONS)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g} for g in groups]}


_WORKLOADS_READ = [
    _rule(_READ, [""], ["pods", "pods/log", "pods/status", "configmaps", "events", "namespaces", "namespaces/status",
                        "resourcequotas", "resourcequotas/status", "serviceaccounts", "services", "services/status"]),
    _rule(_READ, ["discovery.k8s.io"], ["endpointslices"]),
    _rule(_READ, ["apps"], ["deployments", "deployments/status", "replicasets", "replicasets/status",
                            "statefulsets", "statefulsets/status"]),
    _rule(_READ, ["batch"], ["jobs", "jobs/status", "cronjobs", "cronjobs/status"]),
    _rule(_READ, ["coordination.k8s.io"], ["leases"]),
    _rule(_READ, ["policy"], ["poddisruptionbudgets", "poddisruptionbudgets/status"]),
    _rule(_READ, ["resource.k8s.io"], ["resourceclaims", "resourceclaims/status", "resourceclaimtemplates"]),
    _rule(_READ, ["scheduling.k8s.io"], ["workloads", "podgroups", "podgroups/status"]),
]
_WORKLOADS_WRITE = [
    _rule(_WRITE, [""], ["pods", "configmaps", "secrets", "serviceaccounts", "services"]),
    _rule(["create"], [""], ["serviceaccounts/token", "pods/eviction"]),
    _rule(_WRITE, ["apps"], ["deployments", "deployments/scale", "replicasets", "replicasets/scale",
                             "statefulsets", "statefulsets/scale"]),
    _rule(_WRITE, ["batch"], ["jobs", "cronjobs"]),
    _rule(_WRITE, ["coordination.k8s.io"], ["leases"]),
    _rule(_WRITE, ["policy"], ["poddisruptionbudgets"]),
    _rule(_WRITE, ["resource.k8s.io"], ["resourceclaims", "resourceclaimtemplates"]),
    _rule(_WRITE, ["scheduling.k8s.io"], ["workloads", "podgroups"]),
    _rule(_READ, [""], ["secrets"]),
]


def bootstrap_policy() -> list[dict[str, Any]]:
    """The ClusterRoles and ClusterRoleBindings, in the order they are stored."""
    return [
        _role("cluster-admin", [_rule(["*"], ["*"], ["*"]), _rule(["*"], urls=["*"])]),
        _role("system:discovery", [_rule(["get"], urls=["/api", "/api/*", "/apis", "/apis/*", "/healthz",
                                                         "/livez", "/openapi", "/openapi/*", "/readyz",
                                                         "/version", "/version/"])]),
        _role("system:public-info-viewer", [_rule(["get"], urls=["/healthz", "/livez", "/readyz", "/version",
                                                                  "/version/"])]),
        _role("system:basic-user", [
            _rule(["create"], ["authorization.k8s.io"], ["selfsubjectaccessreviews", "selfsubjectrulesreviews"]),
            _rule(["create"], ["authentication.k8s.io"], ["selfsubjectreviews"])]),
        _role("admin", [], aggregate_from="admin"),
        _role("edit", [], {_AGGREGATE + "admin": "true"}, aggregate_from="edit"),
        _role("view", [], {_AGGREGATE + "edit": "true"}, aggregate_from="view"),
        _role("system:aggregate-to-admin", [
            _rule(_WRITE, ["rbac.authorization.k8s.io"], ["roles", "rolebindings"]),
            _rule(_READ, ["rbac.authorization.k8s.io"], ["roles", "rolebindings"]),
            _rule(["create"], ["authorization.k8s.io"], ["localsubjectaccessreviews"])],
            {_AGGREGATE + "admin": "true"}),
        _role("system:aggregate-to-edit", _WORKLOADS_WRITE, {_AGGREGATE + "edit": "true"}),
        _role("system:aggregate-to-view", _WORKLOADS_READ, {_AGGREGATE + "view": "true"}),
        _binding("cluster-admin", "cluster-admin", ["system:masters"]),
        _binding("system:discovery", "system:discovery", ["system:authenticated"]),
        _binding("system:basic-user", "system:basic-user", ["system:authenticated"]),
        _binding("system:public-info-viewer", "system:public-info-viewer",
                 ["system:authenticated", "system:unauthenticated"]),
    ]


# bootstrappolicy.NodeRules(): what the Node authorizer grants every kubelet for resources it does not
# subdivide (the rest, pods, nodes, slices, claims, leases, is decided per node in authz/node.py).
NODE_RULES: list[dict[str, Any]] = [
    _rule(["create", "get", "list", "watch", "update", "patch", "delete"], [""], ["nodes"]),
    _rule(["patch", "update"], [""], ["nodes/status"]),
    _rule(["create", "update", "patch"], [""], ["events"]),
    _rule(["create", "update", "patch"], ["events.k8s.io"], ["events"]),
    _rule(_READ, [""], ["pods", "services", "endpoints"]),
    _rule(["create", "delete"], [""], ["pods"]),
    _rule(["update", "patch"], [""], ["pods/status"]),
    _rule(["create"], [""], ["pods/eviction"]),
    _rule(["get"], [""], ["configmaps", "secrets", "persistentvolumeclaims", "persistentvolumes"]),
    _rule(["create"], ["authentication.k8s.io"], ["tokenreviews"]),
    _rule(["create"], ["authorization.k8s.io"], ["subjectaccessreviews", "localsubjectaccessreviews"]),
    _rule(["get"], ["resource.k8s.io"], ["resourceclaims"]),
    _rule(_READ, ["resource.k8s.io"], ["resourceslices"]),
    _rule(["create", "update", "patch", "delete", "deletecollection"], ["resource.k8s.io"], ["resourceslices"]),
    _rule(["get", "create", "update", "patch", "delete"], ["coordination.k8s.io"], ["leases"]),
    _rule(["create"], [""], ["serviceaccounts/token"]),
]
