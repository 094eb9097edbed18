"""`gpu-dra cel EXPRESSION (--device FILE | -f SLICES...) [--strict] [-o json|table]`: evaluate a selector.

Exit 0 when the expression compiled and every device evaluated (match or not), 1 on a compile error or
any runtime error, 2 when an input file cannot be read or holds no usable device.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.cel import CelCompileError, CelEnvironment, CelRuntimeError, DeviceView
from controller.cel.errors import missing_key_hint
from gpudra import cliopts
from gpudra.features import FeatureGateError, Features
from gpudra.features import add_arguments as add_feature_arguments
from gpudra.features import from_arguments as features_from_arguments
from gpudra.conversion import normalize_objects
from gpudra.manifests import InputError, load_objects


@dataclass(frozen=True)
class NamedDevice:
    name: str
    view: DeviceView


def register(parser: argparse.ArgumentParser) -> None:
    # Optional here only so that `-f SLICES... EXPRESSION` works too: -f takes every word after it, and the
    # expression is then its last one (see split_expression).
    parser.add_argument("expression", nargs="?",
                        help="CEL selector expression, e.g. 'device.driver == \"gpu.nvidia.com\"'")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--device", metavar="FILE",
                        help="YAML/JSON device: {driver, attributes, capacity, allowMultipleAllocations} (v1 shapes)")
    source.add_argument("-f", "--filename", nargs="+", metavar="SLICES", help="ResourceSlice files; every device")
    parser.add_argument("--strict", action="store_true",
                        help="use the API-validation environment (fields behind disabled gates are unknown)")
    add_feature_arguments(parser)
    cliopts.add_output(parser)


def load_device_file(path: str) -> list[NamedDevice]:
    docs = load_objects([path])
    if len(docs) != 1:
        raise InputError(f"{path}: must hold one device object {{driver, attributes, capacity, "
                         "allowMultipleAllocations}")
    doc = docs[0]
    driver = doc.get("driver", "")
    if not isinstance(driver, str):
        raise InputError(f"{path}: driver: must be a string, a driver name such as gpu.nvidia.com (empty is allowed)")
    for field_name in ("attributes", "capacity"):
        if doc.get(field_name) is not None and not isinstance(doc[field_name], dict):
            raise InputError(f"{path}: {field_name}: must be a map of qualified names to v1 values")
    try:
        view = DeviceView.from_slice_device(driver, doc)
    except ValueError as err:
        raise InputError(f"{path}: {err}") from None
    return [NamedDevice(str(doc.get("name") or Path(path).name or "device"), view)]


def load_slice_files(paths: list[str]) -> list[NamedDevice]:
    devices: list[NamedDevice] = []
    for path in paths:
        objects, errors = normalize_objects(load_objects([path]))  # v1beta1 and v1beta2 slices read as v1
        if errors:
            raise InputError(f"{path}: {errors[0]}")
        for doc in objects:
            if doc.get("kind") != "ResourceSlice":
                continue
            spec = doc.get("spec")
            name = (doc.get("metadata") or {}).get("name", "<unnamed>")
            if not isinstance(spec, dict) or not isinstance(spec.get("driver"), str):
                raise InputError(f"{path}: ResourceSlice {name}: spec.driver: required")
            pool = (spec.get("pool") or {}).get("name", "")
            for device in spec.get("devices") or []:
                if not isinstance(device, dict):
                    raise InputError(f"{path}: ResourceSlice {name}: spec.devices: entries must be objects")
                try:
                    view = DeviceView.from_slice_device(spec["driver"], device)
                except ValueError as err:
                    raise InputError(f"{path}: ResourceSlice {name}: {err}") from None
                devices.append(NamedDevice(f"{spec['driver']}/{pool}/{device.get('name', '')}", view))
    if not devices:
        raise InputError(f"no ResourceSlice devices found in {', '.join(paths)}")
    return devices


def evaluate(expression: str, devices: list[NamedDevice], strict: bool, features: Features | None = None) -> dict[str, Any]:
    """The `-o json` document: compile once, evaluate every device."""
    env = CelEnvironment(strict=strict, features=features)
    try:
        selector = env.compile(expression)
    except CelCompileError as err:
        return {"compileError": str(err), "results": []}
    results: list[dict[str, Any]] = []
    for device in devices:
        try:
            results.append({"device": device.name, "match": selector.matches(device.view)})
        except CelRuntimeError as err:
            # Kubernetes' text as `error`; what was probably meant beside it, as the allocator suggests it.
            entry = {"device": device.name, "error": str(err)}
            hint = missing_key_hint(str(err), device.view.attributes, device.view.capacity, device.name)
            if hint.startswith("; did you mean "):
                entry["hint"] = hint[2:hint.index("?") + 1]
            results.append(entry)
    return {"compileError": None, "results": results}


def _print_table(report: dict[str, Any]) -> None:
    if report["compileError"] is not None:
        print(f"compile error: {report['compileError']}")
        return
    width = max([len("DEVICE")] + [len(r["device"]) for r in report["results"]])
    print(f"{'DEVICE':<{width}}  RESULT")
    for r in report["results"]:
        outcome = ("match" if r["match"] else "no match") if "match" in r else \
            f"error: {r['error']}" + (f"; {r['hint']}" if r.get("hint") else "")
        print(f"{r['device']:<{width}}  {outcome}")


def split_expression(expression: str | None, files: list[str] | None) -> tuple[str, list[str] | None]:
    """The expression and the slice files, for either order on the command line: `cel EXPR -f FILE...` or
    `cel -f FILE... EXPR` (where -f took the expression as its last word). Raises InputError without one."""
    if expression is not None:
        return expression, files
    if files and len(files) >= 2 and not Path(files[-1]).exists():
        return files[-1], files[:-1]
    raise InputError("the following arguments are required: EXPRESSION "
                     "(gpu-dra cel EXPRESSION (--device FILE | -f SLICES...), or -f SLICES... EXPRESSION)")


def run(args: argparse.Namespace) -> int:
    try:
        features = features_from_arguments(args)
        expression, files = split_expression(args.expression, args.filename)
        devices = load_device_file(args.device) if args.device else load_slice_files(files or [])
    except (InputError, FeatureGateError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    report = evaluate(expression, devices, args.strict, features)
    if args.output == "table":
        _print_table(report)
    else:
        print(cliopts.render(report, args.output))
    failed = report["compileError"] is not None or any("error" in r for r in report["results"])
    return 1 if failed else 0
