"""kill -9 of the plugin process after each prepare/unprepare step: a restart completes the work, no orphans.

The plugin process honours GPU_DRA_TEST_CRASH_AFTER=<step> (a test-only fault hook) by SIGKILLing itself right
after that step, which is as abrupt as a node agent crash gets.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.kubelet.dra import ClaimInfo, KubeletError, KubeletSim
from tests.plugin_helpers import DRIVER, NODE, create_allocated_claim, short_tmp, stop_process

REPO = Path(__file__).resolve().parent.parent


class PluginProcess:
    def __init__(self, work: Path, kubeconfig: Path) -> None:
        self.work = work
        self.kubeconfig = kubeconfig
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, crash_after: str | None = None) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("GPU_DRA_TEST_CRASH_AFTER", None)
        if crash_after:
            env["GPU_DRA_TEST_CRASH_AFTER"] = crash_after
        with open(self.work / "plugin.log", "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "plugin", "--node", NODE, "--nvml", "sim:dgx-h100",
                 "--kubeconfig", str(self.kubeconfig), "--kubelet-dir", str(self.work / "kubelet"),
                 "--cdi-dir", str(self.work / "cdi"), "--log-level", "WARNING"],
                env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log,
            )

    def wait_killed(self) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=30)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_process(proc)


@pytest.fixture
def work() -> Iterator[Path]:
    with short_tmp() as path:
        yield path


def _register(kubelet: KubeletSim):  # type: ignore[no-untyped-def]
    kubelet.restart()  # forget the dead instance, as the kubelet does when its socket stops answering
    return kubelet.wait_for_plugin(DRIVER, timeout=60)



def _device_names(work: Path) -> list[str]:
    from driver.discovery import discover
    from driver.nvml import load_backend
    from driver.slices import gpu_device_name

    return [gpu_device_name(g) for g in discover(load_backend("sim:dgx-h100", node=NODE), NODE).gpus]


@pytest.mark.slow
@pytest.mark.parametrize("step", ["prepare-started", "cdi-written", "prepare-completed"])
def test_crash_during_prepare(work: Path, apiserver, step: str) -> None:  # type: ignore[no-untyped-def]
    names = _device_names(work)
    claim = create_allocated_claim(apiserver.api, "c1", [("gpu", names[0]), ("gpu", names[1])])
    info = ClaimInfo("default", claim["metadata"]["uid"], "c1")
    plugin = PluginProcess(work, apiserver.kubeconfig)
    kubelet = KubeletSim(work / "kubelet")
    try:
        plugin.start(crash_after=step)
        first = _register(kubelet)
        with pytest.raises(KubeletError):
            first.prepare([info])
        assert plugin.wait_killed() == -signal.SIGKILL
        plugin.start()
        second = _register(kubelet)
        devices = second.prepare([info])[info.uid]
        assert [d.device_name for d in devices] == names[:2]
        spec_name = f"k8s.gpu.nvidia.com-claim_{info.uid}.json"
        assert sorted(p.name for p in (work / "cdi").iterdir()) == [spec_name]
        spec = json.loads((work / "cdi" / spec_name).read_text())
        assert [d["name"] for d in spec["devices"]] == [f"{info.uid}-{n}" for n in names[:2]]
        second.unprepare([info])
        assert list((work / "cdi").iterdir()) == []
    finally:
        kubelet.close()
        plugin.stop()


@pytest.mark.slow
@pytest.mark.parametrize("step", ["unprepare-cdi-removed", "unprepare-committed"])
def test_crash_during_unprepare(work: Path, apiserver, step: str) -> None:  # type: ignore[no-untyped-def]
    names = _device_names(work)
    claim = create_allocated_claim(apiserver.api, "c1", [("gpu", names[2])])
    info = ClaimInfo("default", claim["metadata"]["uid"], "c1")
    plugin = PluginProcess(work, apiserver.kubeconfig)
    kubelet = KubeletSim(work / "kubelet")
    try:
        plugin.start()
        _register(kubelet).prepare([info])
        plugin.stop()
        plugin.start(crash_after=step)
        with pytest.raises(KubeletError):
            _register(kubelet).unprepare([info])
        assert plugin.wait_killed() == -signal.SIGKILL
        plugin.start()
        again = _register(kubelet)
        again.unprepare([info])  # the kubelet retries; it must succeed
        assert list((work / "cdi").iterdir()) == []
        # The GPU is free again: another claim can get it.
        other = create_allocated_claim(apiserver.api, "c2", [("gpu", names[2])])
        other_info = ClaimInfo("default", other["metadata"]["uid"], "c2")
        assert again.prepare([other_info])[other_info.uid][0].device_name == names[2]
    finally:
        kubelet.close()
        plugin.stop()
