"""Sharing on real nodes: nvidia-smi compute-policy and MPS control daemons.

The real backend runs fake `nvidia-smi` / `nvidia-cuda-mps-control` executables that this test writes first on
PATH; they record argv, the MPS env and stdin, so the exact commands are asserted. The simulator backend is
driven through Preparer: the same code path, with the simulator holding timeslice and daemon state.
"""

from __future__ import annotations

import json
import socket
import stat
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from driver.checkpoint import Checkpoint, ClaimPhase
from gpudra.deviceconfig import parse
from driver.discovery import discover
from driver.gputools import GpuToolError, MpsDirs, NvidiaTools, control_socket_alive
from driver.inventory import Inventory
from driver.nvml import RealNvml, load_backend
from sim.nvml import SimulatedNvml
from driver.prepare import ClaimNotFound, ClaimRef, Preparer
from driver.sharing import (
    COMPUTE_MODE_DEFAULT, COMPUTE_MODE_EXCLUSIVE_PROCESS, NvmlSharing, SharedDevice, SharingError, apply, mps_dirs, undo,
)
from driver.slices import gpu_device_name
from tests.plugin_helpers import short_tmp

DRIVER = "gpu.nvidia.com"
NODE = "node-a"
CFG = {"apiVersion": "gpu.nvidia.com/v1alpha1", "kind": "GpuConfig"}
TIMESLICE_SHORT = {**CFG, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}}
MPS = {
    **CFG,
    "sharing": {
        "strategy": "MPS",
        "mpsConfig": {
            "defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "4Gi",
            "defaultPerDevicePinnedMemoryLimit": {"1": "2Gi"},
        },
    },
}

# One device per daemon: a per-device key "1" would name no device of it (an error, as in NVIDIA's driver).
MPS_ONE = {**CFG, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "4Gi"}}}

_FAKE_TOOL = """#!{python}
import json, os, sys
record = {{
    "tool": os.path.basename(sys.argv[0]),
    "argv": sys.argv[1:],
    "env": {{k: os.environ.get(k) for k in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "CUDA_VISIBLE_DEVICES")}},
    "stdin": "" if sys.stdin is None else sys.stdin.read(),
}}
with open({log!r}, "a") as f:
    f.write(json.dumps(record) + "\\n")
sys.stderr.write({stderr!r})
sys.exit({code})
"""


class FakeTools:
    """Fake NVIDIA tools in a directory put first on PATH; `calls()` are their recorded invocations."""

    def __init__(self, directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.dir = directory
        self.log = directory / "calls.jsonl"
        directory.mkdir(parents=True, exist_ok=True)
        for name in ("nvidia-smi", "nvidia-cuda-mps-control"):
            self.write(name)
        monkeypatch.setenv("PATH", f"{directory}:/usr/bin:/bin")

    def write(self, name: str, code: int = 0, stderr: str = "") -> None:
        path = self.dir / name
        path.write_text(_FAKE_TOOL.format(python=sys.executable, log=str(self.log), stderr=stderr, code=code))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)

    def calls(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def tmp() -> Iterator[Path]:
    with short_tmp() as path:
        yield path


@pytest.fixture
def tools(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> FakeTools:
    return FakeTools(tmp / "bin", monkeypatch)


@pytest.fixture
def sim() -> SimulatedNvml:
    backend = load_backend("sim:dgx-h100", node=NODE)
    assert isinstance(backend, SimulatedNvml)
    return backend


def _devices(inv: Inventory, n: int) -> list[SharedDevice]:
    return [SharedDevice(uuid=g.uuid, gpu_uuid=g.uuid, gpu_index=g.index) for g in inv.gpus[:n]]


def _compute_mode(nvml: Any, uuid: str) -> int:
    return int(nvml.nvmlDeviceGetComputeMode(nvml.nvmlDeviceGetHandleByUUID(uuid)))


class _Listening:
    """A unix socket listening at `<pipe>/control`: what a running MPS control daemon leaves there."""

    def __init__(self, pipe: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(pipe / "control"))
        self.sock.listen(16)

    def close(self) -> None:
        self.sock.close()


# ---- real backend: exact commands -----------------------------------------------------------------------------


@pytest.mark.process
def test_real_timeslice_runs_nvidia_smi_and_restores_default(tools: FakeTools, sim: SimulatedNvml) -> None:
    # NVML calls (compute mode) go to the simulator, the tools to the fake executables.
    backend = NvmlSharing(RealNvml(sim))
    inv = discover(sim, NODE)
    dev = _devices(inv, 1)
    config = parse(TIMESLICE_SHORT)
    assert apply(backend, config, dev, None).notes == ()
    assert [(c["tool"], c["argv"]) for c in tools.calls()] == [
        ("nvidia-smi", ["compute-policy", "-i", dev[0].uuid, "--set-timeslice", "1"]),
    ]
    assert _compute_mode(sim, dev[0].uuid) == COMPUTE_MODE_DEFAULT
    undo(backend, config, set(), dev, None)
    assert tools.calls()[-1]["argv"] == ["compute-policy", "-i", dev[0].uuid, "--set-timeslice", "0"]
    # Another claim still sharing the GPU keeps its interval.
    undo(backend, config, {dev[0].uuid}, dev, None)
    assert len(tools.calls()) == 2


@pytest.mark.process
def test_real_timeslice_failure_names_gpu_and_stderr(tools: FakeTools, sim: SimulatedNvml) -> None:
    tools.write("nvidia-smi", code=1, stderr="Insufficient Permissions\n")
    dev = _devices(discover(sim, NODE), 1)
    with pytest.raises(SharingError) as err:
        apply(NvmlSharing(RealNvml(sim)), parse(TIMESLICE_SHORT), dev, None)
    message = str(err.value)
    assert dev[0].uuid in message and "Insufficient Permissions" in message
    assert f"nvidia-smi compute-policy -i {dev[0].uuid} --set-timeslice 1" in message and "status 1" in message


def test_real_tool_missing(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp / "empty"))
    with pytest.raises(GpuToolError, match="nvidia-smi was not found on PATH"):
        NvidiaTools().set_timeslice("GPU-x", 2)


@pytest.mark.process
def test_real_mps_start_limits_and_stop(tools: FakeTools, sim: SimulatedNvml, tmp: Path) -> None:
    backend = NvmlSharing(RealNvml(sim))
    dev = _devices(discover(sim, NODE), 2)
    dirs = mps_dirs(tmp / "mps", "uid-1")
    config = parse(MPS)
    container = apply(backend, config, dev, dirs)
    calls = tools.calls()
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(dirs.pipe), "CUDA_MPS_LOG_DIRECTORY": str(dirs.log)}
    assert calls[0] == {
        "tool": "nvidia-cuda-mps-control", "argv": ["-d"], "stdin": "",
        "env": {**env, "CUDA_VISIBLE_DEVICES": f"{dev[0].uuid},{dev[1].uuid}"},
    }
    # The second of the daemon's devices (sorted by UUID) has its own limit; the default covers the other.
    assert [(c["argv"], c["stdin"], c["env"]) for c in calls[1:]] == [
        ([], "set_default_active_thread_percentage 50\n", {**env, "CUDA_VISIBLE_DEVICES": None}),
        ([], f"set_default_device_pinned_mem_limit {dev[0].uuid} 4096M\n", {**env, "CUDA_VISIBLE_DEVICES": None}),
        ([], f"set_default_device_pinned_mem_limit {dev[1].uuid} 2048M\n", {**env, "CUDA_VISIBLE_DEVICES": None}),
    ]
    assert all(_compute_mode(sim, d.uuid) == COMPUTE_MODE_EXCLUSIVE_PROCESS for d in dev)
    assert dirs.pipe.is_dir() and dirs.log.is_dir()
    assert container.env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    # While the daemon's control socket answers, re-applying starts nothing and unprepare sends quit.
    daemon = _Listening(dirs.pipe)
    try:
        assert control_socket_alive(dirs.pipe)
        apply(backend, config, dev, dirs)
        assert len(tools.calls()) == 4
        undo(backend, config, set(), dev, dirs)
    finally:
        daemon.close()
    last = tools.calls()[-1]
    assert (last["argv"], last["stdin"], last["env"]["CUDA_MPS_PIPE_DIRECTORY"]) == ([], "quit\n", str(dirs.pipe))
    assert all(_compute_mode(sim, d.uuid) == COMPUTE_MODE_DEFAULT for d in dev)
    assert not dirs.pipe.exists()


def test_real_mps_stale_socket_is_not_alive(tmp: Path) -> None:
    pipe = tmp / "pipe"
    pipe.mkdir()
    daemon = _Listening(pipe)
    daemon.close()  # the socket file stays, nobody listens: a daemon that died
    assert (pipe / "control").exists() and not control_socket_alive(pipe)


@pytest.mark.process
def test_real_mps_start_failure(tools: FakeTools, sim: SimulatedNvml, tmp: Path) -> None:
    tools.write("nvidia-cuda-mps-control", code=1, stderr="An instance of this daemon is already running\n")
    dev = _devices(discover(sim, NODE), 1)
    with pytest.raises(SharingError) as err:
        apply(NvmlSharing(RealNvml(sim)), parse(MPS_ONE), dev, mps_dirs(tmp / "mps", "uid-1"))
    assert dev[0].uuid in str(err.value) and "already running" in str(err.value)


# ---- simulator backend through Preparer ----------------------------------------------------------------------


class Node:
    def __init__(self, tmp: Path, nvml: Any) -> None:
        self.tmp = tmp
        self.nvml = nvml
        self.inv = discover(nvml, NODE)
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        (tmp / "boot_id").write_text("boot-1")
        self.crash_at: str | None = None
        self.preparer = self.new()

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        try:
            return self.claims[(namespace, name)]
        except KeyError:
            raise ClaimNotFound(f"{namespace}/{name}") from None

    def _hook(self, step: str) -> None:
        if step == self.crash_at:
            raise RuntimeError(f"crash at {step}")

    def new(self) -> Preparer:
        cp, report = Checkpoint.open(self.tmp / "plugin", boot_id_path=self.tmp / "boot_id")
        p = Preparer(
            driver_name=DRIVER, node_name=NODE, get_claim=self.get, inventory=lambda: self.inv, checkpoint=cp,
            cdi_dir=self.tmp / "cdi", sharing_backend=NvmlSharing(self.nvml), mps_root=self.tmp / "mps",
            fault_hook=self._hook,
        )
        self.start_report = p.start(report)
        return p

    def restart(self) -> Preparer:
        self.preparer.checkpoint.close()
        self.preparer = self.new()
        return self.preparer

    def add(self, name: str, uid: str, gpus: list[int], parameters: dict[str, Any]) -> ClaimRef:
        self.claims[("ns", name)] = {
            "metadata": {"namespace": "ns", "name": name, "uid": uid},
            "status": {"allocation": {"devices": {
                "results": [
                    {"request": "gpus", "driver": DRIVER, "pool": NODE, "device": gpu_device_name(self.inv.gpus[i])}
                    for i in gpus
                ],
                "config": [{"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": parameters}}],
            }}},
        }
        return ClaimRef(uid, "ns", name)

    def uuid(self, i: int) -> str:
        return self.inv.gpus[i].uuid


@pytest.fixture
def node(tmp: Path, sim: SimulatedNvml) -> Node:
    return Node(tmp, sim)


def test_sim_timeslice_set_and_restored(node: Node, sim: SimulatedNvml) -> None:
    ref = node.add("ts", "uid-ts", [0], TIMESLICE_SHORT)
    assert node.preparer.prepare([ref])["uid-ts"].error == ""
    assert sim.get_timeslice(node.uuid(0)) == 1 and sim.get_timeslice(node.uuid(1)) == 0
    assert _compute_mode(sim, node.uuid(0)) == COMPUTE_MODE_DEFAULT
    assert node.preparer.unprepare([ref]) == {"uid-ts": ""}
    assert sim.get_timeslice(node.uuid(0)) == 0


def test_sim_timeslice_failure_is_a_per_claim_error(node: Node, sim: SimulatedNvml) -> None:
    sim.fail_tool("set_timeslice", node.uuid(0), "Unable to set the timeslice: Not Supported")
    bad = node.add("ts", "uid-ts", [0], TIMESLICE_SHORT)
    good = node.add("other", "uid-ok", [1], TIMESLICE_SHORT)
    results = node.preparer.prepare([bad, good])
    assert node.uuid(0) in results["uid-ts"].error and "Not Supported" in results["uid-ts"].error
    assert results["uid-ok"].error == "" and sim.get_timeslice(node.uuid(1)) == 1
    # Restoring the interval fails the same way; the rollback still completes (it is only logged).
    assert node.preparer.checkpoint.claim("uid-ts") is None


def test_sim_mps_daemon_lifecycle(node: Node, sim: SimulatedNvml) -> None:
    ref = node.add("mps", "uid-mps", [0, 1], MPS)
    assert node.preparer.prepare([ref])["uid-mps"].error == ""
    dirs = mps_dirs(node.tmp / "mps", "uid-mps")
    daemon = sim.mps_daemon(dirs)
    assert daemon is not None and daemon.running and daemon.starts == 1
    assert daemon.device_uuids == (node.uuid(0), node.uuid(1)) and daemon.log_dir == str(dirs.log)
    assert daemon.active_thread_percentage == 50
    assert dict(daemon.pinned_limits) == {node.uuid(0): "4096M", node.uuid(1): "2048M"}
    assert all(_compute_mode(sim, node.uuid(i)) == COMPUTE_MODE_EXCLUSIVE_PROCESS for i in (0, 1))
    record = node.preparer.checkpoint.claim("uid-mps")
    assert record is not None and [(d.pipe_dir, d.device_names) for d in record.mps_daemons] == [
        (str(dirs.pipe), [gpu_device_name(node.inv.gpus[0]), gpu_device_name(node.inv.gpus[1])]),
    ]
    assert node.preparer.unprepare([ref]) == {"uid-mps": ""}
    stopped = sim.mps_daemon(dirs)
    assert stopped is not None and not stopped.running and stopped.commands[-1] == "quit"
    assert all(_compute_mode(sim, node.uuid(i)) == COMPUTE_MODE_DEFAULT for i in (0, 1))
    assert not (node.tmp / "mps" / "uid-mps").exists()


def test_sim_agent_restart_keeps_or_restarts_daemon(node: Node, sim: SimulatedNvml) -> None:
    ref = node.add("mps", "uid-mps", [0], MPS_ONE)
    assert node.preparer.prepare([ref])["uid-mps"].error == ""
    dirs = mps_dirs(node.tmp / "mps", "uid-mps")
    node.restart()
    assert node.start_report.mps_restarted == [] and node.start_report.problems == []
    daemon = sim.mps_daemon(dirs)
    assert daemon is not None and daemon.starts == 1
    sim.kill_mps(dirs)
    node.restart()
    assert node.start_report.mps_restarted == ["uid-mps"]
    daemon = sim.mps_daemon(dirs)
    assert daemon is not None and daemon.running and daemon.starts == 2
    assert daemon.active_thread_percentage == 50 and dict(daemon.pinned_limits) == {node.uuid(0): "4096M"}


def test_sim_rolled_back_claim_stops_its_daemon(node: Node, sim: SimulatedNvml) -> None:
    node.crash_at = "cdi-written"  # the daemon runs, PrepareCompleted was never written
    ref = node.add("mps", "uid-mps", [0], MPS_ONE)
    assert "crash at cdi-written" in node.preparer.prepare([ref])["uid-mps"].error
    record = node.preparer.checkpoint.claim("uid-mps")
    assert record is not None and record.phase is ClaimPhase.PREPARE_STARTED
    dirs = mps_dirs(node.tmp / "mps", "uid-mps")
    assert sim.mps_running(dirs)
    node.crash_at = None
    node.restart()
    assert node.start_report.rolled_back == ["uid-mps"]
    assert not sim.mps_running(dirs) and _compute_mode(sim, node.uuid(0)) == COMPUTE_MODE_DEFAULT


def test_sim_mps_failure_is_a_per_claim_error(node: Node, sim: SimulatedNvml) -> None:
    sim.fail_tool("mps_start", node.uuid(0), "Failed to start MPS control daemon")
    ref = node.add("mps", "uid-mps", [0], MPS_ONE)
    error = node.preparer.prepare([ref])["uid-mps"].error
    assert "ResourceClaim ns/mps" in error and node.uuid(0) in error and "Failed to start MPS control daemon" in error
    assert node.preparer.checkpoint.claim("uid-mps") is None
    assert _compute_mode(sim, node.uuid(0)) == COMPUTE_MODE_DEFAULT
    assert not sim.mps_running(mps_dirs(node.tmp / "mps", "uid-mps"))


def test_sim_tool_state_checks(sim: SimulatedNvml, tmp: Path) -> None:
    inv = discover(sim, NODE)
    dirs = MpsDirs(tmp / "p", tmp / "l")
    with pytest.raises(GpuToolError, match="Cannot find MPS control daemon"):
        sim.mps_command(dirs, "get_default_active_thread_percentage")
    sim.mps_start(dirs, [inv.gpus[0].uuid])
    with pytest.raises(GpuToolError, match="already running"):
        sim.mps_start(dirs, [inv.gpus[0].uuid])
    with pytest.raises(GpuToolError, match="not visible to this daemon"):
        sim.mps_command(dirs, f"set_default_device_pinned_mem_limit {inv.gpus[1].uuid} 1G")
    with pytest.raises(GpuToolError, match="unsupported command"):
        sim.mps_command(dirs, "make_it_fast")
    with pytest.raises(GpuToolError, match="No device found"):
        sim.set_timeslice("GPU-nope", 1)
    with pytest.raises(ValueError, match="fail_tool"):
        sim.fail_tool("nvmlDeviceGetCount")
