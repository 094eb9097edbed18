"""Seeded DRA scenarios for the differential checks against kube-scheduler (bench/differential.py).

A scenario is a few nodes, each with one pool of driver gpu.nvidia.com (whole GPUs split over one or two slices,
or partitionable GPUs: a shared-counter slice and a slice of full GPUs and MIG devices consuming those counters),
three DeviceClasses, and a few pods each with one or two ResourceClaims. Claims draw from: counts, allocation
mode All, CEL selectors over int, string, version and capacity values, matchAttribute constraints, admin access,
device taints (None, NoSchedule, NoExecute) with and without tolerations, and prioritized lists (firstAvailable).

Pure: `generate(seed, index)` is the same objects on every machine. Names carry the scenario's prefix so that one
cluster runs many scenarios one after another.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

DRIVER = "gpu.nvidia.com"
ADMIN_LABEL = "resource.kubernetes.io/admin-access"
TAINT_KEY = f"{DRIVER}/unhealthy"
PRODUCTS = ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3")
DRIVER_VERSIONS = ("550.54.15", "560.35.3")
# (profile, compute slices, memory slices, memory) of the MIG devices a partitionable GPU offers.
MIG_PROFILES = (("1g", 1, 1, "10Gi"), ("3g", 3, 4, "40Gi"))


@dataclass(frozen=True)
class PodSpec:
    name: str
    claims: tuple[str, ...]


@dataclass
class Scenario:
    index: int
    seed: int
    namespace: str
    nodes: list[str]
    classes: list[dict[str, Any]] = field(default_factory=list)
    slices: list[dict[str, Any]] = field(default_factory=list)
    claims: list[dict[str, Any]] = field(default_factory=list)
    pods: list[PodSpec] = field(default_factory=list)
    features: set[str] = field(default_factory=set)  # what the scenario exercises (for the report)

    @property
    def prefix(self) -> str:
        return self.namespace


def _attrs(**values: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in values.items():
        if isinstance(value, bool):
            out[name] = {"bool": value}
        elif isinstance(value, int):
            out[name] = {"int": value}
        elif name == "driverVersion":
            out[name] = {"version": value}
        else:
            out[name] = {"string": value}
    return out


def _taints(rng: random.Random, features: set[str]) -> list[dict[str, Any]]:
    if rng.random() >= 0.15:
        return []
    features.add("taints")
    effect = rng.choice(("NoSchedule", "NoExecute", "None"))
    return [{"key": TAINT_KEY, "value": rng.choice(("xid-79", "ecc")), "effect": effect}]


def _node_pool(rng: random.Random, node: str, features: set[str]) -> list[dict[str, Any]]:
    product, version = rng.choice(PRODUCTS), rng.choice(DRIVER_VERSIONS)
    base = {"driver": DRIVER, "nodeName": node}
    if rng.random() < 0.3:
        features.add("partitionable")
        gpus = rng.randint(1, 3)
        counters = [{"name": f"gpu-{g}-counters", "counters": {"compute": {"value": "7"}, "memory": {"value": "8"}}}
                    for g in range(gpus)]
        devices: list[dict[str, Any]] = []
        for g in range(gpus):
            devices.append({"name": f"gpu-{g}", "attributes": _attrs(type="gpu", index=g, productName=product,
                                                                    driverVersion=version, nvlinkDomain=0),
                            "capacity": {"memory": {"value": "80Gi"}},
                            "consumesCounters": [{"counterSet": f"gpu-{g}-counters",
                                                  "counters": {"compute": {"value": "7"}, "memory": {"value": "8"}}}]})
            for profile, compute, memory, size in MIG_PROFILES:
                for k in range(2):
                    device: dict[str, Any] = {
                        "name": f"gpu-{g}-mig-{profile}-{k}",
                        "attributes": _attrs(type="mig", index=g, productName=product, driverVersion=version,
                                             profile=profile),
                        "capacity": {"memory": {"value": size}},
                        "consumesCounters": [{"counterSet": f"gpu-{g}-counters",
                                              "counters": {"compute": {"value": str(compute)},
                                                           "memory": {"value": str(memory)}}}]}
                    devices.append(device)
        for d in devices:
            if taints := _taints(rng, features):
                d["taints"] = taints
        pool = {"name": node, "generation": 1, "resourceSliceCount": 2}
        return [_slice(f"{node}-counters", {**base, "pool": pool, "sharedCounters": counters}),
                _slice(f"{node}-devices", {**base, "pool": pool, "devices": devices})]
    gpus = rng.randint(2, 8)
    devices = []
    for g in range(gpus):
        device = {"name": f"gpu-{g}", "attributes": _attrs(type="gpu", index=g, productName=product,
                                                           driverVersion=version, nvlinkDomain=g // 4),
                  "capacity": {"memory": {"value": "80Gi"}}}
        if taints := _taints(rng, features):
            device["taints"] = taints
        devices.append(device)
    if gpus >= 4 and rng.random() < 0.5:
        # Two slices whose names sort against the order they are written in: kube-scheduler 1.37 searches a
        # pool's slices by name.
        features.add("multi-slice")
        pool = {"name": node, "generation": 1, "resourceSliceCount": 2}
        half = gpus // 2
        return [_slice(f"{node}-z", {**base, "pool": pool, "devices": devices[:half]}),
                _slice(f"{node}-a", {**base, "pool": pool, "devices": devices[half:]})]
    pool = {"name": node, "generation": 1, "resourceSliceCount": 1}
    return [_slice(f"{node}-gpus", {**base, "pool": pool, "devices": devices})]


def _slice(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


def _classes(prefix: str) -> list[dict[str, Any]]:
    def cls(name: str, expression: str) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": f"{prefix}-{name}"},
                "spec": {"selectors": [{"cel": {"expression": expression}}]}}

    return [cls("gpu", f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"'),
            cls("mig", f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "mig"'),
            cls("any", f'device.driver == "{DRIVER}"')]


# Selectors every device of the matching class can evaluate (no missing attribute: no CEL runtime error).
_SELECTORS_ANY = (
    f'device.attributes["{DRIVER}"].index >= 1',
    f'device.attributes["{DRIVER}"].productName.startsWith("NVIDIA H")',
    f'device.attributes["{DRIVER}"].driverVersion.isGreaterThan(semver("555.0.0"))',
    f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0',
    f'device.attributes["{DRIVER}"].index % 2 == 0',
)
_SELECTORS_GPU = (f'device.attributes["{DRIVER}"].nvlinkDomain == 0',)
_SELECTORS_MIG = (f'device.attributes["{DRIVER}"].profile == "1g"',)
# Selects an attribute MIG devices lack: on the "any" class a runtime error, which kube-scheduler reports as an error.
_SELECTOR_ERROR = f'device.attributes["{DRIVER}"].nvlinkDomain == 0'


def _request_body(rng: random.Random, prefix: str, kind: str, features: set[str], admin: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": f"{prefix}-{kind}"}
    pool = list(_SELECTORS_ANY) + list(_SELECTORS_GPU if kind == "gpu" else _SELECTORS_MIG if kind == "mig" else ())
    chosen = rng.sample(pool, k=rng.choice((0, 0, 1, 1, 2)))
    if kind == "any" and rng.random() < 0.04:
        chosen.append(_SELECTOR_ERROR)
        features.add("cel-error")
    if chosen:
        features.add("selectors")
        body["selectors"] = [{"cel": {"expression": e}} for e in chosen]
    if rng.random() < 0.06:
        body["allocationMode"] = "All"
        features.add("all")
    else:
        body["count"] = rng.choice((1, 1, 1, 2, 2, 3, 4))
        features.add("count")
    if admin:
        body["adminAccess"] = True
        features.add("admin-access")
    if rng.random() < 0.3:
        features.add("tolerations")
        tol: dict[str, Any] = {"key": TAINT_KEY, "operator": rng.choice(("Exists", "Equal"))}
        if tol["operator"] == "Equal":
            tol["value"] = rng.choice(("xid-79", "ecc"))
        # Always with an effect: a NoExecute-tainted device picked through a toleration without one gets the pod
        # evicted at once by kube-controller-manager (its eviction honours only tolerations naming NoExecute),
        # before its allocation can be read back.
        tol["effect"] = rng.choice(("NoSchedule", "NoExecute"))
        body["tolerations"] = [tol]
    return body


def _claim(rng: random.Random, prefix: str, name: str, features: set[str]) -> dict[str, Any]:
    requests: list[dict[str, Any]] = []
    kinds: list[str] = []
    for r in range(rng.choice((1, 1, 1, 2))):
        kind = rng.choice(("gpu", "gpu", "mig", "any"))
        if rng.random() < 0.2:
            features.add("first-available")
            subs = []
            for s in range(rng.randint(2, 3)):
                sub_kind = rng.choice(("gpu", "mig", "any"))
                subs.append({"name": f"s{s}", **_request_body(rng, prefix, sub_kind, features, False)})
            requests.append({"name": f"r{r}", "firstAvailable": subs})
            kinds.append("mixed")
            continue
        admin = rng.random() < 0.08
        requests.append({"name": f"r{r}", "exactly": _request_body(rng, prefix, kind, features, admin)})
        kinds.append(kind)
    devices: dict[str, Any] = {"requests": requests}
    if rng.random() < 0.25:
        features.add("match-attribute")
        # nvlinkDomain only where every request is for whole GPUs: elsewhere a device without the attribute
        # simply does not match.
        attribute = "nvlinkDomain" if rng.random() < 0.6 else rng.choice(("productName", "driverVersion"))
        devices["constraints"] = [{"matchAttribute": f"{DRIVER}/{attribute}"}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": prefix}, "spec": {"devices": devices}}


def generate(seed: int, index: int) -> Scenario:
    rng = random.Random(f"{seed}/{index}")
    prefix = f"d{seed}-{index}"
    features: set[str] = set()
    nodes = [f"{prefix}-n{i}" for i in range(rng.randint(1, 3))]
    scenario = Scenario(index, seed, prefix, nodes, classes=_classes(prefix), features=features)
    for node in nodes:
        scenario.slices += _node_pool(rng, node, features)
    for p in range(rng.randint(2, 4)):
        names = tuple(f"{prefix}-p{p}-c{c}" for c in range(rng.choice((1, 1, 2))))
        scenario.claims += [_claim(rng, prefix, n, features) for n in names]
        scenario.pods.append(PodSpec(f"{prefix}-p{p}", names))
    return scenario


def node_object(name: str) -> dict[str, Any]:
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"capacity": dict(resources), "allocatable": dict(resources)}}


def pod_object(namespace: str, pod: PodSpec) -> dict[str, Any]:
    """A pod that tolerates every node taint: the nodes have no kubelet, and only DRA should decide."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod.name, "namespace": namespace},
            "spec": {"containers": [{"name": "main", "image": "busybox",
                                     "resources": {"claims": [{"name": f"c{i}"} for i in range(len(pod.claims))]}}],
                     "resourceClaims": [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(pod.claims)],
                     "tolerations": [{"operator": "Exists"}], "automountServiceAccountToken": False,
                     "terminationGracePeriodSeconds": 0}}
