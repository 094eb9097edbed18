"""The demo runs every component under the identity and RBAC that manifests/base gives it: with a verb
removed from the node agent's ClusterRole, the agent's writes are refused (403) and the demo fails."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.process  # runs gpu-dra demo


def test_a_missing_verb_fails_the_demo(tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    shutil.copytree(ROOT / "manifests", manifests)
    rbac = manifests / "base" / "rbac.yaml"
    text = rbac.read_text()
    granted = 'resources: ["resourceslices"]\n  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]'
    assert granted in text
    rbac.write_text(text.replace(granted, granted.replace('"create", ', ""), 1))
    workdir = Path(tempfile.mkdtemp(prefix="gdr-", dir="/tmp"))  # unix socket paths must stay short
    try:
        run = subprocess.run([sys.executable, "-m", "cli.main", "demo", "--runtime", "none", "--workdir", str(workdir),
                              "--step-timeout", "8", "--manifests", str(manifests), "-q"],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
        logs = "".join(p.read_text(errors="replace") for p in (workdir / "logs").glob("plugin-*.log"))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    assert run.returncode != 0, run.stderr[-2000:]
    assert ('resourceslices.resource.k8s.io is forbidden: User \\"system:serviceaccount:gpu-dra-system:'
            'gpu-dra-node-agent\\" cannot create resource \\"resourceslices\\"') in logs, run.stderr[-3000:]
