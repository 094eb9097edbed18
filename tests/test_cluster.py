"""`gpu-dra cluster`: up / status / fault / restart of killed children / down, end to end with real processes.

The official `kubernetes` client talks to the cluster through the merged kubeconfig context; kubectl too where
it is installed. Every process the cluster starts is stopped by `cluster down` (checked), or by the fixture's
clean-up when a step fails.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from controller.expand import expand
from sim.cluster import kubeconfig as kc
from sim.cluster.report import gpu_usage
from sim.cluster.spec import ClusterSpec, SpecError, default_nodes, parse_nodes, pid_alive
from sim.nvml.profile import shipped_profiles
from tests.polling import until
from tests.plugin_helpers import short_tmp

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")
NAME = "t"
CONTEXT = "gpu-dra-t"


_until = functools.partial(until, timeout=90.0)


class Cli:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.kubeconfig = home / "kube" / "config"
        self.env = dict(os.environ, XDG_STATE_HOME=str(home / "state"), KUBECONFIG=str(self.kubeconfig),
                        PYTHONPATH=str(ROOT))

    def run(self, *args: str, timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cli.main", "cluster", *args], env=self.env, cwd=str(ROOT),
                              capture_output=True, text=True, timeout=timeout)

    def status(self) -> dict[str, Any]:
        out = self.run("status", "--name", NAME, "-o", "json")
        return json.loads(out.stdout)

    def pid(self, role: str, node: str | None = None) -> int:
        return next(p["pid"] for p in self.status()["processes"] if p["role"] == role and p["node"] == node)


@pytest.fixture
def cli() -> Iterator[Cli]:
    with short_tmp() as home:
        c = Cli(home)
        try:
            yield c
        finally:
            c.run("down", "--name", NAME, timeout=120)


def _api(cli: Cli) -> k8s_client.ApiClient:
    cfg = k8s_client.Configuration()
    k8s_config.load_kube_config(config_file=str(cli.kubeconfig), context=CONTEXT, client_configuration=cfg)
    return k8s_client.ApiClient(cfg)


def _taints(api: k8s_client.ApiClient, node: str) -> list[dict[str, Any]]:
    slices = k8s_client.ResourceV1Api(api).list_resource_slice().to_dict()["items"]
    return [t for s in slices if s["spec"]["node_name"] == node for d in s["spec"]["devices"] for t in d.get("taints") or []]


def _device_count(api: k8s_client.ApiClient, node: str) -> int:
    slices = k8s_client.ResourceV1Api(api).list_resource_slice().to_dict()["items"]
    return sum(len(s["spec"]["devices"]) for s in slices if s["spec"]["node_name"] == node)


CLAIM_AND_POD = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-gpu, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: gpu.nvidia.com}
---
apiVersion: v1
kind: Pod
metadata: {name: POD, namespace: default}
spec:
  nodeSelector: {kubernetes.io/hostname: NODE}
  containers:
  - name: main
    image: busybox
    resources: {claims: [{name: gpu}]}
  resourceClaims:
  - {name: gpu, resourceClaimTemplateName: one-gpu}
"""


def pod_spec(node: str) -> dict[str, Any]:
    return {"nodeSelector": {"kubernetes.io/hostname": node}, "containers": [{"name": "main", "image": "busybox"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]}


def _pod_phase(api: k8s_client.ApiClient, name: str) -> str | None:
    pod = k8s_client.CoreV1Api(api).read_namespaced_pod(name, "default")
    return pod.status.phase if pod.status else None


def _create_pod(api: k8s_client.ApiClient, name: str, node: str) -> None:
    docs = list(yaml.safe_load_all(CLAIM_AND_POD.replace("POD", name).replace("NODE", node)))
    try:
        k8s_client.ResourceV1Api(api).create_namespaced_resource_claim_template("default", docs[0])
    except k8s_client.ApiException as exc:
        assert exc.status == 409
    k8s_client.CoreV1Api(api).create_namespaced_pod("default", docs[1])


@pytest.mark.process
def test_cluster_up_fault_restart_down(cli: Cli) -> None:
    up = cli.run("up", "--name", NAME, "--nodes", "small=t4-1,quad=v100-4", "--runtime", "none")
    assert up.returncode == 0, up.stderr
    assert f"kubeconfig context {CONTEXT} written to {cli.kubeconfig}" in up.stdout
    assert f"gpu-dra cluster: switched the current kubectl context in {cli.kubeconfig} to {CONTEXT} (" in up.stderr
    assert "node quad (v100-4): Ready, agent registered, 4 devices published" in up.stderr  # a progress line
    config = yaml.safe_load(cli.kubeconfig.read_text())
    assert config["current-context"] == CONTEXT
    state = cli.home / "state" / "gpu-dra" / "clusters" / NAME
    assert (state / "store.db").exists() and not str(state).startswith(str(ROOT))
    # the store (every Secret) and the logs are the user's alone
    assert {p.name: p.stat().st_mode & 0o777 for p in (state, state / "logs", state / "store.db")} == {
        state.name: 0o700, "logs": 0o700, "store.db": 0o600}
    assert {p.name: p.stat().st_mode & 0o777 for p in (state / "logs").iterdir()} == {
        p.name: 0o600 for p in (state / "logs").iterdir()}

    # a second `up` of the same name is refused; status and list show the cluster
    again = cli.run("up", "--name", NAME, "--nodes", "x=t4-1")
    assert again.returncode == 1 and "already up" in again.stderr
    status = cli.status()
    assert status["name"] == NAME and status["server"].startswith("https://127.0.0.1:")
    assert status["kubeconfig"] == str(cli.kubeconfig)
    assert {n["name"]: (n["profile"], n["ready"], n["gpusInUse"], n["gpusTotal"]) for n in status["nodes"]} == {
        "small": ("t4-1", True, 0, 1), "quad": ("v100-4", True, 0, 4)}
    roles = sorted((p["role"], p["node"] or "") for p in status["processes"])
    assert roles == [("apiserver", ""), ("controller", ""), ("kubelet", "quad"), ("kubelet", "small"),
                     ("plugin", "quad"), ("plugin", "small"), ("supervisor", "")]
    listed = json.loads(cli.run("list", "-o", "json").stdout)
    assert listed == {"clusters": [{"name": NAME, "state": "ready", "nodes": 2, "server": status["server"]}]}

    api = _api(cli)
    try:
        nodes = {n.metadata.name for n in k8s_client.CoreV1Api(api).list_node().items}
        assert nodes == {"small", "quad"}
        _check_credentials(cli, api, state)
        _create_pod(api, "first", "quad")
        _until("pod first Running", lambda: _pod_phase(api, "first") == "Running")
        assert {n["name"]: n["gpusInUse"] for n in cli.status()["nodes"]}["quad"] == 1
        # The pod's hostIP is its node's InternalIP (each node has a loopback address of its own), and its
        # conditions come in the kubelet's order.
        core = k8s_client.CoreV1Api(api)
        internal = next(a.address for a in core.read_node("quad").status.addresses if a.type == "InternalIP")
        first = core.read_namespaced_pod("first", "default").status
        assert internal != "127.0.0.1" and first.host_ip == internal and [ip.ip for ip in first.host_ips] == [internal]
        assert [c.type for c in first.conditions] == ["PodReadyToStartContainers", "Initialized", "Ready",
                                                      "ContainersReady", "PodScheduled"]

        # workload controllers: a Deployment's pods come from the ReplicaSet the offline tools name (the API server
        # picks each pod's 5-character suffix, as on a cluster), and go with it
        _check_deployment(api, "web", pod_spec("quad"))

        # a fault through the node's faults file: the taint appears on the slice
        assert not _taints(api, "quad")
        fault = cli.run("fault", "quad", "--name", NAME, "--gpu", "2", "--xid", "48")
        assert fault.returncode == 0, fault.stderr
        taint = _until("the Xid taint", lambda: [t for t in _taints(api, "quad") if t["key"] == "gpu.nvidia.com/xid"])
        assert taint[0]["value"] == "48" and taint[0]["effect"] == "NoSchedule"

        lost = cli.run("fault", "quad", "--name", NAME, "--gpu", "3", "--lost")
        assert lost.returncode == 0, lost.stderr
        _until("the gpu-lost taint", lambda: [t for t in _taints(api, "quad") if t["key"] == "gpu.nvidia.com/gpu-lost"])

        # a killed node agent and a killed controller are restarted; the cluster keeps working
        agent, controller = cli.pid("plugin", "quad"), cli.pid("controller")
        os.kill(agent, signal.SIGKILL)
        os.kill(controller, signal.SIGKILL)
        _until("restarted agent and controller",
               lambda: cli.pid("plugin", "quad") != agent and cli.pid("controller") != controller)
        restarted = {(p["role"], p["node"]): p["restarts"] for p in cli.status()["processes"]}
        assert restarted[("plugin", "quad")] == 1 and restarted[("controller", None)] == 1
        _create_pod(api, "second", "quad")
        _until("pod second Running after the restarts", lambda: _pod_phase(api, "second") == "Running")
        # NVML does not replay Xid events to a new process and no longer enumerates a GPU that fell off the bus, but
        # the agent kept both faults in its checkpoint: the restarted agent publishes all four GPUs, both still tainted
        _until("the restarted agent to publish 4 GPUs, the faulty ones tainted",
               lambda: _device_count(api, "quad") == 4
               and {(t["key"], t.get("value")) for t in _taints(api, "quad")} >= {
                   ("gpu.nvidia.com/xid", "48"), ("gpu.nvidia.com/gpu-lost", None)})

        # a killed control plane comes back on the same URL with everything in its store
        apiserver = cli.pid("apiserver")
        os.kill(apiserver, signal.SIGKILL)
        _until("restarted apiserver", lambda: cli.pid("apiserver") != apiserver)
        assert cli.status()["server"] == status["server"]
        _until("pods after the control plane restart", lambda: _pod_phase(api, "second") == "Running")
        # the workload controllers and PodGC kept valid credentials: a new Deployment still gets its pods
        _check_deployment(api, "after", {"nodeSelector": {"kubernetes.io/hostname": "small"},
                                         "containers": [{"name": "main", "image": "busybox"}]})

        # clear = GPU reset: the recorded faults are forgotten, the agent restarts and the taints go
        cleared = cli.run("fault", "quad", "--name", NAME, "--clear")
        assert cleared.returncode == 0, cleared.stderr
        _until("all 4 GPUs back, untainted", lambda: _device_count(api, "quad") == 4 and not _taints(api, "quad"))

        # a supervisor killed with SIGKILL is started again by its keeper: it stops what the old one left and
        # brings the cluster back on the same URL; the kubelets adopt the running pods (their claims stay prepared)
        supervisor = cli.pid("supervisor")
        old_children = [p["pid"] for p in cli.status()["processes"] if p["role"] in ("apiserver", "controller", "plugin")]
        os.kill(supervisor, signal.SIGKILL)
        _until("a new supervisor, ready", lambda: (s := cli.status()) and s.get("state") == "ready"
               and cli.pid("supervisor") != supervisor, timeout=180)
        assert cli.status()["server"] == status["server"]
        _until("the old supervisor's children to be gone", lambda: not any(pid_alive(p) for p in old_children) or None)
        _until("pod second Running under the new supervisor", lambda: _pod_phase(api, "second") == "Running")
        # deleting the pods releases their GPUs on the node (nothing leaked across the restarts and the reset)
        for pod in ("first", "second"):
            k8s_client.CoreV1Api(api).delete_namespaced_pod(pod, "default")
        _until("no GPU in use on quad", lambda: {n["name"]: n["gpusInUse"] for n in cli.status()["nodes"]}["quad"] == 0)
        cdi_dir = state / "nodes" / "quad"
        _until("no claim CDI spec left", lambda: not list(cdi_dir.rglob("k8s.gpu.nvidia.com-claim_*.json")) or None)

        if shutil.which("kubectl"):
            out = subprocess.run(["kubectl", "--context", CONTEXT, "get", "nodes", "-o", "name"], env=cli.env,
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            assert sorted(out.stdout.split()) == ["node/quad", "node/small"]
    finally:
        api.close()

    pids = [p["pid"] for p in cli.status()["processes"]] + [int((state / "keeper.pid").read_text())]
    down = cli.run("down", "--name", NAME)
    assert down.returncode == 0, down.stderr
    assert f"context {CONTEXT} removed" in down.stdout
    assert CONTEXT not in cli.kubeconfig.read_text()
    assert not state.exists()
    _until("every process to exit", lambda: not any(pid_alive(p) for p in pids) or None, timeout=30)
    assert cli.run("status", "--name", NAME).returncode == 1


def _check_deployment(api: k8s_client.ApiClient, name: str, spec: dict[str, Any]) -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": "default"},
                  "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}},
                           "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}}
    k8s_client.AppsV1Api(api).create_namespaced_deployment("default", deployment)
    offline = sorted(p["metadata"]["name"][:-5] for p in expand([deployment]))
    _until(f"the Deployment {name}'s pods Running", lambda: sorted(
        p.metadata.name[:-5] for p in k8s_client.CoreV1Api(api).list_namespaced_pod("default").items
        if p.metadata.name.startswith(f"{name}-") and p.status.phase == "Running") == offline)
    k8s_client.AppsV1Api(api).delete_namespaced_deployment(name, "default")
    _until(f"the Deployment {name}'s pods to go", lambda: not [
        p for p in k8s_client.CoreV1Api(api).list_namespaced_pod("default").items
        if p.metadata.name.startswith(f"{name}-")])


def _anonymous_get(url: str, path: str) -> tuple[int, dict[str, Any]]:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url + path, timeout=30, context=context) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _check_credentials(cli: Cli, api: k8s_client.ApiClient, state: Path) -> None:
    """The context is HTTPS with its CA and the admin's token; a request without credentials is anonymous on every
    port the control plane listens on, and a ServiceAccount's token is that account, for kubectl too."""
    context = next(c for c in yaml.safe_load(cli.kubeconfig.read_text())["clusters"] if c["name"] == CONTEXT)
    assert context["cluster"]["server"].startswith("https://") and context["cluster"]["certificate-authority-data"]
    log = (state / "logs" / "apiserver.log").read_text()
    plain = log.split("msg=serving url=", 1)[1].split()[0]
    for url in (plain, context["cluster"]["server"]):
        code, body = _anonymous_get(url, "/api/v1/secrets")
        assert code == 403 and 'User "system:anonymous" cannot list resource "secrets"' in body["message"], (url, body)
    core = k8s_client.CoreV1Api(api)
    core.create_namespaced_service_account("default", {"metadata": {"name": "ci-runner"}})
    token = core.create_namespaced_service_account_token("ci-runner", "default", {"spec": {}}).status.token
    if shutil.which("kubectl"):
        whoami = subprocess.run(["kubectl", "--context", CONTEXT, "--token", token, "auth", "whoami", "-o", "json"],
                                env=cli.env, capture_output=True, text=True, timeout=60)
        assert whoami.returncode == 0, whoami.stderr
        assert json.loads(whoami.stdout)["status"]["userInfo"]["username"] == "system:serviceaccount:default:ci-runner"
        denied = subprocess.run(["kubectl", "--context", CONTEXT, "--token", token, "get", "secrets", "-A"],
                                env=cli.env, capture_output=True, text=True, timeout=60)
        assert denied.returncode == 1 and "system:serviceaccount:default:ci-runner" in denied.stderr


@pytest.mark.process
def test_fault_and_stand_in_errors_name_what_is_accepted(cli: Cli, tmp_path: Path) -> None:
    assert cli.run("fault", "n1", "--name", NAME, "--gpu", "0", "--xid", "79").returncode == 1  # no such cluster
    missing = cli.run("stand-in", "--name", NAME, "busybox")
    assert missing.returncode == 1 and f"no cluster named {NAME!r}" in missing.stderr
    nothing = cli.run("stand-in", "--name", NAME)
    assert nothing.returncode == 2 and "no image" in nothing.stderr
    no_file = cli.run("stand-in", "--name", NAME, "-f", str(tmp_path / "absent.yaml"))
    assert no_file.returncode == 2 and "absent.yaml: No such file or directory" in no_file.stderr
    spec = tmp_path / "spec.yaml"
    spec.write_text("kind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, image: 'Bad Name'}]}\n")
    bad = cli.run("stand-in", "--name", NAME, "-f", str(spec))
    assert bad.returncode == 2 and "Pod p.spec.containers[0].image: 'Bad Name' is not an image reference" in bad.stderr
    bad_image = cli.run("stand-in", "--name", NAME, "Ubuntu:22.04")
    assert bad_image.returncode == 2 and "'Ubuntu:22.04' is not an image reference" in bad_image.stderr
    up = cli.run("up", "--name", NAME, "--nodes", "n1=t4-1")
    assert up.returncode == 0, up.stderr
    embedded = cli.run("stand-in", "--name", NAME, "nvcr.io/nvidia/cuda:12.9.0-base-ubuntu24.04")
    assert embedded.returncode == 0 and "runs every image on the busybox stand-in already" in embedded.stderr
    bad_gpu = cli.run("fault", "n1", "--name", NAME, "--gpu", "7", "--xid", "79")
    assert bad_gpu.returncode == 2 and "--gpu 7: not a GPU of node n1; its GPUs: 0=GPU-" in bad_gpu.stderr
    bad_node = cli.run("fault", "nope", "--name", NAME, "--gpu", "0", "--lost")
    assert bad_node.returncode == 2 and "its nodes: n1" in bad_node.stderr
    no_gpu = cli.run("fault", "n1", "--name", NAME, "--xid", "79")
    assert no_gpu.returncode == 2 and "--gpu" in no_gpu.stderr
    bad_xid = cli.run("fault", "n1", "--name", NAME, "--gpu", "0", "--xid", "x")
    assert bad_xid.returncode == 2 and "expected an Xid number" in bad_xid.stderr and "Traceback" not in bad_xid.stderr


@pytest.mark.process
def test_manifests_is_an_upstream_flag_naming_a_kustomization(cli: Cli, tmp_path: Path) -> None:
    embedded = cli.run("up", "--name", NAME, "--manifests", "manifests/testbed")
    assert embedded.returncode == 2 and "--manifests: only with --kubernetes upstream" in embedded.stderr
    missing = cli.run("up", "--name", NAME, "--kubernetes", "upstream", "--manifests", str(tmp_path))
    assert missing.returncode == 2 and f"--manifests {tmp_path}: not a kustomization directory" in missing.stderr


def test_parse_nodes() -> None:
    shipped = shipped_profiles()
    assert [(n.name, n.profile, n.device_plugin) for n in parse_nodes("a=t4-1, b=v100-4", shipped, device_plugin=True)] \
        == [("a", "t4-1", True), ("b", "v100-4", True)]
    for text, message in [("a", "expected NAME=PROFILE"), ("a=nope", "neither a shipped profile"),
                          ("A=t4-1", "DNS label"), ("a=t4-1,a=t4-1", "given twice"), ("", "at least one")]:
        with pytest.raises(SpecError, match=message):
            parse_nodes(text, shipped, device_plugin=False)
    assert [n.name for n in default_nodes(device_plugin=False)] == ["a100-1", "a100-2", "v100-1", "h100-1"]
    spec = ClusterSpec("x", default_nodes(device_plugin=False), "none", ("DRADeviceTaints=true",), True)
    assert ClusterSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


def test_a_node_file_that_is_not_a_profile_is_refused_at_once(tmp_path: Path) -> None:
    shipped = shipped_profiles()
    manifest, binary = tmp_path / "pod.yaml", tmp_path / "blob"
    manifest.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n")
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SpecError) as caught:
        parse_nodes(f"a={manifest}", shipped, device_plugin=False)
    message = str(caught.value)
    assert message.startswith(f"--nodes: 'a={manifest}': not a simulator profile: {manifest}: ")
    assert "apiVersion: Extra inputs are not permitted" in message
    with pytest.raises(SpecError, match="not a simulator profile: .*blob: not a text file"):
        parse_nodes(f"b={binary}", shipped, device_plugin=False)


def test_kubeconfig_merge_keeps_other_entries(tmp_path: Path) -> None:
    path = tmp_path / "config"
    other = {"apiVersion": "v1", "kind": "Config", "current-context": "prod",
             "clusters": [{"name": "prod", "cluster": {"server": "https://prod"}}],
             "users": [{"name": "prod", "user": {"token": "x"}}],
             "contexts": [{"name": "prod", "context": {"cluster": "prod", "user": "prod"}}]}
    path.write_text(yaml.safe_dump(other))
    admin = tmp_path / "admin"
    previous = []
    for port in (1, 2):  # up again: replaced, not duplicated
        admin.write_text(yaml.safe_dump({"clusters": [{"name": "gpu-dra", "cluster": {
            "server": f"https://127.0.0.1:{port}", "certificate-authority-data": "Q0E="}}],
            "users": [{"name": "gpu-dra", "user": {"token": "secret"}}]}))
        previous.append(kc.merge(path, "dev", admin))
    assert previous == ["prod", "gpu-dra-dev"]
    merged = yaml.safe_load(path.read_text())
    assert [c["name"] for c in merged["contexts"]] == ["prod", "gpu-dra-dev"]
    assert merged["clusters"][1]["cluster"] == {"server": "https://127.0.0.1:2", "certificate-authority-data": "Q0E="}
    assert merged["users"][1]["user"] == {"token": "secret"}
    assert path.stat().st_mode & 0o777 == 0o600
    assert merged["current-context"] == "gpu-dra-dev"
    assert kc.remove(path, "dev") is True
    assert yaml.safe_load(path.read_text()) | {"preferences": None} == other | {"current-context": "", "preferences": None}
    assert kc.target_file(None, {"KUBECONFIG": f"/a/one{os.pathsep}/b/two"}) == Path("/a/one")
    path.write_text("clusters: [")
    with pytest.raises(kc.KubeconfigError, match="not a valid kubeconfig"):
        kc.merge(path, "dev", admin)


def test_up_says_it_switched_the_current_context(tmp_path: Path) -> None:
    path = tmp_path / "config"
    assert kc.switch_notice("dev", "prod", path) == (
        f"switched the current kubectl context in {path} to gpu-dra-dev (was prod; "
        "`kubectl config use-context prod` switches back)")
    assert kc.switch_notice("dev", "", path) == f"switched the current kubectl context in {path} to gpu-dra-dev (none was set before)"
    assert kc.switch_notice("dev", "gpu-dra-dev", path) == ""


def test_gpu_usage_counts_physical_gpus() -> None:
    def dev(name: str, uuid: str, parent: str | None = None) -> dict[str, Any]:
        attrs = {"uuid": {"string": uuid}} | ({"parentUUID": {"string": parent}} if parent else {})
        return {"name": name, "attributes": attrs}

    slices = [{"spec": {"nodeName": "n", "driver": "d", "pool": {"name": "n"},
                        "devices": [dev("g0", "GPU-0"), dev("m0", "MIG-0", "GPU-1"), dev("m1", "MIG-1", "GPU-1")]}}]
    claims = [{"status": {"allocation": {"devices": {"results": [
        {"driver": "d", "pool": "n", "device": "m0"}, {"driver": "d", "pool": "n", "device": "m1"}]}}}}]
    assert gpu_usage("n", slices, claims, "d") == (1, 2)
    assert gpu_usage("other", slices, claims, "d") == (0, 0)
    # A GPU the device plugin shim gave a legacy nvidia.com/gpu pod is in use as well (the shim's slice taint).
    slices[0]["spec"]["devices"][0]["taints"] = [{"key": "d/device-plugin", "effect": "NoSchedule"}]
    assert gpu_usage("n", slices, claims, "d") == (2, 2)


def test_workload_controllers_plan_owners_then_pods() -> None:
    from sim.cluster.workloads import plan, workload_status

    template = {"metadata": {"labels": {"app": "w"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    deploy = {"metadata": {"name": "web", "namespace": "default", "uid": "d-1"},
              "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "w"}}, "template": template}}
    first = plan({"Deployment": [deploy]})
    ((kind, made),) = first.create
    phash = made["metadata"]["labels"]["pod-template-hash"]
    assert kind == "ReplicaSet" and made["metadata"]["name"] == f"web-{phash}"
    assert made["metadata"]["ownerReferences"][0] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                                                      "uid": "d-1", "controller": True, "blockOwnerDeletion": True}
    rs = {**first.create[0][1], "metadata": {**first.create[0][1]["metadata"], "uid": "rs-1"}}
    second = plan({"Deployment": [deploy], "ReplicaSet": [rs]})
    made_pods = [o for k, o in second.create if k == "Pod"]
    # The ReplicaSet's pods are named by the API server (generateName), as kube-controller-manager creates them.
    assert [p["metadata"]["generateName"] for p in made_pods] == [f"web-{phash}-"] * 2
    assert all("name" not in p["metadata"] for p in made_pods)
    assert all(p["metadata"]["ownerReferences"][0]["uid"] == "rs-1" for p in made_pods)
    pods = [{**p, "metadata": {**p["metadata"], "name": f"web-{phash}-{i}"}} for i, p in enumerate(made_pods)]
    # Counted, not named: the ReplicaSet with its pods wants nothing more, and one more pod is one too many.
    assert [k for k, _ in plan({"Deployment": [deploy], "ReplicaSet": [rs], "Pod": pods}).create] == []
    extra = {**pods[0], "metadata": {**pods[0]["metadata"], "name": f"web-{phash}-x", "creationTimestamp": "2026-12-02T00:00:00Z"}}
    assert plan({"Deployment": [deploy], "ReplicaSet": [rs], "Pod": [*pods, extra]}).delete == [("Pod", ("default", f"web-{phash}-x"))]
    running = [{**p, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}} for p in pods]
    assert workload_status("Deployment", deploy, {"ReplicaSet": [rs], "Pod": [
        {**p, "status": {"phase": "Running"}} for p in pods]})["readyReplicas"] == 0  # Running is not Ready
    assert workload_status("Deployment", deploy, {"ReplicaSet": [rs], "Pod": running})["readyReplicas"] == 2
    # A ReplicaSet counts its active pods only: a terminating or finished one is no longer one of its replicas.
    leaving = {**running[0], "metadata": {**running[0]["metadata"], "deletionTimestamp": "2026-12-02T00:00:30Z"}}
    done = {**running[1], "status": {"phase": "Succeeded"}}
    assert workload_status("ReplicaSet", rs, {"Pod": [leaving, done]})["replicas"] == 0
    assert workload_status("ReplicaSet", rs, {"Pod": [leaving, running[1]]})["replicas"] == 1
    # the Deployment is gone: its ReplicaSet goes, then the ReplicaSet's pods (the garbage collector's order)
    gone = plan({"ReplicaSet": [rs], "Pod": running})
    assert gone.delete == [("ReplicaSet", ("default", rs["metadata"]["name"]))]
    orphans = plan({"Pod": running})
    assert sorted(n for _, (_, n) in orphans.delete) == sorted(p["metadata"]["name"] for p in pods)
    bad = plan({"StatefulSet": [{"metadata": {"name": "db"}, "spec": {"replicas": -1, "template": template}}]})
    assert bad.problems == ["StatefulSet/default/db: spec.replicas: -1: expected a non-negative integer"]


def test_node_socket_paths_fit_under_a_long_runtime_dir(tmp_path: Path) -> None:
    """An 18-character directory under /run/user used to push the node sockets past the 105-byte limit."""
    from sim.cluster.spec import cluster_paths, default_nodes, links_home

    runtime = tmp_path / ("x" * 18)
    runtime.mkdir()
    links = Path(f"/run/user/{'x' * 18}") / "gd" / ("x" * 8)  # mkdtemp's 8 characters
    assert cluster_paths("gpu-dra", {"XDG_STATE_HOME": str(tmp_path)}).socket_problem(
        links, default_nodes(device_plugin=False)) is None
    assert links_home({"XDG_RUNTIME_DIR": str(runtime)}) == runtime / "gd"
