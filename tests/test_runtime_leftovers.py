"""What a node runtime leaves running when the process that owns it is killed (SIGKILL: no clean-up) is found
and stopped from its state dir: containers, conmon monitors, the namespace holder. Gated like test_runtime.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sim.runtime import Runtimes
from sim.runtime.namespace import leftover_holder, same_mount_namespace
from sim.runtime.podman import ContainerRequest, stop_leftovers
from tests.plugin_helpers import short_tmp
from tests.runtime_helpers import require_podman


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


@pytest.mark.process
def test_stop_leftovers_after_the_owner_died() -> None:
    require_podman()
    with short_tmp() as tmp:
        runtime = Runtimes(tmp / "runtime").for_node("n1", tmp / "cdi")
        runtime.run(ContainerRequest("k8s_c_p_default_u_0", ("sleep", "1000")))
        holder = leftover_holder(runtime.state_dir / "ns")
        assert holder == runtime.ns.pid
        monitors = same_mount_namespace(holder)
        assert monitors  # conmon
        container_pid = int((runtime.state_dir / "conmon" / "k8s_c_p_default_u_0.ctr.pid").read_text())
        assert _alive(container_pid)
        # The owner is gone without closing anything (as after kill -9): the state dir is all that is left.
        stopped = stop_leftovers(runtime.state_dir)
        assert stopped[0] == "1 containers" and stopped[-1].startswith(f"namespace holder (pid {holder})")
        deadline = time.monotonic() + 20
        while any(_alive(p) for p in (container_pid, holder, *monitors)):
            assert time.monotonic() < deadline, "leftovers still running"
            time.sleep(0.1)
        assert stop_leftovers(runtime.state_dir) == []  # nothing twice; a reused pid is never taken for it
        runtime.ns.close()  # reaps the (already killed) holder, our child here
