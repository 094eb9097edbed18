"""`gpu-dra webhook --tls-cert-file FILE --tls-private-key-file FILE [--port N]`: the validating admission webhook
for resource.k8s.io objects (our opaque configs, refused NVIDIA classes, Kubernetes' rules), HTTPS, until
SIGTERM/SIGINT. The certificate is re-read when its files change (cert-manager renewals)."""

from __future__ import annotations

import argparse
import logging
import ssl
import sys
import threading
from pathlib import Path

from controller.validationhooks import validation_admission
from controller.webhook import VALIDATE_PATH, ReloadingTlsContext, TlsFiles, WebhookServer
from gpudra import DEFAULT_DRIVER_NAME, cliopts
from gpudra.features import DEFAULT_VERSION, SUPPORTED_VERSIONS, FeatureGateError, check_version
from gpudra.logfmt import configure
from gpudra.signals import stop_on_signals

log = logging.getLogger("gpu-dra.webhook")


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tls-cert-file", required=True, help="PEM certificate (chain) the webhook serves")
    parser.add_argument("--tls-private-key-file", required=True, help="PEM private key of that certificate")
    parser.add_argument("--port", type=cliopts.port, default=8443, help="HTTPS port (default %(default)s)")
    parser.add_argument("--bind-address", default="0.0.0.0", help="address to listen on (default %(default)s)")
    parser.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME,
                        help="driver whose opaque parameters are checked with our config schema (default %(default)s)")
    parser.add_argument("--kubernetes-version", default=DEFAULT_VERSION, metavar="VERSION",
                        help=f"the release whose validation rules apply ({SUPPORTED_VERSIONS[0]}..{SUPPORTED_VERSIONS[-1]}, "
                             "default %(default)s)")
    cliopts.add_log_level(parser)


def run(args: argparse.Namespace) -> int:
    configure(cliopts.log_level(args))
    try:
        version = check_version(args.kubernetes_version)
    except FeatureGateError as exc:
        print(f"error: --kubernetes-version: {exc}", file=sys.stderr)
        return 2
    files = TlsFiles(Path(args.tls_cert_file), Path(args.tls_private_key_file))
    try:
        tls = ReloadingTlsContext(files)
    except ssl.SSLError as exc:  # before OSError, its base: a key that does not match, not PEM, ...
        print(f"error: --tls-cert-file {files.cert} / --tls-private-key-file {files.key}: not a usable PEM "
              f"certificate and key: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: --tls-cert-file/--tls-private-key-file: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        server = WebhookServer((args.bind_address, args.port), validation_admission(args.driver_name, version), tls)
    except OSError as exc:
        print(f"error: --port {args.port}: cannot listen on {args.bind_address}: {exc.strerror}", file=sys.stderr)
        return 2
    stop = stop_on_signals()
    host, port = str(server.server_address[0]), int(server.server_address[1])
    # The first line of stdout is the URL (as `gpu-dra apiserver` does), so that scripts can find a port 0 server.
    print(f"https://{host}:{port}{VALIDATE_PATH}", flush=True)
    log.info("event=serving address=%s port=%d path=%s cert=%s", host, port, VALIDATE_PATH, files.cert)
    thread = threading.Thread(target=server.serve_forever, name="webhook", daemon=True)
    thread.start()
    stop.wait()
    server.shutdown()
    server.server_close()
    log.info("event=stopped")
    return 0
