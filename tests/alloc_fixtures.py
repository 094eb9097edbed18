"""Small builders for resource.k8s.io/v1 objects used by the allocator tests (shapes as in allocator_test.go)."""

from __future__ import annotations

from typing import Any

DRIVER = "driver-a"


def device(name: str, attrs: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name}
    if attrs:
        out["attributes"] = {k: ({"int": v} if isinstance(v, int) and not isinstance(v, bool) else
                                 {"bool": v} if isinstance(v, bool) else {"string": v}) for k, v in attrs.items()}
    out.update(extra)
    return out


def slice_(name: str, node: str | None, pool: str, devices: list[dict[str, Any]], *, driver: str = DRIVER,
           generation: int = 1, count: int = 1, **spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"driver": driver, "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
                         "devices": devices}
    if node is not None:
        s["nodeName"] = node
    s.update(spec)
    return {"kind": "ResourceSlice", "metadata": {"name": name}, "spec": s}


def klass(name: str = "class-a", selectors: list[str] | None = None, config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if selectors:
        spec["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    if config:
        spec["config"] = config
    return {"kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def request(name: str = "req-0", cls: str = "class-a", count: int | None = None, **extra: Any) -> dict[str, Any]:
    exact: dict[str, Any] = {"deviceClassName": cls}
    if count is not None:
        exact["count"] = count
    exact.update(extra)
    return {"name": name, "exactly": exact}


def claim(name: str = "claim-0", requests: list[dict[str, Any]] | None = None, constraints: list[dict[str, Any]] | None = None,
          config: list[dict[str, Any]] | None = None, namespace: str = "default", allocation: dict[str, Any] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": requests if requests is not None else [request()]}
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    obj: dict[str, Any] = {"kind": "ResourceClaim", "metadata": {"name": name, "namespace": namespace}, "spec": {"devices": devices}}
    if allocation is not None:
        obj["status"] = {"allocation": allocation}
    return obj


def allocation(node: str, *devices: tuple[str, str], driver: str = DRIVER, request_name: str = "req-0") -> dict[str, Any]:
    return {"devices": {"results": [{"request": request_name, "driver": driver, "pool": p, "device": d} for p, d in devices]},
            "nodeSelector": node_selector(node)}


def node_selector(node: str) -> dict[str, Any]:
    return {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}


def node(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "labels": labels or {}}}


def picked(result: list[dict[str, Any]]) -> list[list[tuple[str, str]]]:
    return [[(r["request"], r["device"]) for r in a["devices"]["results"]] for a in result]
