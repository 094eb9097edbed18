"""End to end: `gpu-dra demo` as a user runs it, its JSON report checked against what the nodes left on disk.

The demo starts real processes (API server, four node agents, the controller) and simulated kubelets; the
report must say every expected outcome happened, and the CDI specs and node checkpoints under --workdir must
hold exactly the claims of the workloads the report calls Running.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.checkpoint import Checkpoint
from tests.runtime_helpers import require_podman

REPO = Path(__file__).resolve().parent.parent
DRIVER = "gpu.nvidia.com"
CDI_KIND = "k8s.gpu.nvidia.com/claim"
EXPECTED_OUTCOMES = {
    "trainings-one-node-one-nvlink-domain",
    "inference-replicas-share-one-gpu-time-slicing",
    "mig-worker-on-1g.10gb-of-h100-1",
    "notebook-on-v100-1",
    "legacy-pod-gpu-through-shim-not-held-by-dra",
    "gang-waits-in-act-1-placed-on-both-a100-nodes-in-act-2",
    "cannot-fit-pending-with-explanation",
    "finished-trainings-released",
    "cdi-specs-and-checkpoints-match-prepared-claims",
    "processes-stopped-cleanly",
}
# With real containers (--runtime podman), what each container saw is checked too.
CONTAINER_OUTCOMES = {
    "containers-saw-exactly-their-devices",
    "inference-replicas-saw-the-same-gpu",
    "mig-worker-saw-only-its-mig-device",
    "legacy-pod-saw-its-device-plugin-gpu",
    "trainings-ended-by-their-command",
}


@pytest.fixture
def workdir() -> Iterator[Path]:
    # Unix socket paths under the work dir must fit 107 bytes; pytest's tmp_path is often too long.
    base = Path(tempfile.mkdtemp(prefix="gd-demo-", dir="/tmp"))
    try:
        yield base / "w"
    finally:
        shutil.rmtree(base, ignore_errors=True)


Demo = Callable[..., "subprocess.Popen[str]"]


@pytest.fixture
def demo(workdir: Path) -> Iterator[Demo]:
    """Starts `gpu-dra demo`; whatever happens in the test, the demo and its children are gone afterwards."""
    started: list[subprocess.Popen[str]] = []

    def launch(*args: str) -> subprocess.Popen[str]:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen([sys.executable, "-m", "cli.main", "demo", *args], cwd=REPO, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        started.append(proc)
        return proc

    try:
        yield launch
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # the demo stops its children on SIGTERM
                try:
                    proc.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.communicate()
        # Children a killed demo could not stop: they carry this test's unique work dir.
        for pid, _ in _processes_mentioning_with_pids(str(workdir)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that name `text` (the demo's children carry the work dir)."""
    return [cmdline for _, cmdline in _processes_mentioning_with_pids(text)]


def _processes_mentioning_with_pids(text: str) -> list[tuple[int, str]]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next((line for line in (entry / "status").read_text().splitlines() if line.startswith("State:")), "")
        except OSError:
            continue
        if text in cmdline and "zombie" not in state:
            found.append((int(entry.name), cmdline))
    return found


def _read_checkpoint(workdir: Path, node: str) -> Any:
    checkpoint, report = Checkpoint.open(workdir / "nodes" / node / "kubelet" / "plugins" / DRIVER)
    try:
        assert report.problems == []
        return checkpoint.state
    finally:
        checkpoint.close()


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["none", "podman"])
def test_demo_report_matches_disk(workdir: Path, demo: Demo, runtime: str) -> None:
    if runtime == "podman":
        require_podman()
    proc = demo("-o", "json", "--workdir", str(workdir), "--runtime", runtime)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"stdout:\n{out}\nstderr:\n{err}"
    report = json.loads(out)

    outcomes = {e["name"]: e for e in report["expectations"]}
    assert set(outcomes) == EXPECTED_OUTCOMES | (CONTAINER_OUTCOMES if runtime == "podman" else set())
    assert report["runtime"]["kind"] == runtime and report["runtime"]["reason"]
    assert all(e["ok"] for e in outcomes.values()), [e for e in outcomes.values() if not e["ok"]]
    assert report["ok"] is True
    assert "act 1" in err and "act 2" in err  # progress lines go to stderr, the report alone to stdout

    w = {x["name"]: x for x in report["workloads"]}
    assert {n: x["phase"] for n, x in w.items()} == {
        "train-llama": "Succeeded", "train-bert": "Succeeded",
        "inference-0": "Running", "inference-1": "Running", "mig-worker": "Running", "notebook": "Running",
        "legacy-cuda": "Running", "gang-worker-0": "Running", "gang-worker-1": "Running",
        "h100-full-node": "Pending",
    }
    # Each training: 4 A100s of one node; both binpacked on one node, which the gang then shares with them later.
    for name in ("train-llama", "train-bert"):
        (claim,) = w[name]["claims"]
        assert len(claim["devices"]) == 4 and {d["pool"] for d in claim["devices"]} == {claim["node"]}
        assert claim["node"] in ("a100-1", "a100-2")
    # The gang: one 8-GPU claim on each A100 node.
    assert sorted(x["claims"][0]["node"] for x in (w["gang-worker-0"], w["gang-worker-1"])) == ["a100-1", "a100-2"]
    assert all(len(w[n]["claims"][0]["devices"]) == 8 for n in ("gang-worker-0", "gang-worker-1"))
    # Inference: two pods, one claim, one device, the same CDI id, time-sliced.
    inf = [w[n]["claims"][0] for n in ("inference-0", "inference-1")]
    assert inf[0]["claim"] == inf[1]["claim"] and inf[0]["devices"] == inf[1]["devices"]
    assert inf[0]["devices"][0]["shared"] is True and inf[0]["devices"][0]["sharing"] == "TimeSlicing"
    assert inf[0]["node"] == "h100-1"
    assert "-mig-1g-10gb-" in w["mig-worker"]["claims"][0]["devices"][0]["device"]
    assert w["notebook"]["node"] == "v100-1"
    assert w["legacy-cuda"]["claims"] == [] and len(w["legacy-cuda"]["devicePlugin"]["devices"]) == 1
    cannot = w["h100-full-node"]
    assert cannot["reason"] == "GpuDraUnschedulable" and cannot["message"].startswith("0/4 nodes are available:")
    assert cannot["node"] is None
    assert report["utilization"] == {
        "a100-1": {"allocated": 8, "total": 8}, "a100-2": {"allocated": 8, "total": 8},
        "h100-1": {"allocated": 2, "total": 8}, "v100-1": {"allocated": 2, "total": 4},
    }

    # What is on disk: per node, CDI specs and checkpoint entries for exactly the running workloads' claims.
    running: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for x in report["workloads"]:
        if x["phase"] == "Running":
            for c in x["claims"]:
                running.setdefault(c["node"], {})[c["uid"]] = c["devices"]
    for node in ("a100-1", "a100-2", "v100-1", "h100-1"):
        cdi_dir = workdir / "nodes" / node / "cdi"
        specs = {p.name.removeprefix("k8s.gpu.nvidia.com-claim_").removesuffix(".json"): json.loads(p.read_text())
                 for p in cdi_dir.glob("k8s.gpu.nvidia.com-claim_*.json")}
        want = running.get(node, {})
        assert set(specs) == set(want), node
        state = _read_checkpoint(workdir, node)
        assert set(state.claims) == set(want), node
        for uid, devices in want.items():
            spec = specs[uid]
            assert spec["kind"] == CDI_KIND
            in_spec = {f"{CDI_KIND}={d['name']}" for d in spec["devices"]}
            assert {i for d in devices for i in d["cdiDeviceIDs"]} == in_spec
            record = state.claims[uid]
            assert record.phase.value == "PrepareCompleted"
            assert [(d.pool_name, d.device_name) for d in record.devices] == [(d["pool"], d["device"]) for d in devices]
            # The ledger holds each claim's physical GPUs for that claim.
            for d in record.devices:
                assert f"dra:{uid}" in state.ledger[d.gpu_uuid]
    # Finished trainings left nothing behind.
    for name in ("train-llama", "train-bert"):
        uid, node = w[name]["claims"][0]["uid"], w[name]["claims"][0]["node"]
        assert not (workdir / "nodes" / node / "cdi" / f"k8s.gpu.nvidia.com-claim_{uid}.json").exists()
        assert uid not in _read_checkpoint(workdir, node).claims
    # The legacy pod's GPU: held by the device plugin alone, and none of the V100 claims has it.
    gpu = w["legacy-cuda"]["devicePlugin"]["devices"][0]
    v100 = _read_checkpoint(workdir, "v100-1")
    holders = v100.ledger[gpu]
    assert holders and all(h.startswith("deviceplugin:") for h in holders)
    assert gpu not in {d.gpu_uuid for r in v100.claims.values() for d in r.devices}
    # The inference claim's sharing was applied as time-slicing on the node.
    (inf_record,) = [r for r in _read_checkpoint(workdir, "h100-1").claims.values() if r.name == inf[0]["claim"]]
    assert inf_record.devices[0].sharing is not None
    assert inf_record.devices[0].sharing["sharing"]["strategy"] == "TimeSlicing"

    assert _processes_mentioning(str(workdir)) == []
    assert (workdir / "logs" / "apiserver.log").exists()
    if runtime == "none":
        assert all(x["containers"] == [] for x in report["workloads"])
        return
    # Each running workload's container listed exactly its own GPUs from inside, with the simulator's UUIDs.
    for name in ("inference-0", "inference-1", "notebook", "mig-worker", "legacy-cuda", "gang-worker-0", "gang-worker-1"):
        (c,) = w[name]["containers"]
        assert c["running"] is True and c["saw"] is not None, name
        smi = c["saw"]["nvidiaSmiL"]
        gpus = [line for line in smi if line.startswith("GPU ")]
        want = {d["cdiDeviceIDs"][0] for cl in w[name]["claims"] for d in cl["devices"]} | set(w[name]["devicePlugin"]["cdiDevices"] if w[name]["devicePlugin"] else [])
        assert set(c["cdiDevices"]) == want, name
        expected_gpus = 8 if name.startswith("gang") else 1
        assert len(gpus) == expected_gpus and len([n for n in c["saw"]["deviceNodes"] if n[len("/dev/nvidia"):].isdigit()]) == expected_gpus, (name, smi)
    assert w["inference-0"]["containers"][0]["saw"]["nvidiaSmiL"] == w["inference-1"]["containers"][0]["saw"]["nvidiaSmiL"]
    mig_lines = w["mig-worker"]["containers"][0]["saw"]["nvidiaSmiL"]
    assert len(mig_lines) == 2 and "MIG 1g.10gb" in mig_lines[1]
    for name in ("train-llama", "train-bert"):
        (c,) = w[name]["containers"]
        assert c["running"] is False and c["exitCode"] == 0
        assert len([line for line in c["saw"]["nvidiaSmiL"] if line.startswith("GPU ")]) == 4


@pytest.mark.slow
def test_demo_sigterm_stops_every_child(workdir: Path, demo: Demo) -> None:
    proc = demo("-o", "json", "--workdir", str(workdir))
    assert proc.stderr is not None
    # Wait until the nodes are up (a progress line), then stop the demo as a supervisor would.
    for line in proc.stderr:
        if "act 1:" in line:
            break
    else:
        pytest.fail(f"the demo ended before act 1: {proc.communicate(timeout=60)}")
    assert _processes_mentioning(str(workdir)) != []  # the children are running now
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert out == ""
    assert _processes_mentioning(str(workdir)) == []


@pytest.mark.process
def test_demo_rejects_a_workdir_in_use(workdir: Path, demo: Demo) -> None:
    workdir.mkdir(parents=True)
    (workdir / "left-over").write_text("x")
    proc = demo("--workdir", str(workdir))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert f"--workdir {workdir}: must be empty" in err and out == ""


@pytest.mark.process
def test_demo_names_missing_manifests(tmp_path: Path, workdir: Path, demo: Demo) -> None:
    (tmp_path / "examples").mkdir()
    proc = demo("--manifests", str(tmp_path), "--workdir", str(workdir))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and out == ""
    assert f"--manifests {tmp_path}: missing {tmp_path / 'base' / 'deviceclasses.yaml'}" in err
    assert not workdir.exists()  # nothing was started
