"""What the pods bound to each node request, as kube-scheduler's NodeInfo sums it (Requested, pod count, used
host ports), kept from the pod cache's deltas and from the scheduler's own assumed bindings.

A pod counts on its node from the moment it is bound (or assumed bound by this scheduler) until it reaches a
terminal phase or is gone; a pod being deleted still holds its resources, as in kube-scheduler's cache.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from controller import objects as o
from sim.roles.podresources import Demand, HostPort, host_ports, pod_demand


@dataclass
class NodeLoad:
    pods: int = 0
    requested: Counter[str] = field(default_factory=Counter)
    ports: Counter[HostPort] = field(default_factory=Counter)


@dataclass(frozen=True)
class _Held:
    node: str
    demand: Demand
    ports: tuple[HostPort, ...]


class NodeUsage:
    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}  # pod key -> what it holds
        self._nodes: dict[str, NodeLoad] = {}
        self._keys: dict[str, set[str]] = {}  # node -> keys of the pods it holds (preemption's candidates)
        self._limits: dict[str, int] = {}  # allocatable pods per node (nodes without a Node object: no limit)
        # Nodes that cannot take one more pod: a pod that requests nothing is checked against this set only.
        self.full: set[str] = set()

    def set_pod_limits(self, limits: Mapping[str, int]) -> None:
        self._limits = dict(limits)
        self.full = {n for n, limit in self._limits.items() if self.load(n).pods + 1 > limit}

    def load(self, node: str) -> NodeLoad:
        found = self._nodes.get(node)
        return found if found is not None else _EMPTY

    def pods_on(self, node: str) -> frozenset[str]:
        return frozenset(self._keys.get(node, ()))

    def observe(self, key: str, pod: Mapping[str, Any] | None) -> None:
        """The cache's current version of the pod (None: gone)."""
        node = o.section(pod, "spec").get("nodeName") if pod is not None else None
        if pod is None or not node or o.section(pod, "status").get("phase") in ("Succeeded", "Failed"):
            self.release(key)
            return
        held = self._held.get(key)
        if held is not None and held.node == node:
            return  # a bound pod's requests and ports do not change
        self.hold(key, str(node), pod_demand(pod), host_ports(pod))

    def hold(self, key: str, node: str, demand: Demand, ports: tuple[HostPort, ...]) -> None:
        self.release(key)
        held = _Held(node, demand, ports)
        self._held[key] = held
        self._keys.setdefault(node, set()).add(key)
        self._apply(held, 1)

    def release(self, key: str) -> None:
        held = self._held.pop(key, None)
        if held is not None:
            self._keys[held.node].discard(key)
            self._apply(held, -1)

    def _apply(self, held: _Held, sign: int) -> None:
        load = self._nodes.setdefault(held.node, NodeLoad())
        load.pods += sign
        for name, value in held.demand.amounts:
            load.requested[name] += sign * value
        for port in held.ports:
            load.ports[port] += sign
            if load.ports[port] <= 0:
                del load.ports[port]
        limit = self._limits.get(held.node)
        if limit is not None and load.pods + 1 > limit:
            self.full.add(held.node)
        else:
            self.full.discard(held.node)


_EMPTY = NodeLoad()
