"""The compute-domain driver's ResourceSlice for one node (pure): IMEX channels `channel-<N>` and the IMEX daemon
`daemon-0`, with NVIDIA's attributes (`type`, `id`), and the node's NVLink clique."""

from __future__ import annotations

from typing import Any

from gpudra import computedomain as cd


def slice_name(node: str) -> str:
    return f"{node}-{cd.DRIVER}".replace(".", "-")


def build_slice(node: str, clique: str | None, node_uid: str | None = None,
                channels: int = cd.PUBLISHED_CHANNELS) -> dict[str, Any]:
    """The node's slice; a node without an NVLink fabric clique publishes an empty pool (nothing to share)."""
    devices: list[dict[str, Any]] = []
    if clique is not None:
        # The clique as NVIDIA's attribute (cliqueID) and as gpu-dra's GPU devices carry it, which the gang
        # placement reads (controller.gang.clique_domains).
        cluster, _, clique_id = clique.rpartition(".")
        extra: dict[str, Any] = {"cliqueID": {"string": clique}, "fabricClusterUUID": {"string": cluster},
                                 "fabricCliqueID": {"int": int(clique_id)}}
        devices = [{"name": f"channel-{i}", "attributes": {"type": {"string": "channel"}, "id": {"int": i}, **extra}}
                   for i in range(channels)]
        devices.append({"name": "daemon-0", "attributes": {"type": {"string": "daemon"}, "id": {"int": 0}, **extra}})
    metadata: dict[str, Any] = {"name": slice_name(node)}
    if node_uid:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid,
                                        "controller": True}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": metadata,
            "spec": {"driver": cd.DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": 0, "resourceSliceCount": 1}, "devices": devices}}
