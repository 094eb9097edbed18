"""Kubernetes semantics of the embedded control plane: deletion, garbage collection, admission, binding,
immutability and concurrent writers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from controlplane import EmbeddedApiServer
from gpudra.kubeapi import ApiError, Conflict, Invalid, KubeApi


def _wait_deleted(api: KubeApi, kind: str, name: str, namespace: str | None = None) -> None:
    """Block on a watch until `name` is gone (the collector runs in the background)."""
    stop = threading.Event()
    field = f"metadata.name={name}"
    current = api.try_get(kind, name, namespace)
    if current is None:
        return
    # Watch from the version just read, so a deletion between the read and the watch is still delivered.
    since = current["metadata"]["resourceVersion"]
    for etype, _ in api.watch(kind, namespace=namespace, field_selector=field, resource_version=since, stop=stop):
        if etype == "DELETED":
            stop.set()
            return


def test_finalizers_hold_deletion_until_removed(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    api.create("ResourceClaim", {"metadata": {"name": "c", "finalizers": ["gpu.nvidia.com/delete-protection"]},
                                 "spec": {}})
    assert api.delete("ResourceClaim", "c", "default") is True
    held = api.get("ResourceClaim", "c", "default")
    assert held["metadata"]["deletionTimestamp"].endswith("Z")
    assert held["metadata"]["finalizers"] == ["gpu.nvidia.com/delete-protection"]
    with pytest.raises(Invalid) as err:
        api.patch("ResourceClaim", "c", {"metadata": {"finalizers": ["a", "gpu.nvidia.com/delete-protection"]}},
                  "default")
    assert err.value.causes[0]["field"] == "metadata.finalizers"
    # A second delete is accepted and changes nothing.
    assert api.delete("ResourceClaim", "c", "default") is True
    assert api.get("ResourceClaim", "c", "default")["metadata"]["resourceVersion"] == held["metadata"]["resourceVersion"]
    api.patch("ResourceClaim", "c", [{"op": "remove", "path": "/metadata/finalizers"}], "default", patch_type="json")
    assert api.try_get("ResourceClaim", "c", "default") is None


def test_delete_preconditions(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    obj = api.create("Node", {"metadata": {"name": "n1"}})
    with pytest.raises(Conflict) as err:
        api.delete("Node", "n1", uid="not-the-uid")
    assert "Precondition failed: UID in precondition" in err.value.message
    assert api.delete("Node", "n1", uid=obj["metadata"]["uid"]) is True


def test_owner_references_are_garbage_collected(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    pod = api.create("Pod", {"metadata": {"name": "owner"}, "spec": {"containers": []}})
    ref = {"apiVersion": "v1", "kind": "Pod", "name": "owner", "uid": pod["metadata"]["uid"], "controller": True}
    other = api.create("Pod", {"metadata": {"name": "other-owner"}, "spec": {"containers": []}})
    other_ref = {"apiVersion": "v1", "kind": "Pod", "name": "other-owner", "uid": other["metadata"]["uid"]}
    api.create("ResourceClaim", {"metadata": {"name": "only-owned", "ownerReferences": [ref]}, "spec": {}})
    api.create("ResourceClaim", {"metadata": {"name": "co-owned", "ownerReferences": [ref, other_ref]}, "spec": {}})
    api.delete("Pod", "owner", "default")
    _wait_deleted(api, "ResourceClaim", "only-owned", "default")
    assert api.try_get("ResourceClaim", "only-owned", "default") is None
    assert api.try_get("ResourceClaim", "co-owned", "default") is not None  # one owner is still alive
    api.delete("Pod", "other-owner", "default")
    _wait_deleted(api, "ResourceClaim", "co-owned", "default")
    assert api.try_get("ResourceClaim", "co-owned", "default") is None


def test_orphan_propagation_keeps_dependents(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    pod = api.create("Pod", {"metadata": {"name": "owner"}, "spec": {"containers": []}})
    ref = {"apiVersion": "v1", "kind": "Pod", "name": "owner", "uid": pod["metadata"]["uid"]}
    api.create("ResourceClaim", {"metadata": {"name": "dep", "ownerReferences": [ref]}, "spec": {}})
    api.delete("Pod", "owner", "default", propagation="Orphan")
    dep = api.get("ResourceClaim", "dep", "default")
    assert "ownerReferences" not in dep["metadata"]


def test_namespace_deletion_removes_contents(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    api.create("Namespace", {"metadata": {"name": "team"}})
    api.create("ResourceClaim", {"metadata": {"name": "c"}, "spec": {}}, namespace="team")
    api.delete("Namespace", "team")
    _wait_deleted(api, "Namespace", "team")
    assert api.list("ResourceClaim", namespace="team")[0] == []
    with pytest.raises(ApiError) as err:
        api.delete("Namespace", "default")
    assert err.value.status == 403


def _rejecting_admission(obj: dict[str, Any], old: dict[str, Any] | None) -> list[str]:
    errors = []
    for i, request in enumerate(((obj.get("spec") or {}).get("devices") or {}).get("requests") or []):
        if not request.get("name"):
            errors.append(f"spec.devices.requests[{i}].name: Required value")
    if obj.get("kind") == "DeviceClass" and "bad" in str(obj.get("spec")):
        errors.append('spec.selectors[0].cel.expression: Invalid value: "bad": compilation failed')
    return errors


@pytest.fixture
def admitting_server() -> Iterator[KubeApi]:
    server = EmbeddedApiServer(admission=_rejecting_admission)
    api = KubeApi.connect(url=server.start())
    try:
        yield api
    finally:
        api.close()
        server.stop()


def test_admission_rejects_with_kubernetes_invalid_status(admitting_server: KubeApi) -> None:
    api = admitting_server
    with pytest.raises(Invalid) as err:
        api.create("ResourceClaim", {"metadata": {"name": "x"},
                                     "spec": {"devices": {"requests": [{"exactly": {}}, {"exactly": {}}]}}})
    e = err.value
    assert e.status == 422 and e.reason == "Invalid"
    assert e.message == ('ResourceClaim.resource.k8s.io "x" is invalid: [spec.devices.requests[0].name: Required value, '
                         "spec.devices.requests[1].name: Required value]")
    assert e.causes[0] == {"reason": "FieldValueRequired", "message": "Required value",
                           "field": "spec.devices.requests[0].name"}
    with pytest.raises(Invalid) as err2:
        api.create("DeviceClass", {"metadata": {"name": "dc"}, "spec": {"selectors": [{"cel": {"expression": "bad"}}]}})
    assert err2.value.message == ('DeviceClass.resource.k8s.io "dc" is invalid: spec.selectors[0].cel.expression: '
                                  'Invalid value: "bad": compilation failed')
    assert err2.value.causes[0]["reason"] == "FieldValueInvalid"
    # Admission also runs on updates and patches.
    api.create("DeviceClass", {"metadata": {"name": "dc"}, "spec": {"selectors": []}})
    with pytest.raises(Invalid):
        api.patch("DeviceClass", "dc", {"spec": {"selectors": [{"cel": {"expression": "bad"}}]}})
    # Core kinds are not subject to resource.k8s.io admission.
    api.create("Pod", {"metadata": {"name": "p"}, "spec": {"containers": [], "bad": True}})


def test_invalid_names_are_rejected(apiserver: Any) -> None:
    with pytest.raises(Invalid) as err:
        apiserver.api.create("ResourceSlice", {"metadata": {"name": "Not_Valid"}, "spec": {"driver": "d"}})
    assert err.value.causes[0]["field"] == "metadata.name"
    assert "RFC 1123 subdomain" in err.value.message


def test_immutable_fields(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    request = {"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
    api.create("ResourceClaim", {"metadata": {"name": "c"}, "spec": {"devices": {"requests": [request]}}})
    with pytest.raises(Invalid) as err:
        api.patch("ResourceClaim", "c", {"spec": {"devices": {"requests": [{**request, "name": "r2"}]}}}, "default")
    assert err.value.causes[0]["field"] == "spec" and "field is immutable" in err.value.message
    allocation = {"devices": {"results": [{"request": "r", "driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-0"}]}}
    api.patch("ResourceClaim", "c", {"status": {"allocation": allocation}}, "default", subresource="status")
    changed = {"devices": {"results": [{"request": "r", "driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-1"}]}}
    with pytest.raises(Invalid) as err2:
        api.patch("ResourceClaim", "c", {"status": {"allocation": changed}}, "default", subresource="status")
    assert err2.value.causes[0]["field"] == "status.allocation"
    # Deallocation (removing the allocation) is allowed.
    cleared = api.patch("ResourceClaim", "c", {"status": {"allocation": None}}, "default", subresource="status")
    assert "allocation" not in cleared["status"]
    api.create("ResourceSlice", {"metadata": {"name": "s"}, "spec": {
        "driver": "a.example.com", "nodeName": "n", "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1}}})
    with pytest.raises(Invalid) as err3:
        api.patch("ResourceSlice", "s", {"spec": {"driver": "b.example.com"}})
    assert err3.value.causes[0]["field"] == "spec.driver"


def test_pod_binding(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    pod = api.create("Pod", {"metadata": {"name": "p"}, "spec": {"containers": []}})
    api.bind_pod("default", "p", "node-1", uid=pod["metadata"]["uid"])
    bound = api.get("Pod", "p", "default")
    assert bound["spec"]["nodeName"] == "node-1"
    assert any(c["type"] == "PodScheduled" and c["status"] == "True" for c in bound["status"]["conditions"])
    with pytest.raises(Conflict) as err:
        api.bind_pod("default", "p", "node-2")
    assert 'already assigned to node "node-1"' in err.value.message
    with pytest.raises(Invalid):
        api.patch("Pod", "p", {"spec": {"nodeName": "node-3"}}, "default")


def test_concurrent_writers_lose_no_updates(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    api.create("Lease", {"metadata": {"name": "counter", "annotations": {"n": "0"}}, "spec": {}})
    writers, increments = 8, 25
    errors: list[BaseException] = []

    def increment() -> None:
        def once() -> None:
            lease = api.get("Lease", "counter", "default")
            lease["metadata"]["annotations"]["n"] = str(int(lease["metadata"]["annotations"]["n"]) + 1)
            api.replace("Lease", lease)

        try:
            for _ in range(increments):
                api.retry_on_conflict(once, attempts=1000)
        except BaseException as exc:  # collected and re-raised in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=increment) for _ in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert api.get("Lease", "counter", "default")["metadata"]["annotations"]["n"] == str(writers * increments)


def test_concurrent_merge_patches_all_apply(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    api.create("Node", {"metadata": {"name": "n"}})

    def label(i: int) -> None:
        api.patch("Node", "n", {"metadata": {"labels": {f"k{i}": "v"}}})

    threads = [threading.Thread(target=label, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert len(api.get("Node", "n")["metadata"]["labels"]) == 20


def _interleave_one_write(monkeypatch: pytest.MonkeyPatch, apiserver: Any) -> None:
    """The store's next read of the Node is followed by another writer's label, before the patch's write."""
    store = apiserver.server.store
    real_get = store.get
    done: list[bool] = []

    def get_then_write(rt: Any, namespace: str, name: str) -> Any:
        obj = real_get(rt, namespace, name)
        if not done and rt.kind == "Node":
            done.append(True)
            apiserver.api.patch("Node", name, {"metadata": {"labels": {"other": "writer"}}})
        return obj

    monkeypatch.setattr(store, "get", get_then_write)


def test_patch_without_resource_version_is_reapplied_after_a_concurrent_write(
        apiserver: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    api: KubeApi = apiserver.api
    api.create("Node", {"metadata": {"name": "n"}})
    _interleave_one_write(monkeypatch, apiserver)
    api.patch("Node", "n", {"metadata": {"labels": {"mine": "v"}}})
    assert api.get("Node", "n")["metadata"]["labels"] == {"other": "writer", "mine": "v"}


def test_patch_with_a_stale_resource_version_is_a_conflict(apiserver: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    api: KubeApi = apiserver.api
    rv = api.create("Node", {"metadata": {"name": "n"}})["metadata"]["resourceVersion"]
    _interleave_one_write(monkeypatch, apiserver)
    api.retries = 0
    with pytest.raises(ApiError) as err:
        api.patch("Node", "n", {"metadata": {"resourceVersion": rv, "labels": {"mine": "v"}}})
    assert err.value.status == 409
    assert "mine" not in api.get("Node", "n")["metadata"]["labels"]


def test_broken_admission_is_a_500_not_a_crash() -> None:
    def broken(obj: dict[str, Any], old: dict[str, Any] | None) -> list[str]:
        raise RuntimeError("validator bug")

    server = EmbeddedApiServer(admission=broken)
    api = KubeApi.connect(url=server.start())
    api.retries = 0
    try:
        with pytest.raises(ApiError) as err:
            api.create("DeviceClass", {"metadata": {"name": "dc"}, "spec": {}})
        assert err.value.status == 500 and "validator bug" in err.value.message
        assert api.get("Namespace", "default")["metadata"]["name"] == "default"
    finally:
        api.close()
        server.stop()
