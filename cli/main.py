"""The `gpu-dra` entry point: a thin dispatcher over one module per subcommand.

Subcommand modules are imported lazily so that `gpu-dra cel` does not pay for gRPC
and `gpu-dra plugin` does not pay for the allocator.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name -> (module, one-line help). Each module exposes register(parser) and run(args) -> int.
COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("cli.validate", "check resource.k8s.io objects (v1, v1beta2, v1beta1) against Kubernetes' validation rules"),
    "apiserver": ("cli.apiserver", "run the embedded Kubernetes-compatible control plane on loopback"),
    "inventory": ("driver.commands.inventory", "discover GPUs through NVML (real or simulated) and print the inventory"),
    "slices": ("driver.commands.slices", "print the ResourceSlices a node would publish"),
    "plugin": ("driver.commands.plugin", "run the node agent: kubelet DRA plugin (and optional device plugin shim)"),
    "cel": ("controller.commands.cel", "evaluate a CEL device selector against devices"),
    "allocate": ("controller.commands.allocate", "allocate claims offline with Kubernetes' structured-parameters semantics"),
    "explain": ("controller.commands.explain", "explain, per claim and node, why claims cannot be allocated"),
    "controller": ("controller.commands.controller", "run the cluster agent (explanations, gang allocation, embedded scheduling)"),
    "bench": ("bench.command", "run a benchmark: allocate, prepare, cel, schedule, serving or store"),
    "demo": ("sim.commands.demo", "run the end-to-end demo on an embedded control plane with simulated GPU nodes"),
}


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-dra", description="Kubernetes DRA driver for NVIDIA GPUs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # Only the chosen subcommand's module is imported; the others just show in --help.
        if name == wanted:
            mod = importlib.import_module(module)
            mod.register(p)
            p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
