"""`gpu-dra cluster status` for an upstream cluster: what its supervisor reports and what the API says."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from sim.upstream.commands import read_spec, read_status, supervisor_alive


def _api(state: Path, bin_dir: str, *argv: str) -> list[dict[str, Any]] | None:
    result = subprocess.run([f"{bin_dir}/kubectl", f"--kubeconfig={state / 'kubeconfig.yaml'}", *argv, "-o", "json"],
                            capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        return None
    return list(json.loads(result.stdout).get("items") or [])


def status_object(state: Path) -> dict[str, Any]:
    spec = read_spec(state)
    sup = read_status(state)
    alive = supervisor_alive(state)
    phase = sup.get("phase", "unknown") if alive else "stopped"
    nodes_api = _api(state, spec.bin_dir, "get", "nodes") if spec is not None and phase == "ready" else None
    ready = {n["metadata"]["name"]: any(c["type"] == "Ready" and c["status"] == "True"
                                        for c in n.get("status", {}).get("conditions", []))
             for n in nodes_api or []}
    versions = {n["metadata"]["name"]: n["status"]["nodeInfo"] for n in nodes_api or []}
    nodes = [{"name": name, "profile": profile, "ready": ready.get(name, False),
              "kubelet": versions.get(name, {}).get("kubeletVersion"),
              "containerRuntime": versions.get(name, {}).get("containerRuntimeVersion")}
             for name, profile in (spec.nodes if spec is not None else ())]
    failing = [p for p in sup.get("processes", []) if not p.get("running")] if alive else []
    return {"name": spec.name if spec else state.name, "backend": "upstream", "phase": phase,
            "server": sup.get("server", "") if alive else "", "kubeconfig": str(state / "kubeconfig.yaml"),
            "ready": phase == "ready" and all(n["ready"] for n in nodes) and not failing,
            "nodes": nodes, "processes": sup.get("processes", []) if alive else [],
            "failing": [f"{p['role']}{'/' + p['node'] if p.get('node') else ''}" for p in failing]}


def status_table(obj: dict[str, Any]) -> str:
    lines = [f"cluster {obj['name']} (real Kubernetes): {obj['phase']}, server {obj['server'] or '-'}"]
    for n in obj["nodes"]:
        lines.append(f"  node {n['name']:<16} {n['profile']:<14} ready={str(n['ready']).lower():<5} "
                     f"kubelet={n['kubelet'] or '-'} runtime={n['containerRuntime'] or '-'}")
    for p in obj["processes"]:
        state = "running" if p.get("running") else "NOT RUNNING"
        lines.append(f"  {p['role']:<24}{('/' + p['node']) if p.get('node') else '':<16} pid={p.get('pid')} {state} "
                     f"restarts={p.get('restarts', 0)}")
    return "\n".join(lines)
