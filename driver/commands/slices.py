"""`gpu-dra slices`: print the ResourceSlices a node would publish (discovery + build_slices, no API)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from driver.slices import SliceBuildError, SliceSettings, build_slices
from gpudra import DEFAULT_DRIVER_NAME, cliopts


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nvml",
        required=True,
        metavar="real|sim:PROFILE|sim:FILE",
        help="NVML backend: the real library, a shipped simulator profile, or a profile file",
    )
    parser.add_argument("--node", required=True, help="node name (the pool name and spec.nodeName)")
    parser.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME, help=f"DRA driver name (default {DEFAULT_DRIVER_NAME})")
    parser.add_argument(
        "--partitionable",
        action="store_true",
        help="publish MIG-capable GPUs as shared counters plus every MIG placement (DRAPartitionableDevices)",
    )
    cliopts.add_output(parser, default="yaml")


def slice_list(slices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": slices}


def run(args: argparse.Namespace) -> int:
    from driver.commands.nvmlinventory import discover_once

    try:
        settings = SliceSettings(
            node_name=args.node, driver_name=args.driver_name, partitionable=args.partitionable
        )
    except ValueError as err:
        print(f"gpu-dra slices: {err}", file=sys.stderr)
        return 2
    inventory = discover_once(args.nvml, args.node, "gpu-dra slices")
    if inventory is None:
        return 2
    for ident, message in inventory.skipped:
        print(f"gpu-dra slices: warning: GPU {ident} skipped: {message}", file=sys.stderr)
    try:
        slices = build_slices(inventory, settings)
    except SliceBuildError as err:
        print(f"gpu-dra slices: node {args.node}: {err}", file=sys.stderr)
        return 1
    print(cliopts.render(slice_list(slices), args.output, lambda: slices_table(slices)))
    return 0


def slices_table(slices: list[dict[str, Any]]) -> str:
    rows = [("NAME", "NODE", "DRIVER", "POOL", "DEVICES")]
    for s in slices:
        spec = s.get("spec") or {}
        rows.append((str(s["metadata"]["name"]), str(spec.get("nodeName") or "-"), str(spec.get("driver")),
                     str((spec.get("pool") or {}).get("name")), str(len(spec.get("devices") or []))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
