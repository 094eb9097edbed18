"""The embedded control plane through KubeApi and the official client: CRUD, selectors, status, watch."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from controlplane import EmbeddedApiServer
from gpudra.kubeapi import AlreadyExists, ApiError, Conflict, KubeApi, NotFound


def _claim(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "labels": labels or {}},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}


def _slice(name: str, node: str, driver: str = "gpu.nvidia.com") -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0"}]}}


def _raw(url: str, method: str = "GET", body: Any = None, ctype: str = "application/json") -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_create_get_list_delete_roundtrip(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    created = api.create("ResourceClaim", _claim("c1"))
    meta = created["metadata"]
    assert created["apiVersion"] == "resource.k8s.io/v1" and created["kind"] == "ResourceClaim"
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z") and meta["generation"] == 1
    assert isinstance(meta["resourceVersion"], str) and int(meta["resourceVersion"]) > 0
    assert api.get("ResourceClaim", "c1", "default") == created
    items, rv = api.list("ResourceClaim")
    assert [i["metadata"]["name"] for i in items] == ["c1"]
    assert int(rv) >= int(meta["resourceVersion"])
    assert api.delete("ResourceClaim", "c1", "default") is True
    assert api.delete("ResourceClaim", "c1", "default") is False
    with pytest.raises(NotFound) as err:
        api.get("ResourceClaim", "c1", "default")
    assert err.value.message == 'resourceclaims.resource.k8s.io "c1" not found'
    assert api.try_get("ResourceClaim", "c1", "default") is None


def test_default_namespaces_exist(apiserver: Any) -> None:
    names = {n["metadata"]["name"] for n in apiserver.api.list("Namespace")[0]}
    assert {"default", "kube-system"} <= names


def test_generate_name_and_monotonic_versions(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    a = api.create("Pod", {"metadata": {"generateName": "worker-"}, "spec": {"containers": []}})
    b = api.create("Pod", {"metadata": {"generateName": "worker-"}, "spec": {"containers": []}})
    assert a["metadata"]["name"].startswith("worker-") and len(a["metadata"]["name"]) == len("worker-") + 5
    assert a["metadata"]["name"] != b["metadata"]["name"]
    assert a["metadata"]["uid"] != b["metadata"]["uid"]
    assert int(b["metadata"]["resourceVersion"]) > int(a["metadata"]["resourceVersion"])
    assert a["status"]["phase"] == "Pending"


def test_already_exists_and_missing_namespace(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    api.create("ResourceSlice", _slice("s1", "n1"))
    with pytest.raises(AlreadyExists) as err:
        api.create("ResourceSlice", _slice("s1", "n1"))
    assert err.value.status == 409 and 'resourceslices.resource.k8s.io "s1" already exists' in err.value.message
    with pytest.raises(NotFound) as err2:
        api.create("ResourceClaim", {"metadata": {"name": "c"}, "spec": {}}, namespace="nowhere")
    assert err2.value.message == 'namespaces "nowhere" not found'


def test_stale_update_conflicts_with_kubernetes_message(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    first = api.create("ResourceClaim", _claim("x"))
    api.patch("ResourceClaim", "x", {"metadata": {"labels": {"touched": "yes"}}}, "default")
    stale = {**first, "metadata": {**first["metadata"], "labels": {"stale": "yes"}}}
    with pytest.raises(Conflict) as err:
        api.replace("ResourceClaim", stale)
    assert err.value.message == (
        'Operation cannot be fulfilled on resourceclaims.resource.k8s.io "x": the object has been modified; '
        "please apply your changes to the latest version and try again")
    current = api.get("ResourceClaim", "x", "default")
    current["metadata"]["labels"] = {"fresh": "yes"}
    updated = api.replace("ResourceClaim", current)
    assert updated["metadata"]["labels"] == {"fresh": "yes"}
    assert int(updated["metadata"]["resourceVersion"]) > int(current["metadata"]["resourceVersion"])


def test_label_selectors(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    api.create("ResourceClaim", _claim("a", {"tier": "gold", "gang": "g1"}))
    api.create("ResourceClaim", _claim("b", {"tier": "silver"}))
    api.create("ResourceClaim", _claim("c", {}))

    def names(selector: str) -> list[str]:
        return [i["metadata"]["name"] for i in api.list("ResourceClaim", label_selector=selector)[0]]

    assert names("tier=gold") == ["a"]
    assert names("tier==silver") == ["b"]
    assert names("tier!=gold") == ["b", "c"]
    assert names("tier in (gold,silver)") == ["a", "b"]
    assert names("tier notin (gold)") == ["b", "c"]
    assert names("gang") == ["a"]
    assert names("!gang") == ["b", "c"]
    assert names("tier in (gold, silver),!gang") == ["b"]
    with pytest.raises(ApiError) as err:
        api.list("ResourceClaim", label_selector="tier in gold")
    assert err.value.status == 400 and "labelSelector" in err.value.message


def test_field_selectors(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    api.create("ResourceSlice", _slice("s1", "n1"))
    api.create("ResourceSlice", _slice("s2", "n2"))
    api.create("ResourceSlice", _slice("s3", "n1", driver="other.example.com"))
    got = api.list("ResourceSlice", field_selector="spec.nodeName=n1,spec.driver=gpu.nvidia.com")[0]
    assert [s["metadata"]["name"] for s in got] == ["s1"]
    assert [s["metadata"]["name"] for s in api.list("ResourceSlice", field_selector="metadata.name!=s1")[0]] == ["s2", "s3"]
    api.create("Pod", {"metadata": {"name": "p1"}, "spec": {"containers": [], "nodeName": "n1"}})
    api.create("Pod", {"metadata": {"name": "p2"}, "spec": {"containers": []}})
    assert [p["metadata"]["name"] for p in api.list("Pod", field_selector="spec.nodeName=n1")[0]] == ["p1"]
    assert [p["metadata"]["name"] for p in api.list("Pod", field_selector="spec.nodeName=")[0]] == ["p2"]
    assert len(api.list("Pod", field_selector="status.phase=Pending")[0]) == 2
    api.create("Event", {"metadata": {"name": "e1"}, "involvedObject": {"kind": "Pod", "name": "p1"}, "reason": "X"})
    assert len(api.list("Event", field_selector="involvedObject.name=p1,involvedObject.kind=Pod")[0]) == 1
    with pytest.raises(ApiError) as err:
        api.list("ResourceSlice", field_selector="spec.pool.name=n1")
    assert err.value.status == 400 and "spec.pool.name" in err.value.message and "spec.nodeName" in err.value.message


def test_status_subresource_isolation(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    allocation = {"devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-0"}]}}
    reserved = [{"resource": "pods", "name": "p", "uid": "u"}]
    claim = api.create("ResourceClaim", {**_claim("c"), "status": {"allocation": allocation}})
    assert "status" not in claim  # create drops status, as Kubernetes' strategy does
    claim["status"] = {"allocation": allocation}
    claim["metadata"]["labels"] = {"via": "put"}
    after_put = api.replace("ResourceClaim", claim)
    assert "status" not in after_put and after_put["metadata"]["labels"] == {"via": "put"}
    after_put["status"] = {"allocation": allocation, "reservedFor": reserved}
    after_put["metadata"]["labels"] = {"via": "status"}
    after_status = api.replace_status("ResourceClaim", after_put)
    assert after_status["status"] == {"allocation": allocation, "reservedFor": reserved}
    assert after_status["metadata"]["labels"] == {"via": "put"}  # /status ignores everything but status
    patched = api.patch("ResourceClaim", "c", {"status": {"reservedFor": None}, "metadata": {"labels": {"z": "1"}}},
                        "default", subresource="status")
    assert patched["status"] == {"allocation": allocation} and patched["metadata"]["labels"] == {"via": "put"}
    main_patch = api.patch("ResourceClaim", "c", {"status": {"reservedFor": reserved}}, "default")
    assert main_patch["status"] == patched["status"]


def test_patch_kinds_and_generation(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    api.create("DeviceClass", {"metadata": {"name": "dc"}, "spec": {"selectors": []}})
    merged = api.patch("DeviceClass", "dc", {"metadata": {"labels": {"a": "1"}}})
    assert merged["metadata"]["labels"] == {"a": "1"} and merged["metadata"]["generation"] == 1
    spec_change = api.patch("DeviceClass", "dc", [{"op": "add", "path": "/spec/selectors/-",
                                                   "value": {"cel": {"expression": "true"}}}], patch_type="json")
    assert spec_change["spec"]["selectors"] == [{"cel": {"expression": "true"}}]
    assert spec_change["metadata"]["generation"] == 2
    strategic = api.patch("DeviceClass", "dc", {"metadata": {"labels": {"a": None, "b": "2"}}}, patch_type="strategic")
    assert strategic["metadata"]["labels"] == {"b": "2"}
    with pytest.raises(ApiError) as err:
        api.patch("DeviceClass", "dc", [{"op": "remove", "path": "/spec/missing"}], patch_type="json")
    assert err.value.status == 422 and "/spec/missing" in err.value.message
    with pytest.raises(Conflict):
        api.patch("DeviceClass", "dc", {"metadata": {"resourceVersion": "1", "labels": {"c": "3"}}})


def test_json_patch_limits_are_kube_apiservers(apiserver: Any) -> None:
    """A patch of copies each doubling a value cannot grow an object without bound: the operations and what copies add
    are capped as kube-apiserver caps them, before the object grows."""
    apiserver.api.create("ConfigMap", {"metadata": {"name": "cm"}, "data": {"a": "x" * 1000}}, namespace="default")
    url = f"{apiserver.url}/api/v1/namespaces/default/configmaps/cm"
    code, status = _raw(url, "PATCH", [{"op": "add", "path": "/data/b", "value": {"k": "x" * 1000}}] +
                        [{"op": "copy", "from": "/data/b", "path": f"/data/b/k{i}"} for i in range(40)],
                        "application/json-patch+json")
    assert code == 422 and status["reason"] == "Invalid"
    assert status["message"] == "the server rejected our request due to an error in our request"
    (cause,) = status["details"]["causes"]
    assert cause["reason"] == "UnexpectedServerResponse"
    assert cause["message"].startswith("Unable to complete the copy, the accumulated size increase of copy is ")
    assert cause["message"].endswith(", exceeding the limit 3145728")
    code, status = _raw(url, "PATCH", [{"op": "test", "path": "/data/a", "value": "x"}] * 10001,
                        "application/json-patch+json")
    assert (code, status["reason"], status["message"]) == (
        413, "RequestEntityTooLarge",
        "Request entity too large: The allowed maximum operations in a JSON patch is 10000, got 10001")
    assert apiserver.api.get("ConfigMap", "cm", namespace="default")["data"] == {"a": "x" * 1000}


def test_list_pagination(apiserver: Any) -> None:
    for i in range(5):
        apiserver.api.create("ResourceSlice", _slice(f"s{i}", "n"))
    status, page = _raw(apiserver.url + "/apis/resource.k8s.io/v1/resourceslices?limit=2")
    assert status == 200 and [i["metadata"]["name"] for i in page["items"]] == ["s0", "s1"]
    token = page["metadata"]["continue"]
    status, page2 = _raw(apiserver.url + f"/apis/resource.k8s.io/v1/resourceslices?limit=2&continue={token}")
    assert [i["metadata"]["name"] for i in page2["items"]] == ["s2", "s3"]
    items, _ = apiserver.api.list("ResourceSlice")  # KubeApi follows continue tokens transparently
    assert len(items) == 5


@pytest.mark.slow
def test_official_typed_client_works(apiserver: Any) -> None:
    cfg = k8s.Configuration()
    cfg.host = apiserver.url
    with k8s.ApiClient(cfg) as client:
        core = k8s.CoreV1Api(client)
        core.create_namespaced_pod("default", k8s.V1Pod(metadata=k8s.V1ObjectMeta(name="typed"),
                                                        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="c", image="i")])))
        pods = core.list_namespaced_pod("default")
        assert [p.metadata.name for p in pods.items] == ["typed"]
        resource = k8s.ResourceV1Api(client)
        apiserver.api.create("ResourceSlice", _slice("s1", "n1"))
        slices = resource.list_resource_slice(field_selector="spec.nodeName=n1")
        assert slices.items[0].spec.driver == "gpu.nvidia.com"
        with pytest.raises(k8s.ApiException) as err:
            core.read_namespaced_pod("nope", "default")
        assert err.value.status == 404
        resource.delete_resource_slice("s1")
        assert apiserver.api.try_get("ResourceSlice", "s1") is None


def test_kubeconfig_connects(apiserver: Any) -> None:
    api = KubeApi.connect(kubeconfig=str(apiserver.kubeconfig))
    try:
        assert api.host == apiserver.url
        assert api.get("Namespace", "default")["metadata"]["name"] == "default"
    finally:
        api.close()


# ----- watch ---------------------------------------------------------------------------------------------------


def _take(it: Iterator[tuple[str, dict[str, Any]]], n: int) -> list[tuple[str, str]]:
    return [(t, o["metadata"]["name"]) for t, o in (next(it) for _ in range(n))]


def test_watch_lists_then_streams_with_selector_semantics(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    api.create("ResourceClaim", _claim("pre", {"app": "x"}))
    stop = threading.Event()
    it = api.watch("ResourceClaim", namespace="default", label_selector="app=x", stop=stop)
    assert _take(it, 1) == [("ADDED", "pre")]
    api.create("ResourceClaim", _claim("other", {"app": "y"}))  # never matches: no event
    api.create("ResourceClaim", _claim("new", {"app": "x"}))
    api.patch("ResourceClaim", "new", {"metadata": {"annotations": {"k": "v"}}}, "default")
    api.patch("ResourceClaim", "new", {"metadata": {"labels": {"app": "z"}}}, "default")  # leaves the selection
    api.patch("ResourceClaim", "other", {"metadata": {"labels": {"app": "x"}}}, "default")  # enters it
    api.delete("ResourceClaim", "pre", "default")
    assert _take(it, 5) == [("ADDED", "new"), ("MODIFIED", "new"), ("DELETED", "new"), ("ADDED", "other"),
                            ("DELETED", "pre")]
    stop.set()


def test_watch_from_resource_version_and_410(apiserver: Any) -> None:
    server = EmbeddedApiServer(history_limit=3)
    url = server.start()
    api = KubeApi.connect(url=url)
    try:
        first = api.create("ResourceSlice", _slice("s0", "n"))
        rv0 = first["metadata"]["resourceVersion"]
        it = api.watch("ResourceSlice", resource_version=rv0, stop=threading.Event())
        api.create("ResourceSlice", _slice("s1", "n"))
        assert _take(it, 1) == [("ADDED", "s1")]  # from rv0 on, s0 itself is not replayed
        for i in range(2, 12):
            api.create("ResourceSlice", _slice(f"s{i}", "n"))
        status, body = _raw(url + f"/apis/resource.k8s.io/v1/resourceslices?watch=true&resourceVersion={rv0}")
        assert status == 410
        assert body["kind"] == "Status" and body["reason"] == "Expired" and body["code"] == 410
        assert body["message"].startswith(f"too old resource version: {rv0} (")
        # KubeApi relists on 410 and emits what the consumer has not seen yet.
        relisted = api.watch("ResourceSlice", resource_version=rv0, stop=threading.Event())
        names = {name for _, name in _take(relisted, 12)}
        assert names == {f"s{i}" for i in range(12)}
    finally:
        api.close()
        server.stop()


@pytest.mark.slow
def test_watch_resumes_after_server_closes_stream(apiserver: Any) -> None:
    api: KubeApi = apiserver.api
    stop = threading.Event()
    # The server ends each watch after one second; the client must reconnect from its last resourceVersion.
    it = api.watch("Lease", namespace="default", stop=stop, server_timeout=1)
    api.create("Lease", {"metadata": {"name": "l1"}, "spec": {}})
    assert _take(it, 1) == [("ADDED", "l1")]
    status, _ = _raw(apiserver.url + "/apis/coordination.k8s.io/v1/namespaces/default/leases?watch=true&timeoutSeconds=1")
    assert status == 200  # one full server-side timeout has passed: the client's stream was closed meanwhile
    api.create("Lease", {"metadata": {"name": "l2"}, "spec": {}})
    api.delete("Lease", "l1", "default")
    assert _take(it, 2) == [("ADDED", "l2"), ("DELETED", "l1")]
    stop.set()


def test_watch_bookmarks_and_initial_events_end() -> None:
    server = EmbeddedApiServer(bookmark_interval=0.05)
    url = server.start()
    try:
        req = urllib.request.Request(url + "/api/v1/namespaces?watch=true&allowWatchBookmarks=true"
                                           "&sendInitialEvents=true&timeoutSeconds=5")
        with urllib.request.urlopen(req) as resp:
            events = [json.loads(resp.readline()) for _ in range(6)]
        types = [e["type"] for e in events]
        assert types[:4] == ["ADDED"] * 4
        assert events[4]["type"] == "BOOKMARK"
        assert events[4]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
        assert events[5]["type"] == "BOOKMARK" and events[5]["object"]["kind"] == "Namespace"
        # The bootstrap objects (4 namespaces, 2 system PriorityClasses) are all that was written.
        assert events[5]["object"]["metadata"]["resourceVersion"] == str(server.store.resource_version)
    finally:
        server.stop()


def test_kubeapi_watch_yields_bookmarks_on_request() -> None:
    server = EmbeddedApiServer(bookmark_interval=0.05)
    url = server.start()
    api = KubeApi.connect(url=url)
    try:
        it = api.watch("Node", stop=threading.Event(), bookmarks=True)
        etype, obj = next(it)
        assert etype == "BOOKMARK" and obj["metadata"]["resourceVersion"] == str(server.store.resource_version)
    finally:
        api.close()
        server.stop()


def test_stop_ends_an_idle_watch(apiserver: Any) -> None:
    stop = threading.Event()
    seen: list[str] = []

    def consume() -> None:
        for etype, _ in apiserver.api.watch("Node", stop=stop):
            seen.append(etype)

    t = threading.Thread(target=consume)
    t.start()
    stop.set()
    t.join(timeout=30)
    assert not t.is_alive() and seen == []


def test_a_body_is_decoded_only_as_a_served_media_type(apiserver: Any) -> None:
    url = f"{apiserver.url}/api/v1/namespaces/default/configmaps"
    code, status = _raw(url, "POST", {"metadata": {"name": "plain"}}, "text/plain")
    assert (code, status["reason"], status["message"]) == (
        415, "UnsupportedMediaType", "the body of the request was in an unknown format - accepted media types "
        "include: application/json, application/vnd.kubernetes.protobuf")
    assert _raw(url, "POST", {"metadata": {"name": "json"}}, "application/json; charset=utf-8")[0] == 201
    assert apiserver.api.try_get("ConfigMap", "plain", namespace="default") is None


def test_annotations_over_256_kib_are_refused_on_every_kind(apiserver: Any) -> None:
    big = {"metadata": {"name": "big", "annotations": {"a": "x" * (256 * 1024)}}}
    code, status = _raw(f"{apiserver.url}/api/v1/namespaces/default/configmaps", "POST", big)
    assert (code, status["reason"], status["message"]) == (
        422, "Invalid", 'ConfigMap "big" is invalid: metadata.annotations: Too long: may not be more than 262144 bytes')
    fits = {"metadata": {"name": "fits", "annotations": {"a": "x" * (256 * 1024 - 1)}}}
    assert _raw(f"{apiserver.url}/api/v1/namespaces/default/configmaps", "POST", fits)[0] == 201
    claim = {"metadata": {"name": "big", "annotations": {"a": "x" * (256 * 1024)}},
             "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}
    code, status = _raw(f"{apiserver.url}/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", "POST", claim)
    assert code == 422 and status["message"].count("metadata.annotations: Too long") == 1, status
