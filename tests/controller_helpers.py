"""Objects and drivers for the controller tests (the `apiserver` fixture provides the API server)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from controller.leader import LeaseTimings
from controller.manager import ControllerConfig, ControllerManager
from sim.roles.embedded import EmbeddedRoles
from driver.discovery import discover
from driver.nvml import load_backend
from driver.slices import SliceSettings, build_slices
from gpudra.features import Features
from gpudra.kubeapi import KubeApi

DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
FAST = LeaseTimings(lease_duration=1.0, renew_deadline=0.6, retry_period=0.1)


class FakeWall:
    """A wall clock the test moves by hand (gang timeouts)."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def manager(api: KubeApi, *, embedded: bool = True, leader_elect: bool = False, identity: str = "test",
            wall: FakeWall | None = None, gang_timeout: float = 60.0, metrics_port: int | None = None,
            features: Features | None = None) -> ControllerManager:
    config = ControllerConfig(
        driver_name=DRIVER, gang_timeout=gang_timeout, leader_elect=leader_elect,
        identity=identity, timings=FAST, tick=0.05, resync_period=5.0, metrics_port=metrics_port,
        metrics_host="127.0.0.1", features=features or Features(),
    )
    return ControllerManager(api, config, wall=wall or FakeWall(), roles=EmbeddedRoles if embedded else None)


def roles(m: ControllerManager) -> EmbeddedRoles:
    """The testbed's scheduler and controller-manager roles of an embedded manager, for tests that look inside."""
    assert isinstance(m.roles, EmbeddedRoles)
    return m.roles


def gpu_class(name: str = GPU_CLASS) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}" && '
                                                     f'device.attributes["{DRIVER}"].type == "gpu"'}}]},
    }


def node(name: str, *, gpus: int | None = None, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Node",
                           "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
                           "spec": {}, "status": {}}
    resources = {"cpu": "64", "memory": "512Gi", "ephemeral-storage": "1Ti", "pods": "110"}
    if gpus is not None:
        resources["nvidia.com/gpu"] = str(gpus)
    obj["status"] = {"allocatable": dict(resources), "capacity": dict(resources)}
    return obj


def sim_slices(node_name: str, profile: str = "sim:dgx-a100") -> list[dict[str, Any]]:
    """What the node agent would publish for a simulated machine."""
    return build_slices(discover(load_backend(profile, node=node_name), node_name), SliceSettings(node_name=node_name, driver_name=DRIVER))


def gpu_slice(node_name: str, devices: Iterable[tuple[str, str]], *, clique: tuple[str, int] | None = None) -> dict[str, Any]:
    """A hand-written slice: (device name, nvlinkDomain) pairs, optionally in a multi-node NVLink clique."""
    devs = []
    for name, domain in devices:
        attrs: dict[str, Any] = {"type": {"string": "gpu"}, "nvlinkDomain": {"string": domain},
                                 "productName": {"string": "NVIDIA H100 80GB HBM3"}}
        if clique is not None:
            attrs["fabricClusterUUID"] = {"string": clique[0]}
            attrs["fabricCliqueID"] = {"int": clique[1]}
        devs.append({"name": name, "attributes": attrs, "capacity": {"memory": {"value": "80Gi"}}})
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{node_name}-{DRIVER}"},
        "spec": {"driver": DRIVER, "nodeName": node_name, "pool": {"name": node_name, "generation": 0,
                                                                   "resourceSliceCount": 1}, "devices": devs},
    }


def claim_spec(count: int = 1, *, match_nvlink: bool = False, device_class: str = GPU_CLASS) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": [{"name": "gpus", "exactly": {"deviceClassName": device_class, "count": count}}]}
    if match_nvlink:
        devices["constraints"] = [{"matchAttribute": f"{DRIVER}/nvlinkDomain"}]
    return {"devices": devices}


def claim(name: str, count: int = 1, *, namespace: str = "default", labels: Mapping[str, str] | None = None,
          match_nvlink: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = dict(labels)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
            "spec": claim_spec(count, match_nvlink=match_nvlink)}


def template(name: str, count: int = 1, *, namespace: str = "default", match_nvlink: bool = False) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"metadata": {"labels": {"app": "train"}}, "spec": claim_spec(count, match_nvlink=match_nvlink)}}


def pod(name: str, *, namespace: str = "default", templates: Mapping[str, str] | None = None,
        claims: Mapping[str, str] | None = None, gpus: int | None = None, priority_class: str | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    if gpus is not None:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    spec: dict[str, Any] = {"containers": [container]}
    refs = [{"name": k, "resourceClaimTemplateName": v} for k, v in (templates or {}).items()]
    refs += [{"name": k, "resourceClaimName": v} for k, v in (claims or {}).items()]
    if refs:
        spec["resourceClaims"] = refs
        container.setdefault("resources", {})["claims"] = [{"name": r["name"]} for r in refs]
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def create_all(api: KubeApi, objs: Iterable[Mapping[str, Any]]) -> None:
    for obj in objs:
        api.create(str(obj["kind"]), dict(obj))


def claims_of(api: KubeApi, namespace: str = "default") -> dict[str, dict[str, Any]]:
    items, _ = api.list("ResourceClaim", namespace=namespace)
    return {i["metadata"]["name"]: i for i in items}


def devices_of(claim_obj: Mapping[str, Any]) -> list[str]:
    alloc = (claim_obj.get("status") or {}).get("allocation") or {}
    return [r["device"] for r in alloc.get("devices", {}).get("results", [])]


def node_of(claim_obj: Mapping[str, Any]) -> str | None:
    alloc = (claim_obj.get("status") or {}).get("allocation") or {}
    for term in (alloc.get("nodeSelector") or {}).get("nodeSelectorTerms", []):
        for f in term.get("matchFields", []):
            if f.get("key") == "metadata.name":
                return str(f["values"][0])
    return None


def events_for(api: KubeApi, pod_name: str, namespace: str = "default") -> list[dict[str, Any]]:
    items, _ = api.list("Event", namespace=namespace, field_selector=f"involvedObject.name={pod_name}")
    return items


def terminating(api: KubeApi, name: str, namespace: str = "default") -> bool:
    """The pod was deleted and waits for its kubelet (it is bound to a node): Terminating."""
    found = api.try_get("Pod", name, namespace=namespace)
    return found is not None and bool(found["metadata"].get("deletionTimestamp"))


def kubelet_finishes_terminating_pods(api: KubeApi) -> list[str]:
    """What a node's kubelet does once a deleted pod's containers have stopped (these tests run none): the final
    delete, with a grace period of 0. The names of the pods it removed."""
    gone = []
    for p in api.list("Pod")[0]:
        if p["metadata"].get("deletionTimestamp"):
            api.delete("Pod", p["metadata"]["name"], namespace=p["metadata"]["namespace"], uid=p["metadata"]["uid"],
                       grace_period_seconds=0)
            gone.append(p["metadata"]["name"])
    return gone
