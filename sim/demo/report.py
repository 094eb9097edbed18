"""The demo's report: one JSON document for machines, tables for people (same content)."""

from __future__ import annotations

from typing import Any

from sim.demo.expect import Expectation
from sim.demo.observe import Utilization, WorkloadRow


def as_json(rows: list[WorkloadRow], util: dict[str, Utilization], expectations: list[Expectation],
            *, wall_seconds: float, workdir: str | None) -> dict[str, Any]:
    return {
        "workloads": [
            {
                "name": r.name,
                "phase": r.phase,
                "reason": r.reason,
                "message": r.message,
                "node": r.node or None,
                "claims": [
                    {
                        "claim": c.claim,
                        "uid": c.uid,
                        "node": c.node or None,
                        "devices": [
                            {"driver": d.driver, "pool": d.pool, "device": d.device, "cdiDeviceIDs": list(d.cdi_device_ids),
                             "shared": d.shared, "sharing": d.sharing or None}
                            for d in c.devices
                        ],
                    }
                    for c in r.claims
                ],
                "devicePlugin": ({"devices": list(r.legacy_devices), "cdiDevices": list(r.legacy_cdi_devices)}
                                 if r.legacy_devices else None),
                "containers": [
                    {"name": c.name, "running": c.running, "exitCode": c.exit_code, "restartCount": c.restart_count,
                     "cdiDevices": list(c.cdi_devices),
                     "saw": ({"nvidiaSmiL": list(c.nvidia_smi), "nvidiaVisibleDevices": c.visible_devices,
                              "deviceNodes": list(c.device_nodes)} if c.probed else None)}
                    for c in r.containers
                ],
            }
            for r in rows
        ],
        "utilization": {n: {"allocated": u.allocated, "total": u.total} for n, u in util.items()},
        "expectations": [{"name": e.name, "ok": e.ok, "detail": e.detail} for e in expectations],
        "ok": all(e.ok for e in expectations),
        "wallSeconds": round(wall_seconds, 2),
        "workdir": workdir,
    }


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*headers).rstrip()] + [fmt.format(*r).rstrip() for r in rows]


def as_table(rows: list[WorkloadRow], util: dict[str, Utilization], expectations: list[Expectation],
             *, wall_seconds: float, workdir: str | None) -> str:
    out: list[str] = ["", "WORKLOADS"]
    table_rows: list[list[str]] = []
    for r in rows:
        devices = [d for c in r.claims for d in c.devices]
        if r.legacy_devices:
            what = ", ".join(f"nvidia.com/gpu {d}" for d in r.legacy_devices)
            cdi_ids = ", ".join(r.legacy_cdi_devices)
        else:
            what = ", ".join(f"{d.pool}/{d.device}" for d in devices) if devices else "-"
            cdi_ids = ", ".join(i for d in devices for i in d.cdi_device_ids) or "-"
        sharing = sorted({d.sharing for d in devices if d.shared and d.sharing}) or (["shared"] if any(d.shared for d in devices) else [])
        table_rows.append([r.name, r.phase, r.node or "-", str(len(devices) + len(r.legacy_devices)),
                           ", ".join(sharing) or ("exclusive" if devices or r.legacy_devices else "-"),
                           _short(what, 60), _short(cdi_ids, 70)])
    out += _table(["NAME", "PHASE", "NODE", "GPUS", "SHARING", "DEVICES", "CDI IDS"], table_rows)
    seen = [(r, c) for r in rows for c in r.containers]
    if seen:
        out += ["", "WHAT EACH CONTAINER SAW (inside the container: nvidia-smi -L, NVIDIA_VISIBLE_DEVICES, /dev/nvidia*)"]
        for r, c in seen:
            state = "running" if c.running else f"exited {c.exit_code}"
            out.append(f"{r.name}/{c.name} ({state}):")
            if not c.probed:
                out.append("    (no record: the container did not get to run its probe)")
                continue
            out += [f"    {line}" for line in c.nvidia_smi] or ["    (nvidia-smi -L printed nothing)"]
            out.append(f"    NVIDIA_VISIBLE_DEVICES={c.visible_devices if c.visible_devices is not None else '(unset)'}")
            out.append(f"    device nodes: {' '.join(c.device_nodes) or '-'}")
    out += ["", "NODES"]
    out += _table(["NODE", "GPUS IN USE", "UTILIZATION"],
                  [[n, f"{u.allocated}/{u.total}", f"{100 * u.allocated // max(u.total, 1)}%"] for n, u in util.items()])
    waiting = [r for r in rows if r.phase == "Pending" and r.message]
    if waiting:
        out += ["", "WHY PENDING"]
        out += [f"{r.name}: {r.reason}: {r.message}" for r in waiting]
    out += ["", "EXPECTATIONS"]
    out += [f"[{'ok' if e.ok else 'FAILED'}] {e.name}: {e.detail}" for e in expectations]
    passed = sum(e.ok for e in expectations)
    out += ["", f"{passed}/{len(expectations)} expectations met in {wall_seconds:.1f} s"
            + (f"; sockets, CDI specs, checkpoints and logs kept in {workdir}" if workdir else "")]
    return "\n".join(out)


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
