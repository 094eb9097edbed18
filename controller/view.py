"""A consistent-enough snapshot of the informer caches for one concern of one pass."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from controller import objects as o
from controller.informer import Store
from controller.objects import Obj
from controller.taintrules import apply_taint_rules


@dataclass(frozen=True)
class View:
    pods: dict[str, Obj] = field(default_factory=dict)
    claims: dict[str, Obj] = field(default_factory=dict)
    slices: dict[str, Obj] = field(default_factory=dict)
    classes: dict[str, Obj] = field(default_factory=dict)
    nodes: dict[str, Obj] = field(default_factory=dict)
    templates: dict[str, Obj] = field(default_factory=dict)
    priority_classes: dict[str, Obj] = field(default_factory=dict)
    quotas: dict[str, Obj] = field(default_factory=dict)
    pod_groups: dict[str, Obj] = field(default_factory=dict)  # scheduling.k8s.io PodGroups (embedded mode)
    taint_rules: dict[str, Obj] = field(default_factory=dict)
    disruption_budgets: dict[str, Obj] = field(default_factory=dict)  # embedded mode: preemption weighs them

    @classmethod
    def from_stores(cls, stores: Mapping[str, Store]) -> "View":
        def grab(kind: str) -> dict[str, Obj]:
            store = stores.get(kind)
            return store.by_key() if store is not None else {}

        return cls(
            pods=grab("Pod"),
            claims=grab("ResourceClaim"),
            slices=grab("ResourceSlice"),
            classes=grab("DeviceClass"),
            nodes=grab("Node"),
            templates=grab("ResourceClaimTemplate"),
            priority_classes=grab("PriorityClass"),
            quotas=grab("ResourceQuota"),
            pod_groups=grab("PodGroup"),
            taint_rules=grab("DeviceTaintRule"),
            disruption_budgets=grab("PodDisruptionBudget"),
        )

    def sorted_slices(self) -> list[Obj]:
        """Slices in name order (the allocator searches slices in input order, so fix one), with the taints of
        the DeviceTaintRules added to the devices they select."""
        slices = [self.slices[k] for k in sorted(self.slices)]
        return apply_taint_rules(slices, [self.taint_rules[k] for k in sorted(self.taint_rules)])

    def allocated_claims(self) -> list[Obj]:
        return [c for c in self.claims.values() if o.allocation(c) is not None]
