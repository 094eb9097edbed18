"""Services as kube-apiserver's service REST stores them: a ClusterIP from the service CIDR (10.96.0.0/16, as a
kind cluster's; 10.96.0.1 is the `kubernetes` Service's), node ports for NodePort and LoadBalancer Services from
30000-32767, headless Services (`clusterIP: None`) and ExternalName ones without an IP. A requested IP or node
port must be free and in range; what was allocated cannot change on update, and an update that omits it keeps it
(as `kubectl apply` of a manifest without a clusterIP does). No traffic is routed: there is no kube-proxy.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from typing import Any

SERVICE_CIDR = ipaddress.ip_network("10.96.0.0/16")
KUBERNETES_SERVICE_IP = "10.96.0.1"
NODE_PORTS = range(30000, 32768)
_TYPES = ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")


def _spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        spec = obj["spec"] = {}
    return spec


def _ports(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in spec.get("ports") or [] if isinstance(p, dict)]


def allocated(services: Iterable[dict[str, Any]]) -> tuple[set[str], set[int]]:
    """The cluster IPs and node ports the stored Services hold."""
    ips: set[str] = set()
    ports: set[int] = set()
    for svc in services:
        spec = svc.get("spec") or {}
        ips.update(ip for ip in spec.get("clusterIPs") or [spec.get("clusterIP")] if isinstance(ip, str) and ip != "None")
        ports.update(p["nodePort"] for p in _ports(spec) if isinstance(p.get("nodePort"), int))
    return ips, ports


def assign(obj: dict[str, Any], used_ips: set[str], used_ports: set[int]) -> list[str]:
    """Allocate, in place, the new Service's cluster IP and node ports; the validation errors instead."""
    spec = _spec(obj)
    kind = spec.get("type") or "ClusterIP"
    if kind not in _TYPES:
        return [f'spec.type: Unsupported value: {json.dumps(kind)}: supported values: {", ".join(map(json.dumps, _TYPES))}']
    errors: list[str] = []
    if kind == "ExternalName":
        if not spec.get("externalName"):
            errors.append("spec.externalName: Required value")
        return errors
    if not _ports(spec) and spec.get("clusterIP") != "None":
        errors.append("spec.ports: Required value")
    requested = spec.get("clusterIP") or ((spec.get("clusterIPs") or [None])[0])
    if requested == "None":
        if kind != "ClusterIP":
            errors.append(f'spec.clusterIPs[0]: Invalid value: "None": may not be set to \'None\' for {kind} services')
        spec["clusterIP"], spec["clusterIPs"] = "None", ["None"]
    elif requested:
        try:
            address = ipaddress.ip_address(str(requested))
        except ValueError:
            return [f'spec.clusterIPs[0]: Invalid value: "{requested}": must be a valid IP address']
        if address not in SERVICE_CIDR:
            errors.append(f'spec.clusterIPs: Invalid value: ["{requested}"]: failed to allocate IP {requested}: the '
                          f"provided IP ({requested}) is not in the valid range. The range of valid IPs is {SERVICE_CIDR}")
        elif str(address) in used_ips:
            errors.append(f'spec.clusterIPs: Invalid value: ["{requested}"]: failed to allocate IP {requested}: '
                          "provided IP is already allocated")
        spec["clusterIP"], spec["clusterIPs"] = str(address), [str(address)]
    else:
        free = next((str(ip) for ip in SERVICE_CIDR.hosts() if str(ip) not in used_ips), None)
        if free is None:
            return ["spec.clusterIPs: Internal error: failed to allocate a serviceIP: range is full"]
        spec["clusterIP"], spec["clusterIPs"] = free, [free]
    if spec["clusterIP"] != "None":
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
    if kind in ("NodePort", "LoadBalancer"):
        taken = set(used_ports)
        for i, port in enumerate(_ports(spec)):
            wanted = port.get("nodePort")
            if isinstance(wanted, int) and wanted:
                if wanted not in NODE_PORTS:
                    errors.append(f"spec.ports[{i}].nodePort: Invalid value: {wanted}: provided port is not in the "
                                  "valid range. The range of valid ports is 30000-32767")
                elif wanted in taken:
                    errors.append(f"spec.ports[{i}].nodePort: Invalid value: {wanted}: provided port is already allocated")
                taken.add(wanted)
                continue
            free_port = next((p for p in NODE_PORTS if p not in taken), None)
            if free_port is None:
                errors.append(f"spec.ports[{i}].nodePort: Internal error: range is full")
                continue
            port["nodePort"] = free_port
            taken.add(free_port)
        spec.setdefault("externalTrafficPolicy", "Cluster")
    return errors


def keep_allocated(new: dict[str, Any], old: dict[str, Any]) -> list[str]:
    """An update keeps what was allocated when it omits it, and may not change it."""
    spec, before = _spec(new), old.get("spec") or {}
    errors: list[str] = []
    for field in ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"):
        if field in before and not spec.get(field):
            spec[field] = before[field]
    if spec.get("clusterIPs") != before.get("clusterIPs") and before.get("clusterIPs"):
        errors.append(f"spec.clusterIPs[0]: Invalid value: {spec.get('clusterIPs')}: may not change once set")
    old_ports = {(p.get("port"), p.get("protocol", "TCP")): p.get("nodePort") for p in _ports(before)}
    for port in _ports(spec):
        kept = old_ports.get((port.get("port"), port.get("protocol", "TCP")))
        if kept and not port.get("nodePort") and (spec.get("type") in ("NodePort", "LoadBalancer")):
            port["nodePort"] = kept
    return errors


def kubernetes_service() -> dict[str, Any]:
    """The `kubernetes` Service kube-apiserver keeps in the default namespace."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kubernetes", "namespace": "default",
                         "labels": {"component": "apiserver", "provider": "kubernetes"}},
            "spec": {"type": "ClusterIP", "clusterIP": KUBERNETES_SERVICE_IP,
                     "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]}}
