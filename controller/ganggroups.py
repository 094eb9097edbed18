"""Which claims form which gang: the gang labels (`<driver>/gang: NAME`, `<driver>/gang-size: "N"`) and the Gang
they group into. Label-named gangs (here) and Workload-API gangs (controller.podgroups) are the same Gang, which
the gang controller (controller.gang) plans and allocates."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller import objects as o
from controller.objects import Obj


def gang_label(driver: str) -> str:
    return f"{driver}/gang"


def gang_size_label(driver: str) -> str:
    return f"{driver}/gang-size"


def gang_topology_label(driver: str) -> str:
    """`clique`: the gang is placed within one multi-node NVLink clique or not at all (a ComputeDomain's pods)."""
    return f"{driver}/gang-topology"


TOPOLOGIES = ("", "clique")


def allocated_at_annotation(driver: str) -> str:
    return f"{driver}/gang-allocated-at"


def released_at_annotation(driver: str) -> str:
    return f"{driver}/gang-released-at"


def gang_gate(driver: str) -> str:
    """The scheduling gate gang pods may carry until their gang's allocation has settled."""
    return f"{driver}/gang"


def is_gang_claim(claim: Mapping[str, Any], driver: str) -> bool:
    labels = o.labels(claim)
    return gang_label(driver) in labels and gang_size_label(driver) in labels


@dataclass(frozen=True)
class Gang:
    namespace: str
    name: str
    size: int | None  # None when the label is not a positive integer or the claims disagree
    claims: tuple[Obj, ...]  # sorted by name
    problem: str = ""
    topology: str = ""  # "" (any nodes) or "clique" (one NVLink clique), from gang_topology_label

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def group_gangs(claims: Iterable[Mapping[str, Any]], driver: str) -> list[Gang]:
    groups: dict[tuple[str, str], list[Obj]] = {}
    name_label, size_label = gang_label(driver), gang_size_label(driver)  # once, not per claim: this scans them all
    for claim in claims:
        labels = o.labels(claim)
        if name_label in labels and size_label in labels:
            groups.setdefault((o.namespace(claim), str(labels[name_label])), []).append(dict(claim))
    gangs = []
    for (ns, name), members in sorted(groups.items()):
        members.sort(key=o.name)
        sizes = {str(o.labels(c)[gang_size_label(driver)]) for c in members}
        size: int | None = None
        problem = ""
        if len(sizes) != 1:
            problem = f"gang {ns}/{name}: claims disagree on label {gang_size_label(driver)} ({', '.join(sorted(sizes))})"
        else:
            raw = next(iter(sizes))
            if raw.isdigit() and int(raw) > 0:
                size = int(raw)
                if len(members) > size:
                    problem = (
                        f"gang {ns}/{name}: {len(members)} claims carry label {gang_label(driver)}={name} "
                        f"but {gang_size_label(driver)} is {size}"
                    )
                    size = None
            else:
                problem = f"gang {ns}/{name}: label {gang_size_label(driver)}: {raw!r} is not a positive integer"
        topologies = {str(o.labels(c).get(gang_topology_label(driver), "")) for c in members}
        topology = next(iter(topologies)) if len(topologies) == 1 else ""
        if len(topologies) != 1:
            problem = problem or (f"gang {ns}/{name}: claims disagree on label {gang_topology_label(driver)} "
                                  f"({', '.join(sorted(topologies))})")
        elif topology not in TOPOLOGIES:
            problem = problem or (f"gang {ns}/{name}: label {gang_topology_label(driver)}: {topology!r} is not a "
                                  "placement topology; accepted: clique")
        gangs.append(Gang(ns, name, size if not problem else None, tuple(members), problem, topology))
    return gangs
