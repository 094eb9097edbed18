"""Preemption on `gpu-dra cluster up` as kubectl 1.37 shows it on a cluster: a high-priority pod makes room by
evicting a Deployment's lower-priority pod (Preempted event, nomination, the pod placed once its victim is gone), and
the Deployment's replacement pod waits without taking that room back."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster_helpers import cluster_up
from tests.polling import until

pytestmark = pytest.mark.process

NAME = "preempt"
WORKLOAD = """
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: batch}
value: 100
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: serving}
value: 100000
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: batch, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: batch}}
  template:
    metadata: {labels: {app: batch}}
    spec:
      priorityClassName: batch
      terminationGracePeriodSeconds: 1
      containers: [{name: c, image: "busybox:1", resources: {requests: {cpu: "30"}}}]
"""
URGENT = """
apiVersion: v1
kind: Pod
metadata: {name: urgent, namespace: default}
spec:
  priorityClassName: serving
  containers: [{name: c, image: "busybox:1", resources: {requests: {cpu: "30"}}}]
"""


@pytest.fixture(scope="module")
def kubectl() -> Iterator[list[str]]:
    with cluster_up(NAME, "n1=v100-4", "none") as cluster:
        yield cluster.kubectl


def _run(base: list[str], *args: str, stdin: str | None = None) -> str:
    done = subprocess.run([*base, *args], capture_output=True, text=True, input=stdin, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _pods(base: list[str]) -> dict[str, dict[str, Any]]:
    items = json.loads(_run(base, "get", "pods", "-o", "json"))["items"]
    return {p["metadata"]["name"]: p for p in items}


def test_a_high_priority_pod_preempts_a_deployment_pod(kubectl: list[str]) -> None:
    _run(kubectl, "apply", "-f", "-", stdin=WORKLOAD)
    _run(kubectl, "rollout", "status", "deploy/batch", "--timeout=60s")
    before = {n for n, p in _pods(kubectl).items() if n.startswith("batch-")}
    _run(kubectl, "apply", "-f", "-", stdin=URGENT)
    until("the preemptor placed on n1", lambda: _pods(kubectl).get("urgent", {}).get("spec", {}).get("nodeName") == "n1",
          timeout=60)
    urgent = _pods(kubectl)["urgent"]
    assert urgent["status"]["nominatedNodeName"] == "n1"
    events = json.loads(_run(kubectl, "get", "events", "--field-selector", "reason=Preempted", "-o", "json"))["items"]
    (event,) = events
    assert event["involvedObject"]["name"] in before
    assert event["message"] == f"Preempted by pod {urgent['metadata']['uid']} on node n1"

    # The ReplicaSet replaces its victim under a new name; the replacement does not outrank the preemptor (nor
    # its sibling, its equal) and stays Pending, saying so in kube-scheduler's words.
    def replacement() -> str | None:
        return next((n for n, p in _pods(kubectl).items()
                     if n.startswith("batch-") and n not in before and not p["spec"].get("nodeName")), None)

    name = until("the victim's replacement Pending", replacement, timeout=60)

    def failed_scheduling() -> str | None:
        items = json.loads(_run(kubectl, "get", "events", "--field-selector",
                                f"reason=FailedScheduling,involvedObject.name={name}", "-o", "json"))["items"]
        return items[0]["message"] if items else None

    assert until("the replacement's FailedScheduling event", failed_scheduling, timeout=30) == (
        "0/1 nodes are available: 1 Insufficient cpu. no new claims to deallocate, "
        "preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod.")
