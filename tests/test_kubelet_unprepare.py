"""The kubelet simulator keeps retrying NodeUnprepareResources until it succeeds: a pod deleted while the node
agent is down stays Terminating and has its claim unprepared once the agent is back (CDI spec, checkpoint record
and ledger hold gone); only then does the kubelet delete the pod object."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from driver.checkpoint import Checkpoint
from sim.kubelet.pods import NodeKubelet
from tests.conftest import RunningApiServer
from tests.plugin_helpers import DRIVER, NODE, create_allocated_claim, short_tmp, start_agent

T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T | None], deadline_s: float = 60.0) -> T:
    deadline = time.monotonic() + deadline_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _held(kubelet_dir: Path, tmp: Path, uid: str) -> tuple[bool, bool]:
    """(checkpoint record present, ledger hold present) as the agent's checkpoint says."""
    state_dir = next(p.parent for p in kubelet_dir.rglob("checkpoint.json"))
    cp, _ = Checkpoint.open(state_dir, boot_id_path=tmp / "boot_id")
    try:
        return cp.claim(uid) is not None, any(f"dra:{uid}" in h for h in cp.state.ledger.values())
    finally:
        cp.close()


def test_pod_deleted_while_the_agent_is_down_is_unprepared_when_it_is_back(apiserver: RunningApiServer) -> None:
    api = apiserver.api
    with short_tmp() as tmp:
        agent = start_agent(tmp, api, profile="v100-4")
        kubelet = NodeKubelet(api, NODE, tmp / "kubelet", DRIVER)
        try:
            kubelet.register_plugin(timeout=30)
            kubelet.start()
            slices = wait_for("slices", lambda: api.list("ResourceSlice")[0])
            device = slices[0]["spec"]["devices"][0]["name"]
            claim = create_allocated_claim(api, "gpu", [("gpu", device)])
            uid = claim["metadata"]["uid"]
            pod = api.create("Pod", {"metadata": {"name": "p", "namespace": "default"}, "spec": {
                "nodeName": NODE, "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "g"}]}}],
                "resourceClaims": [{"name": "g", "resourceClaimName": "gpu"}]}}, namespace="default")
            claim = api.get("ResourceClaim", "gpu", namespace="default")
            claim["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": pod["metadata"]["uid"]}]
            api.replace_status("ResourceClaim", claim)
            wait_for("Running", lambda: api.get("Pod", "p", namespace="default").get("status", {}).get("phase") == "Running")
            spec = tmp / "cdi" / f"k8s.gpu.nvidia.com-claim_{uid}.json"
            assert spec.exists() and _held(tmp / "kubelet", tmp, uid) == (True, True)
            agent.stop()  # the node agent is down ...
            api.delete("Pod", "p", namespace="default")  # ... when the pod goes
            wait_for("a failed unprepare", lambda: any(r.unprepare_failures >= 2 for r in kubelet.snapshot().values()))
            assert spec.exists()  # nothing could release it yet
            # The pod stays Terminating, its claim reserved, until its resources are released, as on a real node.
            stuck = api.get("Pod", "p", namespace="default")
            assert stuck["metadata"]["deletionTimestamp"] and stuck["metadata"]["deletionGracePeriodSeconds"] == 30
            assert api.get("ResourceClaim", "gpu", namespace="default")["status"]["reservedFor"]
            agent = start_agent(tmp, api, profile="v100-4")  # back: a new socket, found by the retry
            wait_for("the retried unprepare", lambda: not spec.exists())
            assert _held(tmp / "kubelet", tmp, uid) == (False, False)
            wait_for("the pod deleted by its kubelet", lambda: api.try_get("Pod", "p", namespace="default") is None)
            (record,) = kubelet.snapshot().values()
            assert record.unprepared
        finally:
            kubelet.stop()
            agent.stop()


def test_pod_deleted_while_the_kubelet_was_down_is_unprepared_when_it_starts(apiserver: RunningApiServer) -> None:
    api = apiserver.api
    with short_tmp() as tmp:
        agent = start_agent(tmp, api, profile="v100-4")
        kubelet = NodeKubelet(api, NODE, tmp / "kubelet", DRIVER)
        try:
            kubelet.register_plugin(timeout=30)
            kubelet.start()
            slices = wait_for("slices", lambda: api.list("ResourceSlice")[0])
            device = slices[0]["spec"]["devices"][0]["name"]
            uid = create_allocated_claim(api, "gpu", [("gpu", device)])["metadata"]["uid"]
            pod = api.create("Pod", {"metadata": {"name": "p", "namespace": "default"}, "spec": {
                "nodeName": NODE, "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "g"}]}}],
                "resourceClaims": [{"name": "g", "resourceClaimName": "gpu"}]}}, namespace="default")
            claim = api.get("ResourceClaim", "gpu", namespace="default")
            claim["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": pod["metadata"]["uid"]}]
            api.replace_status("ResourceClaim", claim)
            wait_for("Running", lambda: api.get("Pod", "p", namespace="default").get("status", {}).get("phase") == "Running")
            spec = tmp / "cdi" / f"k8s.gpu.nvidia.com-claim_{uid}.json"
            assert spec.exists()
            kubelet.stop()  # the kubelet is down (its process killed: nothing of it in memory survives) ...
            api.delete("Pod", "p", namespace="default")  # ... when the pod goes
            time.sleep(0.5)
            assert spec.exists()
            kubelet = NodeKubelet(api, NODE, tmp / "kubelet", DRIVER)  # a new kubelet: only its checkpoint is left
            kubelet.register_plugin(timeout=30)
            kubelet.start()
            wait_for("the claim of the deleted pod to be unprepared", lambda: not spec.exists())
            assert _held(tmp / "kubelet", tmp, uid) == (False, False)
        finally:
            kubelet.stop()
            agent.stop()
