"""CustomResourceDefinitions in the embedded control plane, as kube-apiserver serves them: NVIDIA's
ComputeDomain CRDs applied unchanged, structural schemas (defaulting, pruning, validation, CEL rules), the status
and scale subresources, printer columns, discovery, OpenAPI v3 and the CRD's conditions and cleanup."""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from controlplane import EmbeddedApiServer
from controlplane.crds import schema as sc
from controlplane.crds.celrules import CelRules

DATA = Path(__file__).parent / "data" / "nvidia-compute-domain"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


def _req(method: str, url: str, body: Any = None, ctype: str = "application/json",
         accept: str = "application/json") -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": ctype, "Accept": accept})
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _wait_established(url: str, name: str) -> dict[str, Any]:
    for _ in range(200):
        code, crd = _req("GET", f"{url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conds = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
        if conds.get("Established") == "True":
            return crd
        time.sleep(0.02)
    raise AssertionError(f"{name} was not established: {crd}")


def _nvidia_crds() -> list[dict[str, Any]]:
    return [doc for f in sorted(DATA.glob("resource.nvidia.com_*.yaml")) for doc in yaml.safe_load_all(f.read_text())
            if doc]


@pytest.fixture
def crd_server(server: EmbeddedApiServer) -> str:
    for crd in _nvidia_crds():
        code, body = _req("POST", f"{server.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        assert code == 201, body
        _wait_established(server.url, crd["metadata"]["name"])
    return server.url


CD_URL = "/apis/resource.nvidia.com/v1beta1/namespaces/default/computedomains"


def _domain(name: str = "cd", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain", "metadata": {"name": name},
            "spec": {"channel": {"resourceClaimTemplate": {"name": f"{name}-channel"}}, **spec}}


# ----- the schema core -------------------------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {
    "spec": {"type": "object", "required": ["size"], "properties": {
        "size": {"type": "integer", "minimum": 1, "maximum": 8},
        "mode": {"type": "string", "enum": ["A", "B"], "default": "A"},
        "name": {"type": "string", "maxLength": 5, "pattern": "^[a-z]+$"},
        "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "port": {"x-kubernetes-int-or-string": True},
        "nodes": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                  "items": {"type": "object", "properties": {"name": {"type": "string"},
                                                             "state": {"type": "string", "default": "Down"}}}},
    }},
}}


def test_defaults_fill_missing_fields_and_list_items_and_replace_non_nullable_nulls() -> None:
    obj = {"spec": {"size": 2, "nodes": [{"name": "a"}], "name": None}}
    sc.default(SCHEMA, obj)
    assert obj == {"spec": {"size": 2, "mode": "A", "nodes": [{"name": "a", "state": "Down"}]}}


def test_prune_drops_unknown_fields_and_keeps_preserved_ones() -> None:
    obj = {"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "n"},
           "spec": {"size": 1, "extra": 1, "free": {"any": {"thing": 1}}, "labels": {"a": "b"},
                    "nodes": [{"name": "a", "junk": True}]}, "other": 1}
    pruned, dropped = sc.prune(SCHEMA, obj, "")
    assert dropped == ["spec.extra", "spec.nodes[0].junk", "other"]
    assert pruned["spec"]["free"] == {"any": {"thing": 1}} and pruned["metadata"] == {"name": "n"}


def test_validation_errors_are_worded_as_kube_apiserver() -> None:
    errors = sc.validate(SCHEMA, {"spec": {"size": 0, "mode": "C", "name": "ABCDEFG", "tags": ["x", "x", "y"],
                                           "port": 1.5, "nodes": [{"name": "a"}, {"name": "a"}]}}, "", None)
    assert "spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1" in errors
    assert 'spec.mode: Unsupported value: "C": supported values: "A", "B"' in errors
    assert "spec.name: Too long: may not be more than 5 bytes" in errors
    assert "spec.name: Invalid value: \"ABCDEFG\": spec.name in body should match '^[a-z]+$'" in errors
    assert "spec.tags: Too many: 3: must have at most 2 items" in errors
    assert 'spec.tags[1]: Duplicate value: "x"' in errors
    assert any(e.startswith("spec.port: Invalid value: 1.5") for e in errors)
    assert any(e.startswith("spec.nodes[1]: Duplicate value:") for e in errors)
    assert sc.validate(SCHEMA, {"spec": {"size": "2"}}, "", None) == [
        'spec.size: Invalid value: "string": spec.size in body must be of type integer: "string"']
    assert sc.validate(SCHEMA, {"spec": {}}, "", None) == ["spec.size: Required value"]


def test_transition_rules_see_old_self_only_on_update() -> None:
    schema = {"type": "object", "properties": {"spec": {
        "type": "object", "properties": {"n": {"type": "integer"}},
        "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "immutable"},
                                     {"rule": "self.n < 10", "message": "n must be below 10"}]}}}
    rules = CelRules()
    assert sc.validate(schema, {"spec": {"n": 1}}, "", None, rules) == []
    assert sc.validate(schema, {"spec": {"n": 11}}, "", None, rules) == ['spec: Invalid value: "object": n must be '
                                                                         'below 10']
    assert sc.validate(schema, {"spec": {"n": 2}}, "", {"spec": {"n": 1}}, rules, has_old=True) == [
        'spec: Invalid value: "object": immutable']


def test_structural_check_refuses_untyped_fields_and_bad_defaults() -> None:
    bad = {"type": "object", "properties": {"spec": {"properties": {"a": {"type": "string", "default": 3}}}}}
    errors = sc.check_structural(bad, "spec.versions[0].schema.openAPIV3Schema")
    assert ("spec.versions[0].schema.openAPIV3Schema.properties[spec].type: Required value: must not be empty for "
            "specified object fields") in errors
    assert sc.check_structural(SCHEMA, "s") == []
    for crd in _nvidia_crds():
        assert sc.check_structural(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"], "s") == []


# ----- served through the API ----------------------------------------------------------------------------------

def test_nvidia_crds_are_established_with_accepted_names_and_discovered(crd_server: str) -> None:
    crd = _wait_established(crd_server, "computedomains.resource.nvidia.com")
    assert crd["status"]["acceptedNames"]["kind"] == "ComputeDomain"
    assert crd["status"]["storedVersions"] == ["v1beta1"]
    conds = {c["type"]: c for c in crd["status"]["conditions"]}
    assert conds["NamesAccepted"]["reason"] == "NoConflicts"
    assert crd["metadata"]["finalizers"] == ["customresourcecleanup.apiextensions.k8s.io"]
    _, groups = _req("GET", f"{crd_server}/apis")
    assert any(g["name"] == "resource.nvidia.com" for g in groups["groups"])
    _, resources = _req("GET", f"{crd_server}/apis/resource.nvidia.com/v1beta1")
    names = {r["name"]: r for r in resources["resources"]}
    assert names["computedomains"]["kind"] == "ComputeDomain" and names["computedomains"]["namespaced"]
    assert "computedomains/status" in names


def test_custom_resource_is_defaulted_pruned_and_validated(crd_server: str) -> None:
    body = _domain(numNodes=2)
    body["spec"]["bogus"] = 1
    code, obj = _req("POST", f"{crd_server}{CD_URL}?fieldValidation=Strict", body)
    assert code == 400 and 'unknown field "spec.bogus"' in obj["message"]
    code, obj = _req("POST", f"{crd_server}{CD_URL}", body)
    assert code == 201, obj
    assert obj["spec"] == {"numNodes": 2, "channel": {"allocationMode": "Single",
                                                        "resourceClaimTemplate": {"name": "cd-channel"}}}
    code, obj = _req("POST", f"{crd_server}{CD_URL}", _domain("bad", numNodes=-1,
                                                              channel={"allocationMode": "Some"}))
    assert code == 422
    assert obj["message"].startswith('ComputeDomain.resource.nvidia.com "bad" is invalid: [')
    assert "spec.numNodes: Invalid value: -1: spec.numNodes in body should be greater than or equal to 0" in obj["message"]
    assert 'spec.channel.allocationMode: Unsupported value: "Some": supported values: "All", "Single"' in obj["message"]
    assert "spec.channel.resourceClaimTemplate: Required value" in obj["message"]


def test_spec_immutability_rule_and_status_subresource(crd_server: str) -> None:
    _, obj = _req("POST", f"{crd_server}{CD_URL}", {**_domain(), "status": {"status": "Ready"}})
    assert "status" not in obj  # the status subresource: a create sets no status
    code, err = _req("PATCH", f"{crd_server}{CD_URL}/cd", {"spec": {"numNodes": 4}}, "application/merge-patch+json")
    assert code == 422 and "spec: Invalid value: \"object\": A computeDomain.spec is immutable" in err["message"]
    code, err = _req("PATCH", f"{crd_server}{CD_URL}/cd", {"spec": {"numNodes": 4}},
                     "application/strategic-merge-patch+json")
    assert code == 415
    code, obj = _req("PATCH", f"{crd_server}{CD_URL}/cd/status", {"status": {"nodes": [{"name": "n1", "cliqueID": "c",
                                                                                           "ipAddress": "10.0.0.1"}]}},
                     "application/merge-patch+json")
    assert code == 200, obj
    assert obj["status"] == {"status": "NotReady", "nodes": [{"name": "n1", "cliqueID": "c", "ipAddress": "10.0.0.1",
                                                              "status": "NotReady"}]}
    code, err = _req("PATCH", f"{crd_server}{CD_URL}/cd/status", {"status": {"status": "Maybe"}},
                     "application/merge-patch+json")
    assert code == 422 and 'status.status: Unsupported value: "Maybe"' in err["message"]


def test_openapi_v3_document_for_kubectl_explain(crd_server: str) -> None:
    _, root = _req("GET", f"{crd_server}/openapi/v3")
    assert "apis/resource.nvidia.com/v1beta1" in root["paths"]
    _, doc = _req("GET", f"{crd_server}/openapi/v3/apis/resource.nvidia.com/v1beta1")
    schema = doc["components"]["schemas"]["com.nvidia.resource.v1beta1.ComputeDomain"]
    assert schema["x-kubernetes-group-version-kind"] == [{"group": "resource.nvidia.com", "kind": "ComputeDomain",
                                                          "version": "v1beta1"}]
    assert schema["properties"]["spec"]["properties"]["channel"]["required"] == ["resourceClaimTemplate"]
    assert "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta" in doc["components"]["schemas"]


WIDGETS = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {"group": "example.com", "scope": "Cluster",
             "names": {"plural": "widgets", "kind": "Widget", "shortNames": ["wg"]},
             "versions": [
                 {"name": "v1", "served": True, "storage": True,
                  "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                      "spec": {"type": "object", "properties": {"replicas": {"type": "integer"},
                                                                 "color": {"type": "string"}}},
                      "status": {"type": "object", "properties": {"replicas": {"type": "integer"},
                                                                   "selector": {"type": "string"}}}}}},
                  "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas",
                                                           "statusReplicasPath": ".status.replicas",
                                                           "labelSelectorPath": ".status.selector"}},
                  "additionalPrinterColumns": [{"name": "Color", "type": "string", "jsonPath": ".spec.color"},
                                               {"name": "Replicas", "type": "integer",
                                                "jsonPath": ".spec.replicas"},
                                               {"name": "Age", "type": "date",
                                                "jsonPath": ".metadata.creationTimestamp"}]},
                 {"name": "v1beta1", "served": True, "storage": False,
                  "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}},
             ]},
}


def test_user_crd_with_scale_printer_columns_and_two_versions(server: EmbeddedApiServer) -> None:
    url = server.url
    code, _ = _req("POST", f"{url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions", WIDGETS)
    assert code == 201
    _wait_established(url, "widgets.example.com")
    base = f"{url}/apis/example.com/v1/widgets"
    code, obj = _req("POST", base, {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
                                    "spec": {"replicas": 2, "color": "red"}})
    assert code == 201, obj
    _, old_version = _req("GET", f"{url}/apis/example.com/v1beta1/widgets/w")
    assert old_version["apiVersion"] == "example.com/v1beta1" and old_version["spec"]["color"] == "red"
    _, scale = _req("GET", f"{base}/w/scale")
    assert scale["kind"] == "Scale" and scale["spec"] == {"replicas": 2} and scale["status"] == {"replicas": 0}
    code, scale = _req("PATCH", f"{base}/w/scale", {"spec": {"replicas": 5}}, "application/merge-patch+json")
    assert code == 200 and scale["spec"]["replicas"] == 5
    _, obj = _req("GET", f"{base}/w")
    assert obj["spec"]["replicas"] == 5 and obj["metadata"]["generation"] == 2
    _, table = _req("GET", base, accept=TABLE)
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Color", "Replicas", "Age"]
    assert table["rows"][0]["cells"][:3] == ["w", "red", 5]
    _, resources = _req("GET", f"{url}/apis/example.com/v1")
    scale_entry = next(r for r in resources["resources"] if r["name"] == "widgets/scale")
    assert scale_entry["kind"] == "Scale" and scale_entry["group"] == "autoscaling"
    assert next(r for r in resources["resources"] if r["name"] == "widgets")["shortNames"] == ["wg"]


def test_invalid_crd_is_refused_with_field_paths(server: EmbeddedApiServer) -> None:
    bad = json.loads(json.dumps(WIDGETS))
    bad["metadata"]["name"] = "gadgets.example.com"
    bad["spec"]["versions"][1]["storage"] = True
    bad["spec"]["scope"] = "Global"
    code, err = _req("POST", f"{server.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions", bad)
    assert code == 422
    assert 'metadata.name: Invalid value: "gadgets.example.com": must be spec.names.plural+"."+spec.group' in err["message"]
    assert 'spec.scope: Unsupported value: "Global"' in err["message"]
    assert "must have exactly one version marked as storage version" in err["message"]


def test_deleting_a_crd_deletes_its_resources_and_stops_serving(crd_server: str) -> None:
    assert _req("POST", f"{crd_server}{CD_URL}", _domain())[0] == 201
    code, _ = _req("DELETE", f"{crd_server}/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                             "computedomains.resource.nvidia.com")
    assert code == 200
    for _ in range(200):
        code, _ = _req("GET", f"{crd_server}/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                              "computedomains.resource.nvidia.com")
        if code == 404:
            break
        time.sleep(0.02)
    assert code == 404
    assert _req("GET", f"{crd_server}{CD_URL}")[0] == 404


def test_custom_resources_survive_a_restart_of_a_durable_server(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    with EmbeddedApiServer(state_file=db) as srv:
        crd = _nvidia_crds()[1]
        assert crd["spec"]["names"]["kind"] == "ComputeDomain"
        _req("POST", f"{srv.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        _wait_established(srv.url, "computedomains.resource.nvidia.com")
        assert _req("POST", f"{srv.url}{CD_URL}", _domain())[0] == 201
    with EmbeddedApiServer(state_file=db) as srv:
        code, obj = _req("GET", f"{srv.url}{CD_URL}/cd")
        assert code == 200 and obj["spec"]["channel"]["allocationMode"] == "Single"


def test_custom_resources_list_and_watch(crd_server: str) -> None:
    assert _req("POST", f"{crd_server}{CD_URL}", _domain("w1"))[0] == 201
    _, listed = _req("GET", f"{crd_server}{CD_URL}")
    assert listed["kind"] == "ComputeDomainList" and [i["metadata"]["name"] for i in listed["items"]] == ["w1"]
    rv = listed["metadata"]["resourceVersion"]
    code, _ = _req("PATCH", f"{crd_server}{CD_URL}/w1/status", {"status": {"status": "Ready"}},
                   "application/merge-patch+json")
    assert code == 200
    with urllib.request.urlopen(f"{crd_server}{CD_URL}?watch=true&resourceVersion={rv}&timeoutSeconds=1") as resp:
        events = [json.loads(line) for line in resp.read().splitlines() if line.strip()]
    assert [(e["type"], e["object"]["status"]["status"]) for e in events] == [("MODIFIED", "Ready")]


def _watch_in_background(url: str, seconds: int) -> tuple[threading.Thread, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []

    def read() -> None:
        with urllib.request.urlopen(f"{url}&timeoutSeconds={seconds}") as resp:
            events.extend(json.loads(line) for line in resp if line.strip())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader, events


def test_a_watch_keeps_its_events_when_its_crd_changes(crd_server: str) -> None:
    """A watch opened before its CRD changed (here: a printer column added) still gets the objects' events: the
    store serves the changed type under the same route, and the watch matches events by route."""
    assert _req("POST", f"{crd_server}{CD_URL}", _domain("w1"))[0] == 201
    rv = _req("GET", f"{crd_server}{CD_URL}")[1]["metadata"]["resourceVersion"]
    reader, events = _watch_in_background(f"{crd_server}{CD_URL}?watch=true&resourceVersion={rv}", 3)
    crd_url = f"{crd_server}/apis/apiextensions.k8s.io/v1/customresourcedefinitions/computedomains.resource.nvidia.com"
    crd = _req("GET", crd_url)[1]
    for version in crd["spec"]["versions"]:
        version["additionalPrinterColumns"] = [{"name": "Mode", "type": "string",
                                                "jsonPath": ".spec.channel.allocationMode"}]
    assert _req("PUT", crd_url, crd)[0] == 200
    for _ in range(200):
        columns = _req("GET", f"{crd_server}{CD_URL}", accept=TABLE)[1]["columnDefinitions"]
        if "Mode" in [c["name"] for c in columns]:
            break
        time.sleep(0.02)
    assert "Mode" in [c["name"] for c in columns]
    assert _req("PATCH", f"{crd_server}{CD_URL}/w1/status", {"status": {"status": "Ready"}},
                "application/merge-patch+json")[0] == 200
    reader.join(10)
    assert [(e["type"], e["object"]["status"]["status"]) for e in events] == [("MODIFIED", "Ready")]


def test_a_watch_of_a_deleted_crds_resources_ends_with_410(crd_server: str) -> None:
    """Deleting the CRD ends its resources' open watches with kube-apiserver's Expired (410) error event; the
    client's relist then gets 404, rather than a watch that stays open on a type no longer served."""
    rv = _req("GET", f"{crd_server}{CD_URL}")[1]["metadata"]["resourceVersion"]
    reader, events = _watch_in_background(f"{crd_server}{CD_URL}?watch=true&resourceVersion={rv}", 20)
    time.sleep(0.2)
    assert _req("DELETE", f"{crd_server}/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                          "computedomains.resource.nvidia.com")[0] == 200
    reader.join(15)
    assert not reader.is_alive()
    assert [(e["type"], e["object"]["code"]) for e in events] == [("ERROR", 410)]
    assert _req("GET", f"{crd_server}{CD_URL}")[0] == 404


@pytest.mark.process
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_get_describe_explain_a_custom_resource(crd_server: str, tmp_path: Path) -> None:
    import subprocess

    f = tmp_path / "cd.yaml"
    f.write_text(yaml.safe_dump(_domain("k1", numNodes=2)))

    def kubectl(*args: str) -> str:
        out = subprocess.run(["kubectl", "--server", crd_server, *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert "computedomain.resource.nvidia.com/k1 created" in kubectl("apply", "-f", str(f))
    assert kubectl("get", "computedomains").split()[:3] == ["NAME", "AGE", "k1"]
    assert "Num Nodes:  2" in kubectl("describe", "computedomain", "k1")
    explained = kubectl("explain", "computedomain.spec.channel")
    assert "allocationMode\t<string>" in explained and "resourceClaimTemplate\t<Object> -required-" in explained
