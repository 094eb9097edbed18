"""`gpu-dra bench allocate|prepare|cel|schedule|serving|store`: dispatch to one benchmark module of this package."""

from __future__ import annotations

import argparse
import importlib

BENCHMARKS: dict[str, str] = {
    "allocate": "bench.allocate",
    "cel": "bench.cel",
    "prepare": "bench.prepare",
    "schedule": "bench.schedule",
    "serving": "bench.apiserver:run_serving",
    "store": "bench.apiserver:run_store",
}


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("benchmark", choices=sorted(BENCHMARKS), help="which benchmark to run")
    parser.add_argument("-o", "--output", choices=["json", "table"], default="table")
    parser.add_argument("--seed", type=int, default=1, help="random seed (fixed for comparable runs)")
    parser.add_argument(
        "--scenario", default="all", help="allocate only: a (scheduler_perf shape), b (NVLink gangs of 4/8) or all"
    )


def run(args: argparse.Namespace) -> int:
    module, _, func = BENCHMARKS[args.benchmark].partition(":")
    return int(getattr(importlib.import_module(module), func or "run")(args) or 0)
