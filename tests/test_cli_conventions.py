"""The command line's shared conventions: --version, completion, usage errors (no tracebacks), flag typos, -f DIR
and -, -o json|yaml|table, one --log-level, $KUBECONFIG then in-cluster config, the faults file, one log line per
backoff step when the API server is unreachable, and the node agent saying it waits for a kubelet."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli.main import COMMANDS, main
from gpudra import cliopts
from tests.plugin_helpers import short_tmp, stop_process

ROOT = Path(__file__).resolve().parent.parent
SLICES = """apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: n1}
spec:
  driver: gpu.nvidia.com
  nodeName: n1
  pool: {name: n1, generation: 1, resourceSliceCount: 1}
  devices: [{name: gpu-0, attributes: {type: {string: gpu}, productName: {string: T4}}}]
"""
CLAIM = """apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: c}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.nvidia.com}
"""


def gpu_dra(*args: str, env: dict[str, str] | None = None, stdin: str | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=str(ROOT), capture_output=True, text=True,
                          input=stdin, timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


@pytest.mark.process
def test_version_and_help_list_every_benchmark() -> None:
    out = gpu_dra("--version")
    assert out.returncode == 0 and re.fullmatch(r"gpu-dra \S+\n", out.stdout)
    from bench.command import BENCHMARKS

    assert ", ".join(sorted(BENCHMARKS)) in " ".join(gpu_dra("--help").stdout.split())  # help text wraps


@pytest.mark.process
@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completion_completes_commands_subcommands_and_flags(tmp_path: Path) -> None:
    script = tmp_path / "c.sh"
    out = gpu_dra("completion", "bash")
    assert out.returncode == 0
    script.write_text(out.stdout)

    def complete(*words: str) -> list[str]:
        line = " ".join(f'"{w}"' for w in words)
        probe = (f'source {script}; COMP_WORDS=(gpu-dra {line}); COMP_CWORD={len(words)}; _gpu_dra_complete; '
                 'printf "%s\\n" "${COMPREPLY[@]}"')
        return subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout.split()

    assert complete("clu") == ["cluster"]
    assert complete("cluster", "") == ["--help", "down", "fault", "list", "stand-in", "status", "up"]
    assert complete("cluster", "up", "--no") == ["--nodes"]
    assert "--log-level" in complete("controller", "--")
    zsh = gpu_dra("completion", "zsh").stdout
    assert "bashcompinit" in zsh and "complete -F _gpu_dra_complete gpu-dra" in zsh


@pytest.mark.parametrize("argv, flag", [
    (["apiserver", "--port", "70000"], "--port"),
    (["controller", "--metrics-port", "-1"], "--metrics-port"),
    (["plugin", "--node", "n", "--nvml", "sim:t4-1", "--metrics-port", "x"], "--metrics-port"),
    (["cluster", "up", "--wait", "0"], "--wait"),
    (["cluster", "fault", "n", "--gpu", "0", "--xid", "abc"], "--xid"),
    (["inventory", "-o", "xml"], "-o/--output"),
])
@pytest.mark.process
def test_invalid_flag_values_are_usage_errors(argv: list[str], flag: str) -> None:
    out = gpu_dra(*argv)
    assert out.returncode == 2
    assert f"argument {flag}:" in out.stderr and "usage: gpu-dra" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.process
def test_flag_typo_shows_the_subcommand_usage_and_the_closest_flag() -> None:
    out = gpu_dra("cluster", "up", "--nodse", "a=t4-1")
    assert out.returncode == 2
    assert out.stderr.startswith("usage: gpu-dra cluster up ")
    assert "unrecognized arguments: --nodse a=t4-1 (--nodse: did you mean --nodes?)" in out.stderr
    out = gpu_dra("allocate", "-f", "x.yaml", "--ndoe", "n1")
    assert out.stderr.startswith("usage: gpu-dra allocate ") and "did you mean --node?" in out.stderr


@pytest.mark.process
def test_one_logging_flag_for_long_running_commands() -> None:
    for command in ("apiserver", "plugin", "controller"):
        text = gpu_dra(command, "--help").stdout
        assert "--log-level {debug,info,warning,error}" in text, command
        assert "--verbose" not in text


@pytest.mark.process
def test_f_takes_directories_and_stdin_and_o_means_the_same_everywhere(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "in"
    d.mkdir()
    (d / "a-slices.yaml").write_text(SLICES)
    (d / "b-claim.yaml").write_text(CLAIM)
    (d / "README.txt").write_text("not read")
    classes = str(ROOT / "manifests" / "base" / "deviceclasses.yaml")
    out = gpu_dra("allocate", "-f", str(d), "-f", classes, "-o", "yaml")
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout)["results"][0]["outcome"] == "allocated"
    out = gpu_dra("allocate", "-f", "-", "-f", classes, "-o", "json", stdin=SLICES + "---\n" + CLAIM)
    assert json.loads(out.stdout)["results"][0]["claim"] == "default/c"
    # validate: a missing metadata.namespace is `default`, as kubectl applies it
    out = gpu_dra("validate", "-f", str(d / "b-claim.yaml"), "-o", "yaml")
    assert out.returncode == 0 and yaml.safe_load(out.stdout)["results"][0]["object"] == "ResourceClaim/default/c"
    # every reporting command takes json, yaml and table
    for argv in (["validate", "-f", str(d)], ["explain", "-f", str(d), "-f", classes],
                 ["inventory", "--nvml", "sim:t4-1", "--node", "n1"], ["slices", "--nvml", "sim:t4-1", "--node", "n1"],
                 ["cel", "true", "-f", str(d / "a-slices.yaml")], ["cluster", "list"]):
        docs = {}
        for fmt in ("json", "yaml", "table"):
            rc = main([*argv, "-o", fmt])
            docs[fmt] = capsys.readouterr().out
            assert rc == 0, (argv, fmt)
        assert json.loads(docs["json"]) == yaml.safe_load(docs["yaml"]), argv
        assert docs["table"].strip() and not docs["table"].lstrip().startswith("{"), argv


@pytest.mark.process
def test_kubeconfig_then_in_cluster_then_one_message(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("apiVersion: v1\nkind: Config\n")
    assert cliopts.kubeconfig_source(None, {"KUBECONFIG": f"{tmp_path}/missing{os.pathsep}{config}"}) == str(config)
    assert cliopts.kubeconfig_source(str(config), {}) == str(config)
    token = tmp_path / "token"
    token.write_text("t")
    in_cluster = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert cliopts.kubeconfig_source(None, in_cluster, str(token)) is None
    with pytest.raises(cliopts.NoApiConfig, match=r"no API server configured: .*\$KUBECONFIG is not set"):
        cliopts.kubeconfig_source(None, {}, str(tmp_path / "no-token"))
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    for argv in (["controller"], ["plugin", "--node", "n1", "--nvml", "sim:t4-1"]):
        out = subprocess.run([sys.executable, "-m", "cli.main", *argv], cwd=str(ROOT), capture_output=True, text=True,
                             timeout=60, env={**env, "PYTHONPATH": str(ROOT)})
        assert out.returncode == 2 and out.stderr.count("no API server configured") == 1, out.stderr


@pytest.mark.process
def test_controller_honours_kubeconfig_env(apiserver: Any) -> None:
    api = apiserver.api
    api.create("ResourceClaimTemplate", {"metadata": {"name": "t", "namespace": "default"},
                                         "spec": {"spec": {"devices": {"requests": []}}}})
    api.create("Pod", {"metadata": {"name": "p", "namespace": "default"},
                       "spec": {"containers": [{"name": "c", "image": "i"}],
                                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]}})
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "controller", "--embedded", "--no-leader-elect"],
                            cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "KUBECONFIG": str(apiserver.kubeconfig)})
    try:
        deadline = time.monotonic() + 60
        while not api.list("ResourceClaim", namespace="default")[0]:
            assert time.monotonic() < deadline, "the controller did not create the pod's claim"
            time.sleep(0.2)
    finally:
        stop_process(proc)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def dead_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    url = f"http://127.0.0.1:{closed_port()}"
    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": url}}], "users": [{"name": "x", "user": {}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}))
    yield url, config


def run_for(argv: list[str], seconds: float, env: dict[str, str]) -> str:
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", *argv], cwd=str(ROOT), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    time.sleep(seconds)
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err


@pytest.mark.process
def test_unreachable_api_server_is_logged_once_per_backoff_step(dead_server: tuple[str, Path]) -> None:
    url, config = dead_server
    err = run_for(["controller", "--embedded", "--no-leader-elect"], 8.0, {"KUBECONFIG": str(config)})
    lines = [line for line in err.splitlines() if "unreachable" in line]
    assert lines, err
    assert "urllib3" not in err and "Retrying" not in err
    per_kind: dict[str, int] = {}
    for line in lines:
        assert f"url={url}" in line and re.search(r"nextRetry=\d{4}-\d\d-\d\dT", line), line
        kind = re.search(r"kind=(\w+)", line).group(1)  # type: ignore[union-attr]
        per_kind[kind] = per_kind.get(kind, 0) + 1
    # 1 + 2 + 4 s of backoff fit in 8 s: at most 4 lines per watched kind, however long each try takes
    assert max(per_kind.values()) <= 4, per_kind


@pytest.mark.process
def test_node_agent_says_it_waits_for_a_kubelet_then_reports_the_unreachable_server(
        dead_server: tuple[str, Path]) -> None:
    from sim.kubelet.dra import KubeletSim

    url, config = dead_server
    with short_tmp() as tmp:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "plugin", "--node", "n1", "--nvml", "sim:t4-1",
             "--kubelet-dir", str(tmp / "kubelet"), "--cdi-dir", str(tmp / "cdi")],
            cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT), "KUBECONFIG": str(config)})
        try:
            assert proc.stderr is not None
            seen = []
            for line in proc.stderr:
                seen.append(line)
                if "waiting-for-kubelet" in line:
                    break
            assert "no kubelet has registered this plugin yet" in seen[-1], "".join(seen)
            assert str(tmp / "kubelet" / "plugins_registry") in seen[-1]
            kubelet = KubeletSim(tmp / "kubelet")
            kubelet.wait_for_plugin("gpu.nvidia.com", timeout=60)
            failures = []
            for line in proc.stderr:
                if "slice publish failed" in line:
                    failures.append(line)
                    if len(failures) == 2:
                        break
            assert all(f"url={url}" in f and "next_retry=" in f for f in failures), failures
            assert "retry_in=1.0s" in failures[0] and "retry_in=2.0s" in failures[1]
            kubelet.close()
        finally:
            stop_process(proc)


@pytest.mark.process
def test_faults_file_is_reported(tmp_path: Path) -> None:
    missing = gpu_dra("inventory", "--nvml", f"sim:t4-1?faults={tmp_path}/faults.json", "-o", "json")
    assert missing.returncode == 0 and "faults-file-missing" in missing.stderr
    no_dir = gpu_dra("inventory", "--nvml", f"sim:t4-1?faults={tmp_path}/nope/faults.json")
    assert no_dir.returncode == 2 and "its directory" in no_dir.stderr and "does not exist" in no_dir.stderr


def test_every_command_is_registered() -> None:
    from cli.main import build_parser

    parser = build_parser([], load_all=True)
    assert set(COMMANDS) <= set(parser._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
