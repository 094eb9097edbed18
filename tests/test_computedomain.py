"""ComputeDomains (compute-domain.nvidia.com): the shared validation, the controller's objects and status, the
node plugin's slice and readiness, the IMEX stand-ins over real TCP, fabric faults through NVML, the simulated
racks, and clique-gang placement offline."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.computedomain import channel_template, daemon_set, daemon_template, domain_status
from driver.computedomain.fabric import fabric_health, node_clique
from driver.computedomain.slices import build_slice
from driver.discovery import discover
from driver.nvml import load_backend
from gpudra import computedomain as cd
from sim.cluster.spec import SpecError, gb200_racks, parse_nodes, with_addresses
from sim.nvml.faults import write_faults
from sim.nvml.profile import shipped_profiles

ROOT = Path(__file__).resolve().parents[1]
DOMAIN = {"apiVersion": cd.API_VERSION, "kind": "ComputeDomain",
          "metadata": {"name": "train", "namespace": "ml", "uid": "1234abcd-0000-4000-8000-000000000000"},
          "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": "train-channel"},
                                              "allocationMode": "Single"}}}


def test_config_and_domain_validation_name_fields_and_accepted_values() -> None:
    ok = {"apiVersion": cd.API_VERSION, "kind": cd.CHANNEL_CONFIG_KIND, "domainID": "u", "allocationMode": "All"}
    assert cd.validate_config(ok) == []
    assert cd.validate_config({**ok, "allocationMode": "Some"}) == [
        "allocationMode: Unsupported value: 'Some': supported values: \"All\", \"Single\""]
    assert cd.validate_config({"apiVersion": cd.API_VERSION, "kind": cd.DAEMON_CONFIG_KIND}) == [
        "domainID: Required value: domainID cannot be empty"]
    bad = {**DOMAIN, "spec": {"numNodes": -1, "channel": {"resourceClaimTemplate": {"name": "Bad_Name"}}}}
    errors = cd.validate_compute_domain(bad)
    assert any(e.startswith("spec.channel.resourceClaimTemplate.name: Invalid value: 'Bad_Name'") for e in errors)
    assert any(e.startswith("spec.numNodes: Invalid value: -1") for e in errors)


@pytest.mark.process
def test_gpu_dra_validate_checks_compute_domains_against_nvidias_crd(tmp_path: Path) -> None:
    f = tmp_path / "cd.yaml"
    bad = {**DOMAIN, "spec": {"numNodes": -2, "channel": {"allocationMode": "Half"}}}
    f.write_text(yaml.safe_dump_all([DOMAIN, bad]))
    out = subprocess.run([sys.executable, "-m", "cli.main", "validate", "-f", str(f), "-o", "json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    results = json.loads(out.stdout)["results"]
    assert out.returncode == 1 and results[0]["valid"] and not results[1]["valid"]
    assert "spec.numNodes: Invalid value: -2: spec.numNodes in body should be greater than or equal to 0" in results[1]["errors"]
    assert "spec.channel.resourceClaimTemplate: Required value" in results[1]["errors"]


def test_controller_objects_for_a_domain() -> None:
    rct = channel_template(DOMAIN, "gpu.nvidia.com")
    assert rct["metadata"]["name"] == "train-channel" and rct["metadata"]["namespace"] == "ml"
    assert rct["metadata"]["ownerReferences"][0]["uid"] == DOMAIN["metadata"]["uid"]
    devices = rct["spec"]["spec"]["devices"]
    assert devices["requests"] == [{"name": "channel", "exactly": {"deviceClassName": cd.CHANNEL_CLASS}}]
    assert devices["config"][0]["opaque"]["parameters"] == {
        "apiVersion": cd.API_VERSION, "kind": cd.CHANNEL_CONFIG_KIND, "domainID": DOMAIN["metadata"]["uid"],
        "allocationMode": "Single"}
    # numNodes 2: the channel claims are one gang of 2 within one clique.
    assert rct["spec"]["metadata"]["labels"] == {cd.DOMAIN_LABEL: DOMAIN["metadata"]["uid"],
                                                 "gpu.nvidia.com/gang": "computedomain-train",
                                                 "gpu.nvidia.com/gang-size": "2",
                                                 "gpu.nvidia.com/gang-topology": "clique"}
    unsized = {**DOMAIN, "spec": {**DOMAIN["spec"], "numNodes": 0}}
    assert channel_template(unsized)["spec"]["metadata"]["labels"] == {cd.DOMAIN_LABEL: DOMAIN["metadata"]["uid"]}
    ds = daemon_set(DOMAIN, "gpu-dra-system")
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {cd.DOMAIN_LABEL: DOMAIN["metadata"]["uid"]}
    assert pod["resourceClaims"][0]["resourceClaimTemplateName"] == daemon_template(DOMAIN, "gpu-dra-system")[
        "metadata"]["name"]
    assert "imagePullSecrets" not in pod


def test_daemon_pods_get_the_image_pull_secrets_and_tolerate_what_the_agent_does() -> None:
    from sim.roles.nodefit import tolerates

    pod = daemon_set(DOMAIN, "gpu-dra-system", "registry.example.com/gpu-dra:v2", ("regcred",))["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "registry.example.com/gpu-dra:v2"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    agent = yaml.safe_load((ROOT / "manifests/base/node-agent.yaml").read_text())["spec"]["template"]["spec"]
    # A taint the agent tolerates (it must run on the node for the daemon's claim to be prepared) is tolerated
    # by the daemon too, whatever its value (NVIDIA's template: Exists for every effect).
    for toleration in agent["tolerations"]:
        taint = {"key": toleration["key"], "value": toleration.get("value", "x"), "effect": toleration["effect"]}
        assert any(tolerates(t, taint) for t in pod["tolerations"]), taint


def test_domain_status_ready_when_num_nodes_daemons_are() -> None:
    clique = {"daemons": [{"nodeName": "a", "ipAddress": "10.0.0.1", "cliqueID": "c.1", "index": 0, "status": "Ready"},
                          {"nodeName": "b", "ipAddress": "10.0.0.2", "cliqueID": "c.1", "index": 1,
                           "status": "NotReady"}]}
    assert domain_status(DOMAIN, [clique])["status"] == "NotReady"
    clique["daemons"][1]["status"] = "Ready"
    status = domain_status(DOMAIN, [clique])
    assert status["status"] == "Ready" and [n["name"] for n in status["nodes"]] == ["a", "b"]
    assert domain_status({**DOMAIN, "spec": {**DOMAIN["spec"], "numNodes": 0}}, [])["status"] == "NotReady"


def test_gb200_tray_slice_clique_and_fabric_fault(tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    nvml = load_backend(f"sim:gb200-nvl?clique=7&faults={faults}", node="tray-1")
    inventory = discover(nvml, "tray-1")
    clique = node_clique(inventory)
    assert clique is not None and clique.endswith(".7")
    sl = build_slice("tray-1", clique)
    names = [d["name"] for d in sl["spec"]["devices"]]
    assert names[0] == "channel-0" and names[-1] == "daemon-0" and len(names) == cd.PUBLISHED_CHANNELS + 1
    assert sl["spec"]["devices"][0]["attributes"]["fabricCliqueID"] == {"int": 7}
    assert build_slice("h100-1", None)["spec"]["devices"] == []
    assert fabric_health(nvml, inventory).healthy
    write_faults(faults, fabric_unhealthy=[inventory.gpus[1].uuid])
    health = fabric_health(nvml, inventory)
    assert not health.healthy and health.problems == (f"GPU {inventory.gpus[1].uuid}: NVLink fabric route unhealthy",)


def test_racks_and_node_options() -> None:
    racks = gb200_racks("2x3", device_plugin=False)
    assert [n.name for n in racks][:4] == ["gb200-r1-t1", "gb200-r1-t2", "gb200-r1-t3", "gb200-r2-t1"]
    assert {n.profile for n in racks} == {"gb200-nvl?clique=1", "gb200-nvl?clique=2"}
    assert len(gb200_racks("1", device_plugin=False)) == 18  # an NVL72 rack: 18 trays of 4 GPUs
    with pytest.raises(SpecError, match="at most 18 trays"):
        gb200_racks("1x19", device_plugin=False)
    addressed = with_addresses("t", racks)
    assert len({n.address for n in addressed}) == len(racks)
    assert parse_nodes("x=gb200-nvl?clique=3", shipped_profiles(), device_plugin=False)[0].profile == "gb200-nvl?clique=3"
    with pytest.raises(SpecError, match=r"accepted: \?clique=N"):
        parse_nodes("x=gb200-nvl?rack=3", shipped_profiles(), device_plugin=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _imex_config(tmp: Path, name: str, ip: str, peers: list[str], port: int, cmd_port: int) -> Path:
    nodes = tmp / f"{name}-nodes.cfg"
    nodes.write_text("".join(p + "\n" for p in peers))
    cfg = tmp / f"{name}.cfg"
    cfg.write_text(f"BIND_INTERFACE_IP={ip}\nSERVER_PORT={port}\nIMEX_NODE_CONFIG_FILE={nodes}\n"
                   f"IMEX_CMD_BIND_INTERFACE_IP={ip}\nIMEX_CMD_PORT={cmd_port}\n")
    return cfg


def _ctl(cfg: Path) -> str:
    out = subprocess.run([sys.executable, "-c", "import sys; from sim.imex.ctl import main; sys.exit(main(sys.argv[1:]))",
                          "-c", str(cfg), "-q"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    return (out.stdout or out.stderr).strip()


def _wait(what: str, fn: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not fn():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out: {what}")
        time.sleep(0.1)


@pytest.mark.process
def test_imex_stand_ins_are_ready_only_when_every_peer_is_up(tmp_path: Path) -> None:
    port, cmd = _free_port(), _free_port()
    peers = ["127.0.91.1", "127.0.91.2"]
    configs = [_imex_config(tmp_path, f"n{i}", ip, peers, port, cmd) for i, ip in enumerate(peers)]
    start = [sys.executable, "-c", "import sys; from sim.imex.daemon import main; sys.exit(main(sys.argv[1:]))", "-c"]
    first = subprocess.Popen([*start, str(configs[0])], cwd=ROOT, stderr=subprocess.PIPE)
    try:
        _wait("the first daemon answers", lambda: _ctl(configs[0]) in ("READY", "NOT_READY"))
        time.sleep(1.2)
        assert _ctl(configs[0]) == "NOT_READY"  # its peer is not up
        assert "cannot reach the IMEX daemon" in _ctl(configs[1])
        second = subprocess.Popen([*start, str(configs[1])], cwd=ROOT, stderr=subprocess.PIPE)
        try:
            _wait("both ready", lambda: _ctl(configs[0]) == "READY" and _ctl(configs[1]) == "READY")
        finally:
            second.terminate()
            second.wait(timeout=10)
        _wait("the survivor notices", lambda: _ctl(configs[0]) == "NOT_READY")
    finally:
        first.terminate()
        first.wait(timeout=10)
    alone = _imex_config(tmp_path, "x", "127.0.91.3", peers, port, cmd)
    refused = subprocess.run([*start, str(alone)], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert refused.returncode == 1 and "not in the nodes config" in refused.stderr


def _gang_objects(racks: int, trays: int, claims: int) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = [yaml.safe_load(d) for d in (ROOT / "manifests/base/deviceclasses.yaml").read_text()
                                     .split("\n---\n") if "compute-domain" in d]
    for r in range(1, racks + 1):
        for t in range(1, trays + 1):
            node = f"r{r}-t{t}"
            objects.append({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
            objects.append(build_slice(node, f"5c1f5a3e-0b7d-4e61-9d2a-7c3b8e4f1a20.{r}"))
    template = channel_template({**DOMAIN, "spec": {**DOMAIN["spec"], "numNodes": claims}})
    for i in range(claims):
        objects.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                        "metadata": {"name": f"w{i}-channel", "namespace": "ml", **template["spec"]["metadata"]},
                        "spec": template["spec"]["spec"]})
    return objects


def _allocate(tmp_path: Path, objects: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    f = tmp_path / "in.yaml"
    f.write_text(yaml.safe_dump_all(objects))
    out = subprocess.run([sys.executable, "-m", "cli.main", "allocate", "-f", str(f), "-o", "json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    return out.returncode, json.loads(out.stdout)


@pytest.mark.process
def test_domain_gang_is_placed_in_one_clique_or_waits_naming_each_clique(tmp_path: Path) -> None:
    rc, doc = _allocate(tmp_path, _gang_objects(racks=2, trays=3, claims=3))
    assert rc == 0, doc
    nodes = {r["node"] for r in doc["results"]}
    assert len(nodes) == 3 and len({n.split("-")[0] for n in nodes}) == 1  # three trays of one rack
    rc, doc = _allocate(tmp_path, _gang_objects(racks=2, trays=2, claims=3))
    assert rc == 1 and {r["outcome"] for r in doc["results"]} == {"unschedulable"}
    message = doc["results"][0]["message"]
    assert "must share one NVLink clique" in message
    assert "clique 5c1f5a3e-0b7d-4e61-9d2a-7c3b8e4f1a20.1: too small (2 nodes for 3 claims)" in message
    assert "clique 5c1f5a3e-0b7d-4e61-9d2a-7c3b8e4f1a20.2: too small (2 nodes for 3 claims)" in message


def _claim(kind: str, device: str, mode: str = "Single") -> dict[str, Any]:
    params: dict[str, Any] = {"apiVersion": cd.API_VERSION, "kind": kind, "domainID": DOMAIN["metadata"]["uid"]}
    if kind == cd.CHANNEL_CONFIG_KIND:
        params["allocationMode"] = mode
    return {"metadata": {"name": "c", "namespace": "ml"}, "status": {"allocation": {"devices": {
        "results": [{"request": "r", "driver": cd.DRIVER, "pool": "tray-1", "device": device}],
        "config": [{"source": "FromClaim", "opaque": {"driver": cd.DRIVER, "parameters": params}}]}}}}


def test_preparer_waits_for_the_daemon_then_injects_channels(tmp_path: Path) -> None:
    from driver.cdi import DeviceNumbers
    from driver.computedomain.preparer import Checkpoint, ComputeDomainPreparer, NodeContext
    from driver.prepare import ClaimRef

    claims = {"ch": _claim(cd.CHANNEL_CONFIG_KIND, "channel-3"), "all": _claim(cd.CHANNEL_CONFIG_KIND, "channel-0", "All"),
              "dm": _claim(cd.DAEMON_CONFIG_KIND, "daemon-0")}
    ready = {"now": False}
    labels: list[str | None] = []
    preparer = ComputeDomainPreparer(
        NodeContext("tray-1", "c.1", lambda d: tmp_path / "domains" / d,
                    lambda: DeviceNumbers(majors={cd.CHANNEL_MAJOR_NAME: 234})),
        Checkpoint(tmp_path / "checkpoint.json"), tmp_path / "cdi",
        get_claim=lambda ns, name: claims[name], get_domain=lambda uid: DOMAIN,
        daemon_ready=lambda uid: (ready["now"], "nvidia-imex-ctl -q: NOT_READY"), label_node=labels.append)
    first = preparer.prepare([ClaimRef("u1", "ml", "ch")])["u1"]
    assert "waiting for the IMEX daemon of ComputeDomain ml/train on node tray-1 to be ready" in first.error
    assert labels[-1] == DOMAIN["metadata"]["uid"]  # the node joins the domain: its daemon is placed there
    daemon = preparer.prepare([ClaimRef("u3", "ml", "dm")])["u3"]
    assert not daemon.error
    spec = json.loads((tmp_path / "cdi" / "k8s.compute-domain.nvidia.com-claim_u3.json").read_text())
    assert spec["devices"][0]["containerEdits"]["mounts"][0]["containerPath"] == "/imexd"
    ready["now"] = True
    done = preparer.prepare([ClaimRef("u1", "ml", "ch"), ClaimRef("u2", "ml", "all")])
    assert done["u1"].devices[0].cdi_device_ids == ("k8s.compute-domain.nvidia.com/claim=u1-channel-3",)
    single = json.loads((tmp_path / "cdi" / "k8s.compute-domain.nvidia.com-claim_u1.json").read_text())
    assert single["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia-caps-imex-channels/channel3", "type": "c", "major": 234, "minor": 3, "permissions": "rw"}]
    every = json.loads((tmp_path / "cdi" / "k8s.compute-domain.nvidia.com-claim_u2.json").read_text())
    assert len(every["devices"][0]["containerEdits"]["deviceNodes"]) == cd.MAX_CHANNELS
    # Restarted: the checkpoint still knows the claims; unprepare removes specs and the node leaves the domain.
    again = Checkpoint(tmp_path / "checkpoint.json")
    assert set(again.claims) == {"u1", "u2", "u3"}
    preparer.unprepare([ClaimRef("u1", "ml", "ch"), ClaimRef("u2", "ml", "all")])
    assert labels[-1] is None and not (tmp_path / "cdi" / "k8s.compute-domain.nvidia.com-claim_u1.json").exists()


def test_a_channel_prepare_waits_for_its_daemon_without_blocking_the_daemons_own_claim(tmp_path: Path) -> None:
    """The kubelet retries a failed prepare only after its backoff: a channel's prepare waits (up to its budget)
    for the IMEX daemon, and meanwhile the daemon pod's own claim, prepared by the same plugin, goes through."""
    import threading

    from driver.cdi import DeviceNumbers
    from driver.computedomain.preparer import Checkpoint, ComputeDomainPreparer, NodeContext
    from driver.prepare import ClaimRef

    claims = {"ch": _claim(cd.CHANNEL_CONFIG_KIND, "channel-3"), "dm": _claim(cd.DAEMON_CONFIG_KIND, "daemon-0")}
    daemon_prepared = threading.Event()
    preparer = ComputeDomainPreparer(
        NodeContext("tray-1", "c.1", lambda d: tmp_path / "domains" / d,
                    lambda: DeviceNumbers(majors={cd.CHANNEL_MAJOR_NAME: 234})),
        Checkpoint(tmp_path / "checkpoint.json"), tmp_path / "cdi",
        get_claim=lambda ns, name: claims[name], get_domain=lambda uid: DOMAIN,
        daemon_ready=lambda uid: (daemon_prepared.is_set(), "nvidia-imex-ctl -q: NOT_READY"),
        label_node=lambda domain: None, daemon_wait_s=30.0, poll_s=0.01)
    results: dict[str, Any] = {}
    channel = threading.Thread(target=lambda: results.update(preparer.prepare([ClaimRef("u1", "ml", "ch")])))
    channel.start()
    daemon = preparer.prepare([ClaimRef("u3", "ml", "dm")])["u3"]  # not held up by the waiting channel
    assert not daemon.error and channel.is_alive()
    daemon_prepared.set()  # the daemon is up: the waiting channel is prepared in the same call
    channel.join(10)
    assert not results["u1"].error
    assert results["u1"].devices[0].cdi_device_ids == ("k8s.compute-domain.nvidia.com/claim=u1-channel-3",)

    # A daemon that stays down: the channel fails once its budget is spent, naming what it waited for.
    claims["late"] = _claim(cd.CHANNEL_CONFIG_KIND, "channel-4")
    daemon_prepared.clear()
    preparer.daemon_wait_s = 0.05
    late = preparer.prepare([ClaimRef("u4", "ml", "late")])["u4"]
    assert "waiting for the IMEX daemon of ComputeDomain ml/train on node tray-1 to be ready" in late.error
