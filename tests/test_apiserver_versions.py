"""Served versions, conversion, tables, DeviceTaintRule and admission of the embedded control plane, through the
official `kubernetes` client and raw HTTP, as a client of a current kube-apiserver sees them."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from conftest import RESOURCE_BETAS
from controlplane import EmbeddedApiServer

# resource.k8s.io's beta versions are served only when --runtime-config enables them, as in kube-apiserver 1.37.
pytestmark = pytest.mark.apiserver_options(runtime_config=RESOURCE_BETAS)

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


@pytest.fixture
def client(apiserver: Any) -> Iterator[k8s.ApiClient]:
    cfg = k8s.Configuration()
    cfg.host = apiserver.url
    with k8s.ApiClient(cfg) as c:
        yield c


def _get(url: str, accept: str = "application/json") -> Any:
    req = urllib.request.Request(url, headers={"Accept": accept})
    with urllib.request.urlopen(req) as resp:
        return json.loads(resp.read())


def _post(url: str, body: Any) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _v1beta1_slice(name: str = "s1", node: str = "n1") -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0", "basic": {"attributes": {"type": {"string": "gpu"}},
                                                             "capacity": {"memory": {"value": "80Gi"}}}}]}}


# ----- discovery ------------------------------------------------------------------------------------------------


def test_discovery_lists_every_served_version_with_v1_preferred(apiserver: Any) -> None:
    group = _get(apiserver.url + "/apis/resource.k8s.io")
    assert [v["version"] for v in group["versions"]] == ["v1", "v1beta2", "v1beta1"]
    assert group["preferredVersion"] == {"groupVersion": "resource.k8s.io/v1", "version": "v1"}
    groups = {g["name"]: g for g in _get(apiserver.url + "/apis")["groups"]}
    assert groups["resource.k8s.io"]["preferredVersion"]["version"] == "v1"
    v1 = {r["name"] for r in _get(apiserver.url + "/apis/resource.k8s.io/v1")["resources"]}
    v1beta1 = {r["name"] for r in _get(apiserver.url + "/apis/resource.k8s.io/v1beta1")["resources"]}
    assert {"devicetaintrules", "devicetaintrules/status", "resourceclaims/status"} <= v1
    assert "devicetaintrules" not in v1beta1 and "resourceslices" in v1beta1
    assert _get(apiserver.url + "/version")["minor"] == "37"


# ----- one object, every version --------------------------------------------------------------------------------


def test_a_v1beta1_claim_reads_back_through_v1_and_v1beta2(client: k8s.ApiClient) -> None:
    old = k8s.ResourceV1beta1Api(client)
    old.create_namespaced_resource_claim("default", k8s.V1beta1ResourceClaim(
        metadata=k8s.V1ObjectMeta(name="c"),
        spec=k8s.V1beta1ResourceClaimSpec(devices=k8s.V1beta1DeviceClaim(requests=[
            k8s.V1beta1DeviceRequest(name="gpu", device_class_name="gpu.nvidia.com", count=2)]))))
    v1 = k8s.ResourceV1Api(client).read_namespaced_resource_claim("c", "default")
    exactly = v1.spec.devices.requests[0].exactly
    assert (exactly.device_class_name, exactly.count, exactly.allocation_mode) == ("gpu.nvidia.com", 2, "ExactCount")
    v1beta2 = k8s.ResourceV1beta2Api(client).read_namespaced_resource_claim("c", "default")
    assert v1beta2.api_version == "resource.k8s.io/v1beta2" and v1beta2.spec.devices.requests[0].exactly.count == 2
    back = old.list_namespaced_resource_claim("default")
    assert back.api_version == "resource.k8s.io/v1beta1"
    assert back.items[0].spec.devices.requests[0].device_class_name == "gpu.nvidia.com"


def test_a_v1_slice_reads_back_through_v1beta1_with_basic_devices(apiserver: Any, client: k8s.ApiClient) -> None:
    status, created = _post(apiserver.url + "/apis/resource.k8s.io/v1beta1/resourceslices", _v1beta1_slice())
    assert status == 201 and created["apiVersion"] == "resource.k8s.io/v1beta1"
    assert created["spec"]["devices"][0]["basic"]["capacity"]["memory"] == {"value": "80Gi"}
    stored = k8s.ResourceV1Api(client).read_resource_slice("s1")
    assert stored.spec.devices[0].capacity["memory"].value == "80Gi"
    # A merge patch in v1beta1 is applied to the v1beta1 view of the object.
    patched = k8s.ResourceV1beta1Api(client).patch_resource_slice(
        "s1", {"spec": {"devices": [{"name": "gpu-0", "basic": {"attributes": {"type": {"string": "mig"}}}}]}})
    assert patched.spec.devices[0].basic.attributes["type"].string == "mig"
    assert apiserver.api.get("ResourceSlice", "s1")["spec"]["devices"][0]["attributes"] == {"type": {"string": "mig"}}
    # Field selectors work in every version, as upstream's field label conversion allows.
    listed = k8s.ResourceV1beta2Api(client).list_resource_slice(field_selector="spec.nodeName=n1")
    assert [s.metadata.name for s in listed.items] == ["s1"]


def test_watch_in_v1beta1_streams_v1beta1_objects(apiserver: Any, client: k8s.ApiClient) -> None:
    _post(apiserver.url + "/apis/resource.k8s.io/v1/resourceslices",
          {**_v1beta1_slice(), "apiVersion": "resource.k8s.io/v1",
           "spec": {**_v1beta1_slice()["spec"], "devices": [{"name": "gpu-0"}]}})
    stream = k8s_watch.Watch().stream(k8s.ResourceV1beta1Api(client).list_resource_slice, timeout_seconds=5)
    event = next(stream)
    assert event["type"] == "ADDED" and event["object"].api_version == "resource.k8s.io/v1beta1"
    assert event["object"].spec.devices[0].basic is not None


def test_a_body_in_an_unserved_version_is_refused_naming_the_served_ones(apiserver: Any) -> None:
    body = {**_v1beta1_slice(), "apiVersion": "resource.k8s.io/v1alpha3"}
    status, err = _post(apiserver.url + "/apis/resource.k8s.io/v1beta1/resourceslices", body)
    assert status == 400
    assert "resource.k8s.io/v1, resource.k8s.io/v1beta2, resource.k8s.io/v1beta1" in err["message"]


# ----- DeviceTaintRule ------------------------------------------------------------------------------------------


def test_device_taint_rule_is_validated_and_has_a_status(apiserver: Any, client: k8s.ApiClient) -> None:
    api = k8s.ResourceV1Api(client)
    api.create_device_taint_rule(k8s.V1DeviceTaintRule(
        metadata=k8s.V1ObjectMeta(name="maint"),
        spec=k8s.V1DeviceTaintRuleSpec(device_selector=k8s.V1DeviceTaintSelector(driver="gpu.nvidia.com", pool="n1"),
                                       taint=k8s.V1DeviceTaint(key="example.com/maintenance", effect="NoSchedule"))))
    beta = k8s.ResourceV1beta2Api(client).read_device_taint_rule("maint")
    assert beta.spec.taint.key == "example.com/maintenance"
    api.patch_device_taint_rule_status("maint", {"status": {"conditions": [
        {"type": "EvictionInProgress", "status": "False", "reason": "NoEffect", "message": "",
         "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})
    assert api.read_device_taint_rule("maint").status.conditions[0].type == "EvictionInProgress"
    status, err = _post(apiserver.url + "/apis/resource.k8s.io/v1/devicetaintrules",
                        {"metadata": {"name": "bad"}, "spec": {"taint": {"key": "k", "effect": "Sometimes"}}})
    assert status == 422
    assert 'spec.taint.effect: Unsupported value: "Sometimes"' in err["message"]


# ----- tables ---------------------------------------------------------------------------------------------------


def test_tables_follow_kube_apiserver_printers(apiserver: Any) -> None:
    api = apiserver.api
    api.create("Node", {"metadata": {"name": "n1", "labels": {"node-role.kubernetes.io/control-plane": ""}},
                        "spec": {"unschedulable": True},
                        "status": {"conditions": [{"type": "Ready", "status": "True"}],
                                   "nodeInfo": {"kubeletVersion": "v1.37.0"},
                                   "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}})
    table = _get(apiserver.url + "/api/v1/nodes", TABLE)
    assert [c["name"] for c in table["columnDefinitions"]] == [
        "Name", "Status", "Roles", "Age", "Version", "Internal-IP", "External-IP", "OS-Image", "Kernel-Version",
        "Container-Runtime"]
    cells = table["rows"][0]["cells"]
    assert cells[:3] == ["n1", "Ready,SchedulingDisabled", "control-plane"] and cells[4:7] == ["v1.37.0", "10.0.0.1",
                                                                                               "<none>"]
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    api.create("Pod", {"metadata": {"name": "p", "namespace": "default"},
                       "spec": {"containers": [{"name": "c", "image": "i"}]}})
    pods = _get(apiserver.url + "/api/v1/namespaces/default/pods", TABLE)
    assert [(c["name"], c["priority"]) for c in pods["columnDefinitions"]] == [
        ("Name", 0), ("Ready", 0), ("Status", 0), ("Restarts", 0), ("Age", 0), ("IP", 1), ("Node", 1),
        ("Nominated Node", 1), ("Readiness Gates", 1)]
    assert pods["rows"][0]["cells"][:4] == ["p", "0/1", "Pending", "0"]
    assert pods["rows"][0]["cells"][5:] == ["<none>", "<none>", "<none>", "<none>"]
    api.create("Event", {"metadata": {"name": "e", "namespace": "default"}, "type": "Warning", "reason": "Boom",
                         "message": " it broke ", "involvedObject": {"kind": "Pod", "name": "p"},
                         "source": {"component": "gpu-dra"}, "count": 3,
                         "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:01:00Z"})
    events = _get(apiserver.url + "/api/v1/namespaces/default/events", TABLE)
    assert [c["name"] for c in events["columnDefinitions"] if c["priority"] == 0] == [
        "Last Seen", "Type", "Reason", "Object", "Message"]
    row = dict(zip([c["name"] for c in events["columnDefinitions"]], events["rows"][0]["cells"]))
    assert (row["Type"], row["Reason"], row["Object"], row["Message"], row["Count"], row["Source"]) == (
        "Warning", "Boom", "pod/p", "it broke", 3, "gpu-dra")


def test_include_object_none_metadata_and_object(apiserver: Any) -> None:
    _post(apiserver.url + "/apis/resource.k8s.io/v1beta1/resourceslices", _v1beta1_slice())
    base = apiserver.url + "/apis/resource.k8s.io/v1beta1/resourceslices"
    assert "object" not in _get(base + "?includeObject=None", TABLE)["rows"][0]
    assert _get(base + "?includeObject=Metadata", TABLE)["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    full = _get(base + "?includeObject=Object", TABLE)["rows"][0]["object"]
    # The full object is in the version asked for, so `kubectl --sort-by` sees the fields it names.
    assert full["apiVersion"] == "resource.k8s.io/v1beta1" and full["spec"]["devices"][0]["basic"]
    table = _get(base + "?includeObject=Object", TABLE)
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Node", "Driver", "Pool", "Age"]
    with pytest.raises(urllib.error.HTTPError) as err:
        _get(base + "?includeObject=Everything", TABLE)
    assert err.value.code == 400


@pytest.mark.slow
def test_a_watch_asked_as_table_sends_rows_with_columns_once(apiserver: Any) -> None:
    api = apiserver.api
    api.create("ResourceClaim", {"metadata": {"name": "a", "namespace": "default"}, "spec": {"devices": {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}}})
    api.create("ResourceClaim", {"metadata": {"name": "b", "namespace": "default"}, "spec": {"devices": {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}}})
    req = urllib.request.Request(apiserver.url + "/apis/resource.k8s.io/v1/resourceclaims?watch=true&"
                                 "timeoutSeconds=2", headers={"Accept": TABLE})
    with urllib.request.urlopen(req) as resp:
        events = [json.loads(line) for line in resp.read().splitlines() if line.strip()]
    assert [e["type"] for e in events] == ["ADDED", "ADDED"]
    assert all(e["object"]["kind"] == "Table" for e in events)
    assert [c["name"] for c in events[0]["object"]["columnDefinitions"]] == ["Name", "State", "Age"]
    assert "columnDefinitions" not in events[1]["object"]
    assert events[1]["object"]["rows"][0]["cells"][:2] == ["b", "pending"]


# ----- admission ------------------------------------------------------------------------------------------------


def test_pod_priority_is_resolved_at_admission(apiserver: Any) -> None:
    api = apiserver.api
    api.create("PriorityClass", {"metadata": {"name": "high"}, "value": 1000, "preemptionPolicy": "Never"})
    pod = api.create("Pod", {"metadata": {"name": "p", "namespace": "default"},
                             "spec": {"priorityClassName": "high", "containers": [{"name": "c", "image": "i"}]}})
    assert (pod["spec"]["priority"], pod["spec"]["preemptionPolicy"]) == (1000, "Never")
    plain = api.create("Pod", {"metadata": {"name": "q", "namespace": "default"},
                               "spec": {"containers": [{"name": "c", "image": "i"}]}})
    assert plain["spec"]["priority"] == 0
    status, err = _post(apiserver.url + "/api/v1/namespaces/default/pods",
                        {"metadata": {"name": "r"}, "spec": {"priorityClassName": "nope",
                                                             "containers": [{"name": "c", "image": "i"}]}})
    assert status == 403 and err["message"] == 'pods "r" is forbidden: no PriorityClass with name nope was found'
    api.create("PriorityClass", {"metadata": {"name": "everyone"}, "value": 7, "globalDefault": True})
    defaulted = api.create("Pod", {"metadata": {"name": "s", "namespace": "default"},
                                   "spec": {"containers": [{"name": "c", "image": "i"}]}})
    assert (defaulted["spec"]["priorityClassName"], defaulted["spec"]["priority"]) == ("everyone", 7)


def test_pods_get_the_default_not_ready_and_unreachable_tolerations(apiserver: Any) -> None:
    api = apiserver.api
    plain = api.create("Pod", {"metadata": {"name": "p", "namespace": "default"},
                               "spec": {"containers": [{"name": "c", "image": "i"}],
                                        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                                         "effect": "NoSchedule"}]}})
    assert plain["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
         "tolerationSeconds": 300}]
    # A pod's own NoExecute toleration of a key (or of every key) is kept instead of the default.
    own = api.create("Pod", {"metadata": {"name": "q", "namespace": "default"},
                             "spec": {"containers": [{"name": "c", "image": "i"}],
                                      "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                                                       "effect": "NoExecute", "tolerationSeconds": 5}]}})
    assert [(t["key"], t.get("tolerationSeconds")) for t in own["spec"]["tolerations"]] == [
        ("node.kubernetes.io/unreachable", 5), ("node.kubernetes.io/not-ready", 300)]
    everything = api.create("Pod", {"metadata": {"name": "r", "namespace": "default"},
                                    "spec": {"containers": [{"name": "c", "image": "i"}],
                                             "tolerations": [{"operator": "Exists"}]}})
    assert everything["spec"]["tolerations"] == [{"operator": "Exists"}]


# ----- OpenAPI --------------------------------------------------------------------------------------------------


def test_openapi_v3_documents_carry_the_generated_schemas(apiserver: Any) -> None:
    root = _get(apiserver.url + "/openapi/v3")
    assert {"apis/resource.k8s.io/v1", "apis/resource.k8s.io/v1beta1", "api/v1"} <= set(root["paths"])
    doc = _get(apiserver.url + root["paths"]["apis/resource.k8s.io/v1beta1"]["serverRelativeURL"])
    schemas = doc["components"]["schemas"]
    claim = schemas["io.k8s.api.resource.v1beta1.ResourceClaim"]
    assert claim["x-kubernetes-group-version-kind"] == [{"group": "resource.k8s.io", "kind": "ResourceClaim",
                                                         "version": "v1beta1"}]
    request = schemas["io.k8s.api.resource.v1beta1.DeviceRequest"]["properties"]
    assert "deviceClassName" in request and "exactly" not in request
    assert schemas["io.k8s.api.resource.v1beta1.DeviceClaim"]["properties"]["requests"]["items"]["$ref"] == \
        "#/components/schemas/io.k8s.api.resource.v1beta1.DeviceRequest"
    v1 = _get(apiserver.url + "/openapi/v3/apis/resource.k8s.io/v1")["components"]["schemas"]
    assert "exactly" in v1["io.k8s.api.resource.v1.DeviceRequest"]["properties"]
    assert v1["io.k8s.api.resource.v1.DeviceTaintRule"]["description"].startswith("DeviceTaintRule")


def test_openapi_v2_is_served_as_json_and_protobuf(apiserver: Any) -> None:
    doc = _get(apiserver.url + "/openapi/v2")
    assert doc["swagger"] == "2.0" and "io.k8s.api.core.v1.Pod" in doc["definitions"]
    req = urllib.request.Request(apiserver.url + "/openapi/v2",
                                 headers={"Accept": "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"})
    with urllib.request.urlopen(req) as resp:
        body = resp.read()
        assert resp.headers["Content-Type"] == "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
    assert body.startswith(b"\n\x032.0") and b"io.k8s.api.resource.v1.ResourceClaim" in body


def test_the_system_priority_classes_exist_from_the_start(apiserver: Any) -> None:
    classes = {pc["metadata"]["name"]: pc for pc in apiserver.api.list("PriorityClass")[0]}
    assert classes["system-node-critical"]["value"] == 2000001000
    assert classes["system-cluster-critical"]["value"] == 2000000000
    pod = apiserver.api.create("Pod", {"metadata": {"name": "agent", "namespace": "kube-system"}, "spec": {
        "priorityClassName": "system-node-critical", "containers": [{"name": "c", "image": "i"}]}})
    assert pod["spec"]["priority"] == 2000001000


def test_openapi_documents_follow_each_servers_versions() -> None:
    # Registries compare by their types' routes: a document cached for a GA-only server must not be what a server
    # with the beta versions enabled answers.
    ga = EmbeddedApiServer()
    _get(ga.start() + "/openapi/v2")
    ga.stop()
    beta = EmbeddedApiServer(runtime_config="resource.k8s.io/v1beta1=true")
    url = beta.start()
    try:
        root = _get(url + "/openapi/v3")
        doc = _get(url + root["paths"]["apis/resource.k8s.io/v1beta1"]["serverRelativeURL"])
        assert "io.k8s.api.resource.v1beta1.ResourceClaim" in doc["components"]["schemas"]
        assert "io.k8s.api.resource.v1beta1.ResourceClaim" in _get(url + "/openapi/v2")["definitions"]
    finally:
        beta.stop()
