"""`gpu-dra apiserver`: run the embedded Kubernetes-compatible control plane on loopback until signalled."""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from pathlib import Path

from controller.cel.policyenv import PolicyEnvironment
from controller.validationhooks import validation_admission
from controlplane import EmbeddedApiServer
from controlplane.persistence import StateFileError
from controlplane.resources import known_group_versions
from controlplane.audit.backend import LogBackend
from controlplane.audit.event import Auditor
from controlplane.audit.policy import PolicyError, load_policy
from controlplane.tls import read_ca_bundle
from controlplane.runtimeconfig import RuntimeConfig, RuntimeConfigError
from gpudra.features import DEFAULT_VERSION, SUPPORTED_VERSIONS, FeatureGateError, Features, check_version
from gpudra.signals import stop_on_signals
from controlplane.podlogs import PodLogsDir
from gpudra import DEFAULT_DRIVER_NAME, cliopts, logfmt


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
    parser.add_argument("--token-key", metavar="FILE",
                        help="key that signs ServiceAccount and node tokens (created, mode 0600, if missing); keep it "
                             "to keep tokens valid across restarts, as kube-apiserver's --service-account-signing-key-file")
    parser.add_argument("--tls", action=argparse.BooleanOptionalAction, default=True,
                        help="also serve HTTPS (a cluster CA made at start; the kubeconfig written points there), where "
                             "credentials are always required, as on kube-apiserver: kubectl sends its token only over "
                             "TLS (default: on)")
    parser.add_argument("--tls-port", type=cliopts.port, default=0, help="HTTPS port (default: a free port)")
    parser.add_argument("--tls-dir", metavar="DIR",
                        help="keep the CA and serving certificate in DIR (made if missing) so clients keep trusting "
                             "the server across restarts")
    parser.add_argument("--client-ca-file", metavar="FILE",
                        help="over HTTPS, authenticate client certificates signed by a CA in FILE (PEM): the CN is the "
                             "user, each O a group, as kube-apiserver's flag (default: the server's own CA)")
    parser.add_argument("--audit-log-path", metavar="FILE",
                        help="append the audit events the --audit-policy-file selects to FILE as audit.k8s.io/v1 Event "
                             "JSON lines ('-': standard output), as kube-apiserver's flag")
    parser.add_argument("--audit-policy-file", metavar="FILE",
                        help="the audit.k8s.io/v1 Policy (YAML or JSON) that gives each request its audit level; "
                             "without it nothing is audited, as on kube-apiserver")
    parser.add_argument("--unauthenticated-as-admin", action=argparse.BooleanOptionalAction, default=False,
                        help="on the plain HTTP port, serve a request without credentials as the admin, as "
                             "kube-apiserver's old insecure localhost port did: any local user is then the admin "
                             "there, so it is off by default and a request without credentials is system:anonymous "
                             "(kubectl uses the HTTPS URL of the --kubeconfig-out kubeconfig). Presented tokens "
                             "are always authenticated and authorized")
    parser.add_argument("--kubernetes-version", default=DEFAULT_VERSION, metavar="VERSION",
                        help=f"Kubernetes release the server behaves as: /version, served API versions, validation "
                             f"({SUPPORTED_VERSIONS[0]}..{SUPPORTED_VERSIONS[-1]}, default %(default)s)")
    cliopts.add_runtime_config(parser)
    parser.add_argument("--feature-gates", "--feature", dest="feature", action="append", default=[],
                        metavar="GATE=true|false[,...]",
                        help="feature gates over the release's defaults, as kube-apiserver's --feature-gates: a gated "
                             "API is served and a gated field kept only with its gate on (repeatable)")



def _token_key(path: Path) -> bytes:
    """The signing key in `path`, made (32 random bytes, mode 0600) when the file does not exist."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
    key = path.read_bytes()
    if len(key) < 32:
        raise OSError(f"the key is {len(key)} bytes; at least 32 are needed (remove the file to make a new one)")
    return key


def _auditor(args: argparse.Namespace) -> Auditor | None:
    """The audit the flags ask for; PolicyError or OSError naming the flag and the file."""
    if not args.audit_policy_file:
        if args.audit_log_path:
            print("level=warning component=apiserver msg=\"--audit-log-path without --audit-policy-file: no audit "
                  "events are recorded, as on kube-apiserver\"", file=sys.stderr)
        return None
    try:
        policy = load_policy(args.audit_policy_file)
    except PolicyError as exc:
        raise PolicyError(f"--audit-policy-file {exc}") from None
    if not args.audit_log_path:
        return None
    try:
        return Auditor(policy, LogBackend(args.audit_log_path))
    except OSError as exc:
        raise OSError(f"--audit-log-path {exc.strerror or exc}") from None


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
        token_key = _token_key(Path(args.token_key)) if args.token_key else None
    except OSError as exc:
        print(f"gpu-dra apiserver: --token-key {args.token_key}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        client_ca = read_ca_bundle(Path(args.client_ca_file)) if args.client_ca_file else None
    except ValueError as exc:
        print(f"gpu-dra apiserver: --client-ca-file {exc}", file=sys.stderr)
        return 2
    try:
        auditor = _auditor(args)
    except (PolicyError, OSError) as exc:
        print(f"gpu-dra apiserver: {exc}", file=sys.stderr)
        return 2
    try:
        server = EmbeddedApiServer(args.address, args.port, state_file=args.state,
                                   admission=validation_admission(args.driver_name, version), kubernetes_version=version,
                                   runtime_config=runtime_config, features=features,
                                   unauthenticated_as_admin=args.unauthenticated_as_admin,
                                   expressions=PolicyEnvironment(), token_key=token_key, tls=args.tls,
                                   tls_port=args.tls_port, tls_dir=args.tls_dir, client_ca=client_ca,
                                   audit=auditor)
        if args.pod_logs_dir:
            server.pod_logs = PodLogsDir(Path(args.pod_logs_dir).absolute())
        url = server.start()
    except (ValueError, OSError, StateFileError, RuntimeError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"gpu-dra apiserver: cannot start on {args.address}:{args.port}: {detail}", file=sys.stderr)
        return 2
    stop = stop_on_signals()
    try:
        if args.kubeconfig_out:
            server.write_kubeconfig(args.kubeconfig_out)
        print(url, flush=True)
        print(f"level=info component=apiserver msg=serving url={url} tls_url={server.tls_url or '-'} "
              f"state={args.state or '-'} "
              f"kubeconfig={args.kubeconfig_out or '-'}", file=sys.stderr, flush=True)
        while not stop.wait(3600):
            pass
    finally:
        server.stop()
    print("level=info component=apiserver msg=stopped", file=sys.stderr, flush=True)
    return 0
