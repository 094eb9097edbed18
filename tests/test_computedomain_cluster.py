"""End to end on `gpu-dra cluster up --gb200-racks 2x2` (two racks of two trays, each rack its own NVLink clique):
NVIDIA's ComputeDomain CRDs and its demo/specs/imex channel-injection example applied unchanged (domain Ready,
pod Running, the container listing its channel device; the IMEX daemons run in their pods), a domain that fits one rack
placed within it, a domain larger than any clique waiting with an explanation and holding nothing, a fabric fault
visible on the domain, and a deleted domain's objects removed."""

from __future__ import annotations

import functools
import contextlib
import os
import subprocess
import sys
import threading
import ssl
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from gpudra import computedomain as cd
from gpudra.kubeapi import KubeApi
from sim.runtime import podman_missing
from tests.polling import until
from tests.plugin_helpers import short_tmp

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
NAME = "cdt"
T = TypeVar("T")
pytestmark = pytest.mark.process


_until = functools.partial(until, timeout=120.0)


class Cluster:
    def __init__(self, home: Path) -> None:
        self.kubeconfig = home / "kube" / "config"
        self.env = dict(os.environ, XDG_STATE_HOME=str(home / "state"), KUBECONFIG=str(self.kubeconfig),
                        PYTHONPATH=str(ROOT))

    def run(self, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cli.main", "cluster", *args], env=self.env, cwd=str(ROOT),
                              capture_output=True, text=True, timeout=timeout)


@contextlib.contextmanager
def _up(runtime: str) -> Iterator[tuple[Cluster, KubeApi, str]]:
    with short_tmp() as home:
        c = Cluster(home)
        up = c.run("up", "--name", NAME, "--gb200-racks", "2x2", "--runtime", runtime)
        try:
            assert up.returncode == 0, up.stderr[-3000:]
            api = KubeApi.connect(kubeconfig=str(c.kubeconfig))
            try:
                yield c, api, runtime
            finally:
                api.close()
        finally:
            c.run("down", "--name", NAME, timeout=120)


@pytest.fixture
def cluster() -> Iterator[tuple[Cluster, KubeApi, str]]:
    # The IMEX daemon pods' command runs on the kubelet's runtime (our image as host processes beside podman's
    # containers); without podman, `--runtime none` still runs those pods as host processes and simulates the rest.
    with _up("none" if podman_missing() else "podman") as up:
        yield up


def _docs(path: Path, **subst: str) -> list[dict[str, Any]]:
    text = path.read_text()
    for k, v in subst.items():
        text = text.replace(k, v)
    return [d for d in yaml.safe_load_all(text) if d]


def _create(api: KubeApi, objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        api.create(obj["kind"], obj, namespace=(obj.get("metadata") or {}).get("namespace") or
                   ("default" if obj["kind"] not in ("CustomResourceDefinition",) else None))


def _domain(api: KubeApi, name: str) -> dict[str, Any]:
    return api.get("ComputeDomain", name, namespace="default")


def _log(api: KubeApi, pod: str, namespace: str = "default") -> str:
    cfg = api.client.configuration  # the cluster's HTTPS URL, its CA and the admin's token
    req = urllib.request.Request(f"{api.host}/api/v1/namespaces/{namespace}/pods/{pod}/log",
                                 headers={"Authorization": cfg.api_key["BearerToken"]})
    with urllib.request.urlopen(req, timeout=10, context=ssl.create_default_context(cafile=cfg.ssl_ca_cert)) as resp:
        return resp.read().decode()


def _seen_since(api: KubeApi, name: str, resource_version: str, what: str,
                check: Callable[[dict[str, Any]], bool], timeout: float = 90) -> None:
    """Wait until some state of ComputeDomain `name` after `resource_version` had a status passing `check`,
    however briefly (its watch from that version replays every change since)."""
    stop = threading.Event()
    timer = threading.Timer(timeout, stop.set)
    timer.start()
    try:
        for _, obj in api.watch("ComputeDomain", namespace="default", field_selector=f"metadata.name={name}",
                                resource_version=resource_version, stop=stop, server_timeout=5):
            if check(obj.get("status") or {}):
                return
    finally:
        timer.cancel()
        stop.set()
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def _clique(api: KubeApi, node: str) -> str:
    return str(api.get("Node", node)["metadata"]["labels"][cd.CLIQUE_LABEL])


def test_nvidia_compute_domain_examples_on_two_gb200_racks(cluster: tuple[Cluster, KubeApi, str]) -> None:
    c, api, runtime = cluster
    _create(api, _docs(DATA / "nvidia-compute-domain" / "resource.nvidia.com_computedomains.yaml")
            + _docs(DATA / "nvidia-compute-domain" / "resource.nvidia.com_computedomaincliques.yaml"))
    for crd in ("computedomains.resource.nvidia.com", "computedomaincliques.resource.nvidia.com"):
        _until(f"{crd} established", lambda crd=crd: any(
            x.get("type") == "Established" and x.get("status") == "True"
            for x in (api.get("CustomResourceDefinition", crd).get("status") or {}).get("conditions") or []))

    # NVIDIA's channel-injection example, unchanged.
    _create(api, _docs(DATA / "nvidia-compute-domain" / "channel-injection.yaml"))
    _until("channel-injection running", lambda: (api.get("Pod", "imex-channel-injection", namespace="default")
                                                 .get("status") or {}).get("phase") == "Running")
    _until("its domain Ready", lambda: (_domain(api, "imex-channel-injection").get("status") or {}).get("status")
           == "Ready")
    status = _domain(api, "imex-channel-injection")["status"]
    node = api.get("Pod", "imex-channel-injection", namespace="default")["spec"]["nodeName"]
    assert [n["name"] for n in status["nodes"]] == [node] and status["nodes"][0]["cliqueID"] == _clique(api, node)
    if runtime == "podman":  # under none the workload pod is simulated: no container, no listing
        listing = _until("the container's listing", lambda: _log(api, "imex-channel-injection") or None)
        assert "channel0" in listing, listing

    # A domain that fits one rack: both workers in one clique, Ready.
    _create(api, _docs(DATA / "compute-domain" / "domain-workers.yaml", NAME="pair", NODES="2"))
    pods = _until("pair workers running", lambda: (lambda ps: ps if len(ps) == 2 and all(
        (p.get("status") or {}).get("phase") == "Running" for p in ps) else None)(
        api.list("Pod", namespace="default", label_selector="app=pair")[0]))
    assert len({_clique(api, p["spec"]["nodeName"]) for p in pods}) == 1
    _until("pair Ready", lambda: (_domain(api, "pair").get("status") or {}).get("status") == "Ready")

    # Larger than any clique: it waits, explained, holding nothing.
    _create(api, _docs(DATA / "compute-domain" / "domain-workers.yaml", NAME="big", NODES="3"))
    claims = _until("big's claims explained", lambda: (lambda cs: cs if len(cs) == 3 and all(
        "gpu.nvidia.com/explanation" in (x["metadata"].get("annotations") or {}) for x in cs) else None)(
        [x for x in api.list("ResourceClaim", namespace="default")[0] if x["metadata"]["name"].startswith("big-")]))
    assert all("allocation" not in (x.get("status") or {}) for x in claims)
    why = claims[0]["metadata"]["annotations"]["gpu.nvidia.com/explanation"]
    assert "must share one NVLink clique" in why and why.count("too small (2 nodes for 3 claims") == 2, why
    assert all((p.get("spec") or {}).get("nodeName") is None
               for p in api.list("Pod", namespace="default", label_selector="app=big")[0])

    # A tray's fabric link fails: its daemon and the domain go NotReady, with a Warning on the domain.
    victim = pods[0]["spec"]["nodeName"]
    fault = c.run("fault", victim, "--name", NAME, "--fabric-down")
    assert fault.returncode == 0, fault.stderr
    _until("pair NotReady", lambda: (_domain(api, "pair").get("status") or {}).get("status") == "NotReady")
    node_status = {n["name"]: n["status"] for n in _domain(api, "pair")["status"]["nodes"]}
    assert node_status[victim] == "NotReady"
    events = _until("a FabricUnhealthy event", lambda: [e for e in api.list("Event", namespace="default")[0]
                                                        if e.get("reason") == "FabricUnhealthy"
                                                        and e["involvedObject"]["name"] == "pair"])
    assert victim in events[0]["message"]

    # Deleting a domain removes its DaemonSet and daemon template (the finalizer), and its channel template.
    uid = _domain(api, "pair")["metadata"]["uid"]
    api.delete("Deployment", "pair-workers", namespace="default")
    api.delete("ComputeDomain", "pair", namespace="default")
    _until("pair's objects gone", lambda: not api.list("DaemonSet", namespace="gpu-dra-system",
                                                       label_selector=f"{cd.DOMAIN_LABEL}={uid}")[0]
           and api.try_get("ComputeDomain", "pair", namespace="default") is None)
    assert not api.list("ResourceClaimTemplate", label_selector=f"{cd.DOMAIN_LABEL}={uid}")[0]


def test_a_deleted_imex_daemon_pod_is_recreated_and_the_domain_recovers(cluster: tuple[Cluster, KubeApi, str]) -> None:
    """The IMEX daemon runs in its pod (`gpu-dra compute-domain-daemon run`): deleting one pod of a two-node domain
    ends that daemon cleanly (its clique entry goes, the domain turns NotReady), the DaemonSet's new pod rejoins
    with the freed index, and the domain is Ready again while the workers keep running with their channels."""
    c, api, runtime = cluster
    _create(api, _docs(DATA / "nvidia-compute-domain" / "resource.nvidia.com_computedomains.yaml")
            + _docs(DATA / "nvidia-compute-domain" / "resource.nvidia.com_computedomaincliques.yaml"))
    for crd in ("computedomains.resource.nvidia.com", "computedomaincliques.resource.nvidia.com"):
        _until(f"{crd} established", lambda crd=crd: any(
            x.get("type") == "Established" and x.get("status") == "True"
            for x in (api.get("CustomResourceDefinition", crd).get("status") or {}).get("conditions") or []))
    _create(api, _docs(DATA / "compute-domain" / "domain-workers.yaml", NAME="pair", NODES="2"))
    workers = _until("pair workers running", lambda: (lambda ps: ps if len(ps) == 2 and all(
        (p.get("status") or {}).get("phase") == "Running" for p in ps) else None)(
        api.list("Pod", namespace="default", label_selector="app=pair")[0]))
    _until("pair Ready", lambda: (_domain(api, "pair").get("status") or {}).get("status") == "Ready")
    uid = _domain(api, "pair")["metadata"]["uid"]
    selector = f"{cd.DOMAIN_LABEL}={uid}"
    daemons = api.list("Pod", namespace="gpu-dra-system", label_selector=selector)[0]
    assert len(daemons) == 2
    # The daemon pods run our image's command and labelled themselves with their clique, as NVIDIA's do.
    spec = daemons[0]["spec"]["containers"][0]
    assert spec["command"][:3] == ["gpu-dra", "compute-domain-daemon", "-v"] and spec["command"][-1] == "run"
    assert spec["readinessProbe"]["exec"]["command"][-1] == "check"
    assert daemons[0]["metadata"]["labels"]["resource.nvidia.com/computeDomain.cliqueID"] == _clique(
        api, daemons[0]["spec"]["nodeName"])
    before = {n["name"]: n for n in _domain(api, "pair")["status"]["nodes"]}
    victim = daemons[0]
    node = victim["spec"]["nodeName"]
    assert before[node]["ipAddress"] == victim["status"]["podIP"]

    since = _domain(api, "pair")["metadata"]["resourceVersion"]
    api.delete("Pod", victim["metadata"]["name"], namespace="gpu-dra-system")
    # The DaemonSet's new pod can rejoin before a poll would see the gap, so the domain's history is read back.
    _seen_since(api, "pair", since, "the deleted daemon's entry gone (SIGTERM: it leaves its clique) and the "
                "domain NotReady", lambda s: s.get("status") == "NotReady" and node not in {
                    n["name"] for n in s.get("nodes") or []})
    fresh = _until("the DaemonSet's new pod on that node", lambda: [
        p for p in api.list("Pod", namespace="gpu-dra-system", label_selector=selector)[0]
        if p["spec"].get("nodeName") == node and p["metadata"]["uid"] != victim["metadata"]["uid"]])
    _until("pair Ready again", lambda: (_domain(api, "pair").get("status") or {}).get("status") == "Ready")
    after = {n["name"]: n for n in _domain(api, "pair")["status"]["nodes"]}
    assert after[node]["index"] == before[node]["index"] and after[node]["status"] == "Ready"
    recreated = api.get("Pod", fresh[0]["metadata"]["name"], namespace="gpu-dra-system")
    assert recreated["status"]["podIP"] == victim["status"]["podIP"] == after[node]["ipAddress"]  # the node's
    # The probe's command, run in the pod (kubectl exec), asks the pod's own nvidia-imex; and the pod's
    # /etc/hosts maps both daemons' DNS names, as the nodes config names them.
    kubectl = [str(ROOT / ".venv" / "bin" / "kubectl"), "-n", "gpu-dra-system", "exec", recreated["metadata"]["name"],
               "--"]
    probe = subprocess.run([*kubectl, "gpu-dra", "compute-domain-daemon", "check"], env=c.env, capture_output=True,
                           text=True, timeout=60)
    assert probe.returncode == 0 and probe.stdout == "READY\n", probe.stderr
    hosts = subprocess.run([*kubectl, "sh", "-c", 'cat "$GPU_DRA_CONTAINER_ROOT/etc/hosts"'], env=c.env,
                           capture_output=True, text=True, timeout=60).stdout
    assert {line.split()[1] for line in hosts.splitlines() if "compute-domain-daemon-" in line} == {
        "compute-domain-daemon-0000", "compute-domain-daemon-0001"}, hosts
    # The workers were never touched: same pods, running, not restarted, their channel claims still allocated.
    now = {p["metadata"]["uid"]: p for p in api.list("Pod", namespace="default", label_selector="app=pair")[0]}
    assert set(now) == {p["metadata"]["uid"] for p in workers}
    for pod in now.values():
        assert pod["status"]["phase"] == "Running"
        assert all(s.get("restartCount", 0) == 0 for s in pod["status"].get("containerStatuses") or [])
        claim = api.get("ResourceClaim", pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"],
                        namespace="default")
        assert claim["status"]["allocation"] and [r["uid"] for r in claim["status"]["reservedFor"]] == [
            pod["metadata"]["uid"]]


def _crds(api: KubeApi) -> None:
    _create(api, _docs(DATA / "nvidia-compute-domain" / "resource.nvidia.com_computedomains.yaml")
            + _docs(DATA / "nvidia-compute-domain" / "resource.nvidia.com_computedomaincliques.yaml"))
    for crd in ("computedomains.resource.nvidia.com", "computedomaincliques.resource.nvidia.com"):
        _until(f"{crd} established", lambda crd=crd: any(
            x.get("type") == "Established" and x.get("status") == "True"
            for x in (api.get("CustomResourceDefinition", crd).get("status") or {}).get("conditions") or []))


def test_under_runtime_none_the_imex_daemons_run_and_a_domain_becomes_ready() -> None:
    """`--runtime none` (no container runtime): the IMEX daemon pods (our image) still run, as host processes
    with their token, CDI env and logs, so a two-node domain goes Ready with both workers' channel claims
    allocated, while the workers (busybox) are simulated pods, Running once prepared."""
    with _up("none") as (c, api, _):
        _crds(api)
        _create(api, _docs(DATA / "compute-domain" / "domain-workers.yaml", NAME="pair", NODES="2"))
        workers = _until("pair workers running", lambda: (lambda ps: ps if len(ps) == 2 and all(
            (p.get("status") or {}).get("phase") == "Running" for p in ps) else None)(
            api.list("Pod", namespace="default", label_selector="app=pair")[0]))
        status = _until("pair Ready", lambda: (lambda s: s if s.get("status") == "Ready" else None)(
            _domain(api, "pair").get("status") or {}))
        assert sorted(n["name"] for n in status["nodes"]) == sorted(p["spec"]["nodeName"] for p in workers)
        for pod in workers:
            claim = api.get("ResourceClaim", pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"],
                            namespace="default")
            assert claim["status"]["allocation"]["devices"]["results"], claim["status"]
            assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pod["metadata"]["uid"]]
            assert "containerID" not in pod["status"]["containerStatuses"][0]  # simulated: nothing ran
        uid = _domain(api, "pair")["metadata"]["uid"]
        daemons = api.list("Pod", namespace="gpu-dra-system", label_selector=f"{cd.DOMAIN_LABEL}={uid}")[0]
        assert len(daemons) == 2
        for d in daemons:  # really running: a runtime container id, a log, on its node's address
            assert d["status"]["containerStatuses"][0]["containerID"], d["status"]
            assert d["status"]["podIP"] == next(n["ipAddress"] for n in status["nodes"]
                                                if n["name"] == d["spec"]["nodeName"])
        # Ready by their probes (NVIDIA's `-v $(LOG_VERBOSITY) check`, expanded by the kubelet), with nvidia-imex
        # run by the stand-in that refuses a container without the driver's device nodes and NVML.
        _until("the daemon pods Ready", lambda: all(
            any(c.get("type") == "Ready" and c.get("status") == "True" for c in (p.get("status") or {}).get(
                "conditions") or []) and p["status"]["containerStatuses"][0].get("started") is True
            for p in api.list("Pod", namespace="gpu-dra-system", label_selector=f"{cd.DOMAIN_LABEL}={uid}")[0]))
        log = _until("a daemon's log", lambda: _log(api, daemons[0]["metadata"]["name"], "gpu-dra-system") or None)
        assert log.strip(), log
        kubectl = [str(ROOT / ".venv" / "bin" / "kubectl"), "-n", "gpu-dra-system", "exec",
                   daemons[0]["metadata"]["name"], "--"]
        probe = subprocess.run([*kubectl, "gpu-dra", "compute-domain-daemon", "check"], env=c.env,
                               capture_output=True, text=True, timeout=60)
        assert probe.returncode == 0 and probe.stdout == "READY\n", probe.stderr

