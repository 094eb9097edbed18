"""What the container image ships: the in-cluster commands import and start with the testbed (sim, bench, the
embedded control plane) unavailable, and the testbed commands say plainly that they are not installed. The
Dockerfile copies exactly the shipped packages and installs the locked dependencies on a base pinned by digest."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import NOT_SHIPPED
from tests.test_webhook import make_certs

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("gpudra", "driver", "controller", "cli")

# Runs the CLI with the testbed's packages made unimportable, as in the image (the editable install would
# otherwise find them in the checkout).
BOOT = """
import importlib.abc, sys
BLOCKED = {blocked!r}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Block())
{body}
"""


def _run(body: str, *args: str, timeout: float = 120, **kw: object) -> subprocess.CompletedProcess[str]:
    code = BOOT.format(blocked=sorted(NOT_SHIPPED), body=body)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, **kw)  # type: ignore[call-overload, no-any-return]


CLI = "from cli.main import main; sys.exit(main(sys.argv[1:]))"


def test_the_distribution_claims_no_module_name_other_packages_own() -> None:
    """`proto` is proto-plus's top-level package (Google's client libraries install it); the kubelet stubs live in
    gpudra.kubeletapi and proto/ holds only their sources."""
    import tomllib

    from setuptools import find_packages

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    top_level = {name.split(".")[0] for name in find_packages(str(ROOT), include=include)}
    assert top_level == {"gpudra", "driver", "controller", "cli", "controlplane", "sim", "bench"}
    assert not (ROOT / "proto" / "__init__.py").exists()


@pytest.mark.process
def test_every_shipped_module_imports_without_the_testbed() -> None:
    # cli/apiserver.py is the embedded control plane's command (its module imports it): checked below.
    modules = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for pkg in SHIPPED for p in (ROOT / pkg).rglob("*.py") if p.name not in ("generate.py", "__main__.py")
        and p.relative_to(ROOT) != Path("cli/apiserver.py")
    )
    body = f"import importlib\nfor m in {modules!r}:\n    importlib.import_module(m)\nprint(len({modules!r}))"
    proc = _run(body)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.strip()) > 50


@pytest.mark.process
def test_in_cluster_commands_start_and_testbed_commands_say_why_not(tmp_path: Path) -> None:
    for command in ("plugin", "controller", "webhook", "validate", "allocate"):
        proc = _run(CLI, command, "--help")
        assert proc.returncode == 0 and "usage: gpu-dra" in proc.stdout, (command, proc.stderr[-2000:])
    proc = _run(CLI, "--help")
    assert proc.returncode == 0 and "webhook" in proc.stdout
    for command, part in (("demo", "sim"), ("cluster", "sim"), ("bench", "bench"), ("apiserver", "controlplane")):
        proc = _run(CLI, command)
        assert proc.returncode == 2, (command, proc.stdout, proc.stderr)
        assert f"package `{part}`) is not part of this installation" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    # The node agent on a simulator names the missing package through its seam.
    proc = _run(CLI, "plugin", "--node", "n1", "--nvml", "sim:dgx-a100")
    assert proc.returncode == 2 and "not part of this installation" in proc.stderr, proc.stderr
    # So does the controller asked to play kube-scheduler: those roles are the testbed's.
    proc = _run(CLI, "controller", "--embedded", "--kubeconfig", str(tmp_path / "absent"))
    assert proc.returncode == 2 and "package `sim`, the testbed) are not part of this installation" in proc.stderr, \
        proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.process
def test_webhook_serves_without_the_testbed(tmp_path: Path) -> None:
    _, cert, key = make_certs(tmp_path)
    code = BOOT.format(blocked=sorted(NOT_SHIPPED), body=CLI)
    proc = subprocess.Popen([sys.executable, "-c", code, "webhook", "--tls-cert-file", str(cert),
                             "--tls-private-key-file", str(key), "--port", "0", "--bind-address", "127.0.0.1"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("https://127.0.0.1:")
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def test_dockerfile_ships_the_in_cluster_packages_on_a_pinned_base() -> None:
    text = (ROOT / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\w+) \./\1$", text, re.M))
    assert copied == set(SHIPPED)
    for part in NOT_SHIPPED:
        assert not re.search(rf"^COPY {part}\b", text, re.M)
    assert re.search(r"^ARG BASE_IMAGE=[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}$", text, re.M)
    assert "requirements.lock" in text and "--no-deps" in text


@pytest.mark.process
def test_lock_matches_pyproject() -> None:
    proc = subprocess.run([sys.executable, "tools/lockdeps.py", "--check"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ})
    assert proc.returncode == 0, proc.stderr
