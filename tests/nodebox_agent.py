"""The node agent on a node in a box, in a process of its own (pynvml holds one NVML library per process).

`python -m tests.nodebox_agent REQUEST.json` loads NVML with `--nvml real` semantics from the request's driver
root, builds the NodeAgent as `gpu-dra plugin` does (driver files from the root, device numbers from the box's
procfs), prepares the request's claims and writes `{"inventory": ..., "results": {claim: {error, cdiIds}}}` to
the request's `out` path. Claims are `[name, uid, [[request, device name], ...], config or null]`.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from driver.discovery import discover
from driver.nvml import load_backend
from driver.plugin.agent import AgentSettings, NodeAgent
from driver.prepare import ClaimNotFound, ClaimRef

DRIVER = "gpu.nvidia.com"


def main(request_path: str) -> int:
    req = json.loads(Path(request_path).read_text())
    root = Path(req["driverRoot"])
    node = req["node"]
    nvml = load_backend("real", node=node, driver_root=root)
    inventory = discover(nvml, node)
    claims: dict[str, dict[str, Any]] = {}
    for name, uid, devices, config in req["claims"]:
        claims[name] = {
            "metadata": {"namespace": "ns", "name": name, "uid": uid}, "spec": {},
            "status": {"allocation": {"devices": {
                "results": [{"request": r, "driver": DRIVER, "pool": node, "device": d} for r, d in devices],
                "config": [{"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": config}}]
                if config else [],
            }}},
        }

    def get_claim(namespace: str, name: str) -> dict[str, Any]:
        if namespace != "ns" or name not in claims:
            raise ClaimNotFound(f"{namespace}/{name}")
        return claims[name]

    state = Path(req["state"])
    (state / "boot_id").write_text("boot-1\n")
    settings = AgentSettings(
        node_name=node, driver_name=DRIVER, kubelet_dir=state / "kubelet", cdi_dir=Path(req["cdiDir"]),
        boot_id_path=state / "boot_id", driver_root=root, host_driver_root=str(root), proc_root=Path(req["procRoot"]),
    )
    agent = NodeAgent(settings, nvml=nvml, inventory=inventory, get_claim=get_claim)
    try:
        agent.preparer.start(agent.load_report)
        refs = [ClaimRef(uid, "ns", name) for name, uid, _, _ in req["claims"]]
        results = agent.preparer.prepare(refs)
    finally:
        agent.checkpoint.close()
    out = {
        "inventory": dataclasses.asdict(inventory),
        "mpsRoot": str(agent.paths.plugin_dir / "mps"),
        "results": {ref.name: {"error": results[ref.uid].error,
                               "cdiIds": [i for d in results[ref.uid].devices for i in d.cdi_device_ids]}
                    for ref in refs},
    }
    Path(req["out"]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
