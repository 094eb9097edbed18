"""`gpu-dra demo`: the end-to-end run on one machine, no cluster and no GPU.

An embedded control plane, four simulated GPU nodes with their node agents and kubelets, the controller in
embedded mode, and the example workloads in two acts (see sim.demo.runner). Progress lines go to stderr,
the report to stdout. Exit 0 only when every expected outcome happened, 1 when one did not or a step failed,
2 for bad arguments, 130 on Ctrl-C. Child processes are stopped (SIGTERM, then SIGKILL) in every case.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import FrameType

from driver.unixsocket import MAX_UNIX_SOCKET_PATH
from gpudra import cliopts

MAX_SOCKET_PATH_BYTES = MAX_UNIX_SOCKET_PATH  # what gRPC can bind (sun_path less its limits)
# The longest socket path the demo creates under the work dir.
LONGEST_SOCKET_SUFFIX = "/nodes/a100-1/kubelet/plugins_registry/gpu.nvidia.com-reg.sock"


def register(parser: argparse.ArgumentParser) -> None:
    cliopts.add_output(parser)
    parser.add_argument("--workdir", metavar="DIR",
                        help="keep sockets, CDI specs, checkpoints and logs in DIR (default: a temporary dir, removed)")
    parser.add_argument("--step-timeout", type=float, default=45.0, metavar="SECONDS",
                        help="how long one step may take before the demo gives up (default %(default)s)")
    parser.add_argument("--manifests", metavar="DIR",
                        help="the project's manifests/ directory with base/deviceclasses.yaml and examples/ "
                             "(default: the checkout's; an installed copy, e.g. the container image, names its own)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    parser.add_argument("--runtime", choices=["auto", "podman", "none"], default="auto",
                        help="container runtime of the simulated kubelets: podman (containers start for real with "
                             "their CDI devices; needs root, podman, runc, busybox-static), none (pods are marked "
                             "Running after prepare), auto (podman when it can run here, else none; default)")
    cliopts.add_runtime_config(parser)


class _Terminated(BaseException):
    """SIGTERM: unwind like Ctrl-C so that the children are stopped."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated()


def run(args: argparse.Namespace) -> int:
    if args.step_timeout <= 0:
        print(f"gpu-dra demo: --step-timeout {args.step_timeout}: must be greater than 0 seconds", file=sys.stderr)
        return 2
    from sim.demo.cluster import DEFAULT_MANIFESTS, Manifests

    manifests = Manifests(Path(args.manifests).absolute() if args.manifests else DEFAULT_MANIFESTS)
    missing = manifests.missing()
    if missing:
        print(f"gpu-dra demo: --manifests {manifests.root}: missing {', '.join(str(p) for p in missing)}; "
              "give the project's manifests/ directory (it holds base/deviceclasses.yaml and examples/)", file=sys.stderr)
        return 2
    from controlplane.resources import known_group_versions
    from controlplane.runtimeconfig import RuntimeConfig, RuntimeConfigError

    try:
        RuntimeConfig.parse(args.runtime_config, known_group_versions())
    except RuntimeConfigError as exc:
        print(f"gpu-dra demo: {exc}", file=sys.stderr)
        return 2
    if args.workdir:
        workdir = Path(args.workdir).absolute()
        longest = len(str(workdir).encode()) + len(LONGEST_SOCKET_SUFFIX)
        if longest > MAX_SOCKET_PATH_BYTES:
            print(f"gpu-dra demo: --workdir {workdir}: too long: unix sockets under it (e.g. {LONGEST_SOCKET_SUFFIX[1:]}) "
                  f"would be {longest} bytes, at most {MAX_SOCKET_PATH_BYTES} fit; choose a path of at most "
                  f"{MAX_SOCKET_PATH_BYTES - len(LONGEST_SOCKET_SUFFIX)} bytes", file=sys.stderr)
            return 2
        if workdir.exists() and any(workdir.iterdir()):
            print(f"gpu-dra demo: --workdir {workdir}: must be empty or not exist yet (a previous run's checkpoints "
                  "would be taken over by the new nodes)", file=sys.stderr)
            return 2
        workdir.mkdir(parents=True, exist_ok=True)
        keep = True
    else:
        # $TMPDIR can be long (macOS); /tmp keeps the node sockets under the unix path limit.
        base = tempfile.gettempdir()
        if len(base.encode()) + len("/gpu-dra-demo-XXXXXXXX") + len(LONGEST_SOCKET_SUFFIX) > MAX_SOCKET_PATH_BYTES:
            base = "/tmp"
        workdir = Path(tempfile.mkdtemp(prefix="gpu-dra-demo-", dir=base))
        keep = False

    from sim.runtime import choose

    try:
        runtime = choose(args.runtime)
    except ValueError as exc:
        print(f"gpu-dra demo: --runtime {args.runtime}: {exc}", file=sys.stderr)
        return 2

    from sim.demo import expect, observe, report
    from sim.demo.processes import log_tail
    from sim.demo.runner import Demo, DemoFailed, DemoSettings

    def progress(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    start = time.monotonic()
    if runtime.kind == "none" and args.runtime == "auto":
        # Falling back is worth a line even with --quiet: the report then has no container views.
        print(f"gpu-dra demo: notice: {runtime.reason}", file=sys.stderr, flush=True)
    else:
        progress(f"runtime: {runtime.kind}: {runtime.reason}")
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    demo = Demo(DemoSettings(workdir=workdir, manifests=manifests, step_timeout=args.step_timeout, progress=progress,
                             runtime=runtime.kind, runtime_config=tuple(args.runtime_config)))
    failure = ""
    observed = None
    interrupted = False
    try:
        observed = demo.run()
    except DemoFailed as exc:
        failure = str(exc)
    except Exception:  # noqa: BLE001 - a bug or an API error still ends in clean-up and a report
        failure = traceback.format_exc()
    except (KeyboardInterrupt, _Terminated):
        interrupted = True
        progress("interrupted: stopping every process")
    finally:
        # A second Ctrl-C or SIGTERM must not cut the clean-up short and leave children behind.
        previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            codes = demo.close()
        finally:
            signal.signal(signal.SIGINT, previous_int)
            signal.signal(signal.SIGTERM, previous)
    if interrupted:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
        return 130
    unclean = {name: code for name, code in codes.items() if code not in (0, None)}
    wall = time.monotonic() - start
    shown_workdir = str(workdir) if keep else None
    try:
        if observed is None:
            print(f"gpu-dra demo: failed: {failure}", file=sys.stderr)
            for log in sorted((workdir / "logs").glob("*.log")):
                print(f"--- last lines of {log.name}:\n{log_tail(log, 8)}", file=sys.stderr)
            if keep:
                print(f"gpu-dra demo: logs are in {workdir / 'logs'}", file=sys.stderr)
            if args.output != "table":
                print(cliopts.render({"ok": False, "error": failure, "wallSeconds": round(wall, 2), "workdir": shown_workdir},
                                     args.output))
            return 1
        rows = observe.workloads(observed)
        util = observe.utilization(observed, rows)
        results = expect.check_all(rows, observed)
        results.append(expect.Expectation(
            "processes-stopped-cleanly", not unclean,
            "every child exited 0 on SIGTERM" if not unclean else f"exit codes {unclean}",
        ))
        progress(f"all processes stopped; wall time {wall:.1f} s")
        if args.output != "table":
            doc = report.as_json(rows, util, results, wall_seconds=wall, workdir=shown_workdir)
            doc["runtime"] = {"kind": runtime.kind, "reason": runtime.reason}
            print(cliopts.render(doc, args.output))
        else:
            print(report.as_table(rows, util, results, wall_seconds=wall, workdir=shown_workdir))
            print(f"container runtime: {runtime.kind}: {runtime.reason}")
        return 0 if all(r.ok for r in results) else 1
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
