"""`gpu-dra bench allocate|cel|differential|kubeapi|memory|prepare|schedule|serving|store`: dispatch to one benchmark module of this package."""

from __future__ import annotations

import argparse
import importlib

from bench.report import OUTPUTS

BENCHMARKS: dict[str, str] = {
    "allocate": "bench.allocate",
    "cel": "bench.cel",
    "differential": "bench.differential",
    "kubeapi": "bench.kubeapi",
    "memory": "bench.memory",
    "prepare": "bench.prepare",
    "schedule": "bench.schedule",
    "serving": "bench.apiserver:run_serving",
    "store": "bench.apiserver:run_store",
}

# The benchmarks that also run against upstream Kubernetes (--kubernetes upstream).
UPSTREAM: dict[str, str] = {"allocate": "bench.allocate_upstream", "schedule": "bench.schedule_upstream"}


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("benchmark", choices=sorted(BENCHMARKS), help="which benchmark to run")
    parser.add_argument("-o", "--output", choices=OUTPUTS, default="table",
                        help="one result object per benchmark, the same keys in every format")
    parser.add_argument("--seed", type=int, default=1, help="random seed (fixed for comparable runs)")
    parser.add_argument(
        "--scenario", default="all", help="allocate only: a (scheduler_perf shape), b (NVLink gangs of 4/8) or all"
    )
    parser.add_argument("--nodes", type=node_sizes, default=None,
                        help="allocate, schedule, memory: cluster size (default: the scenario's own); allocate also takes a "
                             "comma-separated list (100,500,1000: one run per size, and the scale curve)")
    parser.add_argument("--devices", type=int, default=None, help="allocate only: devices per node (default: the scenario's own)")
    parser.add_argument("--pods", type=int, default=None, help="schedule: pods to create (default 4 per node); memory: pods (and claims) in the cluster (default 50000)")
    parser.add_argument("--rate", type=float, default=None,
                        help="schedule only: create pods at this many per second instead of back to back")
    parser.add_argument("--size", type=positive_int, default=None,
                        help="the workload of the benchmarks without a shape of their own: prepare: claims (1000), "
                             "differential: scenarios (30), "
                             "cel: devices (10000), kubeapi: calls per shape (300), store: writes (1200), "
                             "serving: requests (2000)")
    parser.add_argument("--kubernetes", choices=("embedded", "upstream"), default="embedded",
                        help="schedule: upstream also places the same pods with the real kube-scheduler 1.37.2 "
                             "(needs Go and root) and prints both and their ratio; allocate: upstream also allocates "
                             "each claim with kube-scheduler 1.37's DRA allocator (needs Go) and prints both figures "
                             "and their agreement")
    parser.add_argument("--keep", default=None, metavar="DIR",
                        help="differential only: write each disagreeing case there as `gpu-dra allocate -f` input")
    parser.add_argument("--audit-level", choices=("None", "Metadata", "Request", "RequestResponse"), default=None,
                        help="serving only: run the server with an audit log (a temporary file) whose policy gives "
                             "every request this level (default: no audit log)")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be at least 1")
    return value


def node_sizes(text: str) -> list[int]:
    """`--nodes N` or `--nodes N,N,...`: whole numbers (checked further by each benchmark)."""
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of nodes, or several separated by commas "
                                         "(100,500,1000)") from None


def run(args: argparse.Namespace) -> int:
    target = BENCHMARKS[args.benchmark]
    if getattr(args, "kubernetes", "embedded") == "upstream" and args.benchmark in UPSTREAM:
        target = UPSTREAM[args.benchmark]
    module, _, func = target.partition(":")
    return int(getattr(importlib.import_module(module), func or "run")(args) or 0)
