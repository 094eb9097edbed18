"""Builders mirroring the helpers of Kubernetes' shared allocator test table
(k8s.io/dynamic-resource-allocation/structured/internal/allocatortesting), producing v1 dicts for the CLI."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gpudra.features import stage_of

NODE1, NODE2 = "node-1", "node-2"
REGION1, REGION2 = "region-1", "region-2"
CLASS_A, CLASS_B = "class-a", "class-b"
DRIVER_A, DRIVER_B = "driver-a", "driver-b"
NS = "default"
MAX = 32  # AllocationResultsMaxSize

TAINT_NONE = {"key": "taint-key", "value": "taint-value", "effect": "None"}
TAINT_NO_SCHEDULE = {"key": "taint-key", "value": "taint-value", "effect": "NoSchedule"}
TAINT_NO_EXECUTE = {"key": "taint-key", "value": "taint-value-2", "effect": "NoExecute"}
TOL_NO_SCHEDULE = {"operator": "Exists", "key": "taint-key", "effect": "NoSchedule"}
TOL_NO_EXECUTE = {"operator": "Equal", "key": "taint-key", "value": "taint-value-2", "effect": "NoExecute"}
TOL_NO_SCHEDULE_KEY1 = {"operator": "Exists", "key": "key1", "effect": "NoSchedule"}

# Upstream Features{} field -> our feature gates.
GATES = {
    "PrioritizedList": ["DRAPrioritizedList"],
    "AdminAccess": ["DRAAdminAccess"],
    "PartitionableDevices": ["DRAPartitionableDevices"],
    "DeviceTaints": ["DRADeviceTaints"],
    "ConsumableCapacity": ["DRAConsumableCapacity"],
    "DeviceBindingAndStatus": ["DRADeviceBindingConditions", "DRAResourceClaimDeviceStatus"],
}

# The API fields each gate governs, for Case._uses.
_GATE_FIELDS_USED = {
    "DRAPrioritizedList": ("firstAvailable",),
    "DRAAdminAccess": ("adminAccess",),
    "DRAResourceClaimDeviceStatus": ("bindingConditions", "bindingFailureConditions", "bindsToNode"),
}


def memory_at_least(q: str, driver: str = DRIVER_A) -> str:
    return f'device.capacity["{driver}"].memory.compareTo(quantity("{q}")) >= 0'


def node(name: str, region: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"region": region, "planet": "earth"}}}


def klass(name: str, driver: str, expr: str | None = None, config_attr: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": expr or f'device.driver == "{driver}"'}}]}
    if config_attr:
        spec["config"] = [{"opaque": opaque(driver, config_attr)}]
    return {"kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def klass_multi(name: str, driver: str, multi: bool) -> dict[str, Any]:
    return klass(name, driver, f'device.driver == "{driver}" && device.allowMultipleAllocations == {str(multi).lower()}')


def opaque(driver: str, attr: str) -> dict[str, Any]:
    return {"driver": driver, "parameters": {attr: attr + "Value"}}


def req(name: str, cls: str, count: int = 1, *selectors: str, mode: str = "ExactCount", admin: bool = False,
        tolerations: list[dict[str, Any]] | None = None, capacity: str | None = None) -> dict[str, Any]:
    exact: dict[str, Any] = {"deviceClassName": cls, "allocationMode": mode}
    if count:
        exact["count"] = count
    if selectors:
        exact["selectors"] = [{"cel": {"expression": s}} if s else {} for s in selectors]
    if admin:
        exact["adminAccess"] = True
    if tolerations:
        exact["tolerations"] = tolerations
    if capacity is not None:
        exact["capacity"] = {"requests": {"capacity-0": capacity}}
    return {"name": name, "exactly": exact}


def all_req(name: str, cls: str, *selectors: str, **kw: Any) -> dict[str, Any]:
    return req(name, cls, 0, *selectors, mode="All", **kw)


def sub(name: str, cls: str, count: int = 1, *selectors: str, mode: str = "ExactCount",
        tolerations: list[dict[str, Any]] | None = None, capacity: str | None = None) -> dict[str, Any]:
    out = req(name, cls, count, *selectors, mode=mode, tolerations=tolerations, capacity=capacity)["exactly"]
    return {"name": name, **out}


def first(name: str, *subs: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "firstAvailable": list(subs)}


def claim(name: str, *requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None,
          config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints is not None:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    return {"kind": "ResourceClaim", "metadata": {"name": name, "namespace": NS}, "spec": {"devices": devices}}


def match(attr: str, *requests: str) -> dict[str, Any]:
    out: dict[str, Any] = {"matchAttribute": f"{DRIVER_A}/{attr}"}
    if requests:
        out["requests"] = list(requests)
    return out


def distinct(attr: str, *requests: str) -> dict[str, Any]:
    out: dict[str, Any] = {"distinctAttribute": f"{DRIVER_A}/{attr}"}
    if requests:
        out["requests"] = list(requests)
    return out


def attrs(**values: Any) -> dict[str, Any]:
    """Attribute values: int, bool, str; a ("version", "1.0.0") tuple for versions."""
    out: dict[str, Any] = {}
    for k, v in values.items():
        if isinstance(v, tuple):
            out[k] = {"version": v[1]}
        elif isinstance(v, bool):
            out[k] = {"bool": v}
        elif isinstance(v, int):
            out[k] = {"int": v}
        else:
            out[k] = {"string": v}
    return out


def dev(name: str, capacity: dict[str, str] | None = None, attributes: dict[str, Any] | None = None, *,
        counters: list[tuple[str, dict[str, str]]] | None = None, from_counters: bool = False,
        taints: list[dict[str, Any]] | None = None, multi: bool = False,
        policy_range: dict[str, str] | None = None, policy_values: tuple[str, dict[str, str], list[str]] | None = None,
        binding: tuple[list[str], list[str]] | None = None, binds_to_node: bool = False,
        node_name: str | None = None, node_selector: dict[str, Any] | None = None, all_nodes: bool = False) -> dict[str, Any]:
    d: dict[str, Any] = {"name": name}
    if attributes is not None:
        d["attributes"] = attributes
    cap: dict[str, Any] = {k: {"value": v} for k, v in (capacity or {}).items()}
    if counters:
        d["consumesCounters"] = [{"counterSet": s, "counters": {n: {"value": v} for n, v in c.items()}} for s, c in counters]
        if from_counters:
            cap = {n: {"value": v} for _, c in counters for n, v in c.items()}
    if policy_range:
        for n, v in policy_range.items():
            cap[n] = {"value": v, "requestPolicy": {"default": "2", "validRange": {"min": "2", "step": "2", "max": "4"}}}
    if policy_values:
        default, values, extra = policy_values
        for n, v in values.items():
            cap[n] = {"value": v, "requestPolicy": {"default": default, "validValues": [default, *extra]}}
    if cap:
        d["capacity"] = cap
    if taints:
        d["taints"] = taints
    if multi:
        d["allowMultipleAllocations"] = True
    if binding:
        d["bindingConditions"], d["bindingFailureConditions"] = binding
    if binds_to_node:
        d["bindsToNode"] = True
    if node_name:
        d["nodeName"] = node_name
    if node_selector:
        d["nodeSelector"] = node_selector
    if all_nodes:
        d["allNodes"] = True
    return d


def label_selector(key: str, *values: str) -> dict[str, Any]:
    return {"nodeSelectorTerms": [{"matchExpressions": [{"key": key, "operator": "In", "values": list(values)}]}]}


def local_selector(node_name: str) -> dict[str, Any]:
    return {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}]}


ALL = "allNodes"
PER_DEVICE = "perDevice"


def slice_(name: str, where: Any, pool: str, driver: str, *devices: dict[str, Any], count: int = 1, generation: int = 1,
           counter_sets: list[tuple[str, dict[str, str] | None]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": driver, "pool": {"name": pool, "generation": generation, "resourceSliceCount": count}}
    if isinstance(where, dict):
        spec["nodeSelector"] = where
    elif where == ALL:
        spec["allNodes"] = True
    elif where == PER_DEVICE:
        spec["perDeviceNodeSelection"] = True
    else:
        spec["nodeName"] = where
    if devices:
        spec["devices"] = list(devices)
    if counter_sets is not None:
        spec["sharedCounters"] = [{"name": n, "counters": {k: {"value": v} for k, v in (c or {}).items()}}
                                  for n, c in counter_sets]
    return {"kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


def multi_devices(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [dev(f"device-{i}") for i in range(start, start + n)]


def allocated_claim(i: int, devices: list[tuple[str, str, str]], consumed: dict[str, str] | None = None) -> dict[str, Any]:
    """A claim that already holds devices (upstream's allocatedDevices / allocatedCapacityDevices)."""
    results = []
    for driver, pool, device in devices:
        r: dict[str, Any] = {"request": "held", "driver": driver, "pool": pool, "device": device}
        if consumed is not None:
            r["shareID"] = f"00000000-0000-0000-0000-00000000000{i}"
            r["consumedCapacity"] = consumed
        results.append(r)
    return {"kind": "ResourceClaim", "metadata": {"name": f"held-{i}", "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "held", "exactly": {"deviceClassName": CLASS_A}}]}},
            "status": {"allocation": {"devices": {"results": results}, "nodeSelector": local_selector(NODE1)}}}


def res(request: str, driver: str, pool: str, device: str, *, admin: bool = False,
        tolerations: list[dict[str, Any]] | None = None, binding: tuple[list[str], list[str]] | None = None,
        consumed: dict[str, str] | None | bool = False) -> dict[str, Any]:
    """An expected DeviceRequestAllocationResult. consumed=None means shared (shareID set) without consumed capacity."""
    r: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
    if admin:
        r["adminAccess"] = True
    if tolerations:
        r["tolerations"] = tolerations
    if binding:
        r["bindingConditions"], r["bindingFailureConditions"] = binding
    if consumed is not False:
        r["shareID"] = "<share>"
        if consumed:
            r["consumedCapacity"] = consumed
    return r


def alloc(selector: dict[str, Any] | None, *results: dict[str, Any], config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"devices": {"results": list(results)}}
    if config:
        out["devices"]["config"] = config
    if selector is not None:
        out["nodeSelector"] = selector
    return out


def local(*results: dict[str, Any], config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return alloc(local_selector(NODE1), *results, config=config)


def cfg(source: str, requests: list[str] | None, driver: str, attr: str) -> dict[str, Any]:
    out: dict[str, Any] = {"source": source}
    if requests is not None:
        out["requests"] = requests
    out["opaque"] = opaque(driver, attr)
    return out


@dataclass
class Case:
    """One upstream test case. expect: list of allocations (claims in order) | None (unschedulable) | error text."""

    name: str
    claims: list[dict[str, Any]]
    classes: list[dict[str, Any]] = field(default_factory=list)
    slices: list[dict[str, Any]] = field(default_factory=list)
    expect: list[dict[str, Any]] | str | None = None
    features: tuple[str, ...] = ()
    allocated: list[tuple[str, str, str]] = field(default_factory=list)
    allocated_capacity: dict[tuple[str, str, str], dict[str, str]] = field(default_factory=dict)
    node: str = NODE1
    # Kubernetes releases whose semantics the expectation is: a case whose outcome changed between releases is
    # transcribed twice, the older expectation limited to the releases before the change.
    versions: tuple[str, ...] = ("1.35", "1.37")

    def objects(self) -> list[dict[str, Any]]:
        held = [allocated_claim(0, self.allocated)] if self.allocated else []
        held += [allocated_claim(i + 1, [d], c) for i, (d, c) in enumerate(self.allocated_capacity.items())]
        objs = [node(NODE1, REGION1), node(NODE2, REGION2), *self.classes, *self.slices, *held, *self.claims]
        for o in objs:
            o.setdefault("apiVersion", "resource.k8s.io/v1")
        return objs

    def gate_values(self) -> dict[str, bool]:
        """Our gates as upstream's Features{} struct of the case sets them (everything not named is off)."""
        return {gate: upstream in self.features for upstream, gates in GATES.items() for gate in gates}

    def _uses(self, gate: str) -> bool:
        """Whether the case's objects use the API fields `gate` governs (upstream's tables leave a feature off
        where a case does not need it; with no such field in the objects on and off give the same result)."""
        text = json.dumps(self.objects())
        return any(f'"{name}"' in text for name in _GATE_FIELDS_USED.get(gate, (gate,)))

    def runs_at(self, version: str) -> bool:
        """Whether Kubernetes `version` can run the case: a gate the case needs on must exist there, and a gate
        locked on (DRAPrioritizedList, DRAAdminAccess in 1.37) can stand for "off" only where nothing uses it."""
        for gate, value in self.gate_values().items():
            entry = stage_of(gate, version)
            if entry is None and value:
                return False
            if entry is not None and entry.locked and entry.default != value and self._uses(gate):
                return False
        return True

    def feature_args(self, version: str = "1.35") -> list[str]:
        """`--kubernetes-version` plus a `--feature` for every settable gate whose value differs from that
        release's default."""
        args = ["--kubernetes-version", version]
        for gate, value in self.gate_values().items():
            entry = stage_of(gate, version)
            if entry is not None and not entry.locked and entry.default != value:
                args += ["--feature", f"{gate}={'true' if value else 'false'}"]
        return args
