"""DaemonSet rollouts on `gpu-dra cluster up` driven by kubectl 1.37 as on a cluster: `rollout status` through a
maxSurge update, the revisions in ControllerRevisions (`get controllerrevisions`, `rollout history`, one
revision's template), `rollout undo` renumbering the old revision, `--to-revision`, and OnDelete leaving pods alone."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.cluster_helpers import cluster_up

pytestmark = pytest.mark.process

NAME = "dsroll"
DAEMONSET = """
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent, namespace: default}
spec:
  selector: {matchLabels: {app: agent}}
  updateStrategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}
  template:
    metadata: {labels: {app: agent}}
    spec: {containers: [{name: c, image: "busybox:1"}]}
"""


@pytest.fixture(scope="module")
def kubectl() -> Iterator[list[str]]:
    with cluster_up(NAME, "n1=v100-4,n2=v100-4,n3=v100-4", "none") as cluster:
        yield cluster.kubectl


def _run(base: list[str], *args: str, stdin: str | None = None, timeout: float = 120) -> str:
    done = subprocess.run([*base, *args], capture_output=True, text=True, input=stdin, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _images(base: list[str]) -> list[str]:
    pods = json.loads(_run(base, "get", "pods", "-l", "app=agent", "-o", "json"))["items"]
    return sorted(p["spec"]["containers"][0]["image"] for p in pods if not p["metadata"].get("deletionTimestamp"))


def test_rollout_status_history_and_undo(kubectl: list[str]) -> None:
    _run(kubectl, "apply", "-f", "-", stdin=DAEMONSET)
    assert 'daemon set "agent" successfully rolled out' in _run(kubectl, "rollout", "status", "ds/agent")
    _run(kubectl, "set", "image", "ds/agent", "c=busybox:2")
    status = _run(kubectl, "rollout", "status", "ds/agent")
    # One node at a time (maxSurge 1): the progress lines count up to the success line.
    assert "1 out of 3 new pods have been updated" in status and status.endswith(
        'daemon set "agent" successfully rolled out\n'), status
    assert _images(kubectl) == ["busybox:2"] * 3
    # kube-apiserver counts template changes in the DaemonSet's template generation; the pods carry it.
    ds = json.loads(_run(kubectl, "get", "ds", "agent", "-o", "json"))
    assert ds["metadata"]["annotations"]["deprecated.daemonset.template.generation"] == "2"
    pods = json.loads(_run(kubectl, "get", "pods", "-l", "app=agent", "-o", "json"))["items"]
    assert {p["metadata"]["labels"]["pod-template-generation"] for p in pods
            if not p["metadata"].get("deletionTimestamp")} == {"2"}
    history = _run(kubectl, "rollout", "history", "ds/agent")
    assert history.split("\n", 1)[1].split() == ["REVISION", "CHANGE-CAUSE", "1", "<none>", "2", "<none>"]
    revisions = _run(kubectl, "get", "controllerrevisions", "--no-headers").splitlines()
    assert sorted(line.split()[1:3] for line in revisions) == [["daemonset.apps/agent", "1"],
                                                              ["daemonset.apps/agent", "2"]]
    assert "busybox:1" in _run(kubectl, "rollout", "history", "ds/agent", "--revision=1")
    # Undo goes back to revision 1's template, which becomes revision 3.
    assert "daemonset.apps/agent rolled back" in _run(kubectl, "rollout", "undo", "ds/agent")
    assert "successfully rolled out" in _run(kubectl, "rollout", "status", "ds/agent")
    assert _images(kubectl) == ["busybox:1"] * 3
    history = _run(kubectl, "rollout", "history", "ds/agent")
    assert history.split("\n", 1)[1].split() == ["REVISION", "CHANGE-CAUSE", "2", "<none>", "3", "<none>"]
    assert "daemonset.apps/agent rolled back" in _run(kubectl, "rollout", "undo", "ds/agent", "--to-revision=2")
    assert "successfully rolled out" in _run(kubectl, "rollout", "status", "ds/agent")
    assert _images(kubectl) == ["busybox:2"] * 3
    wide = _run(kubectl, "get", "ds", "agent", "-o", "wide", "--no-headers").split()
    assert wide[:6] == ["agent", "3", "3", "3", "3", "3"] and wide[-2:] == ["busybox:2", "app=agent"]


def test_on_delete_replaces_only_deleted_pods(kubectl: list[str]) -> None:
    manifest = DAEMONSET.replace("name: agent,", "name: manual,").replace("app: agent", "app: manual").replace(
        "{type: RollingUpdate, rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}", "{type: OnDelete}")
    _run(kubectl, "apply", "-f", "-", stdin=manifest)
    deadline = time.monotonic() + 60
    while _run(kubectl, "get", "ds", "manual", "-o", "jsonpath={.status.numberReady}") != "3":
        assert time.monotonic() < deadline, "the OnDelete DaemonSet's pods"
        time.sleep(0.3)
    refused = subprocess.run([*kubectl, "rollout", "status", "ds/manual"], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "rollout status is only available for RollingUpdate strategy type" in refused.stderr
    _run(kubectl, "set", "image", "ds/manual", "c=busybox:2")
    time.sleep(3)  # several controller passes
    pods = json.loads(_run(kubectl, "get", "pods", "-l", "app=manual", "-o", "json"))["items"]
    assert sorted(p["spec"]["containers"][0]["image"] for p in pods) == ["busybox:1"] * 3
    _run(kubectl, "delete", "pod", pods[0]["metadata"]["name"], "--wait=false")
    deadline = time.monotonic() + 60
    while True:
        pods = json.loads(_run(kubectl, "get", "pods", "-l", "app=manual", "-o", "json"))["items"]
        images = sorted(p["spec"]["containers"][0]["image"] for p in pods if not p["metadata"].get("deletionTimestamp"))
        if images == ["busybox:1", "busybox:1", "busybox:2"]:
            break
        assert time.monotonic() < deadline, f"the deleted pod's replacement; got {images}"
        time.sleep(0.3)
