"""What NodeResourcesFit and NodePorts read of pods and nodes, as kube-scheduler computes it.

A pod's request (k8s.io/component-helpers PodRequests): the regular containers' requests summed, plus the
restartable init containers (sidecars, which keep running); each other init container runs alone beside the
sidecars started before it, so the pod needs at least that much; pod-level `spec.resources.requests` replace the
containers' cpu, memory and hugepages; `spec.overhead` is added. A container's limit without a request counts as
its request (the API server defaults it so). Quantities are rounded up as Go's Quantity.Value/MilliValue do.

Only cpu, memory, ephemeral-storage and the scalar resources (extended resources such as `nvidia.com/gpu`,
`hugepages-*`, `attachable-volumes-*`, prefixed native resources) are fitted; a node's `pods` allocatable caps
how many pods it runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controller import objects as o
from gpudra.quantity import Quantity, QuantityError

CPU, MEMORY, EPHEMERAL, PODS = "cpu", "memory", "ephemeral-storage", "pods"
_POD_LEVEL = (CPU, MEMORY)  # plus hugepages-*: the resources pod-level requests may set


def is_scalar(name: str) -> bool:
    """kube-scheduler's IsScalarResourceName: extended, hugepages, attachable volumes, prefixed native."""
    if name.startswith(("hugepages-", "attachable-volumes-")):
        return True
    if "/" not in name:
        return False
    # Extended resources (outside kubernetes.io, not `requests.*` quota names) and prefixed native resources.
    return not name.startswith("requests.")


def is_extended(name: str) -> bool:
    """Outside the kubernetes.io namespace and not a quota name: a resource some node agent advertises."""
    return "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")


def _amount(raw: Any, milli: bool) -> int:
    """A quantity's Value() (or MilliValue()), rounded up; unreadable input counts as zero (admission rejects it)."""
    if isinstance(raw, bool):
        return 0
    if isinstance(raw, int):
        return raw * 1000 if milli else raw
    try:
        value = Quantity.parse(str(raw)).as_fraction()
    except (QuantityError, ValueError):
        return 0
    return math.ceil(value * 1000 if milli else value)


def _read(resources: Mapping[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, raw in resources.items():
        name = str(name)
        if name == CPU:
            out[name] = _amount(raw, milli=True)
        elif name in (MEMORY, EPHEMERAL, PODS) or is_scalar(name):
            out[name] = _amount(raw, milli=False)
    return out


def _container_requests(container: Mapping[str, Any]) -> dict[str, int]:
    resources = o.section(container, "resources")
    return _read({**o.section(resources, "limits"), **o.section(resources, "requests")})


def _add(into: dict[str, int], more: Mapping[str, int]) -> None:
    for name, value in more.items():
        into[name] = into.get(name, 0) + value


def _max(into: dict[str, int], other: Mapping[str, int]) -> None:
    for name, value in other.items():
        if value > into.get(name, 0):
            into[name] = value


@dataclass(frozen=True)
class Demand:
    """A pod's effective request: cpu in millicores, the others in units; only non-zero entries."""

    amounts: tuple[tuple[str, int], ...]

    @property
    def empty(self) -> bool:
        return not self.amounts

    def get(self, name: str) -> int:
        return next((v for n, v in self.amounts if n == name), 0)



def pod_demand(pod: Mapping[str, Any]) -> Demand:
    spec = o.section(pod, "spec")
    total: dict[str, int] = {}
    for container in o.list_field(spec, "containers"):
        if isinstance(container, Mapping):
            _add(total, _container_requests(container))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for container in o.list_field(spec, "initContainers"):
        if not isinstance(container, Mapping):
            continue
        requests = _container_requests(container)
        if container.get("restartPolicy") == "Always":
            _add(sidecars, requests)
            _max(init_peak, sidecars)
        else:
            alone = dict(sidecars)
            _add(alone, requests)
            _max(init_peak, alone)
    _add(total, sidecars)
    _max(total, init_peak)
    pod_level = _read(o.section(o.section(spec, "resources"), "requests"))
    for name, value in pod_level.items():
        if name in _POD_LEVEL or name.startswith("hugepages-"):
            total[name] = value
    _add(total, _read(o.section(spec, "overhead")))
    total.pop(PODS, None)
    return Demand(tuple(sorted((n, v) for n, v in total.items() if v > 0)))


def node_allocatable(node: Mapping[str, Any]) -> dict[str, int]:
    """status.allocatable as kube-scheduler's NodeInfo holds it (pods included); absent entries are zero."""
    return _read(o.section(o.section(node, "status"), "allocatable"))


@dataclass(frozen=True)
class HostPort:
    ip: str
    protocol: str
    port: int

    def conflicts(self, other: "HostPort") -> bool:
        if self.port != other.port or self.protocol != other.protocol:
            return False
        wildcard = ("", "0.0.0.0", "::")
        return self.ip == other.ip or self.ip in wildcard or other.ip in wildcard


def host_ports(pod: Mapping[str, Any]) -> tuple[HostPort, ...]:
    """The host ports of the pod's containers and sidecars (what NodePorts reserves on a node)."""
    spec = o.section(pod, "spec")
    containers = [c for c in o.list_field(spec, "containers") if isinstance(c, Mapping)]
    containers += [c for c in o.list_field(spec, "initContainers")
                   if isinstance(c, Mapping) and c.get("restartPolicy") == "Always"]
    out: list[HostPort] = []
    for container in containers:
        for port in o.list_field(container, "ports"):
            if not isinstance(port, Mapping):
                continue
            number = port.get("hostPort")
            if isinstance(number, int) and not isinstance(number, bool) and number > 0:
                out.append(HostPort(str(port.get("hostIP") or ""), str(port.get("protocol") or "TCP"), number))
    return tuple(out)
