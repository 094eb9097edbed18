"""The IMEX daemon pod gets what nvidia-imex needs, and the simulated nvidia-imex refuses to start without it.

A GB200 tray's simulated driver install (sim.runtime.driverinstall), the daemon claim's CDI spec as the node agent
writes it (driver.computedomain.preparer with imex.daemon_edits), and the host process runtime that runs the daemon
pods' containers (sim.runtime.hostprocess): with the spec the stand-in passes its checks (and then reads its
config); with the daemon spec as it was before (config dir, env and the IMEX binaries only) it fails as a real one
would, on the missing driver library, and without device nodes on the missing /dev/nvidiactl."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from driver.cdi import DeviceNumbers
from driver.computedomain import imex
from driver.computedomain.preparer import Checkpoint, ComputeDomainPreparer, NodeContext
from driver.discovery import discover
from driver.driverfiles import discover as discover_driver_files
from driver.prepare import ClaimRef
from gpudra import computedomain as cd
from sim.imex.daemon import LOADER_EXIT, missing
from sim.nvml.profile import load_profile
from sim.nvml.simulator import SimulatedNvml
from sim.runtime import driverinstall
from sim.runtime.hostprocess import OWN_IMAGE, HostProcessRuntime
from sim.runtime.podman import ContainerRequest
from tests.polling import until

DOMAIN = {"metadata": {"name": "train", "namespace": "ml", "uid": "d-1"}}
CLAIM = {"metadata": {"name": "dm", "namespace": "gpu-dra-system"}, "status": {"allocation": {"devices": {
    "results": [{"request": "daemon", "driver": cd.DRIVER, "pool": "tray", "device": "daemon-0"}],
    "config": [{"source": "FromClaim", "opaque": {"driver": cd.DRIVER, "parameters": {
        "apiVersion": cd.API_VERSION, "kind": cd.DAEMON_CONFIG_KIND, "domainID": "d-1"}}}]}}}}


def _tray(tmp_path: Path) -> tuple[Path, Any]:
    nvml = SimulatedNvml(load_profile("gb200-nvl"))
    nvml.nvmlInit()
    inventory = discover(nvml, "tray")
    return driverinstall.write(tmp_path / "driver", "tray", inventory), inventory


def daemon_spec(tmp_path: Path, root: Path, inventory: Any, edits: Any, binaries: Any = None) -> str:
    """Prepare the daemon claim (its CDI spec in tmp_path/cdi); returns its CDI device id. `binaries`: the IMEX
    binaries' mounts (default: imex.binaries of `root`)."""
    preparer = ComputeDomainPreparer(
        NodeContext("tray", "c.1", lambda d: imex.write_domain_dir(tmp_path / "domains", d), lambda: DeviceNumbers(),
                    binaries or (lambda: imex.binaries(root, str(root))), edits),
        Checkpoint(tmp_path / "checkpoint.json"), tmp_path / "cdi", get_claim=lambda ns, name: CLAIM,
        get_domain=lambda uid: DOMAIN, daemon_ready=lambda uid: (True, ""), label_node=lambda d: None)
    result = preparer.prepare([ClaimRef("u1", "gpu-dra-system", "dm")])["u1"]
    assert not result.error, result.error
    return result.devices[0].cdi_device_ids[0]


def test_the_daemon_spec_has_the_gpu_control_and_imex_nodes_and_the_driver_files(tmp_path: Path) -> None:
    root, inventory = _tray(tmp_path)
    numbers = DeviceNumbers.read(root / "proc")
    files = discover_driver_files(root, inventory.driver_version, host_root=str(root))
    daemon_spec(tmp_path, root, inventory,
                 lambda: imex.daemon_edits(numbers, [g.minor for g in inventory.gpus], files))
    spec = json.loads((tmp_path / "cdi" / "k8s.compute-domain.nvidia.com-claim_u1.json").read_text())
    edits = spec["devices"][0]["containerEdits"]
    nodes = {n["path"]: (n["major"], n["minor"]) for n in edits["deviceNodes"]}
    assert {f"/dev/nvidia{g.minor}" for g in inventory.gpus} | {"/dev/nvidiactl", "/dev/nvidia-uvm"} <= set(nodes)
    assert nodes[f"/dev/nvidia-caps/nvidia-cap{driverinstall.FABRIC_IMEX_MGMT_MINOR}"] == (
        numbers.majors["nvidia-caps"], driverinstall.FABRIC_IMEX_MGMT_MINOR)
    targets = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    assert targets["/imexd"] == str(tmp_path / "domains" / "d-1")
    assert targets["/usr/bin/nvidia-imex"] == str(root / "usr/bin/nvidia-imex")
    assert targets["/usr/lib64/libnvidia-ml.so.1"] == str(root / f"usr/lib64/libnvidia-ml.so.{inventory.driver_version}")
    # The host's IMEX channel nodes, as NVIDIA's management-mode device lists them (none on a simulated node).
    assert imex.host_channel_nodes(None) == [] and imex.host_channel_nodes(tmp_path / "no-dev") == []
    channels = [{"path": "/dev/nvidia-caps-imex-channels/channel0", "type": "c", "major": 509, "minor": 0}]
    with_channels = imex.daemon_edits(numbers, [0], files, channels)["deviceNodes"]
    assert channels[0] in with_channels and with_channels[-1]["path"].startswith("/dev/nvidia-caps/nvidia-cap")
    # A driver that publishes no fabric-imex-mgmt capability: the node cannot run the daemon, and says why.
    with pytest.raises(imex.ImexError, match="fabric-imex-mgmt"):
        imex.daemon_edits(DeviceNumbers(numbers.majors, None), [0], files)


def test_stand_in_refuses_without_library_or_device_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, inventory = _tray(tmp_path)
    capability = root / driverinstall.CAPABILITIES_DIR / "fabric-imex-mgmt"
    container = tmp_path / "container"
    container.mkdir()
    monkeypatch.setenv("GPU_DRA_CONTAINER_ROOT", str(container))
    assert missing(len(inventory.gpus), capability) == (LOADER_EXIT, (
        "nvidia-imex: error while loading shared libraries: libnvidia-ml.so.1: cannot open shared object file: "
        "No such file or directory"))
    (container / "usr/lib64").mkdir(parents=True)
    (container / "usr/lib64/libnvidia-ml.so.1").symlink_to(root / f"usr/lib64/libnvidia-ml.so.{inventory.driver_version}")
    code, message = missing(len(inventory.gpus), capability) or (0, "")
    assert code == 1 and message.startswith("nvidia-imex: failed to open /dev/nvidiactl: No such file or directory")
    (container / "dev").mkdir()
    (container / "dev/nvidiactl").write_text("")  # a file is no device node
    assert "failed to open /dev/nvidiactl: not a character device" in (missing(1, capability) or (0, ""))[1]


def _run(tmp_path: Path, name: str, device: str) -> tuple[int, str]:
    runtime = HostProcessRuntime(tmp_path / "host", tmp_path / "cdi")
    log = tmp_path / f"{name}.log"
    try:
        runtime.run(ContainerRequest(name, ("nvidia-imex", "-c", "/imexd/imexd.cfg"), {}, (device,), log_path=log,
                                     image=f"{OWN_IMAGE}:test"))
        status = until(f"{name} exits", lambda: (lambda s: s if not s.running else None)(runtime.status(name)),
                       timeout=30.0)
    finally:
        runtime.close()
    return int(status.exit_code or 0), log.read_text()


@pytest.mark.process
@pytest.mark.skipif(os.geteuid() != 0, reason="the host process runtime makes device nodes with mknod (root)")
def test_nvidia_imex_starts_in_the_daemon_pod_only_with_the_new_spec(tmp_path: Path) -> None:
    root, inventory = _tray(tmp_path)
    numbers = DeviceNumbers.read(root / "proc")
    files = discover_driver_files(root, inventory.driver_version, host_root=str(root))
    old = daemon_spec(tmp_path / "old", root, inventory, dict)  # config dir, env and binaries only
    code, log = _run(tmp_path / "old", "old", old)
    assert code == LOADER_EXIT and "libnvidia-ml.so.1: cannot open shared object file" in log
    new = daemon_spec(tmp_path / "new", root, inventory,
                       lambda: imex.daemon_edits(numbers, [g.minor for g in inventory.gpus], files))
    code, log = _run(tmp_path / "new", "new", new)
    # Past its checks, it reads its config: the domain dir holds only the template until the daemon fills it in.
    assert code == 1 and "config file /imexd/imexd.cfg: No such file or directory" in log, log
    assert "failed to open" not in log and "error while loading" not in log


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_host_channel_nodes_are_the_hosts_character_devices_in_channel_order(tmp_path: Path) -> None:
    directory = tmp_path / "nvidia-caps-imex-channels"
    directory.mkdir()
    for n in (10, 2):
        os.mknod(directory / f"channel{n}", 0o600 | stat.S_IFCHR, os.makedev(509, n))
    (directory / "channel3").write_text("")  # not a device node
    (directory / "README").write_text("")
    assert imex.host_channel_nodes(tmp_path) == [
        {"path": f"/dev/nvidia-caps-imex-channels/channel{n}", "type": "c", "major": 509, "minor": n} for n in (2, 10)]
