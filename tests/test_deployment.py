"""What a real GPU node needs from the shipped manifests (read against NVIDIA's DRA driver chart), and RBAC that
grants every API call the code makes, derived from the code's KubeApi and Writer calls rather than listed by hand."""

from __future__ import annotations

import ast
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.manager import CLUSTER_KINDS
from gpudra.kubeapi import KINDS

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "manifests"
NAMESPACE = "gpu-dra-system"

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")


def build(overlay: str = "") -> list[dict[str, Any]]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(MANIFESTS / overlay)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    return [o for o in yaml.safe_load_all(out) if o]


def agent_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    ds = next(o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "gpu-dra-node-agent")
    return ds["spec"]["template"]["spec"]


# ---- the node agent's pod ---------------------------------------------------------------------------------


@pytest.mark.process
def test_node_agent_is_privileged_with_dev_and_driver_root_and_no_gpus_injected() -> None:
    spec = agent_pod(build())
    (container,) = spec["containers"]
    assert container["securityContext"]["privileged"] is True
    assert "capabilities" not in container["securityContext"]  # nothing dropped from a privileged container
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env["GPU_DRA_NVML"] == "real"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts["/dev"]["name"]]["hostPath"]["path"] == "/dev"
    root = mounts["/driver-root"]
    assert root["readOnly"] and root["mountPropagation"] == "HostToContainer"
    assert volumes[root["name"]]["hostPath"]["path"] == "/"
    assert "--driver-root=/driver-root" in container["args"]
    plugins = mounts["/var/lib/kubelet/plugins"]
    assert plugins["mountPropagation"] == "Bidirectional"  # the MPS shm tmpfs must reach the host
    for path in ("/var/lib/kubelet/plugins_registry", "/var/run/cdi"):
        assert path in mounts


@pytest.mark.process
def test_node_agent_runs_on_gpu_nodes_only_and_tolerates_the_gpu_taint() -> None:
    spec = agent_pod(build())
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {e["key"]: e["values"] for t in terms for e in t["matchExpressions"]}
    assert keys["feature.node.kubernetes.io/pci-10de.present"] == ["true"]
    assert keys["nvidia.com/gpu.present"] == ["true"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]


@pytest.mark.process
def test_device_plugin_shim_is_opt_in() -> None:
    assert "--device-plugin" not in agent_pod(build())["containers"][0]["args"]
    assert "--device-plugin" in agent_pod(build("device-plugin"))["containers"][0]["args"]


@pytest.mark.process
def test_kind_overlay_runs_the_simulator_on_unlabelled_nodes() -> None:
    spec = agent_pod(build("kind/overlay"))
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    # Each worker simulates the profile its gpu-dra.simulated-profile label names (manifests/kind/cluster.yaml).
    assert env["GPU_DRA_NVML"] == "sim:node-label"
    assert "affinity" not in spec
    container = spec["containers"][0]
    # The testbed image carries the simulator (the product image does not); on a node the agent's state is the
    # kubelet's, not the simulator's private default, or it would never register.
    assert container["image"] == "ghcr.io/gpu-dra/gpu-dra:v0.1.0-testbed"
    assert {"--kubelet-dir=/var/lib/kubelet", "--cdi-dir=/var/run/cdi"} <= set(container["args"])


@pytest.mark.process
def test_the_manifests_name_the_image_the_build_produces() -> None:
    from sim.upstream.images import product_reference

    assert agent_pod(build())["containers"][0]["image"] == product_reference()
    assert agent_pod(build("testbed"))["containers"][0]["image"] == product_reference(testbed=True)


def test_each_kind_worker_gets_the_profile_its_label_names(apiserver: Any) -> None:
    from driver.commands.plugin import CLIQUE_LABEL, PROFILE_LABEL, resolve_nvml_spec

    cluster = yaml.safe_load((MANIFESTS / "kind/cluster.yaml").read_text())
    profiles = [n["labels"][PROFILE_LABEL] for n in cluster["nodes"] if n["role"] == "worker"]
    assert profiles == ["dgx-a100", "v100-4"]
    for i, profile in enumerate(profiles):
        apiserver.api.create("Node", {"metadata": {"name": f"worker-{i}", "labels": {PROFILE_LABEL: profile}}})
        assert resolve_nvml_spec("sim:node-label", apiserver.api, f"worker-{i}") == f"sim:{profile}"
    apiserver.api.create("Node", {"metadata": {"name": "plain"}})
    with pytest.raises(ValueError, match="Node plain has no gpu-dra.simulated-profile label; set it to one of .*dgx-a100"):
        resolve_nvml_spec("sim:node-label", apiserver.api, "plain")
    with pytest.raises(ValueError, match="Node absent does not exist"):
        resolve_nvml_spec("sim:node-label", apiserver.api, "absent")
    assert resolve_nvml_spec("sim:t4-1", apiserver.api, "absent") == "sim:t4-1"
    # A fabric profile's clique comes from its own label (a label value cannot hold `?clique=N`).
    apiserver.api.create("Node", {"metadata": {"name": "gb200", "labels": {PROFILE_LABEL: "gb200-nvl",
                                                                           CLIQUE_LABEL: "2"}}})
    assert resolve_nvml_spec("sim:node-label", apiserver.api, "gb200") == "sim:gb200-nvl?clique=2"
    apiserver.api.create("Node", {"metadata": {"name": "bad", "labels": {PROFILE_LABEL: "gb200-nvl",
                                                                         CLIQUE_LABEL: "two"}}})
    with pytest.raises(ValueError, match="gpu-dra.simulated-clique='two': expected a clique id"):
        resolve_nvml_spec("sim:node-label", apiserver.api, "bad")


# ---- RBAC derived from the code ---------------------------------------------------------------------------

# KubeApi methods -> (verb, subresource); `watch` is list + watch.
KUBEAPI_VERBS: dict[str, list[tuple[str, str]]] = {
    "get": [("get", "")], "try_get": [("get", "")], "list": [("list", "")], "watch": [("list", ""), ("watch", "")],
    "create": [("create", "")], "replace": [("update", "")], "replace_status": [("update", "status")],
    "patch": [("patch", "")], "delete": [("delete", "")],
}
# controller.writes.Writer methods -> what they call on the API (updates re-read on a conflict, delete reads after).
WRITER_VERBS: dict[str, list[tuple[str, str]]] = {
    "read": [("get", "")], "create": [("create", "")], "update": [("update", ""), ("get", "")],
    "update_status": [("update", "status"), ("get", "")], "patch": [("patch", "")],
    "patch_status": [("patch", "status")], "delete": [("delete", ""), ("get", "")],
}
API_RECEIVERS = {"api", "_api"}
WRITER_RECEIVERS = {"writer", "_writer"}
# Code of the driver package that runs in the ComputeDomain IMEX daemon pods, under their own ServiceAccount.
IMEX_DAEMON = {"driver/computedomain/daemon.py", "driver/commands/computedomaindaemon.py"}
@dataclass(frozen=True)
class Need:
    group: str
    resource: str  # plural, or plural/subresource
    verb: str
    where: str


def _receiver_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _literal_kind(call: ast.Call) -> str | None:
    if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
        return call.args[0].value
    return None


def needs_of(path: Path) -> Iterator[Need]:
    tree = ast.parse(path.read_text(), str(path))
    rel = str(path.relative_to(ROOT))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "bind_pod":
            yield Need("", "pods/binding", "create", f"{rel}:{node.lineno}")  # controller.writes.bind_pod
            continue
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        method, receiver = node.func.attr, _receiver_name(node.func.value)
        where = f"{rel}:{node.lineno}"
        if receiver in API_RECEIVERS and method == "bind_pod":
            if rel != "controller/writes.py":  # the wrapper's own call; its callers are counted above
                yield Need("", "pods/binding", "create", where)
            continue
        table = KUBEAPI_VERBS if receiver in API_RECEIVERS else WRITER_VERBS if receiver in WRITER_RECEIVERS else None
        if table is None or method not in table:
            continue
        kind = _literal_kind(node)
        if kind is None:
            continue  # the generic wrappers (Writer, Informer) themselves; their callers name the kind
        info = KINDS[kind]
        sub = next((k.value for k in node.keywords if k.arg == "subresource" and isinstance(k.value, ast.Constant)), None)
        for verb, subresource in table[method]:
            subresource = subresource or (str(sub.value) if sub is not None else "")
            yield Need(info.group, f"{info.plural}/{subresource}" if subresource else info.plural, verb, where)


def code_needs(package: str, excluded: set[str] = IMEX_DAEMON) -> list[Need]:
    out: list[Need] = []
    for path in sorted((ROOT / package).rglob("*.py")):
        if str(path.relative_to(ROOT)) in excluded:
            continue
        out.extend(needs_of(path))
    return out


def granted(objects: list[dict[str, Any]], service_account: str) -> set[tuple[str, str, str]]:
    """(group, resource, verb) the service account gets from the shipped (Cluster)Roles and bindings."""
    roles = {(o["kind"], o["metadata"]["name"]): o for o in objects if o["kind"] in ("Role", "ClusterRole")}
    out: set[tuple[str, str, str]] = set()
    for b in objects:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == service_account and s["namespace"] == NAMESPACE
                   for s in b["subjects"]):
            continue
        role = roles[(b["roleRef"]["kind"], b["roleRef"]["name"])]
        for rule in role["rules"]:
            for g in rule["apiGroups"]:
                for r in rule["resources"]:
                    for v in rule["verbs"]:
                        out.add((g, r, v))
    return out


def _missing(needs: list[Need], grants: set[tuple[str, str, str]]) -> list[str]:
    return sorted({f"{n.verb} {n.resource} ({n.group or 'core'}) for {n.where}"
                   for n in needs if (n.group, n.resource, n.verb) not in grants})


@pytest.mark.slow
def test_the_derivation_sees_the_calls_it_must() -> None:
    """A guard against a derivation that silently finds nothing: known calls are found."""
    controller = {(n.resource, n.verb) for n in code_needs("controller")}
    assert {("events", "get"), ("events", "create"), ("resourceclaims/status", "update"), ("pods", "patch"),
            ("leases", "update")} <= controller
    agent = {(n.resource, n.verb) for n in code_needs("driver")}
    assert {("resourceslices", "create"), ("resourceslices", "watch"), ("resourceclaims", "get"),
            ("deployments", "create"), ("deployments", "delete"), ("pods", "list")} <= agent


@pytest.mark.process
def test_controller_rbac_grants_every_call_the_controller_makes() -> None:
    needs = code_needs("controller")
    # The informers list and watch these kinds (named in a constant, not at the call).
    for kind in CLUSTER_KINDS:
        info = KINDS[kind]
        needs += [Need(info.group, info.plural, v, "controller/manager.py CLUSTER_KINDS") for v in ("list", "watch")]
    assert _missing(needs, granted(build(), "gpu-dra-controller")) == []


@pytest.mark.process
def test_node_agent_rbac_grants_every_call_the_agent_makes() -> None:
    needs = code_needs("driver")
    assert _missing(needs, granted(build(), "gpu-dra-node-agent")) == []


@pytest.mark.process
def test_imex_daemon_rbac_grants_every_call_the_daemon_makes() -> None:
    needs = [n for path in sorted(IMEX_DAEMON) for n in needs_of(ROOT / path)]
    assert needs, "the derivation found no API call in the IMEX daemon's code"
    assert _missing(needs, granted(build(), "compute-domain-daemon-service-account")) == []


def test_the_controller_reaches_the_testbed_roles_only_through_embedded_mode() -> None:
    """kube-scheduler's and kube-controller-manager's work (placement, binding, claims from templates, taint
    eviction) is the testbed's (sim.roles), so none of it is in the controller package the image ships
    and none of its API calls needs the deployed controller's RBAC: the one import of the testbed is the
    `--embedded` flag's, inside the function that loads it."""
    testbed = {"controlplane", "sim", "bench"}
    found: list[tuple[str, int]] = []
    for path in sorted((ROOT / "controller").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(name.split(".")[0] in testbed for name in names):
                found.append((str(path.relative_to(ROOT)), node.lineno))
    assert len(found) == 1 and found[0][0] == "controller/commands/controller.py", found
    tree = ast.parse((ROOT / "controller/commands/controller.py").read_text())
    loader = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "embedded_roles")
    assert loader.lineno <= found[0][1] <= (loader.end_lineno or 0)
