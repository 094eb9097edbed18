"""The kubelet's node heartbeat: a Lease per node in kube-node-lease, renewed every 10 s (a quarter of its
40 s duration), as the kubelet's node lease controller keeps it."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

from gpudra.kubeapi import AlreadyExists, ApiError, KubeApi, NotFound
from gpudra.timestamps import micro_rfc3339

NODE_LEASE_NAMESPACE = "kube-node-lease"
NODE_LEASE_DURATION_S = 40  # the kubelet's default nodeLeaseDurationSeconds
RENEW_INTERVAL_S = NODE_LEASE_DURATION_S / 4


def node_lease(name: str, node_uid: str | None = None, now: datetime | None = None) -> dict[str, Any]:
    """The node's heartbeat Lease in kube-node-lease, owned by the Node, as the kubelet keeps it."""
    meta: dict[str, Any] = {"name": name, "namespace": NODE_LEASE_NAMESPACE}
    if node_uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}]
    stamp = micro_rfc3339(now)
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
            "spec": {"holderIdentity": name, "leaseDurationSeconds": NODE_LEASE_DURATION_S, "renewTime": stamp}}


def renew_node_lease(api: KubeApi, name: str, node_uid: str | None = None) -> None:
    """Create the node's Lease or move its renewTime to now (what the kubelet's heartbeat does)."""
    lease = node_lease(name, node_uid)
    try:
        api.patch("Lease", name, {"spec": {"renewTime": lease["spec"]["renewTime"]}}, namespace=NODE_LEASE_NAMESPACE)
    except NotFound:
        body = {k: v for k, v in lease.items() if k not in ("apiVersion", "kind")}
        try:
            api.create("Lease", body)
        except AlreadyExists:
            pass


def heartbeat_loop(api: KubeApi, name: str, stop: threading.Event, interval: float = RENEW_INTERVAL_S) -> None:
    """Renew the node's Lease until `stop` is set; an API error waits for the next beat."""
    while not stop.wait(interval):
        try:
            renew_node_lease(api, name)
        except ApiError:
            continue
