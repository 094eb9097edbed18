"""Partitionable MIG on a fresh `gpu-dra cluster up` with the h100-mig profile (issue 37): its GPUs come with MIG
instances made beforehand that no claim holds, so the scheduler (whose counters only know allocated devices) may
place a claim on a placement overlapping them. The node agent makes room by destroying the idle instances in the
way; before, creating the placement failed ("the placement is taken or overlaps an existing MIG instance"), the
binding failed, and the scheduler placed it there again, several times a second, forever."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.cluster_helpers import cluster_up
from tests.polling import until

pytestmark = pytest.mark.process

# GPU 0 of h100-mig (PCI 0000:1b:00.0) holds seven 1g.10gb instances: any 3g.40gb placement overlaps three of them.
WORKLOAD = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: mig-3g, namespace: default}
spec:
  devices:
    requests:
    - name: mig
      exactly:
        deviceClassName: mig.nvidia.com
        selectors:
        - cel: {expression: 'device.attributes["gpu.nvidia.com"].profile == "3g.40gb" &&
                             device.attributes["resource.kubernetes.io"].pciBusID == "0000:1b:00.0"'}
---
apiVersion: v1
kind: Pod
metadata: {name: infer, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  resourceClaims: [{name: mig, resourceClaimName: mig-3g}]
  containers: [{name: c, image: "busybox:1", resources: {claims: [{name: mig}]}}]
"""


def _get(kubectl: list[str], kind: str, name: str) -> dict:
    done = subprocess.run([*kubectl, "get", kind, name, "-o", "json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_first_dynamic_mig_claim_binds_on_a_fresh_cluster() -> None:
    with cluster_up("dynmig", "h1=h100-mig", "none", "--partitionable") as cluster:
        applied = subprocess.run([*cluster.kubectl, "apply", "-f", "-"], input=WORKLOAD, capture_output=True,
                                 text=True, timeout=60)
        assert applied.returncode == 0, applied.stderr
        until("the pod bound to h1", lambda: _get(cluster.kubectl, "pod", "infer")["spec"].get("nodeName") == "h1",
              timeout=90)
        claim = _get(cluster.kubectl, "resourceclaim", "mig-3g")
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert "-mig-3g-40gb-" in result["device"]
        (entry,) = claim["status"]["devices"]
        conditions = {c["type"]: c["status"] for c in entry["conditions"]}
        assert conditions == {"gpu.nvidia.com/mig-ready": "True", "gpu.nvidia.com/mig-failed": "False"}
