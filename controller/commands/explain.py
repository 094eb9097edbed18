"""`gpu-dra explain -f FILE... [--kubernetes-version V] [--feature GATE]... [-o json|table]`: per claim and node, why it cannot be allocated."""

from __future__ import annotations

import argparse

from controller.cel import CelEnvironment
from controller.commands._inputs import read_inputs, report_input_errors
from controller.offline import Session
from gpudra import cliopts
from gpudra.features import FeatureGateError
from gpudra.features import add_arguments as add_feature_arguments
from gpudra.features import from_arguments as features_from_arguments


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--filename", dest="files", action="extend", nargs="+", required=True, metavar="FILE",
                        help="YAML/JSON with Node, DeviceClass, ResourceSlice, ResourceClaim(Template), Pod objects (repeatable)")
    add_feature_arguments(parser)
    cliopts.add_output(parser)


def run(args: argparse.Namespace) -> int:
    try:
        features = features_from_arguments(args)
    except FeatureGateError as exc:
        return report_input_errors([str(exc)], args.output)
    inputs = read_inputs(args.files)
    if inputs.errors:
        return report_input_errors(inputs.errors, args.output)
    try:
        session = Session(inputs.objects, features, CelEnvironment(features=features))
    except Exception as exc:  # noqa: BLE001 - malformed objects the validator let through
        return report_input_errors([str(exc)], args.output)
    units = session.explain_all()
    if args.output != "table":
        print(cliopts.render({"units": units}, args.output))
    else:
        for u in units:
            print(f"{u['owner']} ({', '.join(u['claims']) or 'no pending claims'})")
            for e in u["errors"]:
                print(f"  error: {e}")
            if "summary" in u:
                print(f"  {u['summary']}")
                for n in u["nodes"]:
                    print(f"    {n['node']}: {n['code']}: {n['message']}")
    # A unit with no claims of its own may still wait on one another unit failed to place (it then has a summary).
    return 0 if all(u.get("fits") or (not u["claims"] and "summary" not in u) for u in units) \
        and not any(u["errors"] for u in units) else 1
