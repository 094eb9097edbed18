"""The node in a box: the agent with real NVML semantics (the official pynvml over a C mock of libnvidia-ml)
on each supported driver-root layout, claims prepared as on a GPU node, and their CDI specs started by the strict
runtime with a CUDA program inside that finds libcuda.so.1 and exactly the claimed devices.

No NVIDIA Container Toolkit file is on the "host" in any layout. The Ubuntu and driver-container layouts hold a
libc.so.6 of another glibc build beside the NVIDIA libraries: a tool run with that directory on its loader path
dies before main (the negative control below shows it), so the time-slicing and MPS tools exiting 0 there shows
the agent does not put it there. The C sources are built once per session (tests/conftest-style session fixture).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driver import cdi
from driver.discovery import discover
from driver.inventory import Inventory
from driver.nvml import load_backend
from driver.slices import gpu_device_name, mig_device_name
from sim.nodebox.build import Built, BuildError, build
from sim.nodebox.layout import LAYOUTS, Install, install
from sim.runtime import Runtimes
from sim.runtime.podman import ContainerRequest
from sim.runtime.rootfs import add_program
from tests.plugin_helpers import short_tmp
from tests.runtime_helpers import require_podman

pytestmark = pytest.mark.process  # every test here builds or runs the C mock of libnvidia-ml (gcc, the agent)

PROFILE = "a30-4"  # four A30s; GPU 0 in MIG mode with three MIG devices
NODE = "box-node"
CFG = {"apiVersion": "gpu.nvidia.com/v1alpha1", "kind": "GpuConfig"}
TIMESLICE = {**CFG, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}
MPS = {**CFG, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 40,
                                                             "defaultPinnedDeviceMemoryLimit": "2Gi"}}}
MPS_MULTI = {**CFG, "sharing": {"strategy": "MPS", "mpsConfig": {"multiUser": True}}}
CAPS_MAJOR = 238
UVM_MAJOR = 237
DEADLINE = 60.0
CUDA_PROBE = "/usr/local/bin/cudaprobe"
# Non-root container users no account on a CI machine has (a process of the same UID elsewhere on the host could
# signal the containers' processes, and shares their RLIMIT_NPROC).
USER_A, USER_B = 41001, 41002


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    try:
        return build(tmp_path_factory.mktemp("nodebox-build"))
    except BuildError as exc:
        if shutil.which("gcc") is None and not os.environ.get("CI"):
            pytest.skip(str(exc))
        raise


@pytest.fixture(scope="session")
def sim_inventory() -> Inventory:
    return discover(load_backend(f"sim:{PROFILE}", node=NODE), NODE)


def _proc(box: Path, uvm: bool) -> Path:
    """The box's procfs: the driver's majors (nvidia-uvm only where the layout has it loaded)."""
    proc = box / "proc"
    proc.mkdir(parents=True)
    lines = ["Character devices:", "195 nvidia-frontend", f"{CAPS_MAJOR} nvidia-caps"]
    lines += [f"{UVM_MAJOR} nvidia-uvm"] if uvm else []
    (proc / "devices").write_text("\n".join(lines + ["", "Block devices:", "  8 sd", ""]))
    return proc


def _dev(box: Path) -> Path:
    """The box's /dev as the agent waits for it: the driver's control node (a stand-in file; only its presence is
    looked at, the specs type every node)."""
    dev = box / "dev"
    dev.mkdir(exist_ok=True)
    (dev / "nvidiactl").touch()
    return dev


@dataclasses.dataclass
class Box:
    tmp: Path
    inst: Install
    proc: Path
    report: dict[str, Any]
    claims: dict[str, tuple[str, list[tuple[str, str]]]]


def _claims(inv: Inventory) -> list[tuple[str, str, list[tuple[str, str]], dict[str, Any] | None]]:
    mig_gpu, full, shared, mps = inv.gpus
    mig = mig_gpu.mig_devices[0]
    return [
        ("full", "10000000-0000-4000-8000-000000000001", [("gpu", gpu_device_name(full))], None),
        ("mig", "10000000-0000-4000-8000-000000000002", [("mig", mig_device_name(mig_gpu, mig))], None),
        ("timeslice", "10000000-0000-4000-8000-000000000003", [("gpu", gpu_device_name(shared))], TIMESLICE),
        ("mps", "10000000-0000-4000-8000-000000000004", [("gpu", gpu_device_name(mps))], MPS),
        # A multi-user MPS daemon on another MIG device of the MIG GPU (isolated from the first one).
        ("mps-multi", "10000000-0000-4000-8000-000000000005", [("mig", mig_device_name(mig_gpu, mig_gpu.mig_devices[1]))],
         MPS_MULTI),
    ]


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def box(request: pytest.FixtureRequest, built: Built, sim_inventory: Inventory) -> Iterator[Box]:
    layout = LAYOUTS[request.param]
    with short_tmp() as tmp:
        inst = install(tmp / "host", layout, built, profile=PROFILE, node=NODE, version=sim_inventory.driver_version)
        proc = _proc(tmp, uvm=layout.name in ("ubuntu", "rhel"))
        claims = _claims(sim_inventory)
        req = {"driverRoot": str(inst.root), "node": NODE, "procRoot": str(proc), "cdiDir": str(tmp / "cdi"),
               "state": str(tmp), "out": str(tmp / "report.json"), "claims": claims}
        (tmp / "request.json").write_text(json.dumps(req))
        # No LD_LIBRARY_PATH from this process either: the agent process starts as in its image.
        env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
        done = subprocess.run([sys.executable, "-m", "tests.nodebox_agent", str(tmp / "request.json")],
                              capture_output=True, text=True, timeout=180, env=env)
        assert done.returncode == 0, done.stderr
        report = json.loads((tmp / "report.json").read_text())
        try:
            yield Box(tmp, inst, proc, report, {n: (u, d) for n, u, d, _ in claims})
        finally:
            # The MPS daemon the stand-in forked outlives the agent process, as the real one does: stop it.
            for pipe in Path(report["mpsRoot"]).glob("*/pipe"):
                subprocess.run([str(inst.bin_dir / "nvidia-cuda-mps-control")], input="quit\n", text=True,
                               env={**env, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}, capture_output=True, timeout=30)


def _inventory_dict(inv: Inventory) -> dict[str, Any]:
    out = dataclasses.asdict(inv)
    for gpu in out["gpus"]:
        gpu["pcie_root"] = None  # from sysfs on a node, from the profile in the simulator: not NVML's
    return json.loads(json.dumps(out))


def test_discovery_through_pynvml_on_the_mock_matches_the_simulator(box: Box, sim_inventory: Inventory) -> None:
    real = box.report["inventory"]
    for gpu in real["gpus"]:
        gpu["pcie_root"] = None
    assert real == _inventory_dict(sim_inventory)
    assert [len(g["mig_devices"]) for g in real["gpus"]] == [3, 0, 0, 0]


def test_every_claim_prepares_and_the_tools_ran_cleanly(box: Box, sim_inventory: Inventory) -> None:
    assert {n: r["error"] for n, r in box.report["results"].items()} == dict.fromkeys(box.claims, "")
    calls = box.inst.calls_log.read_text().splitlines()
    shared = sim_inventory.gpus[2]
    smi = [c for c in calls if " argv=" in c and "nvidia-smi compute-policy" in c]
    assert len(smi) == 1 and smi[0].endswith(f"-i {shared.uuid} --set-timeslice 3 result=ok"), calls
    # The MPS daemon got the claim's limits from the control client, both run from the driver root.
    daemon = (Path(box.report["mpsRoot"]) / box.claims["mps"][0] / "log" / "control.log").read_text().splitlines()
    mps_gpu = sim_inventory.gpus[3]
    assert f"[daemon] started devices={mps_gpu.uuid} user=0" in daemon
    assert "[daemon] set_default_active_thread_percentage 40" in daemon
    assert f"[daemon] set_default_device_pinned_mem_limit {mps_gpu.uuid} 2048M" in daemon


def test_foreign_libc_beside_the_libraries_breaks_a_tool_given_that_dir(box: Box) -> None:
    """The negative control: the same stand-in with the library dir on its loader path dies before main."""
    if not box.inst.layout.foreign_libc:
        pytest.skip(f"the {box.inst.layout.name} layout keeps no libc beside the NVIDIA libraries")
    done = subprocess.run([str(box.inst.bin_dir / "nvidia-smi"), "-L"], capture_output=True, text=True, timeout=30,
                          env={"LD_LIBRARY_PATH": str(box.inst.lib_dir), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 127 and "GLIBC" in done.stderr, done.stderr
    preloaded = subprocess.run([str(box.inst.bin_dir / "nvidia-smi"), "-L"], capture_output=True, text=True, timeout=30,
                               env={"LD_PRELOAD": str(box.inst.lib_dir / f"libnvidia-ml.so.{box.inst.version}"),
                                    "PATH": "/usr/bin:/bin"})
    assert preloaded.returncode == 0 and preloaded.stdout.count("GPU ") == 4, preloaded.stderr


def test_specs_name_only_nodes_the_node_has(box: Box) -> None:
    for path in (box.tmp / "cdi").glob("*.json"):
        spec = json.loads(path.read_text())
        assert cdi.validate_spec(spec) == []
        nodes = [n for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]]
        assert all(n.get("type") == "c" and n.get("major") for n in nodes), nodes
        uvm = [n for n in nodes if n["path"].startswith("/dev/nvidia-uvm")]
        assert bool(uvm) == (box.inst.layout.name in ("ubuntu", "rhel"))
        mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
        for directory in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64"):
            assert mounts[f"{directory}/libcuda.so.1"] == str(box.inst.lib_dir / f"libcuda.so.{box.inst.version}")
        assert not any("libc.so" in p for p in mounts)
        # No toolkit on the host, none deployed: the one hook is the agent's own, installed by it.
        (hook,) = spec["containerEdits"]["hooks"]
        assert hook["path"] == str(box.tmp / "kubelet/plugins/gpu.nvidia.com-cdi-hook/gpu-dra-cdi-hook")
        assert hook["hookName"] == "createContainer" and hook["args"][:2] == ["gpu-dra-cdi-hook", "update-ldcache"]


def _run(runtime: Any, name: str, ids: list[str]) -> tuple[int, str]:
    runtime.run(ContainerRequest(name, (CUDA_PROBE,), {}, tuple(ids)))
    return _exited(runtime, name)


def _exited(runtime: Any, name: str) -> tuple[int, str]:
    _until(lambda: not runtime.status(name).running, f"{name} still running")
    status = runtime.status(name)
    return int(status.exit_code or 0), runtime.logs(name) + (f"\n[runtime: {status.error}]" if status.error else "")


def _until(condition: Any, what: Any) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(0.1)


def test_cuda_in_the_container_sees_exactly_its_devices(box: Box, built: Built, sim_inventory: Inventory) -> None:
    require_podman()
    runtimes = Runtimes(box.tmp / "runtime")
    add_program(runtimes.rootfs, built.cuda_probe, CUDA_PROBE)
    # The box's host has the driver's control node and GPU nodes, as a node with the driver loaded does; the
    # specs type every node, so the strict runtime stats none of them.
    runtime = runtimes.for_node(NODE, box.tmp / "cdi")
    results = box.report["results"]
    mig_gpu, full = sim_inventory.gpus[0], sim_inventory.gpus[1]
    mig = mig_gpu.mig_devices[0]
    try:
        code, out = _run(runtime, "full", results["full"]["cdiIds"])
        assert code == 0, out
        assert out.splitlines() == ["libcuda /usr/lib/x86_64-linux-gnu/libcuda.so.1", f"device 0 minor {full.minor}"]
        code, out = _run(runtime, "mig", results["mig"]["cdiIds"])
        assert code == 0, out
        gi, ci = cdi.mig_cap_minors(mig_gpu.minor, mig.gpu_instance_id, mig.compute_instance_id)
        lines = out.splitlines()
        assert lines[:2] == ["libcuda /usr/lib/x86_64-linux-gnu/libcuda.so.1", f"device 0 minor {mig_gpu.minor}"]
        assert sorted(lines[2:]) == sorted([f"mig-cap {gi}", f"mig-cap {ci}"])
        # The shared GPUs' claims too: each container finds exactly its GPU; the MPS one is a client of its
        # claim's daemon (a root container: the root server).
        for claim, gpu, mps in (("timeslice", sim_inventory.gpus[2], []), ("mps", sim_inventory.gpus[3], ["mps server uid 0"])):
            code, out = _run(runtime, claim, results[claim]["cdiIds"])
            assert code == 0, out
            assert out.splitlines() == ["libcuda /usr/lib/x86_64-linux-gnu/libcuda.so.1", f"device 0 minor {gpu.minor}", *mps]
    finally:
        runtime.close()


FRAMEWORK_LOOKUP = r"""
set -e
ldconfig -p | grep 'libcuda\.so'
# Triton's lookup: the directories of the cache's libcuda.so.1 entries, where -lcuda must find libcuda.so.
for dir in $(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF}' | xargs -n1 dirname | sort -u); do
  test -e "$dir/libcuda.so" && echo "link-dir $dir"
done
/usr/local/bin/cudadev
/usr/local/bin/cudalink
"""


def test_frameworks_find_libcuda_in_a_glibc_container(box: Box, built: Built) -> None:
    """What CUDA frameworks that JIT-compile kernels do (Triton, so torch.compile and vLLM), in a glibc container
    started from the claim's spec by the strict runtime: `ldconfig -p` lists libcuda.so.1 (the agent's hook rebuilt
    the container's cache with the host's ldconfig), `libcuda.so` is beside it in each such directory (what
    `-lcuda -L<dir>` links against), a program dlopen()ing `libcuda.so` runs cuInit, and one linked with `-lcuda`
    against the stand-in starts and sees its GPU."""
    require_podman()
    ldconfig = shutil.which("ldconfig") or shutil.which("ldconfig", path="/sbin:/usr/sbin")
    assert ldconfig is not None, "glibc's ldconfig is needed here (libc-bin)"
    runtimes = Runtimes(box.tmp / "runtime-frameworks")
    assert runtimes.rootfs is not None
    add_program(runtimes.rootfs, built.cuda_dev, "/usr/local/bin/cudadev")
    add_program(runtimes.rootfs, built.cuda_linked, "/usr/local/bin/cudalink")
    shutil.copy2(os.path.realpath(ldconfig), runtimes.rootfs / "sbin" / "ldconfig")  # static: the image's own
    assert not (runtimes.rootfs / "etc" / "ld.so.cache").exists()
    runtime = runtimes.for_node(NODE, box.tmp / "cdi")
    try:
        runtime.run(ContainerRequest("frameworks", ("sh", "-c", FRAMEWORK_LOOKUP), {},
                                     tuple(box.report["results"]["full"]["cdiIds"])))
        code, out = _exited(runtime, "frameworks")
        assert code == 0, out
        lines = out.splitlines()
        cached = sorted(line.split()[-1] for line in lines if line.strip().startswith("libcuda.so.1 "))
        assert cached == ["/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1"], out
        assert "link-dir /usr/lib/x86_64-linux-gnu" in lines and "link-dir /usr/lib64" in lines, out
        assert "libcuda.so /usr/lib/x86_64-linux-gnu/libcuda.so" in lines and lines.count("cuInit 0") == 2, out
        assert lines[-1] == "devices 1", out
    finally:
        runtime.close()


def test_mps_clients_of_other_users(box: Box, built: Built) -> None:
    """Containers running as non-root UIDs connect to their claim's MPS daemon through the pipe directory (mounted
    read-only); the default daemon serves one UID at a time, as the real one: a client of a second UID is queued
    until the first UID's clients are gone; the multi-user daemon (multiUser) serves both at once from its root
    server; and a tenant cannot control the daemon (raise its limits), root can."""
    require_podman()
    runtimes = Runtimes(box.tmp / "runtime-mps")
    add_program(runtimes.rootfs, built.cuda_probe, CUDA_PROBE)
    runtime = runtimes.for_node(NODE, box.tmp / "cdi")
    hold = box.tmp / "hold"
    hold.mkdir(mode=0o777)
    hold.chmod(0o777)
    results = box.report["results"]
    log = Path(box.report["mpsRoot"]) / box.claims["mps"][0] / "log" / "control.log"

    # Container names podman cannot take for an ID prefix (an all-hex name like "a" can remove another container).
    def client(name: str, claim: str, user: str) -> None:
        (hold / name).write_text("")
        runtime.run(ContainerRequest(name, (CUDA_PROBE, "--hold-while", f"/hold/{name}"), {}, tuple(results[claim]["cdiIds"]),
                                     mounts=((str(hold), "/hold", True),), user=user))

    def served(name: str, uid: int) -> bool:
        return f"mps server uid {uid}" in runtime.logs(name)

    try:
        client("client-a", "mps", f"{USER_A}:{USER_A}")
        _until(lambda: served("client-a", USER_A), lambda: runtime.logs("client-a"))
        client("client-b", "mps", f"{USER_B}:{USER_B}")
        _until(lambda: f"from user {USER_B}: server of user {USER_A} is busy" in log.read_text(),
               lambda: f"{log.read_text()}\na: {runtime.status('client-a')} {runtime.logs('client-a')}")
        assert runtime.status("client-b").running and "mps server" not in runtime.logs("client-b")
        (hold / "client-a").unlink()
        code, out = _exited(runtime, "client-a")
        assert code == 0, out
        _until(lambda: served("client-b", USER_B), lambda: runtime.logs("client-b") + log.read_text())
        (hold / "client-b").unlink()
        code, out = _exited(runtime, "client-b")
        assert code == 0, out

        client("client-c", "mps-multi", f"{USER_A}:{USER_A}")
        client("client-d", "mps-multi", f"{USER_B}:{USER_B}")
        _until(lambda: served("client-c", 0) and served("client-d", 0), lambda: runtime.logs("client-c") + runtime.logs("client-d"))
        assert runtime.status("client-c").running and runtime.status("client-d").running  # both at once
        for name in ("client-c", "client-d"):
            (hold / name).unlink()
            code, out = _exited(runtime, name)
            assert code == 0, out

        raise_limit = ("sh", "-c", "echo set_default_active_thread_percentage 100 | nvidia-cuda-mps-control")
        runtime.run(ContainerRequest("tenant", raise_limit, {}, tuple(results["mps"]["cdiIds"]), user=f"{USER_A}:{USER_A}"))
        code, out = _exited(runtime, "tenant")
        assert code == 1 and "only root or the user running the MPS control daemon" in out, out
        query = ("sh", "-c", "echo get_default_active_thread_percentage | nvidia-cuda-mps-control")
        runtime.run(ContainerRequest("admin", query, {}, tuple(results["mps"]["cdiIds"])))
        code, out = _exited(runtime, "admin")
        assert code == 0 and out.split() == ["40"], out
    finally:
        for held in list(hold.iterdir()):
            held.unlink()
        runtime.close()


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_plugin_process_with_real_nvml_publishes_and_prepares(layout: str, built: Built, apiserver: Any) -> None:
    """`gpu-dra plugin --nvml real --driver-root ...` as a process: it registers with the kubelet simulator,
    publishes the mock's devices and prepares a TimeSlicing claim over the kubelet's gRPC."""
    from sim.kubelet.dra import ClaimInfo, KubeletSim
    from tests.plugin_helpers import DRIVER, NODE as POOL, create_allocated_claim, stop_process

    inventory = discover(load_backend(f"sim:{PROFILE}", node=POOL), POOL)
    with short_tmp() as tmp:
        inst = install(tmp / "host", LAYOUTS[layout], built, profile=PROFILE, node=POOL, version=inventory.driver_version)
        proc = _proc(tmp, uvm=True)
        env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
        with open(tmp / "plugin.log", "wb") as log:
            plugin = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "plugin", "--node", POOL, "--nvml", "real",
                 "--driver-root", str(inst.root), "--host-driver-root", str(inst.root), "--proc-root", str(proc),
                 "--kubeconfig", str(apiserver.kubeconfig), "--kubelet-dir", str(tmp / "kubelet"),
                 "--cdi-dir", str(tmp / "cdi"), "--log-level", "WARNING", "--rediscover-seconds", "0.5",
                 "--dev-root", str(_dev(tmp))],
                env=env, stdout=subprocess.DEVNULL, stderr=log,
            )
        kubelet = KubeletSim(tmp / "kubelet")
        try:
            registered = kubelet.wait_for_plugin(DRIVER, timeout=DEADLINE)
            full = [gpu_device_name(g) for g in inventory.gpus if not g.mig_enabled]
            migs = [mig_device_name(g, m) for g in inventory.gpus for m in g.mig_devices]
            deadline = time.monotonic() + DEADLINE
            while True:
                slices, _ = apiserver.api.list("ResourceSlice")
                names = sorted(d["name"] for s in slices for d in s["spec"].get("devices", []))
                if names == sorted(full + migs):
                    break
                assert time.monotonic() < deadline, (names, (tmp / "plugin.log").read_text())
                time.sleep(0.1)
            shared = inventory.gpus[2]
            config = [{"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": TIMESLICE}}]
            claim = create_allocated_claim(apiserver.api, "ts", [("gpu", gpu_device_name(shared))], config=config)
            prepared = registered.prepare([ClaimInfo("default", claim["metadata"]["uid"], "ts")])
            assert [d.device_name for d in prepared[claim["metadata"]["uid"]]] == [gpu_device_name(shared)]
            calls = inst.calls_log.read_text()
            assert f"-i {shared.uuid} --set-timeslice 3 result=ok" in calls, calls
            (spec_file,) = (tmp / "cdi").glob("*.json")
            assert cdi.validate_spec(json.loads(spec_file.read_text())) == []
            # A driver upgrade under the running agent (a new libnvidia-ml.so.1 in the root): it exits so that
            # its DaemonSet restarts it on the new driver.
            link = inst.lib_dir / "libnvidia-ml.so.1"
            shutil.copy2(built.nvml, inst.lib_dir / "libnvidia-ml.so.590.10.01")
            link.unlink()
            link.symlink_to("libnvidia-ml.so.590.10.01")
            assert plugin.wait(timeout=DEADLINE) == 3, (tmp / "plugin.log").read_text()
            assert "event=exit-for-driver-change" in (tmp / "plugin.log").read_text()
        finally:
            kubelet.close()
            stop_process(plugin)


def test_an_agent_started_before_the_operators_driver_waits_for_it_and_follows_its_restart(
    built: Built, apiserver: Any,
) -> None:
    """The GPU Operator's node: the agent (driver root = the host's /, as the manifest mounts it) starts before the
    driver container. It waits, naming what it waits for, instead of exiting; once the driver container's root is
    mounted at /run/nvidia/driver and its kernel module made /dev/nvidiactl, it registers, publishes and prepares
    with specs naming /run/nvidia/driver on the host. The driver container restarts (its root unmounted): the agent
    exits for the DaemonSet to restart it, and the restarted agent waits for the new root and comes back."""
    from sim.kubelet.dra import ClaimInfo, KubeletSim
    from tests.plugin_helpers import DRIVER, NODE as POOL, create_allocated_claim, stop_process

    inventory = discover(load_backend(f"sim:{PROFILE}", node=POOL), POOL)
    with short_tmp() as tmp:
        host, dev = tmp / "host", tmp / "dev"
        host.mkdir()
        dev.mkdir()
        proc = _proc(tmp, uvm=True)
        env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
        log_path = tmp / "plugin.log"

        def start() -> subprocess.Popen[bytes]:
            with open(log_path, "ab") as log:
                return subprocess.Popen(
                    [sys.executable, "-m", "cli.main", "plugin", "--node", POOL, "--nvml", "real",
                     "--driver-root", str(host), "--dev-root", str(dev), "--proc-root", str(proc),
                     "--kubeconfig", str(apiserver.kubeconfig), "--kubelet-dir", str(tmp / "kubelet"),
                     "--cdi-dir", str(tmp / "cdi"), "--rediscover-seconds", "0.5"],
                    env=env, stdout=subprocess.DEVNULL, stderr=log,
                )

        def log_text() -> str:
            return log_path.read_text()

        kubelet = KubeletSim(tmp / "kubelet")
        plugin = start()
        try:
            _until(lambda: "event=waiting-for-driver" in log_text(), log_text)
            assert f"libnvidia-ml.so.1 under the driver root {host} (host /)" in log_text()
            time.sleep(1.0)
            assert plugin.poll() is None, log_text()  # waiting, not crash-looping

            # The driver container mounts its root, then its kernel module creates the control node.
            inst = install(host, LAYOUTS["operator"], built, profile=PROFILE, node=POOL,
                           version=inventory.driver_version)
            time.sleep(2.5)
            assert plugin.poll() is None and "event=driver-found" not in log_text(), log_text()
            (dev / "nvidiactl").touch()
            registered = kubelet.wait_for_plugin(DRIVER, timeout=DEADLINE)
            assert f"event=driver-found root={inst.root} host_root=/run/nvidia/driver" in log_text()
            full = inventory.gpus[1]
            claim = create_allocated_claim(apiserver.api, "full", [("gpu", gpu_device_name(full))])
            uid = claim["metadata"]["uid"]
            assert [d.device_name for d in registered.prepare([ClaimInfo("default", uid, "full")])[uid]] == [
                gpu_device_name(full)]
            spec = json.loads((tmp / "cdi" / f"k8s.gpu.nvidia.com-claim_{uid}.json").read_text())
            mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
            assert mounts["/usr/lib64/libcuda.so.1"] == f"/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.{inst.version}"

            # The driver container restarts: its root is unmounted (an empty mount point is left).
            inst.root.rename(tmp / "old-driver-root")
            inst.root.mkdir()
            assert plugin.wait(timeout=DEADLINE) == 3, log_text()
            assert "the driver root no longer holds NVML" in log_text()
            plugin = start()  # the DaemonSet's restart
            _until(lambda: log_text().count("event=waiting-for-driver") >= 2, log_text)
            assert f"under the driver root {inst.root} (host /run/nvidia/driver)" in log_text().split("exit-for-driver-change")[-1]
            inst.root.rmdir()
            install(host, LAYOUTS["operator"], built, profile=PROFILE, node=POOL, version=inventory.driver_version)
            _until(lambda: log_text().count("event=driver-found") >= 2, log_text)
            # The restarted agent serves the node again: the claim prepared before is answered from the checkpoint.
            kubelet.sync()
            again = kubelet.wait_for_plugin(DRIVER, timeout=DEADLINE)
            assert [d.device_name for d in again.prepare([ClaimInfo("default", uid, "full")])[uid]] == [
                gpu_device_name(full)]
        finally:
            kubelet.close()
            stop_process(plugin)


MIG_PARTED = r"""
import json, sys
from pathlib import Path
from driver import miginstances
from driver.nvml import load_backend
nvml = load_backend("real", driver_root=Path(sys.argv[1]))
gpu = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(0))
profile, start, size, action = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
if action == "destroy":
    print(json.dumps(miginstances.destroy(nvml, gpu, profile, start)))
else:
    print(json.dumps(miginstances.create(nvml, gpu, profile, start, size).uuid))
"""


def test_a_mig_relayout_by_another_process_is_republished(built: Built, apiserver: Any) -> None:
    """A mig-parted-like process re-lays out MIG under the running agent (the mock's MIG state is the node's, kept
    in a locked state file): the agent's rediscovery republishes the slices without the destroyed device and
    with the recreated one, and the claim prepared on a surviving MIG device stays prepared."""
    from sim.kubelet.dra import ClaimInfo, KubeletSim
    from tests.plugin_helpers import DRIVER, NODE as POOL, create_allocated_claim, stop_process

    inventory = discover(load_backend(f"sim:{PROFILE}", node=POOL), POOL)
    gpu = inventory.gpus[0]
    gone = next(m for m in gpu.mig_devices if m.placement.start == 3)
    kept = next(m for m in gpu.mig_devices if m is not gone)
    profile_id = next(p.profile_id for p in gpu.mig_profiles if p.name == gone.profile)
    with short_tmp() as tmp:
        inst = install(tmp / "host", LAYOUTS["rhel"], built, profile=PROFILE, node=POOL, version=inventory.driver_version)
        proc = _proc(tmp, uvm=True)
        env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
        with open(tmp / "plugin.log", "wb") as log:
            plugin = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "plugin", "--node", POOL, "--nvml", "real",
                 "--driver-root", str(inst.root), "--host-driver-root", str(inst.root), "--proc-root", str(proc),
                 "--kubeconfig", str(apiserver.kubeconfig), "--kubelet-dir", str(tmp / "kubelet"),
                 "--cdi-dir", str(tmp / "cdi"), "--log-level", "WARNING", "--rediscover-seconds", "0.5",
                 "--dev-root", str(_dev(tmp))],
                env=env, stdout=subprocess.DEVNULL, stderr=log,
            )
        kubelet = KubeletSim(tmp / "kubelet")

        def published() -> list[str]:
            slices, _ = apiserver.api.list("ResourceSlice")
            return sorted(d["name"] for s in slices if s["spec"].get("nodeName") == POOL for d in s["spec"].get("devices", []))

        def mig_parted(action: str) -> Any:
            done = subprocess.run([sys.executable, "-c", MIG_PARTED, str(inst.root), str(profile_id),
                                   str(gone.placement.start), str(gone.placement.size), action],
                                  capture_output=True, text=True, timeout=120, env=env)
            assert done.returncode == 0, done.stderr
            return json.loads(done.stdout)

        try:
            registered = kubelet.wait_for_plugin(DRIVER, timeout=DEADLINE)
            names = [mig_device_name(gpu, m) for m in gpu.mig_devices]
            _until(lambda: set(names) <= set(published()), lambda: (published(), (tmp / "plugin.log").read_text()))
            claim = create_allocated_claim(apiserver.api, "kept", [("mig", mig_device_name(gpu, kept))])
            uid = claim["metadata"]["uid"]
            ref = ClaimInfo("default", uid, "kept")
            assert [d.device_name for d in registered.prepare([ref])[uid]] == [mig_device_name(gpu, kept)]

            assert mig_parted("destroy") is True
            _until(lambda: mig_device_name(gpu, gone) not in published(), lambda: published())
            assert mig_device_name(gpu, kept) in published()
            # The claim on the surviving device is still prepared: its spec is there, prepare answers from the
            # checkpoint with the same device.
            assert (tmp / "cdi" / f"k8s.gpu.nvidia.com-claim_{uid}.json").is_file()
            assert [d.device_name for d in registered.prepare([ref])[uid]] == [mig_device_name(gpu, kept)]

            assert mig_parted("create") == gone.uuid
            _until(lambda: mig_device_name(gpu, gone) in published(), lambda: published())
            assert plugin.poll() is None, (tmp / "plugin.log").read_text()  # a re-layout is no driver change
        finally:
            kubelet.close()
            stop_process(plugin)


def test_mig_instances_are_created_and_destroyed_through_pynvml_on_the_mock(built: Built, sim_inventory: Inventory) -> None:
    """What partitionable MIG (driver.miginstances) does, on the mock: destroy, create at a placement, refuse an
    overlap, and discovery seeing each layout; in a process of its own (one NVML per process)."""
    script = r"""
import json, sys
from pathlib import Path
from driver import miginstances
from driver.discovery import discover
from driver.nvml import load_backend
nvml = load_backend("real", driver_root=Path(sys.argv[1]))
gpu = discover(nvml, "n").gpus[0]
small = next(p for p in gpu.mig_profiles if p.name == "1g.6gb")
last = next(m for m in gpu.mig_devices if m.profile == "1g.6gb" and m.placement.start == 3)
out = {"destroyed": miginstances.destroy(nvml, gpu.uuid, small.profile_id, 3)}
out["after_destroy"] = [m.uuid for m in discover(nvml, "n").gpus[0].mig_devices]
created = miginstances.create(nvml, gpu.uuid, small.profile_id, 3, 1)
out["created"] = [created.gpu_instance_id, created.compute_instance_id, created.uuid]
out["after_create"] = [m.uuid for m in discover(nvml, "n").gpus[0].mig_devices]
try:
    miginstances.create(nvml, gpu.uuid, small.profile_id, 2, 1)
except miginstances.MigError as exc:
    out["overlap"] = str(exc)
out["again"] = miginstances.destroy(nvml, gpu.uuid, small.profile_id, 1)
print(json.dumps(out))
"""
    with short_tmp() as tmp:
        inst = install(tmp / "host", LAYOUTS["ubuntu"], built, profile=PROFILE, node=NODE, version=sim_inventory.driver_version)
        done = subprocess.run([sys.executable, "-c", script, str(inst.root)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    gpu = sim_inventory.gpus[0]
    uuids = [m.uuid for m in gpu.mig_devices]
    gone = next(m for m in gpu.mig_devices if m.placement.start == 3)
    assert out["destroyed"] is True and out["after_destroy"] == [u for u in uuids if u != gone.uuid]
    # The same GPU instance id and UUID the simulator gives that placement.
    assert out["created"] == [gone.gpu_instance_id, 0, gone.uuid] and out["after_create"] == uuids
    assert "taken or overlaps" in out["overlap"]
    assert out["again"] is False  # nothing at placement 1: destroying what is gone is not an error


def test_debian_driver_is_found_through_the_roots_ld_so_cache(built: Built, sim_inventory: Inventory) -> None:
    """Debian's packages keep the driver in /usr/lib/x86_64-linux-gnu/nvidia/current, which only the root's
    ld.so.cache (built by glibc's ldconfig) names: found there; without the cache the standard directories are
    searched and it is not found (the error names them); a corrupt cache is warned about, naming the file."""
    from driver import driverfiles
    from driver.driverroot import DriverRoot, DriverRootError

    version = sim_inventory.driver_version
    with short_tmp() as tmp:
        inst = install(tmp / "host", LAYOUTS["debian"], built, profile=PROFILE, node=NODE, version=version)
        root = DriverRoot(inst.root)
        assert root.find_library() == inst.lib_dir / f"libnvidia-ml.so.{version}"
        files = driverfiles.discover(inst.root, version, host_root=str(inst.root))
        mounts = {m.container_path: m.host_path for m in files.mounts}
        assert mounts["/usr/lib/x86_64-linux-gnu/libcuda.so.1"] == str(inst.lib_dir / f"libcuda.so.{version}")
        assert not any("libc.so" in p for p in mounts)  # the host's libc is not a driver library
        cache = inst.root / "etc" / "ld.so.cache"
        good = cache.read_bytes()
        cache.unlink()
        with pytest.raises(DriverRootError, match="libnvidia-ml.so.1 was not found under the driver root .*usr/lib64"):
            root.find_library()
        assert any("no driver" in n for n in driverfiles.discover(inst.root, version).notes)
        cache.write_bytes(good[:100])
        notes = driverfiles.discover(inst.root, version).notes
        assert any(n.startswith(f"{cache}: not a dynamic-linker cache glibc wrote: ") and "do not fit" in n for n in notes), notes
        with pytest.raises(DriverRootError):
            root.find_library()


@pytest.mark.parametrize("profile", ["dgx-h100", "gb200-nvl", "h100-mig", "t4-1", "v100-4"])
def test_the_mock_answers_as_the_simulator_for_other_profiles(profile: str, built: Built) -> None:
    """NVLink peers and NVSwitches (DGX H100), an NVLink fabric (GB200), MIG on H100, GPUs without MIG."""
    sim = discover(load_backend(f"sim:{profile}", node=NODE), NODE)
    script = ("import dataclasses, json, sys; from pathlib import Path; from driver.discovery import discover; "
              "from driver.nvml import load_backend; "
              "print(json.dumps(dataclasses.asdict(discover(load_backend('real', driver_root=Path(sys.argv[1])), sys.argv[2]))))")
    with short_tmp() as tmp:
        inst = install(tmp / "host", LAYOUTS["rhel"], built, profile=profile, node=NODE, version=sim.driver_version)
        done = subprocess.run([sys.executable, "-c", script, str(inst.root), NODE], capture_output=True, text=True,
                              timeout=120)
    assert done.returncode == 0, done.stderr
    real = json.loads(done.stdout)
    for gpu in real["gpus"]:
        gpu["pcie_root"] = None
    assert real == _inventory_dict(sim)


def test_nvidia_imex_starts_in_the_daemon_pods_container_only_with_its_spec(
        box: Box, built: Built, sim_inventory: Inventory) -> None:
    """The IMEX daemon pod's CDI spec (driver.computedomain.imex) on every layout: the box's nvidia-imex (linked
    against the driver's NVML, checking the driver's device nodes) starts in a podman container of it; with the
    daemon spec as it was (config dir, env and the IMEX binaries only) glibc's loader refuses to start it."""
    from driver.computedomain import imex
    from driver.driverfiles import discover as discover_driver_files
    from driver.driverroot import DriverRoot
    from sim.runtime.driverinstall import FABRIC_IMEX_MGMT_MINOR
    from tests.test_imex_daemon_pod import daemon_spec

    require_podman()
    proc = box.tmp / "imex-proc"
    shutil.copytree(box.proc, proc)
    caps = proc / "driver/nvidia/capabilities"
    caps.mkdir(parents=True)
    (caps / "fabric-imex-mgmt").write_text(f"DeviceFileMinor: {FABRIC_IMEX_MGMT_MINOR}\nDeviceFileMode: 256\n")
    root, version = box.inst.root, sim_inventory.driver_version
    files = discover_driver_files(root, version, host_root=str(root))
    numbers = cdi.DeviceNumbers.read(proc)
    # The box installs nvidia-imex only (its stand-in exits once checked: nothing for nvidia-imex-ctl to ask).
    binary = [(str(DriverRoot(root).find_binary("nvidia-imex")), "/usr/bin/nvidia-imex")]
    old = daemon_spec(box.tmp / "imex-old", root, sim_inventory, dict, lambda: binary)
    new = daemon_spec(box.tmp / "imex-new", root, sim_inventory, lambda: imex.daemon_edits(
        numbers, [g.minor for g in sim_inventory.gpus], files), lambda: binary)
    for name, device, want in (("imex-old", old, 127), ("imex-new", new, 0)):
        runtimes = Runtimes(box.tmp / f"{name}-runtime")
        add_program(runtimes.rootfs, built.nvidia_imex, "/usr/local/bin/nodebox-imex")  # its loader and libc
        runtime = runtimes.for_node(NODE, box.tmp / name / "cdi")
        try:
            runtime.run(ContainerRequest(name, ("/usr/bin/nvidia-imex", "-c", "/imexd/imexd.cfg"), {}, (device,)))
            code, out = _exited(runtime, name)
        finally:
            runtime.close()
        assert code == want, out
        if want:
            assert ("error while loading shared libraries: libnvidia-ml.so.1: cannot open shared object file: No such "
                    "file or directory") in out
        else:
            assert f"{len(sim_inventory.gpus)} GPUs, /dev/nvidia-caps/nvidia-cap{FABRIC_IMEX_MGMT_MINOR}" in out, out
