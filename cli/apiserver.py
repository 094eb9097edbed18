"""`gpu-dra apiserver`: run the embedded Kubernetes-compatible control plane on loopback until signalled."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from gpudra import DEFAULT_DRIVER_NAME, cliopts, logfmt
from controlplane import EmbeddedApiServer
from controller.validationhooks import validation_admission
from controlplane.persistence import StateFileError
from controlplane.resources import known_group_versions
from controlplane.runtimeconfig import RuntimeConfig, RuntimeConfigError
from gpudra.features import DEFAULT_VERSION, SUPPORTED_VERSIONS, FeatureGateError, Features, check_version
from controlplane.podlogs import PodLogsDir


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=cliopts.port, default=0, help="TCP port (default: a free port)")
    parser.add_argument("--address", default="127.0.0.1",
                        help="loopback address to listen on (default 127.0.0.1; non-loopback addresses are refused)")
    parser.add_argument("--kubeconfig-out", metavar="FILE", help="write a kubeconfig for this server to FILE")
    parser.add_argument("--state", metavar="DB",
                        help="keep objects in the SQLite database DB (created if missing; every write is committed "
                             "before it is answered); a JSON state file of an earlier version is migrated once, "
                             "keeping it as DB.json-backup. Without --state, objects live in memory only")
    cliopts.add_log_level(parser)
    parser.add_argument("--pod-logs-dir", metavar="DIR",
                        help="serve pods/log (kubectl logs) from DIR in the kubelet's /var/log/pods layout "
                             "(<namespace>_<pod>_<uid>/<container>/<restart>.log, CRI log format)")
    parser.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME,
                        help="driver whose opaque configuration admission validates (default %(default)s)")
    parser.add_argument("--kubernetes-version", default=DEFAULT_VERSION, metavar="VERSION",
                        help=f"Kubernetes release the server behaves as: /version, served API versions, validation "
                             f"({SUPPORTED_VERSIONS[0]}..{SUPPORTED_VERSIONS[-1]}, default %(default)s)")
    cliopts.add_runtime_config(parser)
    parser.add_argument("--feature-gates", "--feature", dest="feature", action="append", default=[],
                        metavar="GATE=true|false[,...]",
                        help="feature gates over the release's defaults, as kube-apiserver's --feature-gates: a gated "
                             "API is served and a gated field kept only with its gate on (repeatable)")



def run(args: argparse.Namespace) -> int:
    logfmt.configure(cliopts.log_level(args))
    try:
        version = check_version(args.kubernetes_version)
        features = Features.parse(args.feature, version)
        runtime_config = RuntimeConfig.parse(args.runtime_config, known_group_versions())
    except (FeatureGateError, RuntimeConfigError) as exc:
        print(f"gpu-dra apiserver: {exc}", file=sys.stderr)
        return 2
    try:
        server = EmbeddedApiServer(args.address, args.port, state_file=args.state,
                                   admission=validation_admission(args.driver_name, version), kubernetes_version=version,
                                   runtime_config=runtime_config, features=features)
        if args.pod_logs_dir:
            server.pod_logs = PodLogsDir(Path(args.pod_logs_dir).absolute())
        url = server.start()
    except (ValueError, OSError, StateFileError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"gpu-dra apiserver: cannot start on {args.address}:{args.port}: {detail}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        if args.kubeconfig_out:
            server.write_kubeconfig(args.kubeconfig_out)
        print(url, flush=True)
        print(f"level=info component=apiserver msg=serving url={url} state={args.state or '-'} "
              f"kubeconfig={args.kubeconfig_out or '-'}", file=sys.stderr, flush=True)
        while not stop.wait(3600):
            pass
    finally:
        server.stop()
    print("level=info component=apiserver msg=stopped", file=sys.stderr, flush=True)
    return 0
