"""`gpu-dra allocate -f FILE... [--node NODE] [--kubernetes-version V] [--feature GATE]... [-o json|yaml|table]`: offline allocation."""

from __future__ import annotations

import argparse
import json
import sys

from controller.cel import CelEnvironment
from controller.commands._inputs import read_inputs, report_input_errors, report_warnings
from controller.offline import ClaimResult, Session
from gpudra.features import FeatureGateError
from gpudra.features import add_arguments as add_feature_arguments
from gpudra.features import from_arguments as features_from_arguments


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--filename", dest="files", action="extend", nargs="+", required=True, metavar="FILE",
                        help="YAML/JSON with Node, DeviceClass, ResourceSlice, ResourceClaim(Template), Pod objects (repeatable)")
    parser.add_argument("--node", help="allocate all pending claims together on this node (one scheduler Filter call)")
    add_feature_arguments(parser)
    parser.add_argument("--policy", choices=["binpack", "spread"], default="binpack", help="node scoring policy")
    parser.add_argument("-o", "--output", choices=["json", "yaml", "table"], default="table")


def run(args: argparse.Namespace) -> int:
    try:
        features = features_from_arguments(args)
    except FeatureGateError as exc:
        return report_input_errors([str(exc)], args.output)
    inputs = read_inputs(args.files, strict=False)
    if inputs.errors:
        return report_input_errors(inputs.errors, args.output)
    report_warnings(inputs.warnings)
    try:
        session = Session(inputs.objects, features, CelEnvironment(features=features), args.policy)
    except Exception as exc:  # noqa: BLE001 - malformed objects the validator let through: still exit 2, with the text
        return report_input_errors([str(exc)], args.output)
    if args.node is not None and args.node not in session.snapshot.nodes:
        known = ", ".join(session.snapshot.node_names) or "none"
        return report_input_errors([f"--node {args.node}: no such node in the input; known nodes: {known}"], args.output)
    results = session.allocate_on(args.node) if args.node is not None else session.place_all()
    emit(results, args.output)
    return 0 if all(r.outcome == "allocated" for r in results) else 1


def emit(results: list[ClaimResult], output: str) -> None:
    doc = {"results": [r.to_dict() for r in results]}
    if output == "json":
        print(json.dumps(doc, indent=2))
    elif output == "yaml":
        import yaml

        print(yaml.safe_dump(doc, sort_keys=False), end="")
    else:
        rows = [("CLAIM", "OUTCOME", "NODE", "DEVICES", "MESSAGE")]
        for r in results:
            devices = ",".join(d["device"] for d in (r.allocation or {}).get("devices", {}).get("results", [])) or "-"
            rows.append((r.claim, r.outcome, r.node or "-", devices, r.message))
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        for row in rows:
            print("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4])
    sys.stdout.flush()
