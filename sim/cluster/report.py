"""`gpu-dra cluster status` and `list`: pure builders from the API's objects and the supervisor's status file."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from driver.deviceplugin import taint_key as device_plugin_taint_key
from sim.cluster.spec import ClusterSpec, SupervisorStatus


def _gpu_of(device: Mapping[str, Any], driver: str) -> str | None:
    """The physical GPU a published device is (a GPU) or lives on (a MIG device): its UUID."""
    attrs = device.get("attributes") or {}

    def value(name: str) -> str | None:
        entry = attrs.get(name) or attrs.get(f"{driver}/{name}") or {}
        found = entry.get("string") if isinstance(entry, Mapping) else None
        return str(found) if found else None

    return value("parentUUID") or value("uuid")


def gpu_usage(node: str, slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]],
              driver: str) -> tuple[int, int]:
    """(GPUs with at least one allocated device, GPUs published) on `node`. A GPU the device plugin shim handed to
    a legacy `nvidia.com/gpu` pod is in use too: its devices carry the shim's taint in the slice."""
    held_by_shim = device_plugin_taint_key(driver)
    gpu_by_device: dict[tuple[str, str], str] = {}
    used = set()
    for sl in slices:
        spec = sl.get("spec") or {}
        if spec.get("nodeName") != node or spec.get("driver") != driver:
            continue
        pool = str((spec.get("pool") or {}).get("name"))
        for dev in spec.get("devices") or []:
            gpu = _gpu_of(dev, driver)
            if gpu:
                gpu_by_device[(pool, str(dev.get("name")))] = gpu
                if any(t.get("key") == held_by_shim for t in dev.get("taints") or []):
                    used.add(gpu)
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            gpu = gpu_by_device.get((str(result.get("pool")), str(result.get("device"))))
            if gpu and result.get("driver") == driver:
                used.add(gpu)
    return len(used), len(set(gpu_by_device.values()))


def _ready(node: Mapping[str, Any] | None) -> bool:
    conditions = ((node or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def status_object(spec: ClusterSpec, sup: SupervisorStatus | None, running: bool, kubeconfig: str | None,
                  context: str, api_objects: Mapping[str, list[dict[str, Any]]] | None, driver: str) -> dict[str, Any]:
    """DESIGN.md's `cluster status -o json` shape: {name, server, kubeconfig, nodes, processes} (+ state, context)."""
    by_name = {n["metadata"]["name"]: n for n in (api_objects or {}).get("nodes", [])}
    rows = []
    for n in spec.nodes:
        in_use, total = (gpu_usage(n.name, api_objects["slices"], api_objects["claims"], driver)
                         if api_objects is not None else (None, None))
        rows.append({"name": n.name, "profile": n.profile, "ready": running and _ready(by_name.get(n.name)),
                     "gpusInUse": in_use, "gpusTotal": total})
    procs = [{"role": p.role, "node": p.node, "pid": p.pid, "restarts": p.restarts}
             for p in (sup.processes if sup is not None and running else [])]
    return {"name": spec.name, "state": (sup.phase if sup is not None and running else "stopped"),
            "server": sup.server if sup is not None else None, "kubeconfig": kubeconfig, "context": context,
            "nodes": rows, "processes": procs, "failing": list(sup.failing) if sup is not None and running else []}


def status_table(obj: Mapping[str, Any]) -> str:
    lines = [f"cluster {obj['name']}: {obj['state']}, server {obj['server'] or '-'}",
             f"kubeconfig {obj['kubeconfig'] or '-'} (context {obj['context']})", ""]
    lines += _columns(["NODE", "PROFILE", "READY", "GPUS IN USE", "GPUS"],
                      [[n["name"], n["profile"], "True" if n["ready"] else "False",
                        "-" if n["gpusInUse"] is None else str(n["gpusInUse"]),
                        "-" if n["gpusTotal"] is None else str(n["gpusTotal"])] for n in obj["nodes"]])
    if obj["processes"]:
        lines.append("")
        lines += _columns(["PROCESS", "NODE", "PID", "RESTARTS"],
                          [[p["role"], p["node"] or "-", str(p["pid"]), str(p["restarts"])] for p in obj["processes"]])
    if obj.get("failing"):
        lines.append("")
        lines += [f"FAILING: {f['component']}: {f['message']}" for f in obj["failing"]]
    return "\n".join(lines)


def _columns(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["   ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]


def list_table(rows: list[Mapping[str, Any]]) -> str:
    if not rows:
        return "no clusters (start one with: gpu-dra cluster up)"
    return "\n".join(_columns(["NAME", "STATE", "NODES", "SERVER"],
                              [[r["name"], r["state"], str(r["nodes"]), r["server"] or "-"] for r in rows]))
