"""Pods that ask for an extended resource such as `nvidia.com/gpu`, without DRA claims.

Two paths, as in Kubernetes:
- the device plugin path: NodeResourcesFit (sim.roles.nodefit) fits the request against the node's
  `status.allocatable["nvidia.com/gpu"]` (what its node agent's device plugin reports) less what pods already
  bound to it request;
- DRAExtendedResource (KEP-5004): a DeviceClass with `spec.extendedResourceName` (and every class under its
  implicit name `deviceclass.resource.kubernetes.io/<class>`) backs the resource with DRA. The scheduler gives
  the pod one special ResourceClaim, `<pod>-extended-resources-...` with the annotation
  `resource.kubernetes.io/extended-resource-claim: "true"`, holding one ExactCount request per container and
  resource, named `container-<i>-request-<j>` (i counts initContainers then containers, j is the resource's
  position among the container's sorted request names), and records the mapping in the pod's
  `status.extendedResourceClaimStatus`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from controller import objects as o
from gpudra.quantity import Quantity


def _amount(raw: Any) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    try:
        quantity = Quantity.parse(str(raw))
    except ValueError:
        return 0
    return quantity.as_int() if quantity.is_integer() else 0


def _container_requests(container: Mapping[str, Any]) -> dict[str, Any]:
    """The container's requests as the API server stores them: a limit without a request defaults the request."""
    resources = o.section(container, "resources")
    return {**o.section(resources, "limits"), **o.section(resources, "requests")}


EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"


def class_for_resource(classes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Extended resource name -> the DeviceClass that backs it. Where several classes name the same resource,
    the newest (creationTimestamp) wins, then the alphabetically first name, so the choice is deterministic."""
    out: dict[str, str] = {}
    ranked: dict[str, tuple[str, str]] = {}
    for cls in classes:
        name = o.name(cls)
        out[IMPLICIT_PREFIX + name] = name
        resource = o.section(cls, "spec").get("extendedResourceName")
        if not isinstance(resource, str) or not resource:
            continue
        created = str(o.section(cls, "metadata").get("creationTimestamp") or "")
        best = ranked.get(resource)
        if best is None or created > best[0] or (created == best[0] and name < best[1]):
            ranked[resource] = (created, name)
    out.update({resource: name for resource, (_, name) in ranked.items()})
    return out


def dra_extended_requests(pod: Mapping[str, Any], mapping: Mapping[str, str]) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The special claim's device requests for the pod's DRA-backed extended resources, and the pod status'
    request mappings (containerName, resourceName, requestName). Empty when the pod asks for none."""
    spec = o.section(pod, "spec")
    containers = [c for part in ("initContainers", "containers") for c in o.list_field(spec, part) if isinstance(c, Mapping)]
    requests: list[dict[str, Any]] = []
    mappings: list[dict[str, str]] = []
    for i, container in enumerate(containers):
        wanted = _container_requests(container)
        for j, resource in enumerate(sorted(wanted)):
            cls = mapping.get(resource)
            count = _amount(wanted[resource])
            if cls is None or count <= 0:
                continue
            name = f"container-{i}-request-{j}"
            requests.append({"name": name, "exactly": {"deviceClassName": cls, "allocationMode": "ExactCount", "count": count}})
            mappings.append({"containerName": str(container.get("name", "")), "resourceName": resource, "requestName": name})
    return requests, mappings


def extended_resource_claim(pod: Mapping[str, Any], requests: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The special claim (named `name`: the API server generates it from `<pod>-extended-resources-`)."""
    meta = o.section(pod, "metadata")
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": meta.get("namespace") or "default",
            "annotations": {EXTENDED_CLAIM_ANNOTATION: "true"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta.get("name", ""), "uid": meta.get("uid", ""),
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {"devices": {"requests": requests}},
    }
