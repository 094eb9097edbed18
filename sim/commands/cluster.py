"""`gpu-dra cluster up|down|status|list|fault`: a live simulated GPU cluster on this machine that stays up.

`up` starts a detached supervisor (sim.cluster.supervisor) and returns when every node is Ready with its slices
published, then merges a kubeconfig context `gpu-dra-NAME` (like kind). State lives in the per-user XDG state
directory ($XDG_STATE_HOME/gpu-dra/clusters/NAME, default ~/.local/state/...). Exit codes: 0 done, 1 the
operation failed (the message says why), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpudra import cliopts
from sim.cluster.spec import DEFAULT_NAME, RUNTIMES

ACTIONS = ("up", "down", "status", "list", "fault", "stand-in")


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    def named(p: argparse.ArgumentParser) -> None:
        p.add_argument("--name", default=DEFAULT_NAME, help="cluster name (default %(default)s)")

    up = sub.add_parser("up", help="start a cluster in the background and wait until its nodes are Ready",
                        description="Start the embedded control plane (durable store), the controller, one node "
                                    "agent and one kubelet simulator per node, in the background.")
    named(up)
    up.add_argument("--kubernetes", choices=("embedded", "upstream"), default="embedded",
                    help="embedded (default): the embedded control plane and kubelet simulators, no Go needed; "
                         "upstream: real Kubernetes built from its Go modules (etcd, kube-apiserver, "
                         "kube-controller-manager, kube-scheduler, kube-proxy, kubelets with containerd), the "
                         "manifests applied with kubectl apply -k (needs root and Go)")
    up.add_argument("--manifests", metavar="DIR",
                    help="with --kubernetes upstream: the kustomization applied with kubectl apply -k (default "
                         "manifests/testbed: the base with the simulator and the device plugin shim; "
                         "manifests/testbed-extended-resource serves nvidia.com/gpu through DRA instead)")
    up.add_argument("--nodes", metavar="NAME=PROFILE[,NAME=PROFILE...]",
                    help="nodes and their simulator profiles (shipped name or file); default: the demo's four nodes "
                         "a100-1=dgx-a100,a100-2=dgx-a100,v100-1=v100-4,h100-1=h100-mig")
    up.add_argument("--gb200-racks", metavar="RACKS[xTRAYS]",
                    help="add GB200 NVL racks: RACKS racks of TRAYS compute trays (default 18, as an NVL72 rack), "
                         "4 GPUs each, every rack its own NVLink clique; nodes gb200-r<R>-t<T> (with --nodes: both)")
    up.add_argument("--runtime", choices=RUNTIMES, default="auto",
                    help="container runtime behind the kubelet simulator (default auto: podman when it can run)")
    up.add_argument("--feature", action="append", default=[], metavar="GATE=true|false",
                    help="feature gate for the control plane and the controller (repeatable)")
    cliopts.add_runtime_config(up)
    up.add_argument("--partitionable", action="store_true", help="publish partitionable devices (MIG placements)")
    up.add_argument("--device-plugin", action="store_true",
                    help="every node also serves legacy nvidia.com/gpu (the default nodes: v100-1 always does)")
    up.add_argument("--kubeconfig", metavar="FILE",
                    help="kubeconfig to merge the context into (default: first file of $KUBECONFIG, else ~/.kube/config)")
    up.add_argument("--wait", type=cliopts.positive_seconds, default=180.0, metavar="SECONDS",
                    help="how long to wait for the cluster to be ready (default %(default)s)")
    down = sub.add_parser("down", help="stop a cluster, remove its state and its kubeconfig context")
    named(down)
    status = sub.add_parser("status", help="nodes (profile, Ready, GPUs in use/total), processes and server URL")
    named(status)
    cliopts.add_output(status)
    lst = sub.add_parser("list", help="list clusters")
    cliopts.add_output(lst)
    fault = sub.add_parser("fault", help="inject a fault into a node's simulated GPU (through its faults file)",
                           description="Inject an Xid event or a lost GPU into a node's simulator, or clear its "
                                       "faults (a GPU reset: the node agent is restarted, as health is sticky).")
    named(fault)
    fault.add_argument("node", metavar="NODE")
    fault.add_argument("--gpu", metavar="UUID|INDEX", help="the GPU (required with --xid and --lost; --clear "
                                                           "without it clears every GPU of the node)")
    what = fault.add_mutually_exclusive_group(required=True)
    what.add_argument("--xid", type=_xid, metavar="N", help="deliver an Xid event (e.g. 79: fell off the bus, 48: DBE)")
    what.add_argument("--lost", action="store_true", help="the GPU falls off the bus")
    what.add_argument("--fabric-down", action="store_true",
                      help="the NVLink fabric link of the GPU (without --gpu: of the whole tray) fails: its route is "
                           "unhealthy in NVML's fabric info, and the node's IMEX daemons report it")
    what.add_argument("--clear", action="store_true", help="clear the faults (GPU reset) and restart the node agent")
    stand_in = sub.add_parser(
        "stand-in", help="run the images a spec names on the busybox stand-in (upstream clusters pull nothing)",
        description="Import the busybox stand-in under each image reference into every node's containerd of an "
                    "upstream cluster, as `cluster up` does for the images NVIDIA's quickstart and "
                    "manifests/examples name: this machine reaches no registry, so a pod naming any other image "
                    "gets the kubelet's ErrImagePull until then. An embedded cluster runs every image on it "
                    "already.")
    named(stand_in)
    stand_in.add_argument("images", nargs="*", metavar="IMAGE",
                          help="image reference, e.g. nvcr.io/nvidia/cuda:12.9.0-base-ubuntu24.04")
    stand_in.add_argument("-f", "--filename", action="append", default=[], metavar="FILE",
                          help="a spec (YAML, '-' for stdin): every image its pods and pod templates name "
                               "(repeatable)")


def _xid(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an Xid number such as 79") from None
    if not 0 < value < 2**31:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive Xid number")
    return value


def _err(text: str) -> None:
    print(f"gpu-dra cluster: {text}", file=sys.stderr)


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from sim.cluster.spec import name_error

    if getattr(args, "name", None) is not None:
        problem = name_error(args.name, "--name")
        if problem:
            _err(problem)
            return 2
    if args.action in ("down", "status", "fault", "stand-in") and _upstream_state(args.name) is not None:
        return {"down": _down_upstream, "status": _status_upstream, "fault": _fault_upstream,
                "stand-in": _stand_in_upstream}[args.action](args)
    return {"up": _up, "down": _down, "status": _status, "list": _list, "fault": _fault,
            "stand-in": _stand_in}[args.action](args)


def _upstream_state(name: str) -> Path | None:
    """The state directory of an upstream cluster of that name, or None."""
    from sim.cluster.spec import cluster_paths
    from sim.upstream.commands import read_spec

    root = cluster_paths(name).root
    return root if read_spec(root) is not None else None


# ---- shared -------------------------------------------------------------------------------------------------------


def _load(name: str) -> tuple[Any, Any, Any, bool] | None:
    """(paths, spec, supervisor status, running) of an existing cluster, or None."""
    from sim.cluster.spec import ClusterSpec, SupervisorStatus, cluster_paths, pid_is_ours, read_json

    paths = cluster_paths(name)
    data = read_json(paths.spec)
    if not isinstance(data, dict) or data.get("backend") == "upstream":
        return None
    raw = read_json(paths.status)
    sup = SupervisorStatus.from_json(raw) if isinstance(raw, dict) else None
    running = sup is not None and pid_is_ours(sup.pid, str(paths.root)) and sup.phase in ("starting", "ready")
    return paths, ClusterSpec.from_json(data), sup, running


def _not_found(name: str) -> int:
    _err(f"no cluster named {name!r} (gpu-dra cluster list shows them; gpu-dra cluster up --name {name} starts one)")
    return 1


def _print(obj: Any, output: str, table: str) -> None:
    print(cliopts.render(obj, output, lambda: table))


# ---- up -----------------------------------------------------------------------------------------------------------


def _up(args: argparse.Namespace) -> int:
    if args.kubernetes == "upstream":
        return _up_upstream(args)
    if args.manifests:
        _err("--manifests: only with --kubernetes upstream (the embedded cluster runs its parts itself, not from "
             "manifests)")
        return 2
    from gpudra.privatedir import ensure_private_dir
    from sim.cluster import kubeconfig
    from sim.cluster.spec import (ClusterSpec, SpecError, SupervisorStatus, cluster_paths, default_nodes, gb200_racks,
                                  links_home, parse_nodes, read_json, with_addresses, write_json)
    from sim.demo.processes import child_env, log_tail, PROJECT_ROOT
    from sim.nvml.profile import shipped_profiles

    try:
        node_specs = parse_nodes(args.nodes, shipped_profiles(), device_plugin=args.device_plugin) if args.nodes else ()
        if args.gb200_racks:
            node_specs += gb200_racks(args.gb200_racks, device_plugin=args.device_plugin)
            names = [n.name for n in node_specs]
            if len(set(names)) != len(names):
                raise SpecError("--nodes and --gb200-racks name the same node twice")
        node_specs = with_addresses(args.name, node_specs or default_nodes(device_plugin=args.device_plugin))
        features = tuple(_feature(f) for f in args.feature)
        runtime_config = _runtime_config(args.runtime_config)
    except SpecError as exc:
        _err(str(exc))
        return 2
    runtime = _resolve_runtime(args.runtime)
    if runtime is None:
        return 2
    # The node links get a fresh directory of their own (mkdtemp: never a predictable name another user, or another
    # cluster of the same name under another XDG_STATE_HOME, could hold); its name is recorded in spec.json.
    links_root = links_home()
    existing = _load(args.name)
    if existing is not None and existing[3]:
        _err(f"cluster {args.name!r} is already up (server {existing[2].server}); "
             f"gpu-dra cluster down --name {args.name} first, or choose another --name")
        return 1
    paths = cluster_paths(args.name)
    problem = paths.socket_problem(links_root / ("x" * 8), node_specs)
    if problem:
        _err(problem)
        return 2
    target = kubeconfig.target_file(args.kubeconfig)
    if existing is not None:
        _progress(f"cluster {args.name}: its supervisor is not running (stopped or killed); removing its old state")
        _remove_state(existing[0], existing[1])
    try:
        ensure_private_dir(links_root)
        links = Path(tempfile.mkdtemp(prefix="", dir=links_root))
    except OSError as exc:  # PrivateDirError included
        _err(f"cluster {args.name}: node link directory: {exc}; or set XDG_RUNTIME_DIR to a directory of your own")
        return 1
    spec = ClusterSpec(args.name, node_specs, runtime, features, args.partitionable, str(links), runtime_config)
    # The state (the store holds every Secret) and the logs are the user's alone.
    paths.root.mkdir(mode=0o700, parents=True, exist_ok=True)
    paths.root.chmod(0o700)
    write_json(paths.spec, spec.to_json())
    paths.logs.mkdir(mode=0o700, parents=True, exist_ok=True)
    with os.fdopen(os.open(paths.logs / "supervisor.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "sim.cluster.keeper", str(paths.root)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=child_env(),
                                cwd=str(PROJECT_ROOT), start_new_session=True)
    _progress(f"cluster {args.name}: starting {len(node_specs)} nodes "
              f"({', '.join(f'{n.name}={n.profile}' for n in node_specs)}); state in {paths.root}")
    shown = 0
    deadline = time.monotonic() + args.wait
    phase = "starting"
    sup = None
    try:
        while time.monotonic() < deadline:
            raw = read_json(paths.status)
            sup = SupervisorStatus.from_json(raw) if isinstance(raw, dict) else None
            if sup is not None:
                for line in sup.steps[shown:]:
                    _progress(f"  {line}")
                shown = len(sup.steps)
                phase = sup.phase
            if phase != "starting" or proc.poll() is not None:
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        # The supervisor runs in its own session: Ctrl-C here does not reach it, so stop it rather than leave a
        # half-started cluster behind.
        _progress(f"cluster {args.name}: interrupted; stopping what was started")
        _remove_state(paths, spec)
        return 130
    if phase != "ready":
        why = (sup.error if sup is not None and sup.error else
               f"not ready after {args.wait:.0f} s" if proc.poll() is None else f"supervisor exited with code {proc.poll()}")
        _err(f"cluster {args.name} did not come up: {why}")
        for log_file in sorted(paths.logs.glob("*.log")):
            _progress(f"--- last lines of {log_file}:\n{log_tail(log_file, 8)}")
        _stop_supervisor(proc.pid, str(paths.root), grace=15.0)
        _err(f"logs kept in {paths.logs}; gpu-dra cluster down --name {args.name} removes them")
        return 1
    assert sup is not None and sup.server
    if not _write_context(args.name, target, paths, paths.kubeconfig, sup.server):
        return 1
    context = kubeconfig.context_name(args.name)
    env_hint = "" if _kubectl_reads(target) else f"KUBECONFIG={target} "
    print(f"cluster {args.name} is up: {len(node_specs)} nodes, server {sup.server}\n"
          f"kubeconfig context {context} written to {target} and made current\n\n"
          f"  {env_hint}kubectl --context {context} get nodes,resourceslices\n"
          f"  {env_hint}kubectl --context {context} apply -f manifests/examples/\n"
          f"  {env_hint}kubectl --context {context} get pods,resourceclaims -A -o wide\n"
          f"  gpu-dra cluster status{_name_flag(args.name)}\n"
          f"  gpu-dra cluster fault {node_specs[0].name}{_name_flag(args.name)} --gpu 0 --xid 79\n"
          f"  gpu-dra cluster down{_name_flag(args.name)}")
    return 0


UPSTREAM_DEFAULT_NODES = "a100-1=dgx-a100,h100-1=h100-mig"


def _up_upstream(args: argparse.Namespace) -> int:
    from sim.cluster import kubeconfig
    from sim.cluster.spec import SpecError, cluster_paths, gb200_racks, parse_nodes
    from sim.nvml.profile import shipped_profiles
    from sim.upstream import commands as upstream

    try:
        node_specs = parse_nodes(args.nodes or UPSTREAM_DEFAULT_NODES, shipped_profiles(), device_plugin=True)
        if args.gb200_racks:
            node_specs += gb200_racks(args.gb200_racks, device_plugin=True)
    except SpecError as exc:
        _err(str(exc))
        return 2
    overlay = Path(args.manifests) if args.manifests else upstream.TESTBED_OVERLAY
    if not (overlay / "kustomization.yaml").is_file():
        _err(f"--manifests {overlay}: not a kustomization directory (it holds no kustomization.yaml); "
             f"e.g. {upstream.TESTBED_OVERLAY.relative_to(upstream.ROOT)}")
        return 2
    ignored = [flag for flag, given in (("--runtime", args.runtime != "auto"), ("--feature", args.feature),
                                        ("--runtime-config", args.runtime_config),
                                        ("--partitionable", args.partitionable)) if given]
    if ignored:
        _err(f"{', '.join(ignored)}: not taken with --kubernetes upstream (its components run with 1.37's defaults "
             "and containerd; edit the overlay or the component flags in sim/upstream/config.py)")
        return 2
    paths = cluster_paths(args.name)
    if upstream.read_spec(paths.root) is not None:
        if upstream.supervisor_alive(paths.root):
            _err(f"cluster {args.name!r} is already up; gpu-dra cluster down --name {args.name} first")
            return 1
        _progress(f"cluster {args.name}: its supervisor is not running; removing its old state")
        upstream.stop(paths.root)
    elif (loaded := _load(args.name)) is not None:
        if loaded[3]:
            _err(f"cluster {args.name!r} is already up (embedded); gpu-dra cluster down --name {args.name} first")
            return 1
        _remove_state(loaded[0], loaded[1])
    nodes = [(n.name, n.profile) for n in node_specs]
    _progress(f"cluster {args.name}: real Kubernetes, {len(nodes)} nodes "
              f"({', '.join(f'{n}={p}' for n, p in nodes)}); state in {paths.root}")
    try:
        server, admin = upstream.up(args.name, paths.root, nodes, args.wait)
        spec = upstream.read_spec(paths.root)
        assert spec is not None
        upstream.deploy(Path(spec.bin_dir), admin, overlay.resolve(), args.wait)
    except upstream.UpstreamError as exc:
        _err(str(exc))
        _err(f"logs kept in {paths.root / 'logs'}; gpu-dra cluster down --name {args.name} removes them")
        return 1
    target = kubeconfig.target_file(args.kubeconfig)
    if not _write_context(args.name, target, paths, admin, server):
        return 1
    context = kubeconfig.context_name(args.name)
    env_hint = "" if _kubectl_reads(target) else f"KUBECONFIG={target} "
    print(f"cluster {args.name} is up on real Kubernetes: {len(nodes)} nodes, server {server}\n"
          f"kubeconfig context {context} written to {target} and made current\n\n"
          f"  {env_hint}kubectl --context {context} version\n"
          f"  {env_hint}kubectl --context {context} get nodes -o wide\n"
          f"  {env_hint}kubectl --context {context} get resourceslices\n"
          f"  gpu-dra cluster status{_name_flag(args.name)}\n"
          f"  gpu-dra cluster down{_name_flag(args.name)}")
    return 0


def _write_context(name: str, target: Path, paths: Any, admin_kubeconfig: Path, server: str) -> bool:
    """Merge the cluster's context into the user's kubeconfig (recorded for `down`), saying so when it changed the
    current context; False after saying why it could not."""
    from sim.cluster import kubeconfig
    from sim.cluster.spec import write_json

    try:
        previous = kubeconfig.merge(target, name, admin_kubeconfig)
    except (kubeconfig.KubeconfigError, OSError) as exc:
        _err(f"cluster {name} is up at {server}, but the kubeconfig context was not written: {exc}")
        return False
    write_json(paths.user_kubeconfig, {"path": str(target)})
    notice = kubeconfig.switch_notice(name, previous, target)
    if notice:
        _err(notice)
    return True


def _name_flag(name: str) -> str:
    return "" if name == DEFAULT_NAME else f" --name {name}"


def _kubectl_reads(target: Any) -> bool:
    """Whether kubectl would read `target` without being told (first $KUBECONFIG file or the default)."""
    from sim.cluster.kubeconfig import target_file

    return target_file(None) == target


def _feature(text: str) -> str:
    from sim.cluster.spec import SpecError

    gate, sep, value = text.partition("=")
    if not gate or (sep and value.lower() not in ("true", "false")):
        raise SpecError(f"--feature {text!r}: expected GATE=true or GATE=false")
    return text


def _runtime_config(entries: list[str]) -> tuple[str, ...]:
    """--runtime-config entries, checked as the apiserver will check them (a bad one fails `up` at once)."""
    from controlplane.resources import known_group_versions
    from controlplane.runtimeconfig import RuntimeConfig, RuntimeConfigError
    from sim.cluster.spec import SpecError

    try:
        RuntimeConfig.parse(entries, known_group_versions())
    except RuntimeConfigError as exc:
        raise SpecError(str(exc)) from None
    return tuple(entries)


def _resolve_runtime(requested: str) -> str | None:
    """auto -> podman where the kubelet simulator can run containers with it (sim.runtime.choose), else none."""
    from sim.runtime import choose

    try:
        choice = choose(requested)
    except ValueError as exc:
        _err(f"--runtime {requested}: {exc}")
        return None
    # The kubelets still run pods of our own image (the IMEX daemons) as host processes (sim.runtime.Runtimes).
    own = "; pods of our own image run as host processes" if choice.kind == "none" else ""
    _progress(f"runtime: {choice.kind}: {choice.reason}{own}")
    return choice.kind


# ---- down ---------------------------------------------------------------------------------------------------------


def _stop_supervisor(pid: int, marker: str, grace: float) -> None:
    from sim.cluster.spec import pid_is_ours

    if not pid_is_ours(pid, marker):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and pid_is_ours(pid, marker):
        _reap(pid)
        time.sleep(0.1)
    if pid_is_ours(pid, marker):
        os.kill(pid, signal.SIGKILL)
        _reap(pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _read_pid(path: Any) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _remove_state(paths: Any, spec: Any) -> list[str]:
    """Stop whatever of the cluster still runs (supervisor first; children it left behind by pid), then remove the
    state directory. Returns what it stopped."""
    from sim.cluster.leftovers import stop_children, stop_runtimes
    from sim.cluster.spec import SupervisorStatus, pid_is_ours, read_json

    stopped = []
    raw = read_json(paths.status)
    sup = SupervisorStatus.from_json(raw) if isinstance(raw, dict) else None
    marker = str(paths.root)
    # The keeper first, so that it does not restart the supervisor being stopped.
    keeper = _read_pid(paths.keeper_pid)
    if keeper is not None and pid_is_ours(keeper, marker):
        os.kill(keeper, signal.SIGKILL)
        _reap(keeper)
        stopped.append(f"keeper (pid {keeper})")
    if sup is not None and pid_is_ours(sup.pid, marker):
        _stop_supervisor(sup.pid, marker, grace=30.0)
        stopped.append(f"supervisor (pid {sup.pid})")
    # A supervisor killed with SIGKILL leaves its children, and its node runtimes their containers: stopped
    # before their storage is removed.
    stopped += stop_children(paths) + stop_runtimes(paths)
    if spec.links:
        shutil.rmtree(spec.links, ignore_errors=True)  # only symlinks into the state dir
    shutil.rmtree(paths.root, ignore_errors=True)
    return stopped


def _down(args: argparse.Namespace) -> int:
    from sim.cluster import kubeconfig
    from sim.cluster.spec import read_json

    loaded = _load(args.name)
    if loaded is None:
        return _not_found(args.name)
    paths, spec, _, _ = loaded
    recorded = read_json(paths.user_kubeconfig)
    _progress(f"cluster {args.name}: stopping")
    stopped = _remove_state(paths, spec)
    if stopped:
        _progress(f"  stopped {', '.join(stopped)}")
    removed_from = None
    if isinstance(recorded, dict) and recorded.get("path"):
        try:
            if kubeconfig.remove(Path(recorded["path"]), args.name):
                removed_from = recorded["path"]
        except (kubeconfig.KubeconfigError, OSError) as exc:
            _err(f"context {kubeconfig.context_name(args.name)} not removed from {recorded['path']}: {exc}")
            return 1
    print(f"cluster {args.name} deleted" + (f"; context {kubeconfig.context_name(args.name)} removed from {removed_from}"
                                           if removed_from else ""))
    return 0


def _down_upstream(args: argparse.Namespace) -> int:
    from sim.cluster import kubeconfig
    from sim.cluster.spec import cluster_paths, read_json
    from sim.upstream import commands as upstream

    paths = cluster_paths(args.name)
    recorded = read_json(paths.user_kubeconfig)
    _progress(f"cluster {args.name}: stopping (nodes first, then the control plane)")
    stopped = upstream.stop(paths.root)
    if stopped:
        _progress(f"  stopped {', '.join(stopped)}")
    if isinstance(recorded, dict) and recorded.get("path"):
        try:
            kubeconfig.remove(Path(recorded["path"]), args.name)
        except (kubeconfig.KubeconfigError, OSError) as exc:
            _err(f"context {kubeconfig.context_name(args.name)} not removed from {recorded['path']}: {exc}")
            return 1
    print(f"cluster {args.name} deleted")
    return 0


def _status_upstream(args: argparse.Namespace) -> int:
    from sim.upstream import report

    root = _upstream_state(args.name)
    assert root is not None
    obj = report.status_object(root)
    _print(obj, args.output, report.status_table(obj))
    return 0 if obj["ready"] else 1


def _stand_in_references(args: argparse.Namespace) -> list[str] | None:
    """The images named on the command line and in the -f specs, or None after saying what is wrong."""
    from sim.upstream.images import SpecImagesError, check_reference, references_in

    try:
        found = [check_reference(image) for image in args.images]
        for name in args.filename:
            text = sys.stdin.read() if name == "-" else Path(name).read_text()
            found += references_in(text, "stdin" if name == "-" else name)
    except OSError as exc:
        _err(f"stand-in: -f {exc.filename}: {exc.strerror}")
        return None
    except SpecImagesError as exc:
        _err(f"stand-in: {exc}")
        return None
    if not found:
        _err("stand-in: no image: name images, or specs with -f whose pods name some")
        return None
    return found


def _stand_in_upstream(args: argparse.Namespace) -> int:
    from sim.upstream import commands as upstream

    references = _stand_in_references(args)
    if references is None:
        return 2
    root = _upstream_state(args.name)
    assert root is not None
    try:
        imported = upstream.import_stand_ins(root, references)
    except upstream.UpstreamError as exc:
        _err(f"stand-in: {exc}")
        return 1
    print("\n".join(imported))
    return 0


def _stand_in(args: argparse.Namespace) -> int:
    """An embedded cluster's runtime runs every image on the busybox rootfs: nothing to import, and said so."""
    references = _stand_in_references(args)
    if references is None:
        return 2
    if _load(args.name) is None:
        return _not_found(args.name)
    _progress(f"cluster {args.name} is embedded: its runtime runs every image on the busybox stand-in already")
    return 0


# ---- status, list -------------------------------------------------------------------------------------------------


def _api_objects(paths: Any) -> dict[str, list[dict[str, Any]]] | None:
    from gpudra.kubeapi import KubeApi

    try:
        api = KubeApi.connect(kubeconfig=str(paths.kubeconfig))
    except Exception:  # noqa: BLE001 - a missing or stale kubeconfig: status shows what the supervisor knows
        return None
    try:
        return {"nodes": api.list("Node")[0], "slices": api.list("ResourceSlice")[0],
                "claims": api.list("ResourceClaim")[0]}
    except Exception:  # noqa: BLE001 - the control plane is down or restarting
        return None
    finally:
        api.close()


def _status(args: argparse.Namespace) -> int:
    from gpudra import DEFAULT_DRIVER_NAME
    from sim.cluster import kubeconfig, report
    from sim.cluster.spec import read_json

    loaded = _load(args.name)
    if loaded is None:
        return _not_found(args.name)
    paths, spec, sup, running = loaded
    recorded = read_json(paths.user_kubeconfig)
    objects = _api_objects(paths) if running else None
    obj = report.status_object(spec, sup, running, recorded.get("path") if isinstance(recorded, dict) else None,
                               kubeconfig.context_name(spec.name), objects, DEFAULT_DRIVER_NAME)
    _print(obj, args.output, report.status_table(obj))
    return 0 if running else 1


def _list(args: argparse.Namespace) -> int:
    from sim.cluster import report
    from sim.cluster.spec import state_home

    rows = []
    home = state_home()
    for entry in sorted(home.iterdir()) if home.is_dir() else []:
        if _upstream_state(entry.name) is not None:
            from sim.upstream import report as upstream_report

            up = upstream_report.status_object(entry)
            rows.append({"name": entry.name, "state": up["phase"], "nodes": len(up["nodes"]),
                         "server": up["server"] or None})
            continue
        loaded = _load(entry.name)
        if loaded is None:
            continue
        _, spec, sup, running = loaded
        rows.append({"name": spec.name, "state": sup.phase if running and sup is not None else "stopped",
                     "nodes": len(spec.nodes), "server": sup.server if running and sup is not None else None})
    _print({"clusters": rows}, args.output, report.list_table(rows))
    return 0


# ---- fault --------------------------------------------------------------------------------------------------------


def _fault(args: argparse.Namespace) -> int:
    loaded = _load(args.name)
    if loaded is None:
        return _not_found(args.name)
    paths, spec, sup, running = loaded
    node = spec.node(args.node)
    if node is None:
        _err(f"fault: node {args.node!r} is not a node of cluster {spec.name}; its nodes: "
             f"{', '.join(n.name for n in spec.nodes)}")
        return 2
    if not running:
        _err(f"cluster {spec.name} is not running; gpu-dra cluster up --name {spec.name} first")
        return 1
    from gpudra import DEFAULT_DRIVER_NAME
    from sim.demo.cluster import NodeDirs

    code = _write_fault(args, node.name, node.profile, paths.faults(node.name),
                        NodeDirs(paths.node(node.name)).plugin_dir(DEFAULT_DRIVER_NAME))
    if code is not None:
        return code
    # Health is sticky until the agent restarts (what follows a GPU reset): restart it; the supervisor brings it back.
    agent = next((p for p in (sup.processes if sup else []) if p.role == "plugin" and p.node == node.name), None)
    from sim.cluster.spec import pid_is_ours

    if agent is not None and pid_is_ours(agent.pid, str(paths.root)):
        os.kill(agent.pid, signal.SIGTERM)
    print(f"node {node.name}: faults cleared (GPU reset); node agent restarting (pid {agent.pid if agent else '-'})")
    return 0


def _fault_upstream(args: argparse.Namespace) -> int:
    """The same faults, written where the node's agent pod reads them (the testbed overlay's GPU_DRA_SIM_FAULTS, a
    file under the node's /var/lib/kubelet/plugins); --clear deletes the node's agent pod, as a GPU reset is
    followed by an agent restart, and its DaemonSet starts a new one."""
    from sim.upstream import commands as upstream

    root = _upstream_state(args.name)
    assert root is not None
    spec = upstream.read_spec(root)
    assert spec is not None
    profile = dict(spec.nodes).get(args.node)
    if profile is None:
        _err(f"fault: node {args.node!r} is not a node of cluster {spec.name}; its nodes: "
             f"{', '.join(n for n, _ in spec.nodes)}")
        return 2
    if not upstream.supervisor_alive(root):
        _err(f"cluster {spec.name} is not running; gpu-dra cluster up --kubernetes upstream --name {spec.name} first")
        return 1
    code = _write_fault(args, args.node, profile, upstream.faults_file(root, args.node),
                        upstream.plugin_dir(root, args.node))
    if code is not None:
        return code
    try:
        upstream.restart_agent(root, args.node)
    except upstream.UpstreamError as exc:
        _err(f"fault: faults cleared, but the node agent was not restarted: {exc}")
        return 1
    print(f"node {args.node}: faults cleared (GPU reset); its node agent pod deleted, the DaemonSet starts a new one")
    return 0


def _write_fault(args: argparse.Namespace, node: str, profile: str, path: Path, plugin_dir: Path) -> int | None:
    """Inject or clear the fault `args` names in the node's faults file; an exit code, or None after --clear (its
    health forgotten in the agent's checkpoint in `plugin_dir`; the caller restarts the node's agent)."""
    from sim.nvml import faults as nvml_faults

    if args.gpu is None and not (args.clear or args.fabric_down):
        _err("fault: --gpu UUID|INDEX is required with --xid and --lost")
        return 2
    uuid = None
    if args.gpu is not None:
        uuids = _gpu_uuids(node, profile)
        uuid = _pick_gpu(args.gpu, uuids)
        if uuid is None:
            _err(f"fault: --gpu {args.gpu}: not a GPU of node {node}; its GPUs: "
                 + ", ".join(f"{i}={u}" for i, u in enumerate(uuids)))
            return 2
    try:
        current = nvml_faults.read_faults(path)
    except ValueError as exc:
        _err(f"fault: {exc}")
        return 1
    if args.xid is not None:
        assert uuid is not None
        nvml_faults.append_xid(path, uuid, args.xid)
        print(f"node {node}: Xid {args.xid} injected on {uuid} (faults file {path})")
        return 0
    if args.lost:
        assert uuid is not None
        nvml_faults.write_faults(path, xids=[(x.uuid, x.xid) for x in current.xids], lost=current.lost | {uuid},
                                 fail_calls=current.fail_calls)
        print(f"node {node}: {uuid} fell off the bus (faults file {path})")
        return 0
    if args.fabric_down:
        down = {uuid} if uuid is not None else set(_gpu_uuids(node, profile))
        nvml_faults.write_faults(path, xids=[(x.uuid, x.xid) for x in current.xids], lost=current.lost,
                                 fail_calls=current.fail_calls, fabric_unhealthy=current.fabric_unhealthy | down)
        print(f"node {node}: NVLink fabric down on {', '.join(sorted(down))} (faults file {path})")
        return 0
    keep = (lambda u: u != uuid) if uuid is not None else (lambda u: False)
    nvml_faults.write_faults(path, xids=[(x.uuid, x.xid) for x in current.xids if keep(x.uuid)],
                             lost=frozenset(u for u in current.lost if keep(u)),
                             fail_calls=[c for c in current.fail_calls if c.uuid is not None and keep(c.uuid)],
                             fabric_unhealthy=frozenset(u for u in current.fabric_unhealthy if keep(u)))
    _forget_health(plugin_dir, uuid)
    return None


def _forget_health(plugin_dir: Path, uuid: str | None) -> None:
    """Health is sticky, kept in the agent's checkpoint across restarts: the operator's step after a GPU reset
    (`gpu-dra node-health --forget`) drops it there before the agent restarts."""
    from driver.checkpoint import Checkpoint

    if plugin_dir.is_dir():
        checkpoint, _ = Checkpoint.open(plugin_dir)
        try:
            checkpoint.forget_health(None if uuid is None else [uuid])
        finally:
            checkpoint.close()


def _gpu_uuids(node: str, profile: str) -> list[str]:
    """The node's GPU UUIDs by index, as its simulator reports them."""
    from driver.nvml import load_backend
    from driver.discovery import discover

    inventory = discover(load_backend(f"sim:{profile}", node=node), node)
    return [g.uuid for g in sorted(inventory.gpus, key=lambda g: g.index)]


def _pick_gpu(text: str, uuids: list[str]) -> str | None:
    if text.isdigit():
        index = int(text)
        return uuids[index] if index < len(uuids) else None
    return text if text in uuids else None
