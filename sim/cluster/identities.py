"""Who each component of a simulated cluster is, as a real cluster would have it: `manifests/base` applied at
start (namespace, ServiceAccounts, RBAC, the node-agent ValidatingAdmissionPolicy, DeviceClasses; the DaemonSet
and Deployment are run as processes instead), the controller and each node agent with a ServiceAccount token of
its manifest's account (the agent's bound to its Node, as a DaemonSet pod's projected token is), kubelets as
`system:node:<name>`, and the person's kubeconfig as the admin. A verb missing from the manifests fails the
component that needs it, as on a cluster."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from gpudra.atomicfile import atomic_write
from gpudra.kubeapi import AlreadyExists, KubeApi
from gpudra.manifests import load_objects
from sim.demo.cluster import apply_order

NAMESPACE = "gpu-dra-system"
CONTROLLER_ACCOUNT = "gpu-dra-controller"
AGENT_ACCOUNT = "gpu-dra-node-agent"
# What runs as processes, not as the manifests' workloads.
_RUN_AS_PROCESSES = ("DaemonSet", "Deployment")
# A year: the simulated cluster's tokens are not rotated (a kubelet refreshes projected tokens on a cluster).
TOKEN_SECONDS = 365 * 86400
# In embedded mode the controller also plays kube-scheduler: kube-scheduler's own rights (system:kube-scheduler
# and system:volume-scheduler on a cluster) are bound to it here, beside the manifests' role, which is the
# controller's alone.
EMBEDDED_SCHEDULER_ROLE: list[dict[str, Any]] = [
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
     "metadata": {"name": "gpu-dra-sim:embedded-scheduler"},
     "rules": [
         {"apiGroups": [""], "resources": ["pods/binding", "bindings"], "verbs": ["create"]},
         {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch", "update"]},
         {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete", "update"]},
         {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["create", "delete"]},
         {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaimtemplates"], "verbs": ["get", "list", "watch"]},
         {"apiGroups": ["resource.k8s.io"], "resources": ["devicetaintrules"], "verbs": ["get", "list", "watch"]},
         {"apiGroups": ["resource.k8s.io"], "resources": ["devicetaintrules/status"], "verbs": ["patch", "update"]},
         {"apiGroups": ["scheduling.k8s.io"], "resources": ["workloads", "podgroups"], "verbs": ["get", "list", "watch"]},
         {"apiGroups": ["scheduling.k8s.io"], "resources": ["podgroups/status"], "verbs": ["patch", "update"]},
         {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["get", "list", "watch"]},
         {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
     ]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
     "metadata": {"name": "gpu-dra-sim:embedded-scheduler"},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                 "name": "gpu-dra-sim:embedded-scheduler"},
     "subjects": [{"kind": "ServiceAccount", "name": CONTROLLER_ACCOUNT, "namespace": NAMESPACE}]},
]


def base_objects(manifests: Path) -> list[dict[str, Any]]:
    """The objects of the kustomization's `resources`, less the workloads."""
    kustomization = yaml.safe_load((manifests / "kustomization.yaml").read_text()) or {}
    files = [str(manifests / f) for f in kustomization.get("resources") or ()]
    return [o for o in load_objects(files) if o.get("kind") not in _RUN_AS_PROCESSES]


def apply_base(api: KubeApi, manifests: Path, *, embedded_scheduler: bool = True) -> list[str]:
    """Create what `kubectl apply -k manifests/base` would, less the workloads; objects that exist are kept."""
    objects = base_objects(manifests) + (copy.deepcopy(EMBEDDED_SCHEDULER_ROLE) if embedded_scheduler else [])
    order = ("Namespace", "ServiceAccount", "ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding")
    ranked = sorted(apply_order(objects), key=lambda o: order.index(o["kind"]) if o["kind"] in order else len(order))
    created = []
    for obj in ranked:
        body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
        try:
            api.create(str(obj["kind"]), body)
        except AlreadyExists:
            continue
        created.append(f"{obj['kind']}/{obj['metadata']['name']}")
    return created


def kubeconfig_with_token(admin_kubeconfig: Path, token: str, target: Path) -> Path:
    """The admin kubeconfig's cluster with another user's bearer token."""
    config = yaml.safe_load(admin_kubeconfig.read_text())
    for user in config.get("users") or []:
        user["user"] = {"token": token}
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, yaml.safe_dump(config, sort_keys=False).encode())
    target.chmod(0o600)
    return target


def service_account_kubeconfig(api: KubeApi, admin_kubeconfig: Path, account: str, target: Path, *,
                               node: str | None = None) -> Path:
    """A kubeconfig with a TokenRequest token of `account` in gpu-dra-system, bound to Node `node` if given."""
    spec: dict[str, Any] = {"expirationSeconds": TOKEN_SECONDS}
    if node is not None:
        found = api.get("Node", node)
        spec["boundObjectRef"] = {"kind": "Node", "apiVersion": "v1", "name": node, "uid": found["metadata"]["uid"]}
    return kubeconfig_with_token(admin_kubeconfig, api.create_token(NAMESPACE, account, spec), target)


def node_kubeconfig(token_key: Path, admin_kubeconfig: Path, node: str, target: Path) -> Path:
    """A kubelet's kubeconfig: `system:node:<node>`, minted with the control plane's signing key as kubeadm
    mints kubelet client certificates with the cluster CA's key."""
    from controlplane.authn import TokenAuthenticator

    token = TokenAuthenticator(token_key.read_bytes()).node_token(node)
    return kubeconfig_with_token(admin_kubeconfig, token, target)


def kubelet_client_check(token_key: Path) -> Callable[[str | None], bool]:
    """The kubelet's check of who may use its streaming server: the control plane's kubelet client credential,
    verified with the signing key as kubeadm's kubelets verify the API server's client certificate with the CA."""
    from controlplane.authn import TokenAuthenticator

    return TokenAuthenticator(token_key.read_bytes()).is_kubelet_client
