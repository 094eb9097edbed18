"""`gpu-dra slices`: print the ResourceSlices a node would publish (discovery + build_slices, no API)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml

from driver.slices import SliceBuildError, SliceSettings, build_slices
from gpudra import DEFAULT_DRIVER_NAME


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
    parser.add_argument(
        "--shared-capacity",
        action="store_true",
        help="publish full GPUs shared by capacity: memory and computeShare per claim (DRAConsumableCapacity)",
    )
    parser.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml", help="output format")


def slice_list(slices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": slices}


def run(args: argparse.Namespace) -> int:
    from driver.commands.nvmlinventory import discover_once

    try:
        settings = SliceSettings(
            node_name=args.node, driver_name=args.driver_name, partitionable=args.partitionable,
            shared_capacity=args.shared_capacity,
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
    doc = slice_list(slices)
    if args.output == "json":
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        yaml.safe_dump(doc, sys.stdout, sort_keys=False)
    return 0
