"""A ComputeDomain on real Kubernetes 1.37 (the upstream backend): two simulated GB200 trays of one NVLink clique,
NVIDIA's CRDs from manifests/compute-domains applied as a user applies them, the domain's IMEX daemons run by
our controller as a DaemonSet of our image (each daemon pod prepared a claim for the real kubelet), and a
workload whose pods get the domain's IMEX channel through their claims."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudra import computedomain as cd
from sim.upstream.images import product_reference
from tests.upstream_helpers import UpstreamCluster, running, wait_for

pytestmark = [pytest.mark.upstream, pytest.mark.slow, pytest.mark.process]

ROOT = Path(__file__).resolve().parent.parent
TRAYS = ("gb-1", "gb-2")
WORKERS = (ROOT / "tests" / "data" / "compute-domain" / "domain-workers.yaml").read_text()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpstreamCluster]:
    nodes = ",".join(f"{tray}=gb200-nvl" for tray in TRAYS)
    with running(f"cd-{os.getpid()}", tmp_path_factory.mktemp("upstream-cd"), nodes) as up:
        yield up


def _status(cluster: UpstreamCluster, name: str) -> dict[str, object]:
    return cluster.get("computedomain", name).get("status") or {}


def test_a_compute_domain_on_two_gb200_trays(cluster: UpstreamCluster) -> None:
    cluster.kubectl("apply", "-f", str(ROOT / "manifests" / "compute-domains" / "resource.nvidia.com_computedomains.yaml"),
                    "-f", str(ROOT / "manifests" / "compute-domains" / "resource.nvidia.com_computedomaincliques.yaml"))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/computedomains.resource.nvidia.com", "crd/computedomaincliques.resource.nvidia.com")
    cluster.kubectl("apply", "-f", "-", stdin=WORKERS.replace("NAME", "pair").replace("NODES", "2"))

    def workers_running() -> list[dict[str, object]] | None:
        pods = cluster.get("pods", "-l", "app=pair")["items"]
        return pods if len(pods) == 2 and all(p["status"].get("phase") == "Running" for p in pods) else None

    workers = wait_for("both workers Running", workers_running, timeout=300)
    assert {p["spec"]["nodeName"] for p in workers} == set(TRAYS)
    status = wait_for("pair Ready", lambda: (lambda s: s if s.get("status") == "Ready" else None)(
        _status(cluster, "pair")), timeout=120)
    assert sorted(n["name"] for n in status["nodes"]) == list(TRAYS)
    assert all(n["status"] == "Ready" for n in status["nodes"])
    uid = cluster.get("computedomain", "pair")["metadata"]["uid"]

    # One IMEX daemon pod per tray, from our image, each with its own prepared daemon claim.
    daemons = cluster.get("-n", "gpu-dra-system", "pods", "-l", f"{cd.DOMAIN_LABEL}={uid}")["items"]
    assert sorted(d["spec"]["nodeName"] for d in daemons) == list(TRAYS)
    assert all(d["spec"]["containers"][0]["image"] == product_reference(testbed=True) for d in daemons)
    assert all(d["status"]["phase"] == "Running" for d in daemons)
    # The daemons found each other: each answers its readiness check (nvidia-imex-ctl, in the pod) READY.
    for daemon in daemons:
        probe = cluster.kubectl("-n", "gpu-dra-system", "exec", daemon["metadata"]["name"], "--",
                                "gpu-dra", "compute-domain-daemon", "check")
        assert probe == "READY\n", probe

    # Each worker's container saw its channel device (the spec's `ls /dev/nvidia-caps-imex-channels`).
    for worker in workers:
        log = cluster.kubectl("logs", worker["metadata"]["name"])
        assert log.split() == ["channel0"], log
    clique = cluster.get("computedomaincliques", "-n", "gpu-dra-system")["items"]
    assert len(clique) == 1 and sorted(n["nodeName"] for n in clique[0]["daemons"]) == list(TRAYS)

    # Deleted: the workers, their channels and the daemons go, and the nodes leave the domain.
    cluster.kubectl("delete", "-f", "-", "--wait=true", "--timeout=180s",
                    stdin=WORKERS.replace("NAME", "pair").replace("NODES", "2"), timeout=240)
    wait_for("the daemons gone and the nodes unlabelled", lambda: not cluster.get(
        "-n", "gpu-dra-system", "pods", "-l", f"{cd.DOMAIN_LABEL}={uid}")["items"] and not any(
        cd.DOMAIN_LABEL in (n["metadata"].get("labels") or {}) for n in cluster.get("nodes")["items"]), timeout=180)
    assert not cluster.get("resourceclaimtemplates", "-l", f"{cd.DOMAIN_LABEL}={uid}")["items"]
