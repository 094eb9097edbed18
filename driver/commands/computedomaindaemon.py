"""`gpu-dra compute-domain-daemon run|check`: the IMEX daemon pod's command (driver.computedomain.daemon)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from driver.computedomain import daemon


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbosity", type=int, default=0, help="log verbosity (0: info, 1+: debug)")
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    sub.add_parser("run", help="run the daemon: join the clique, run nvidia-imex, report readiness until SIGTERM")
    sub.add_parser("check", help="exit 0 when the local IMEX daemon is READY (nvidia-imex-ctl -q): the pod's probe")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.DEBUG if args.verbosity > 0 else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    env = dict(os.environ)
    try:
        if args.action == "check":
            ok, said = daemon.check_once(env)
            print(said, file=sys.stdout if ok else sys.stderr)
            return 0 if ok else 1
        return daemon.run_daemon(env)
    except daemon.DaemonError as exc:
        print(f"gpu-dra compute-domain-daemon: {exc}", file=sys.stderr)
        return 1
