"""`gpu-dra node-health`: the device health a node's agent keeps in its checkpoint (driver.stickyhealth), and
forgetting it after a GPU reset.

Health is sticky across agent restarts and upgrades; only a reboot drops it on its own. After resetting a GPU
(`nvidia-smi -r`), run this in the agent's pod with `--forget`, then restart the pod: the GPU is published
untainted again. A running agent keeps what it saw in memory until it restarts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gpudra import DEFAULT_DRIVER_NAME, cliopts


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubelet-dir", default="/var/lib/kubelet",
                        help="the kubelet directory the agent uses (default %(default)s); the checkpoint is in "
                             "<kubelet-dir>/plugins/<driver-name>")
    parser.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME, help=f"DRA driver name (default {DEFAULT_DRIVER_NAME})")
    parser.add_argument("--forget", action="append", default=[], metavar="UUID|all",
                        help="drop the recorded health of this GPU or MIG device (repeatable), or of every device "
                             "(all): after a GPU reset; restart the agent afterwards")
    cliopts.add_output(parser)


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [("DEVICE", "XIDS", "LOST", "UNMONITORED")]
    lines += [(r["uuid"], ",".join(map(str, r["xids"])) or "-", str(r["lost"]).lower(), str(r["unmonitored"]).lower())
              for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(4)]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def run(args: argparse.Namespace) -> int:
    from driver.checkpoint import Checkpoint, CheckpointCorrupt

    directory = Path(args.kubelet_dir) / "plugins" / args.driver_name
    if not (directory / "checkpoint.json").exists() and not (directory / "checkpoint.journal").exists():
        print(f"gpu-dra node-health: {directory}: no checkpoint there (is --kubelet-dir the agent's, and "
              f"--driver-name {args.driver_name!r} its driver?)", file=sys.stderr)
        return 1
    try:
        checkpoint, report = Checkpoint.open(directory)
    except (OSError, CheckpointCorrupt) as exc:
        print(f"gpu-dra node-health: {directory}: {exc}", file=sys.stderr)
        return 1
    try:
        for problem in report.problems:
            print(f"gpu-dra node-health: warning: {problem}", file=sys.stderr)
        known = set(checkpoint.state.health)
        wanted = set(args.forget)
        unknown = sorted(wanted - known - {"all"})
        if unknown:
            print(f"gpu-dra node-health: --forget: {', '.join(unknown)}: no health recorded for it; recorded: "
                  f"{', '.join(sorted(known)) or 'none'}", file=sys.stderr)
            return 2
        if wanted:
            dropped = checkpoint.forget_health(None if "all" in wanted else wanted)
            print(f"gpu-dra node-health: forgot {', '.join(dropped) or 'nothing'}; restart the node agent's pod so "
                  "that it publishes them untainted", file=sys.stderr)
        rows = [{"uuid": uuid, "xids": r.xids, "lost": r.lost, "unmonitored": r.unmonitored}
                for uuid, r in sorted(checkpoint.state.health.items())]
    finally:
        checkpoint.close()
    print(cliopts.render({"devices": rows}, args.output, lambda: _table(rows)))
    return 0
