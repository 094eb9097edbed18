"""Real containers: the CDI specs the node agent writes, run through podman + runc by the testbed's runtime.

Each test prepares claims with the real Preparer on a simulated node (its driver install from
sim.runtime.driverinstall, so specs carry a real mount), then starts busybox containers with the claims' CDI ids
and checks, from inside, what each container got. These run in CI (CI=true) and skip elsewhere when podman,
runc or busybox-static is missing or not running as root (tests/runtime_helpers.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from driver import cdi
from driver.checkpoint import Checkpoint
from driver.discovery import discover
from driver.driverfiles import discover as discover_driver_files
from driver.inventory import Inventory
from driver.nvml import load_backend
from driver.prepare import ClaimRef, Preparer
from driver.slices import gpu_device_name, mig_device_name
from sim.runtime import Runtimes, driverinstall
from sim.runtime.podman import ContainerRequest, PodmanRuntime, RuntimeError_
from tests.plugin_helpers import short_tmp
from tests.runtime_helpers import require_podman
from tests.test_prepare import CFG, Claims, RecordingSharing, claim

pytestmark = pytest.mark.process  # every test here starts a container runtime

NODE = "node-a"
DRIVER = "gpu.nvidia.com"
DEADLINE = 60.0


class Node:
    """A simulated node: inventory, a Preparer writing specs into its CDI dir, and its podman runtime."""

    def __init__(self, tmp: Path, runtime: PodmanRuntime, inventory: Inventory, driver_root: Path,
                 common: dict[str, object], numbers: cdi.DeviceNumbers) -> None:
        self.tmp = tmp
        self.runtime = runtime
        self.inv = inventory
        self.driver_root = driver_root
        self.numbers = numbers
        self.claims = Claims()
        self.sharing = RecordingSharing()
        (tmp / "boot_id").write_text("boot-1")
        cp, report = Checkpoint.open(tmp / "plugin", boot_id_path=tmp / "boot_id")
        self.preparer = Preparer(driver_name=DRIVER, node_name=NODE, get_claim=self.claims.get, inventory=lambda: self.inv,
                                 checkpoint=cp, cdi_dir=tmp / "cdi", sharing_backend=self.sharing, mps_root=tmp / "mps",
                                 common_edits=common, device_numbers=lambda: numbers)
        self.preparer.start(report)

    def prepare(self, name: str, devices: list[tuple[str, str]], **kw: object) -> list[str]:
        uid = f"{len(self.claims.objects) + 1}0000000-aaaa-bbbb-cccc-{name:0>12}"[:36]
        self.claims.add(claim(name, uid, devices, pool=NODE, **kw))  # type: ignore[arg-type]
        result = self.preparer.prepare([ClaimRef(uid, "ns", name)])[uid]
        assert result.error == ""
        return [i for d in result.devices for i in d.cdi_device_ids]

    def run(self, name: str, script: str, cdi_ids: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
        self.runtime.run(ContainerRequest(name, ("sh", "-c", script), env or {}, tuple(cdi_ids)))
        deadline = time.monotonic() + DEADLINE
        while True:
            status = self.runtime.status(name)
            if not status.running:
                assert status.exit_code is not None, status
                return status.exit_code, self.runtime.logs(name)
            assert time.monotonic() < deadline, f"container {name} still running after {DEADLINE} s"
            time.sleep(0.1)


def _node(tmp: Path, profile: str, driver_root: Path | None = None, hook_path: str | None = None) -> Iterator[Node]:
    require_podman()
    nvml = load_backend(f"sim:{profile}", node=NODE)
    inventory = discover(nvml, NODE)
    root = driver_root or driverinstall.write(tmp / "driver", NODE, inventory)
    files = discover_driver_files(root, inventory.driver_version, host_root=str(root), hook_path=hook_path)
    runtime = Runtimes(tmp / "runtime").for_node(NODE, tmp / "cdi")
    try:
        # The simulator's device numbers, as the agent uses them: every node typed, nothing stat-ed on the host.
        yield Node(tmp, runtime, inventory, root, files.container_edits(), nvml.device_numbers())
    finally:
        runtime.close()


@pytest.fixture
def node() -> Iterator[Node]:
    with short_tmp() as tmp:
        yield from _node(tmp, "h100-mig")


def test_container_sees_its_claims_device_nodes_and_no_other_gpu(node: Node) -> None:
    plain = [g for g in node.inv.gpus if not g.mig_devices]
    mig_gpu = next(g for g in node.inv.gpus if g.mig_devices)
    mig = mig_gpu.mig_devices[0]
    a = node.prepare("a", [("gpu", gpu_device_name(plain[0]))])
    node.prepare("b", [("gpu", gpu_device_name(plain[1]))])
    m = node.prepare("m", [("mig", mig_device_name(mig_gpu, mig))])
    probe = ("nvidia-smi -L; echo VISIBLE=$NVIDIA_VISIBLE_DEVICES; for f in /dev/nvidia* /dev/nvidia-caps/*; do "
             "[ -c $f ] && echo NODE=$f; done; grep ' 195:' /sys/fs/cgroup/devices/devices.list || true; "
             f"cat /dev/nvidia{plain[1].minor} 2>&1 | head -1")
    code, out = node.run("sees-a", probe, a)
    assert code == 0, out
    lines = out.splitlines()
    assert f"GPU 0: {plain[0].product_name} (UUID: {plain[0].uuid})" in lines
    assert not any(plain[1].uuid in line for line in lines) and sum(line.startswith("GPU ") for line in lines) == 1
    # NVIDIA_VISIBLE_DEVICES as the claim's spec sets it (the claim's UUIDs).
    spec_a = json.loads((node.tmp / "cdi" / cdi.spec_file_name(a[0].split("=", 1)[1][:36])).read_text())
    (visible,) = [e for e in spec_a["devices"][0]["containerEdits"]["env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert f"VISIBLE={visible.split('=', 1)[1]}" in lines
    nodes = {line[5:] for line in lines if line.startswith("NODE=")}
    assert nodes == {f"/dev/nvidia{plain[0].minor}", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
    # The cgroup allows exactly its GPU's node (195:minor) and nvidiactl (195:255) of NVIDIA's major.
    assert sorted(line for line in lines if " 195:" in line) == sorted([f"c 195:{plain[0].minor} rwm", "c 195:255 rwm"])
    assert any("No such file or directory" in line for line in lines)  # the other GPU's node does not exist

    code, out = node.run("sees-mig", probe, m)
    assert code == 0, out
    lines = out.splitlines()
    gi, ci = cdi.mig_cap_minors(mig_gpu.minor, mig.gpu_instance_id, mig.compute_instance_id)
    assert [line for line in lines if "UUID" in line] == [
        f"GPU 0: {mig_gpu.product_name} (UUID: {mig_gpu.uuid})",
        f"  MIG {mig.profile:<12} Device  0: (UUID: {mig.uuid})",
    ]
    nodes = {line[5:] for line in lines if line.startswith("NODE=")}
    assert {f"/dev/nvidia-caps/nvidia-cap{gi}", f"/dev/nvidia-caps/nvidia-cap{ci}", f"/dev/nvidia{mig_gpu.minor}"} <= nodes
    assert not any(f"/dev/nvidia{g.minor}" in nodes for g in node.inv.gpus if g is not mig_gpu)
    # Only this MIG device's caps: another MIG device of the same GPU is not visible.
    assert len([n for n in nodes if n.startswith("/dev/nvidia-caps/")]) == 2


def test_env_and_mounts_as_the_spec_says_and_the_mps_pipe_dir_is_shared_read_only(node: Node) -> None:
    gpu = next(g for g in node.inv.gpus if not g.mig_devices)
    mps = [{"requests": [], "opaque": {"driver": DRIVER, "parameters": {**CFG, "sharing": {"strategy": "MPS"}}}}]
    ids = node.prepare("mps", [("gpu", gpu_device_name(gpu))], config=mps)
    spec = json.loads(next((node.tmp / "cdi").glob("*.json")).read_text())
    edits = spec["devices"][0]["containerEdits"]
    env = dict(e.split("=", 1) for e in edits["env"])
    pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
    assert {m["containerPath"] for m in edits["mounts"]} >= {pipe}
    host_pipe = next(m["hostPath"] for m in edits["mounts"] if m["containerPath"] == pipe)
    (Path(host_pipe) / "from-daemon").write_text("hello\n")  # what the daemon creates there
    # The spec's env arrives as written; the driver install's nvidia-smi and the pipe dir are mounted read-only:
    # a tenant can neither write into the daemon's pipe dir nor plant a link there.
    code, out = node.run("tenant", f"env; cat {pipe}/from-daemon; (echo x > {pipe}/planted) 2>/dev/null || echo PIPE_READ_ONLY; "
                                   f"ln -s /etc/passwd {pipe}/control 2>/dev/null || echo NO_LINK; "
                                   "(echo x > /usr/bin/nvidia-smi) 2>/dev/null || echo NVIDIA_SMI_READ_ONLY", ids,
                         env={"POD_ENV": "from-the-pod"})
    assert code == 0, out
    lines = out.splitlines()
    for key, value in env.items():
        assert f"{key}={value}" in lines
    assert "POD_ENV=from-the-pod" in lines and "hello" in lines
    assert {"PIPE_READ_ONLY", "NO_LINK", "NVIDIA_SMI_READ_ONLY"} <= set(lines)
    assert sorted(p.name for p in Path(host_pipe).iterdir()) == ["from-daemon"]
    # The second replica of the same claim sees the same daemon pipe dir.
    code, out = node.run("second", f"cat {pipe}/from-daemon", ids)
    assert (code, out) == (0, "hello\n")


@pytest.fixture
def node_with_hooks() -> Iterator[Node]:
    """A node whose driver install has a library, and a deployed nvidia-cdi-hook that records each call."""
    with short_tmp() as tmp:
        inventory = discover(load_backend("sim:h100-mig", node=NODE), NODE)
        root = driverinstall.write(tmp / "driver", NODE, inventory)
        lib = root / "usr/lib/x86_64-linux-gnu"
        lib.mkdir(parents=True)
        (lib / f"libcuda.so.{inventory.driver_version}").write_text("not really libcuda\n")
        (lib / "libcuda.so.1").symlink_to(f"libcuda.so.{inventory.driver_version}")
        hook = tmp / "deployed/nvidia-cdi-hook"
        hook.parent.mkdir()
        record = tmp / "hook-calls"
        hook.write_text(f'#!/bin/sh\n{{ echo "ARGS $*"; echo "STATE $(cat)"; }} >> {record}\n')
        hook.chmod(0o755)
        yield from _node(tmp, "h100-mig", driver_root=root, hook_path=str(hook))


def test_hooks_run_once_and_driver_files_are_mounted(node_with_hooks: Node) -> None:
    node = node_with_hooks
    gpu = next(g for g in node.inv.gpus if not g.mig_devices)
    gpu2 = next(g for g in node.inv.gpus if not g.mig_devices and g is not gpu)
    ids = node.prepare("h", [("gpus", gpu_device_name(gpu)), ("gpus", gpu_device_name(gpu2))])
    spec = json.loads(next((node.tmp / "cdi").glob("*.json")).read_text())
    assert [h["args"][1] for h in spec["containerEdits"]["hooks"]] == ["enable-cuda-compat", "disable-device-node-modification"]
    version = node.inv.driver_version
    # Both image families' system library dirs hold the file (no loader cache or link needed to find it).
    code, out = node.run("hooked", f"cat /usr/lib/x86_64-linux-gnu/libcuda.so.{version} /usr/lib64/libcuda.so.{version}", ids)
    assert (code, out) == (0, "not really libcuda\n" * 2)
    calls = (node.tmp / "hook-calls").read_text().splitlines()
    args = [c for c in calls if c.startswith("ARGS ")]
    # Two devices of one claim, the spec's hooks once each (top-level edits apply once per container).
    assert args == [f"ARGS enable-cuda-compat --host-driver-version={version}", "ARGS disable-device-node-modification"]
    states = [json.loads(c[len("STATE "):]) for c in calls if c.startswith("STATE ")]
    assert len(states) == 2 and all(s["status"] == "creating" and s["bundle"] and s["pid"] > 0 for s in states)  # createContainer: before start


def test_a_spec_podman_refuses_is_a_clear_error(node: Node) -> None:
    (node.tmp / "cdi" / "broken.json").write_text(json.dumps({
        "cdiVersion": "0.5.0", "kind": "example.com/thing", "devices": [{"name": "x", "containerEdits": {}}]}))
    with pytest.raises(RuntimeError_, match="podman run exited with status"):
        node.runtime.run(ContainerRequest("refused", ("true",), {}, ("example.com/thing=x",)))


def test_device_plugin_spec_runs_too(node: Node) -> None:
    from driver.deviceplugin import legacy_cdi_id, legacy_cdi_spec, LEGACY_SPEC_FILE

    gpus = [g for g in node.inv.gpus if not g.mig_devices][:2]
    common = discover_driver_files(node.driver_root, node.inv.driver_version, host_root=str(node.driver_root)).container_edits()
    spec = legacy_cdi_spec(gpus, common, node.numbers)
    assert spec["cdiVersion"] <= "0.5.0"
    (node.tmp / "cdi" / LEGACY_SPEC_FILE).write_text(json.dumps(spec))
    code, out = node.run("legacy", "nvidia-smi -L", [legacy_cdi_id(gpus[1].uuid)],
                         env={"NVIDIA_VISIBLE_DEVICES": gpus[1].uuid})
    assert (code, out) == (0, f"GPU 0: {gpus[1].product_name} (UUID: {gpus[1].uuid})\n")


def test_on_demand_mig_device_runs_and_is_listed() -> None:
    """A partitionable GPU's MIG device created at prepare: its spec runs, the container sees only it."""
    from tests.test_mig_on_demand import Node as MigNode, placement_name

    require_podman()
    with short_tmp() as tmp:
        mig_node = MigNode(tmp)
        gpu = mig_node.gpu(0)
        root = driverinstall.write(tmp / "driver", NODE, mig_node.inv)  # before the MIG device exists
        common = discover_driver_files(root, mig_node.inv.driver_version, host_root=str(root)).container_edits()
        mig_node.preparer._common_edits = common  # the agent passes its driver files the same way
        numbers = load_backend("sim:h100-mig", node=NODE).device_numbers()
        mig_node.preparer._device_numbers = lambda: numbers  # and the simulator's device numbers
        ref = mig_node.add_claim("slice", "1b2c3d4e-0000-0000-0000-000000000001", [placement_name(gpu, "1g.10gb", 0)])
        result = mig_node.preparer.prepare([ref])[ref.uid]
        assert result.error == ""
        (created,) = list(mig_node.gpu(0).mig_devices)
        # The spec says NVIDIA_VISIBLE_DEVICES=void, so the simulated nvidia-smi cannot tell profiles sharing this
        # placement apart by UUID: the install is rewritten from the new inventory, as the driver's own view is.
        driverinstall.write(tmp / "driver", NODE, mig_node.inv)
        runtime = Runtimes(tmp / "runtime").for_node(NODE, tmp / "cdi")
        try:
            runtime.run(ContainerRequest("slice", ("nvidia-smi", "-L"), {}, result.devices[0].cdi_device_ids))
            deadline = time.monotonic() + DEADLINE
            while runtime.status("slice").running:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert runtime.status("slice").exit_code == 0, runtime.logs("slice")
            assert runtime.logs("slice").splitlines() == [
                f"GPU 0: {gpu.product_name} (UUID: {gpu.uuid})",
                f"  MIG 1g.10gb      Device  0: (UUID: {created.uuid})",
            ]
        finally:
            runtime.close()


def test_a_container_removed_behind_the_runtimes_back_reads_as_unknown(node: Node) -> None:
    node.runtime.run(ContainerRequest("gone", ("sleep", "1000")))
    assert node.runtime.status("gone").running
    node.runtime._podman("rm", "-f", "--time", "0", "gone")  # as if someone else removed it
    deadline = time.monotonic() + DEADLINE
    while (status := node.runtime.status("gone")).running:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert status.exit_code == 137 and "gone" in status.error


def test_a_name_no_container_has_removes_no_other_container(node: Node) -> None:
    """podman takes a name no container has for an ID prefix: removing (or re-running) such a name must not
    remove the container whose ID begins with it."""
    node.runtime.run(ContainerRequest("keeper", ("sleep", "1000")))
    ident = node.runtime._podman("inspect", "--format", "{{.Id}}", "keeper").stdout.strip()
    node.runtime.remove(ident[:3])
    state = node.runtime._podman("inspect", "--format", "{{.State.Status}}", "keeper", check=False)
    assert state.stdout.strip() == "running", state.stderr
    node.runtime.remove("keeper", grace_seconds=0)


def test_strict_runtime_refuses_a_node_named_by_path_that_the_host_lacks() -> None:
    """As containerd's CDI handling: a node without type and major is stat-ed on the host; the runtime creates
    nothing a spec names. The node's own device nodes (host_devices) are what makes such a spec start."""
    require_podman()
    spec = {"cdiVersion": "0.5.0", "kind": "example.com/gpu", "devices": [
        {"name": "g", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia7"}]}}]}
    with short_tmp() as tmp:
        (tmp / "cdi").mkdir()
        (tmp / "cdi" / "example.json").write_text(json.dumps(spec))
        runtimes = Runtimes(tmp / "runtime")
        bare = runtimes.for_node("bare", tmp / "cdi")
        try:
            with pytest.raises(RuntimeError_, match='failed to stat CDI host device "/dev/nvidia7"'):
                bare.run(ContainerRequest("refused", ("true",), {}, ("example.com/gpu=g",)))
        finally:
            bare.close()
        with_gpu = runtimes.for_node("with-gpu", tmp / "cdi", host_devices=[("/dev/nvidia7", 195, 7)])
        try:
            with_gpu.run(ContainerRequest("started", ("sh", "-c", "stat -c '%t:%T' /dev/nvidia7"), {}, ("example.com/gpu=g",)))
            deadline = time.monotonic() + DEADLINE
            while with_gpu.status("started").running:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert (with_gpu.status("started").exit_code, with_gpu.logs("started")) == (0, "c3:7\n")
        finally:
            with_gpu.close()
