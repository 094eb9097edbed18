"""The `gpu-dra` entry point: a thin dispatcher over one module per subcommand.

Subcommand modules are imported lazily so that `gpu-dra cel` does not pay for gRPC
and `gpu-dra plugin` does not pay for the allocator.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
from collections.abc import Sequence
from typing import Any

# name -> (module, one-line help). Each module exposes register(parser) and run(args) -> int.
COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("cli.validate", "check resource.k8s.io objects (v1, v1beta2, v1beta1) against Kubernetes' validation rules"),
    "apiserver": ("cli.apiserver", "run the embedded Kubernetes-compatible control plane on loopback"),
    "inventory": ("driver.commands.inventory", "discover GPUs through NVML (real or simulated) and print the inventory"),
    "slices": ("driver.commands.slices", "print the ResourceSlices a node would publish"),
    "plugin": ("driver.commands.plugin", "run the node agent: kubelet DRA plugin (and optional device plugin shim)"),
    "node-health": ("driver.commands.nodehealth", "show or forget (after a GPU reset) the device health a node agent keeps"),
    "cel": ("controller.commands.cel", "evaluate a CEL device selector against devices"),
    "allocate": ("controller.commands.allocate", "allocate claims offline with Kubernetes' structured-parameters semantics"),
    "explain": ("controller.commands.explain", "explain, per claim and node, why claims cannot be allocated"),
    "compute-domain-daemon": ("driver.commands.computedomaindaemon", "run in a ComputeDomain's IMEX daemon pod: "
                              "the clique entry, nvidia-imex and its readiness"),
    "controller": ("controller.commands.controller", "run the cluster agent (explanations, gang allocation, embedded scheduling)"),
    "webhook": ("controller.commands.webhook", "serve the validating admission webhook (HTTPS, AdmissionReview v1)"),
    "bench": ("bench.command", "run a benchmark: {benchmarks}"),
    "demo": ("sim.commands.demo", "run the end-to-end demo on an embedded control plane with simulated GPU nodes"),
    "cluster": ("sim.commands.cluster", "a simulated GPU cluster that stays up: up, down, status, list, fault"),
    "completion": ("cli.completion", "print a shell completion script: bash or zsh"),
}


# Top-level packages of the testbed: a checkout and `pip install .` have them; the image ships only what runs in a
# cluster (plugin, controller, webhook and the offline tools), so their commands say what is missing instead.
NOT_SHIPPED: dict[str, str] = {
    "sim": "the testbed (NVML and kubelet simulators, demo, simulated cluster; package `sim`)",
    "bench": "the benchmarks (package `bench`)",
    "controlplane": "the embedded control plane (package `controlplane`)",
}


class MissingPart(Exception):
    """A subcommand needs a package this installation does not have."""


def load_command(name: str) -> object:
    module = COMMANDS[name][0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top not in NOT_SHIPPED:
            raise
        raise MissingPart(
            f"gpu-dra {name}: {NOT_SHIPPED[top]} is not part of this installation (the container image ships only "
            "what runs in a cluster: plugin, controller, webhook, and validate/allocate/explain/cel/inventory/slices); "
            "install gpu-dra from a source checkout (pip install .) to run it"
        ) from exc


def version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version as dist_version

        return dist_version("gpu-dra")
    except PackageNotFoundError:  # a checkout run without installing
        return "unknown (not installed)"


def help_text(name: str) -> str:
    text = COMMANDS[name][1]
    if "{benchmarks}" in text:
        try:
            from bench.command import BENCHMARKS  # a name table only: cheap to import
        except ModuleNotFoundError:
            return text.format(benchmarks="not part of this installation")
        text = text.format(benchmarks=", ".join(sorted(BENCHMARKS)))
    return text


def build_parser(argv: Sequence[str], *, load_all: bool = False) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-dra", description="Kubernetes DRA driver for NVIDIA GPUs")
    parser.add_argument("--version", action="version", version=f"gpu-dra {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name in COMMANDS:
        text = help_text(name)
        p = sub.add_parser(name, help=text, description=text)
        # Only the chosen subcommand's module is imported; the others just show in --help.
        if name == wanted or load_all:
            try:
                mod: Any = load_command(name)
            except MissingPart:
                if load_all:
                    continue  # completion: offer what this installation has
                raise
            mod.register(p)
            p.set_defaults(_run=mod.run)
    return parser


def chosen_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost (sub)command parser the arguments selected, e.g. `cluster up`'s."""
    while True:
        action = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if action is None:
            return parser
        picked = getattr(args, action.dest, None)
        if picked not in action.choices:
            return parser
        parser = action.choices[picked]


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return [s for a in parser._actions for s in a.option_strings if s.startswith("--")]


def unknown_arguments_error(parser: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    hints = []
    for arg in extras:
        if arg.startswith("--"):
            best = difflib.get_close_matches(arg.split("=", 1)[0], option_strings(parser), n=1, cutoff=0.6)
            if best:
                hints.append(f"{arg.split('=', 1)[0]}: did you mean {best[0]}?")
    return f"unrecognized arguments: {' '.join(extras)}" + (f" ({'; '.join(hints)})" if hints else "")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(argv)
    except MissingPart as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args, extras = parser.parse_known_args(argv)
    if extras:
        # A typo in a flag shows the usage of the subcommand it was meant for, with the closest flag.
        chosen_parser(parser, args).error(unknown_arguments_error(chosen_parser(parser, args), extras))
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
