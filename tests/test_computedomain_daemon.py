"""The compute-domain daemon's pure parts (env, DNS names, /etc/hosts, clique entries, config), the IMEX
stand-ins resolving DNS names through the container root's /etc/hosts and re-reading them on SIGUSR1, and the
host-process runtime's CDI edits and image routing."""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from driver.computedomain import daemon as d
from driver.computedomain.imex import config_template
from sim.runtime.hostprocess import cdi_edits, is_own_image
from sim.runtime.podman import RuntimeError_
from tests.polling import until

ROOT = Path(__file__).resolve().parents[1]
ENV = {"CLIQUE_ID": "c.1", "COMPUTE_DOMAIN_UUID": "u-1", "COMPUTE_DOMAIN_NAME": "train", "NODE_NAME": "n1",
       "POD_IP": "127.0.92.1", "POD_NAME": "p", "POD_NAMESPACE": "gpu-dra-system", "MAX_NODES_PER_IMEX_DOMAIN": "4"}


def test_env_names_what_is_missing_or_invalid() -> None:
    env = d.DaemonEnv.from_env(ENV)
    assert (env.clique_id, env.domain_uid, env.max_nodes, env.domain_namespace) == ("c.1", "u-1", 4, "default")
    with pytest.raises(d.DaemonError, match="COMPUTE_DOMAIN_UUID is not set: the daemon claim's CDI edits"):
        d.DaemonEnv.from_env({**ENV, "COMPUTE_DOMAIN_UUID": ""})
    with pytest.raises(d.DaemonError, match="^POD_IP, POD_NAME not set"):
        d.DaemonEnv.from_env({k: v for k, v in ENV.items() if k not in ("POD_IP", "POD_NAME")})
    with pytest.raises(d.DaemonError, match="MAX_NODES_PER_IMEX_DOMAIN: Invalid value: '0'"):
        d.DaemonEnv.from_env({**ENV, "MAX_NODES_PER_IMEX_DOMAIN": "0"})


def test_nodes_config_hosts_and_config() -> None:
    assert d.nodes_config(3) == "compute-domain-daemon-0000\ncompute-domain-daemon-0001\ncompute-domain-daemon-0002\n"
    hosts = d.hosts_file("127.0.0.1\tlocalhost\n", {"compute-domain-daemon-0001": "10.0.0.2",
                                                    "compute-domain-daemon-0000": "10.0.0.1"})
    assert hosts == ("127.0.0.1\tlocalhost\n# Compute Domain Daemon mappings\n10.0.0.1\tcompute-domain-daemon-0000\n"
                     "10.0.0.2\tcompute-domain-daemon-0001\n")
    # Rewritten, not appended: the old mappings go, other lines stay; no mapping leaves no marker.
    assert d.hosts_file(hosts, {"compute-domain-daemon-0000": "10.0.0.9"}).endswith(
        "mappings\n10.0.0.9\tcompute-domain-daemon-0000\n")
    assert d.hosts_file(hosts, {}) == "127.0.0.1\tlocalhost\n"
    cfg = d.render_config(config_template(), "10.0.0.1")
    assert "IMEX_CMD_BIND_INTERFACE_IP=10.0.0.1\n" in cfg and "IMEX_NODE_CONFIG_FILE=/imexd/nodes.cfg\n" in cfg
    assert "BIND_INTERFACE_IP=\n" in cfg and "{{" not in cfg


def test_clique_entries_take_the_lowest_free_index_and_leave() -> None:
    env = d.DaemonEnv.from_env(ENV)
    others = [{"nodeName": "n0", "ipAddress": "127.0.92.9", "cliqueID": "c.1", "index": 0, "status": "Ready"},
              {"nodeName": "n2", "ipAddress": "127.0.92.2", "cliqueID": "c.1", "index": 2, "status": "Ready"}]
    joined = d.join_clique(others, env, "NotReady")
    assert joined is not None and joined[-1] == {"nodeName": "n1", "ipAddress": "127.0.92.1", "cliqueID": "c.1",
                                                 "index": 1, "status": "NotReady"}
    assert d.join_clique(joined, env, "NotReady") is None  # unchanged: no write
    ready = d.join_clique(joined, env, "Ready")
    assert ready is not None and ready[-1]["status"] == "Ready"
    assert d.join_clique(ready, env, None) == others
    assert d.join_clique(others, env, None) is None
    assert d.clique_mapping(ready + [{"nodeName": "x", "ipAddress": "1.2.3.4", "cliqueID": "c.2", "index": 3}],
                            "c.1", 4) == {"compute-domain-daemon-0000": "127.0.92.9",
                                          "compute-domain-daemon-0001": "127.0.92.1",
                                          "compute-domain-daemon-0002": "127.0.92.2"}
    full = [{"nodeName": f"m{i}", "ipAddress": f"10.0.0.{i}", "cliqueID": "c.1", "index": i} for i in range(4)]
    with pytest.raises(d.DaemonError, match="no index left below MAX_NODES_PER_IMEX_DOMAIN=4"):
        d.join_clique(full, env, "NotReady")
    with pytest.raises(d.DaemonError, match=r"index 7: must be in \[0, 4\)"):
        d.clique_mapping([{**full[0], "index": 7}], "c.1", 4)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _container(tmp: Path, name: str, ip: str, port: int, cmd: int, max_nodes: int) -> Path:
    root = tmp / name
    (root / "imexd").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / "hosts").write_text("127.0.0.1\tlocalhost\n")
    text = d.render_config(config_template(), ip).replace("SERVER_PORT=50000", f"SERVER_PORT={port}")
    (root / "imexd" / "imexd.cfg").write_text(text.replace("IMEX_CMD_PORT=50005", f"IMEX_CMD_PORT={cmd}"))
    (root / "imexd" / "nodes.cfg").write_text(d.nodes_config(max_nodes))
    return root


def _tool(module: str, root: Path, *args: str, **kw: Any) -> Any:
    env = {**os.environ, "GPU_DRA_CONTAINER_ROOT": str(root), "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-c", f"import sys; from {module} import main; sys.exit(main(sys.argv[1:]))", *args]
    if kw.pop("background", False):
        return subprocess.Popen(argv, env=env, cwd=ROOT, stderr=subprocess.PIPE)
    return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=30)


def _query(root: Path) -> str:
    out = _tool("sim.imex.ctl", root, "-c", "/imexd/imexd.cfg", "-q")
    return str(out.stdout or out.stderr)


_until = functools.partial(until, timeout=15.0)


@pytest.mark.process
def test_imex_stand_in_resolves_dns_names_and_rereads_them_on_sigusr1(tmp_path: Path) -> None:
    port, cmd = _free_port(), _free_port()
    a = _container(tmp_path, "a", "127.0.93.1", port, cmd, 4)
    b = _container(tmp_path, "b", "127.0.93.2", port, cmd, 4)
    # No name of this node resolves yet: the bind address cannot be found in the nodes config.
    refused = _tool("sim.imex.daemon", a, "-c", "/imexd/imexd.cfg")
    assert refused.returncode == 1 and "resolves to this node (127.0.93.1)" in refused.stderr
    (a / "etc/hosts").write_text(d.hosts_file((a / "etc/hosts").read_text(), {d.dns_name(0): "127.0.93.1"}))
    first = _tool("sim.imex.daemon", a, "-c", "/imexd/imexd.cfg", background=True)
    second = None
    try:
        _until("a alone is READY (unresolved names are nodes that have not joined)", lambda: _query(a) == "READY\n")
        both = {d.dns_name(0): "127.0.93.1", d.dns_name(1): "127.0.93.2"}
        for root in (a, b):
            (root / "etc/hosts").write_text(d.hosts_file((root / "etc/hosts").read_text(), both))
        first.send_signal(signal.SIGUSR1)  # what the daemon sends when the mapping changed: no restart
        _until("a waits for b", lambda: _query(a) == "NOT_READY\n")
        second = _tool("sim.imex.daemon", b, "-c", "/imexd/imexd.cfg", background=True)
        _until("both READY", lambda: _query(a) == "READY\n" and _query(b) == "READY\n")
        nodes = _tool("sim.imex.ctl", a, "-c", "/imexd/imexd.cfg", "-N").stdout
        assert "127.0.93.2  CONNECTED" in nodes and "Domain State: UP" in nodes
    finally:
        for p in (first, second):
            if p is not None:
                p.terminate()
                p.wait(timeout=10)


def test_host_process_runtime_applies_cdi_edits_and_routes_our_image(tmp_path: Path) -> None:
    spec = {"cdiVersion": "0.5.0", "kind": "k8s.compute-domain.nvidia.com/claim",
            "containerEdits": {"env": ["A=spec"]},
            "devices": [{"name": "u1-daemon-0", "containerEdits": {
                "env": ["COMPUTE_DOMAIN_UUID=u-1", "A=device"],
                "mounts": [{"hostPath": "/state/u-1", "containerPath": "/imexd", "options": ["rw", "bind"]}],
                "deviceNodes": [{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}]}}]}
    (tmp_path / "k8s.compute-domain.nvidia.com-claim_u1.json").write_text(json.dumps(spec))
    env, mounts, nodes = cdi_edits(tmp_path, ["k8s.compute-domain.nvidia.com/claim=u1-daemon-0"])
    assert env == {"A": "device", "COMPUTE_DOMAIN_UUID": "u-1"} and mounts == [("/state/u-1", "/imexd")]
    assert nodes == [{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}]
    with pytest.raises(RuntimeError_, match="unresolvable CDI devices k8s.compute-domain.nvidia.com/claim=nope"):
        cdi_edits(tmp_path, ["k8s.compute-domain.nvidia.com/claim=nope"])
    assert is_own_image("ghcr.io/gpu-dra/gpu-dra:v0.1.0") and is_own_image("ghcr.io/gpu-dra/gpu-dra")
    assert is_own_image("ghcr.io/gpu-dra/gpu-dra@sha256:00")
    assert not is_own_image("busybox:1.36") and not is_own_image("ghcr.io/gpu-dra/gpu-dra-other:v1")


@pytest.mark.process
def test_check_command_is_the_probe(tmp_path: Path) -> None:
    def check(**env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cli.main", "compute-domain-daemon", "check"], cwd=ROOT,
                              env={"PATH": str(tmp_path), "PYTHONPATH": str(ROOT), **env}, capture_output=True,
                              text=True, timeout=60)

    noop = check()
    assert noop.returncode == 0 and "noop, clique ID is empty" in noop.stdout
    missing = check(CLIQUE_ID="c.1")
    assert missing.returncode == 1 and "nvidia-imex-ctl" in missing.stderr
    ctl = tmp_path / "nvidia-imex-ctl"
    ctl.write_text("#!/bin/sh\necho NOT_READY\n")
    ctl.chmod(0o755)
    assert check(CLIQUE_ID="c.1").returncode == 1
    ctl.write_text("#!/bin/sh\n[ \"$*\" = '-c /imexd/imexd.cfg -q' ] && echo READY\n")
    assert check(CLIQUE_ID="c.1").returncode == 0
    run = subprocess.run([sys.executable, "-m", "cli.main", "compute-domain-daemon", "run"], cwd=ROOT,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 1 and "COMPUTE_DOMAIN_UUID is not set" in run.stderr


@pytest.mark.process
def test_host_process_runtime_runs_stops_and_cleans_up(tmp_path: Path) -> None:
    from sim.runtime.hostprocess import HostProcessRuntime, stop_leftovers
    from sim.runtime.podman import ContainerRequest

    volume = tmp_path / "vol"
    volume.mkdir()
    (volume / "f").write_text("hello\n")
    runtime = HostProcessRuntime(tmp_path / "host", tmp_path / "cdi")
    (tmp_path / "cdi").mkdir()
    log = tmp_path / "logs" / "0.log"
    script = 'cat "$GPU_DRA_CONTAINER_ROOT/data/f"; echo "X=$X"; trap "echo bye; exit 0" TERM; sleep 60 & wait'
    status = runtime.run(ContainerRequest("c1", ("sh", "-c", script), {"X": "1"}, log_path=log,
                                          mounts=((str(volume), "/data", True),), image="ghcr.io/gpu-dra/gpu-dra"))
    assert status.running
    _until("its output logged", lambda: log.exists() and "X=1" in log.read_text())
    lines = log.read_text().splitlines()
    assert lines[0].split(" ", 3)[1:] == ["stdout", "F", "hello"]
    argv = runtime.exec_argv("c1", ["cat", "/etc/hosts"])
    assert argv is not None and f"GPU_DRA_CONTAINER_ROOT={tmp_path / 'host' / 'c1' / 'root'}" in argv
    runtime.remove("c1")
    assert runtime.status("c1").error  # removed
    _until("SIGTERM handled: a clean exit", lambda: "bye" in log.read_text())
    with pytest.raises(RuntimeError_, match='exec: "no-such-tool": executable file not found'):
        runtime.run(ContainerRequest("c2", ("no-such-tool",), {}))
    # A supervisor killed without cleaning up leaves its host processes; the next one stops them by pid file.
    left = HostProcessRuntime(tmp_path / "host", tmp_path / "cdi")
    left.run(ContainerRequest("c3", ("sleep", "60"), {}))
    proc = left._procs["c3"].popen
    assert stop_leftovers(tmp_path / "host") == [f"host process c3 (pid {proc.pid})"]
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert stop_leftovers(tmp_path / "host") == []


def test_daemon_claim_mounts_the_drivers_imex_binaries_by_their_host_paths(tmp_path: Path) -> None:
    from driver.computedomain.imex import ImexError, binaries

    with pytest.raises(ImexError, match=r"nvidia-imex was not found under the driver root .*searched: .*usr/bin/nvidia-imex"
                                         r".*the NVIDIA driver install on this node has no IMEX daemon"):
        binaries(tmp_path)
    for rel in ("usr/bin/nvidia-imex", "usr/bin/nvidia-imex-ctl"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("#!/bin/sh\n")
        (tmp_path / rel).chmod(0o755)
    # Found where the agent sees the install (its container's /driver-root), named where the host has it.
    assert binaries(tmp_path, "/run/nvidia/driver") == [
        ("/run/nvidia/driver/usr/bin/nvidia-imex", "/usr/bin/nvidia-imex"),
        ("/run/nvidia/driver/usr/bin/nvidia-imex-ctl", "/usr/bin/nvidia-imex-ctl")]
    with pytest.raises(ImexError, match=r"no driver root \(--driver-root\)"):
        binaries(None)
    # GKE's installer keeps the driver's tools in bin/ below its root: found there, still mounted at /usr/bin.
    gke = tmp_path / "gke"
    for rel in ("bin/nvidia-imex", "bin/nvidia-imex-ctl"):
        (gke / rel).parent.mkdir(parents=True, exist_ok=True)
        (gke / rel).write_text("#!/bin/sh\n")
        (gke / rel).chmod(0o755)
    assert binaries(gke, "/home/kubernetes/bin/nvidia") == [
        ("/home/kubernetes/bin/nvidia/bin/nvidia-imex", "/usr/bin/nvidia-imex"),
        ("/home/kubernetes/bin/nvidia/bin/nvidia-imex-ctl", "/usr/bin/nvidia-imex-ctl")]
