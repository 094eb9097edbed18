"""Command-line conventions every `gpu-dra` command shares: flag value types, `-o`, the logging flag and finding
the API server. Each command module applies them with one call per flag, so all commands behave alike.

- Flag values are checked by argparse types: a bad value is a usage error (exit 2) naming the flag, never a traceback.
- `-o json|yaml|table`: the same three formats wherever a command prints objects or reports.
- `--log-level debug|info|warning|error`: the one logging flag of long-running commands (key=value lines on stderr).
- API access: `--kubeconfig FILE`, else $KUBECONFIG, else in-cluster config, else one message saying so.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

OUTPUT_FORMATS = ("json", "yaml", "table")
LOG_LEVELS = ("debug", "info", "warning", "error")


# ---- value types -------------------------------------------------------------------------------------------------


def port(text: str) -> int:
    """A TCP port, 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a port number from 0 to 65535") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text}: expected a port number from 0 to 65535")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: must be greater than 0 seconds")
    return value


# ---- -o ----------------------------------------------------------------------------------------------------------


def _output_format(text: str) -> str:
    # `text` was validate's name for the table before the formats were unified; it still works.
    return "table" if text == "text" else text


def add_output(parser: argparse.ArgumentParser, default: str = "table", choices: tuple[str, ...] = OUTPUT_FORMATS) -> None:
    parser.add_argument("-o", "--output", type=_output_format, choices=choices, default=default,
                        help=f"output format: {', '.join(choices)} (default {default})")


def render(obj: Any, output: str, table: Callable[[], str] | None = None) -> str:
    """The text for `-o`: JSON (indented), YAML, or the command's table."""
    if output == "json":
        return json.dumps(obj, indent=2)
    if output == "yaml":
        import yaml

        return yaml.safe_dump(obj, sort_keys=False).rstrip("\n")
    if table is None:
        raise ValueError("this command has no table output")
    return table()


# ---- logging -----------------------------------------------------------------------------------------------------


def add_log_level(parser: argparse.ArgumentParser, default: str = "info") -> None:
    parser.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS, default=default,
                        help=f"log level of the key=value lines on stderr (default {default})")


def log_level(args: argparse.Namespace) -> int:
    return int(getattr(logging, str(args.log_level).upper()))


# ---- API access --------------------------------------------------------------------------------------------------

IN_CLUSTER_ENV = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")
TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"


class NoApiConfig(RuntimeError):
    """Neither a kubeconfig nor in-cluster configuration is there."""


def add_kubeconfig(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", metavar="FILE",
                        help="kubeconfig file (default: $KUBECONFIG, then the in-cluster service account)")


def kubeconfig_source(explicit: str | None, environ: Mapping[str, str] = os.environ,
                      token_file: str = TOKEN_FILE) -> str | None:
    """The kubeconfig to load (`--kubeconfig`, else the first existing file of $KUBECONFIG), or None for in-cluster
    config. Raises NoApiConfig with one message when neither is there."""
    if explicit:
        if not os.path.isfile(explicit):
            raise NoApiConfig(f"--kubeconfig {explicit}: no such file")
        return explicit
    paths = [p for p in (environ.get("KUBECONFIG") or "").split(os.pathsep) if p]
    existing = [p for p in paths if os.path.isfile(p)]
    if existing:
        return existing[0]
    if all(environ.get(k) for k in IN_CLUSTER_ENV) and os.path.isfile(token_file):
        return None
    where = f"$KUBECONFIG ({os.pathsep.join(paths)}) names no existing file" if paths else "$KUBECONFIG is not set"
    raise NoApiConfig(f"no API server configured: --kubeconfig is not given, {where}, and this is not a pod "
                      f"(no {' / '.join(IN_CLUSTER_ENV)} and {token_file}); pass --kubeconfig FILE or set KUBECONFIG")


def add_runtime_config(parser: argparse.ArgumentParser) -> None:
    """`--runtime-config`, the same on `apiserver`, `demo` and `cluster up`."""
    parser.add_argument("--runtime-config", action="append", default=[], metavar="GROUP/VERSION=true|false[,...]",
                        help="API versions to serve beyond the GA ones, as kube-apiserver's --runtime-config: e.g. "
                             "resource.k8s.io/v1beta1=true (NVIDIA's v1beta1 specs), resource.k8s.io/v1beta2=true, "
                             "scheduling.k8s.io/v1beta1=true (the Workload API, with --feature-gates "
                             "GenericWorkload=true), api/beta=true (repeatable)")
