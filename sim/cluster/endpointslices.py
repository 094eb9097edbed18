"""The EndpointSlice controller of `gpu-dra cluster` (kube-controller-manager's endpointslice controller), pure: for
each Service with a selector, one EndpointSlice (`kubernetes.io/service-name`) of the selected pods that have an IP,
each endpoint with its conditions (ready: Ready and not terminating; serving: Ready; terminating), node and pod,
and the Service's ports with their target ports (a named target port resolved in the first selected pod that has
it). `kubectl describe service` shows them as its Endpoints. The slice is owned by its Service (the garbage
collector removes it with the Service). No traffic reaches the endpoints: there is no kube-proxy."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpudra.labelselector import selects
from sim.cluster import podstate
from sim.cluster.podstate import meta as _meta

SERVICE_NAME = "kubernetes.io/service-name"
MANAGED_BY = "endpointslice.kubernetes.io/managed-by"
CONTROLLER = "endpointslice-controller.k8s.io"


def _target_port(port: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> int | None:
    target = port.get("targetPort", port.get("port"))
    if isinstance(target, int) and not isinstance(target, bool):
        return target
    for pod in pods:
        for container in (pod.get("spec") or {}).get("containers") or []:
            for cport in container.get("ports") or []:
                if cport.get("name") == target and isinstance(cport.get("containerPort"), int):
                    return int(cport["containerPort"])
    return None


def endpoints_of(service: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(endpoints, ports) of the Service's slice; `pods`: those of its namespace."""
    selector = (service.get("spec") or {}).get("selector") or {}
    chosen = [p for p in pods if selects({"matchLabels": selector}, _meta(p).get("labels") or {})
              and (p.get("status") or {}).get("podIP")
              and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    endpoints = []
    for pod in sorted(chosen, key=lambda p: str(_meta(p).get("name"))):
        terminating = podstate.terminating(pod)
        endpoint: dict[str, Any] = {
            "addresses": [str(pod["status"]["podIP"])],
            "conditions": {"ready": podstate.ready(pod) and not terminating, "serving": podstate.ready(pod),
                           "terminating": terminating},
            "targetRef": {"kind": "Pod", "namespace": str(_meta(pod).get("namespace") or "default"),
                          "name": str(_meta(pod).get("name")), "uid": str(_meta(pod).get("uid") or "")}}
        if (pod.get("spec") or {}).get("nodeName"):
            endpoint["nodeName"] = pod["spec"]["nodeName"]
        endpoints.append(endpoint)
    ports = []
    for port in (service.get("spec") or {}).get("ports") or []:
        number = _target_port(port, chosen)
        if number is not None:
            ports.append({"name": str(port.get("name") or ""), "port": number, "protocol": port.get("protocol") or "TCP"})
    return endpoints, ports


@dataclass
class SlicePlan:
    create: list[dict[str, Any]] = field(default_factory=list)
    update: list[dict[str, Any]] = field(default_factory=list)  # whole slices, with their resourceVersion


def plan(services: Sequence[Mapping[str, Any]], slices: Sequence[Mapping[str, Any]],
         pods: Sequence[Mapping[str, Any]]) -> SlicePlan:
    out = SlicePlan()
    ours = {(str(_meta(s).get("namespace")), str((_meta(s).get("labels") or {}).get(SERVICE_NAME))): s for s in slices
            if (_meta(s).get("labels") or {}).get(MANAGED_BY) == CONTROLLER}
    for svc in services:
        meta, spec = _meta(svc), svc.get("spec") or {}
        if not spec.get("selector") or spec.get("type") == "ExternalName" or meta.get("deletionTimestamp"):
            continue
        ns, name = str(meta.get("namespace") or "default"), str(meta.get("name"))
        endpoints, ports = endpoints_of(svc, [p for p in pods if (_meta(p).get("namespace") or "default") == ns])
        labels = {**(meta.get("labels") or {}), SERVICE_NAME: name, MANAGED_BY: CONTROLLER}
        existing = ours.get((ns, name))
        if existing is None:
            out.create.append({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"generateName": f"{name}-", "namespace": ns, "labels": labels,
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": name,
                                                  "uid": meta.get("uid", ""), "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "addressType": "IPv4", "endpoints": endpoints, "ports": ports})
        elif (existing.get("endpoints") or []) != endpoints or (existing.get("ports") or []) != ports:
            out.update.append({**existing, "endpoints": endpoints, "ports": ports})
    return out
