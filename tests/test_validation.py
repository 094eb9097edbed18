"""Kubernetes' resource.k8s.io/v1 validation rules: exact field paths and messages."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpudra.validation import validate_object

LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end "
    "with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start "
    "and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
C_ID_MSG = (
    "a valid C identifier must start with alphabetic character or '_', followed by a string of alphanumeric "
    "characters or '_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName', regex used for validation is "
    "'[A-Za-z_][A-Za-z0-9_]*')"
)
REF_MSG = "must be the name of a request in the claim or the name of a request and a subrequest separated by '/'"


def errors(obj: dict[str, Any], **hooks: Any) -> list[str]:
    return [str(e) for e in validate_object(obj, **hooks)]


def device_class(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"}, "spec": spec}


def claim(devices: dict[str, Any], name: str = "c", namespace: str | None = "default") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta, "spec": {"devices": devices}}


def exact(name: str = "gpu", **fields: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": "gpu.nvidia.com", **fields}}


def a_slice(devices: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "driver": "gpu.nvidia.com",
        "pool": {"name": "node-1", "generation": 0, "resourceSliceCount": 1},
        "nodeName": "node-1",
    }
    base.update(spec)
    if devices is not None:
        base["devices"] = devices
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "node-1-gpu"}, "spec": base}


def gpu(name: str = "gpu-0", **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {"model": {"string": "H100"}, "driverVersion": {"version": "550.54.15"}, "index": {"int": 0}},
        "capacity": {"memory": {"value": "80Gi"}},
        **fields,
    }


# ---- envelope and metadata ---------------------------------------------------------------------


def test_valid_objects_of_every_kind() -> None:
    assert errors(device_class(selectors=[{"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}])) == []
    assert errors(claim({"requests": [exact()]})) == []
    assert errors(a_slice([gpu()])) == []
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": {"metadata": {"labels": {"app": "x"}}, "spec": {"devices": {"requests": [exact()]}}},
    }
    assert errors(template) == []


def test_unknown_kind_and_api_version() -> None:
    # Every version kube-apiserver serves is accepted (and converted); others are named with what is served.
    assert errors({"apiVersion": "resource.k8s.io/v1alpha3", "kind": "DeviceClass"}) == [
        'apiVersion: Unsupported value: "resource.k8s.io/v1alpha3": supported values: "resource.k8s.io/v1", '
        '"resource.k8s.io/v1beta2", "resource.k8s.io/v1beta1"'
    ]
    assert errors({"apiVersion": "resource.k8s.io/v1beta1", "kind": "DeviceTaintRule", "metadata": {"name": "r"}}) == [
        'apiVersion: Unsupported value: "resource.k8s.io/v1beta1": supported values: "resource.k8s.io/v1", '
        '"resource.k8s.io/v1beta2"'
    ]
    assert errors({"apiVersion": "resource.k8s.io/v1", "kind": "Pod"}) == [
        'kind: Unsupported value: "Pod": supported values: "DeviceClass", "DeviceTaintRule", "ResourceClaim", '
        '"ResourceClaimTemplate", "ResourceSlice"'
    ]
    assert errors({"kind": "DeviceClass"}) == ["apiVersion: Required value: must be 'resource.k8s.io/v1'"]
    assert errors(["not", "an", "object"])[0].startswith(': Invalid value: ["not","an","object"]')  # type: ignore[arg-type]


def test_metadata_names_and_namespaces() -> None:
    obj = claim({"requests": [exact()]}, name="Bad_Name", namespace=None)
    assert errors(obj) == [
        f'metadata.name: Invalid value: "Bad_Name": {SUBDOMAIN_MSG}',
        "metadata.namespace: Required value",
    ]
    obj = claim({"requests": [exact()]}, name="")
    assert errors(obj) == ["metadata.name: Required value: name or generateName is required"]
    obj["metadata"]["generateName"] = "claim-"
    assert errors(obj) == []
    cls = device_class()
    cls["metadata"]["namespace"] = "default"
    assert errors(cls) == ["metadata.namespace: Forbidden: not allowed on this type"]
    obj = claim({"requests": [exact()]}, namespace="Not.A.Label")
    assert errors(obj)[0].startswith('metadata.namespace: Invalid value: "Not.A.Label": ')


def test_metadata_labels_and_annotations() -> None:
    obj = claim({"requests": [exact()]})
    obj["metadata"]["labels"] = {"hello-world": "bad value!"}
    obj["metadata"]["annotations"] = {"bad key!": "x"}
    out = errors(obj)
    assert out[0].startswith('metadata.labels: Invalid value: "bad value!": a valid label must be an empty string')
    assert out[1] == (
        "metadata.annotations: Invalid value: \"bad key!\": name part must consist of alphanumeric characters, '-', "
        "'_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or "
        "'123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
    )


# ---- DeviceClass -------------------------------------------------------------------------------


def test_device_class_limits_and_config() -> None:
    many = [{"cel": {"expression": "true"}}] * 33
    assert errors(device_class(selectors=many)) == ["spec.selectors: Too many: 33: must have at most 32 items"]
    assert errors(device_class(selectors=[{}])) == ["spec.selectors[0].cel: Required value"]
    assert errors(device_class(selectors=[{"cel": {"expression": ""}}])) == [
        "spec.selectors[0].cel.expression: Required value: expression must not be empty"
    ]
    long_expr = "true && " * 1300 + "true"
    assert errors(device_class(selectors=[{"cel": {"expression": long_expr}}])) == [
        "spec.selectors[0].cel.expression: Too long: may not be more than 10240 bytes"
    ]
    configs = [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"a": 1}}}] * 33
    assert errors(device_class(config=configs)) == ["spec.config: Too many: 33: must have at most 32 items"]
    assert errors(device_class(config=[{}])) == ["spec.config[0].opaque: Required value"]
    assert errors(device_class(config=[{"opaque": {"driver": "", "parameters": {}}}])) == [
        "spec.config[0].opaque.driver: Required value",
        f'spec.config[0].opaque.driver: Invalid value: "": {SUBDOMAIN_MSG}',
    ]
    assert errors(device_class(config=[{"opaque": {"driver": "x.example.com", "parameters": [1]}}])) == [
        'spec.config[0].opaque.parameters: Invalid value: "<value omitted>": must be a valid JSON object'
    ]
    assert errors(device_class(config=[{"opaque": {"driver": "x.example.com"}}])) == [
        "spec.config[0].opaque.parameters: Required value"
    ]
    big = {"blob": "x" * 10240}
    assert errors(device_class(config=[{"opaque": {"driver": "x.example.com", "parameters": big}}])) == [
        "spec.config[0].opaque.parameters: Too long: may not be more than 10240 bytes"
    ]
    assert errors(device_class(config=[{"opaque": {"driver": "a" * 64 + ".com", "parameters": {}}}])) == [
        "spec.config[0].opaque.driver: Too long: may not be more than 63 bytes"
    ]


def test_device_class_extended_resource_name() -> None:
    assert errors(device_class(extendedResourceName="example.com/gpu")) == []
    assert errors(device_class(extendedResourceName="gpu")) == [
        'spec.extendedResourceName: Invalid value: "gpu": must be a valid extended resource name'
    ]
    assert errors(device_class(extendedResourceName="kubernetes.io/gpu"))[0].endswith("must be a valid extended resource name")


def test_cel_hook_is_called_in_strict_mode_and_mapped() -> None:
    seen: list[tuple[str, bool]] = []

    def cel(expression: str, strict: bool) -> str | None:
        seen.append((expression, strict))
        if expression == "costly":
            return "too complex, exceeds cost limit"
        if expression == "bad":
            return "compilation failed: ERROR: <input>:1:1: undeclared reference to 'bad'"
        return None

    obj = device_class(selectors=[{"cel": {"expression": e}} for e in ("ok", "bad", "costly")])
    assert errors(obj, cel=cel) == [
        "spec.selectors[1].cel.expression: Invalid value: \"bad\": compilation failed: ERROR: <input>:1:1: undeclared reference to 'bad'",
        "spec.selectors[2].cel.expression: Forbidden: too complex, exceeds cost limit",
    ]
    assert seen == [("ok", True), ("bad", True), ("costly", True)]


def test_opaque_hook_messages_are_anchored_under_parameters() -> None:
    def validator(params: dict[str, Any]) -> list[str]:
        return ["sharing.strategy: unsupported value 'X'", "parameters: must be an object"] if params else []

    obj = device_class(config=[{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"sharing": {"strategy": "X"}}}}])
    assert errors(obj, opaque={"gpu.nvidia.com": validator}) == [
        "spec.config[0].opaque.parameters.sharing.strategy: unsupported value 'X'",
        "spec.config[0].opaque.parameters: must be an object",
    ]
    # other drivers' parameters are opaque to us
    obj["spec"]["config"][0]["opaque"]["driver"] = "other.example.com"
    assert errors(obj, opaque={"gpu.nvidia.com": validator}) == []


# ---- ResourceClaim -----------------------------------------------------------------------------


def test_request_one_of_exactly_first_available() -> None:
    assert errors(claim({"requests": [{"name": "gpu"}]})) == [
        "spec.devices.requests[0]: Required value: exactly one of `exactly` or `firstAvailable` is required"
    ]
    both = exact()
    both["firstAvailable"] = [{"name": "a", "deviceClassName": "x"}]
    assert errors(claim({"requests": [both]})) == [
        "spec.devices.requests[0]: Invalid value: null: exactly one of `exactly` or `firstAvailable` is required, but multiple fields are set"
    ]


def test_request_names_and_limits() -> None:
    assert errors(claim({"requests": [exact("GPU")]})) == [f'spec.devices.requests[0].name: Invalid value: "GPU": {LABEL_MSG}']
    assert errors(claim({"requests": [exact("gpu"), exact("gpu")]})) == ['spec.devices.requests[1]: Duplicate value: "gpu"']
    many = [exact(f"r{i}") for i in range(33)]
    assert errors(claim({"requests": many})) == ["spec.devices.requests: Too many: 33: must have at most 32 items"]
    assert errors(claim({"requests": [exact(deviceClassName="")]})) == [
        "spec.devices.requests[0].exactly.deviceClassName: Required value"
    ]
    assert errors(claim({"requests": [exact(deviceClassName="Bad")]})) == [
        f'spec.devices.requests[0].exactly.deviceClassName: Invalid value: "Bad": {SUBDOMAIN_MSG}'
    ]


def test_allocation_mode_and_count() -> None:
    assert errors(claim({"requests": [exact(allocationMode="All")]})) == []
    assert errors(claim({"requests": [exact(count=0)]})) == []  # v1 defaults count 0 to 1
    assert errors(claim({"requests": [exact(count=-1)]})) == [
        "spec.devices.requests[0].exactly.count: Invalid value: -1: must be greater than zero"
    ]
    assert errors(claim({"requests": [exact(allocationMode="All", count=2)]})) == [
        "spec.devices.requests[0].exactly.count: Invalid value: 2: must not be specified when allocationMode is 'All'"
    ]
    assert errors(claim({"requests": [exact(allocationMode="Foo")]})) == [
        'spec.devices.requests[0].exactly.allocationMode: Unsupported value: "Foo": supported values: "All", "ExactCount"'
    ]
    assert errors(claim({"requests": [exact(count="2")]})) == [
        'spec.devices.requests[0].exactly.count: Invalid value: "2": must be an integer'
    ]


def test_selectors_in_requests() -> None:
    sels = [{"cel": {"expression": "true"}}] * 33
    assert errors(claim({"requests": [exact(selectors=sels)]})) == [
        "spec.devices.requests[0].exactly.selectors: Too many: 33: must have at most 32 items"
    ]
    sels = [{"cel": {"expression": "true"}}, {"cel": {}}]
    assert errors(claim({"requests": [exact(selectors=sels)]})) == [
        "spec.devices.requests[0].exactly.selectors[1].cel.expression: Required value: expression must not be empty"
    ]


def test_first_available_rules() -> None:
    subs = [{"name": f"s{i}", "deviceClassName": "gpu.nvidia.com"} for i in range(9)]
    assert errors(claim({"requests": [{"name": "gpu", "firstAvailable": subs}]})) == [
        "spec.devices.requests[0].firstAvailable: Too many: 9: must have at most 8 items"
    ]
    subs = [{"name": "a", "deviceClassName": "gpu.nvidia.com"}, {"name": "a", "deviceClassName": "x", "adminAccess": True}]
    assert errors(claim({"requests": [{"name": "gpu", "firstAvailable": subs}]})) == [
        "spec.devices.requests[0].firstAvailable[1].adminAccess: Forbidden: may only be set in `exactly`, not in a `firstAvailable` subrequest",
        'spec.devices.requests[0].firstAvailable[1]: Duplicate value: "a"',
    ]
    subs = [{"name": "big", "deviceClassName": "gpu.nvidia.com", "allocationMode": "All", "count": 1}]
    assert errors(claim({"requests": [{"name": "gpu", "firstAvailable": subs}]})) == [
        "spec.devices.requests[0].firstAvailable[0].count: Invalid value: 1: must not be specified when allocationMode is 'All'"
    ]


def test_tolerations() -> None:
    tols = [
        {"key": "a", "operator": "Exists", "value": "x"},
        {"operator": "Equal", "value": "x"},
        {"key": "b", "operator": "Foo"},
        {"key": "c", "effect": "Bad"},
        {"operator": "Exists"},
        {"key": "d", "value": "ok", "effect": "NoSchedule"},
    ]
    assert errors(claim({"requests": [exact(tolerations=tols)]})) == [
        'spec.devices.requests[0].exactly.tolerations[0].value: Invalid value: "x": must be empty for operator `Exists`',
        'spec.devices.requests[0].exactly.tolerations[2].operator: Unsupported value: "Foo": supported values: "Equal", "Exists"',
        'spec.devices.requests[0].exactly.tolerations[3].effect: Unsupported value: "Bad": supported values: "NoExecute", "NoSchedule", "None"',
    ]
    assert errors(claim({"requests": [exact(tolerations=[{"operator": "Exists"}] * 17)]})) == [
        "spec.devices.requests[0].exactly.tolerations: Too many: 17: must have at most 16 items"
    ]


def test_constraints_and_config_references() -> None:
    devices = {
        "requests": [exact("gpu"), {"name": "alt", "firstAvailable": [{"name": "big", "deviceClassName": "x"}]}],
        "constraints": [
            {"requests": ["gpu", "alt/big"], "matchAttribute": "gpu.nvidia.com/model"},
            {"requests": ["gpu", "Bad"], "matchAttribute": "missing-domain"},
            {"matchAttribute": ""},
            {},
            {"requests": ["alt/small", "gpu/x/y"], "matchAttribute": "a.com/b", "distinctAttribute": "a.com/c"},
        ],
        "config": [
            {"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {}}},
            {"requests": ["nope", "gpu", "gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {}}},
        ],
    }
    assert errors(claim(devices)) == [
        f'spec.devices.constraints[1].requests[1]: Invalid value: "Bad": {LABEL_MSG}',
        f'spec.devices.constraints[1].requests[1]: Invalid value: "Bad": {REF_MSG}',
        f'spec.devices.constraints[1].matchAttribute: Invalid value: "missing-domain": {C_ID_MSG}',
        'spec.devices.constraints[1].matchAttribute: Invalid value: "missing-domain": a fully qualified name must be a domain and a name separated by a slash',
        f'spec.devices.constraints[2].matchAttribute: Invalid value: "": {C_ID_MSG}',
        'spec.devices.constraints[2].matchAttribute: Invalid value: "": a fully qualified name must be a domain and a name separated by a slash',
        "spec.devices.constraints[3].matchAttribute: Required value",
        f'spec.devices.constraints[4].requests[0]: Invalid value: "alt/small": {REF_MSG}',
        f'spec.devices.constraints[4].requests[1]: Invalid value: "gpu/x/y": {REF_MSG}',
        "spec.devices.constraints[4]: Invalid value: null: exactly one of `matchAttribute` or `distinctAttribute` is required, but multiple fields are set",
        f'spec.devices.config[1].requests[0]: Invalid value: "nope": {REF_MSG}',
        'spec.devices.config[1].requests[2]: Duplicate value: "gpu"',
    ]
    too_many = {"requests": [exact()], "constraints": [{"matchAttribute": "a.com/b"}] * 33, "config": [{}] * 33}
    assert errors(claim(too_many)) == [
        "spec.devices.constraints: Too many: 33: must have at most 32 items",
        "spec.devices.config: Too many: 33: must have at most 32 items",
    ]


def test_capacity_requests() -> None:
    req = exact(capacity={"requests": {"memory": "10Gi", "bad-key": "1", "cores": "lots"}})
    assert errors(claim({"requests": [req]})) == [
        f'spec.devices.requests[0].exactly.capacity.requests: Invalid value: "bad-key": {C_ID_MSG}',
        "spec.devices.requests[0].exactly.capacity.requests[cores]: Invalid value: \"lots\": quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
    ]


def test_claim_status_allocation() -> None:
    obj = claim({"requests": [exact("gpu")]})
    obj["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-0"},
                    {"request": "other", "driver": "gpu.nvidia.com", "pool": "node-1", "device": "GPU_1"},
                ],
                "config": [{"source": "FromElsewhere", "requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {}}}],
            }
        },
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}, {"resource": "pods", "name": "q"}],
        "devices": [{"driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-9"}],
    }
    assert errors(obj) == [
        "status.reservedFor[1].uid: Required value",
        f'status.allocation.devices.results[1].request: Invalid value: "other": {REF_MSG}',
        f'status.allocation.devices.results[1].device: Invalid value: "GPU_1": {LABEL_MSG}',
        'status.allocation.devices.config[0].source: Unsupported value: "FromElsewhere": supported values: "FromClaim", "FromClass"',
        'status.devices[0]: Invalid value: "gpu.nvidia.com/node-1/gpu-9": must be an allocated device in the claim',
    ]
    no_alloc = claim({"requests": [exact("gpu")]})
    no_alloc["status"] = {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]}
    assert errors(no_alloc) == ["status.reservedFor: Forbidden: may not be specified when `allocated` is not set"]
    results = [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "p", "device": f"d{i}"} for i in range(33)]
    big = claim({"requests": [exact("gpu")]})
    big["status"] = {"allocation": {"devices": {"results": results}}}
    assert errors(big) == ["status.allocation.devices.results: Too many: 33: must have at most 32 items"]


def test_template_paths() -> None:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": {"metadata": {"labels": {"k": "bad value"}}, "spec": {"devices": {"requests": [exact(count=-2)]}}},
    }
    out = errors(template)
    assert out[0].startswith('spec.metadata.labels: Invalid value: "bad value": a valid label must be')
    assert out[1] == "spec.spec.devices.requests[0].exactly.count: Invalid value: -2: must be greater than zero"


# ---- ResourceSlice -----------------------------------------------------------------------------


def test_slice_node_selection_one_of() -> None:
    obj = a_slice([gpu()])
    del obj["spec"]["nodeName"]
    assert errors(obj) == [
        "spec: Required value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
    ]
    obj = a_slice([gpu()], allNodes=True)
    assert errors(obj) == [
        'spec: Invalid value: "{`nodeName`, `allNodes`}": exactly one of `nodeName`, `nodeSelector`, `allNodes`, '
        "`perDeviceNodeSelection` is required, but multiple fields are set"
    ]
    obj = a_slice([gpu()], nodeName="", allNodes=False)
    assert errors(obj) == [
        'spec.nodeName: Invalid value: "": must be either unset or set to a non-empty string',
        "spec.allNodes: Invalid value: false: must be either unset or set to true",
        "spec: Required value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required",
    ]
    selector = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}] * 2}
    obj = a_slice([gpu()], nodeSelector=selector)
    del obj["spec"]["nodeName"]
    out = errors(obj)
    assert len(out) == 1 and out[0].startswith("spec.nodeSelector.nodeSelectorTerms: Invalid value: ")
    assert out[0].endswith(": must have exactly one node selector term")


def test_per_device_node_selection() -> None:
    devices = [gpu("a", nodeName="node-1"), gpu("b"), gpu("c", nodeName="n", allNodes=True)]
    obj = a_slice(devices, perDeviceNodeSelection=True)
    del obj["spec"]["nodeName"]
    msg = (
        "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when `perDeviceNodeSelection` "
        "is set to true in the ResourceSlice spec"
    )
    assert errors(obj) == [
        f"spec.devices[1]: Required value: {msg}",
        f'spec.devices[2]: Invalid value: "{{`nodeName`, `allNodes`}}": {msg}',
    ]
    obj = a_slice([gpu(nodeName="node-1")])
    assert errors(obj) == [
        "spec.devices[0]: Invalid value: null: `nodeName`, `nodeSelector` and `allNodes` can only be set if "
        "`perDeviceNodeSelection` is set to true in the ResourceSlice spec"
    ]


def test_slice_pool_and_driver() -> None:
    obj = a_slice([gpu()], driver="Bad_Driver", pool={"name": "a//b", "generation": -1, "resourceSliceCount": 0})
    assert errors(obj) == [
        f'spec.driver: Invalid value: "Bad_Driver": {SUBDOMAIN_MSG}',
        f'spec.pool.name: Invalid value: "": {SUBDOMAIN_MSG}',
        "spec.pool.resourceSliceCount: Invalid value: 0: must be greater than zero",
        "spec.pool.generation: Invalid value: -1: must be greater than or equal to zero",
    ]
    obj = a_slice([gpu()], pool={"generation": 0, "resourceSliceCount": 1})
    assert errors(obj) == ["spec.pool.name: Required value"]
    # driver names are checked case-insensitively, like CSI driver names
    assert errors(a_slice([gpu()], driver="GPU.nvidia.com")) == []


def test_slice_device_limits() -> None:
    assert errors(a_slice([gpu(f"g{i}") for i in range(128)])) == []
    assert errors(a_slice([gpu(f"g{i}") for i in range(129)])) == ["spec.devices: Too many: 129: must have at most 128 items"]
    tainted = [gpu(f"g{i}", taints=[{"key": "k", "effect": "NoSchedule"}]) for i in range(65)]
    assert errors(a_slice(tainted)) == ["spec.devices: Too many: 65: must have at most 64 items"]
    assert errors(a_slice([gpu("g"), gpu("g")])) == ['spec.devices[1]: Duplicate value: "g"']


def test_attributes_and_capacity() -> None:
    device = gpu()
    device["attributes"] = {
        "ok": {"bool": True},
        "bad-name": {"int": 1},
        "none": {},
        "two": {"int": 1, "string": "x"},
        "long": {"string": "x" * 65},
        "ver": {"version": "v1.2.3"},
        "example.com/qualified": {"string": "fine"},
        "/empty": {"int": 1},
        "a/b/c": {"int": 1},
    }
    device["capacity"] = {"memory": {"value": "80Gi"}, "bad": {"value": "1K"}, "missing": {}}
    out = errors(a_slice([device]))
    assert out == [
        f'spec.devices[0].attributes: Invalid value: "bad-name": {C_ID_MSG}',
        'spec.devices[0].attributes[none]: Invalid value: "": exactly one value must be specified',
        'spec.devices[0].attributes[two]: Invalid value: {"int":1,"string":"x"}: exactly one value must be specified',
        "spec.devices[0].attributes[long].string: Too long: may not be more than 64 bytes",
        'spec.devices[0].attributes[ver].version: Invalid value: "v1.2.3": must be a string compatible with semver.org spec 2.0.0',
        'spec.devices[0].attributes: Invalid value: "": the domain must not be empty',
        'spec.devices[0].attributes: Invalid value: "a/b/c": must not contain more than one slash',
        "spec.devices[0].capacity[bad].value: Invalid value: \"1K\": unable to parse quantity's suffix",
        "spec.devices[0].capacity[missing].value: Required value",
    ]
    crowded = gpu()
    crowded["attributes"] = {f"a{i}": {"int": i} for i in range(32)}
    assert errors(a_slice([crowded])) == [
        "spec.devices[0]: Invalid value: 33: the total number of attributes and capacities must not exceed 32"
    ]
    long_id = gpu()
    long_id["attributes"] = {"x" * 33: {"int": 1}}
    assert errors(a_slice([long_id])) == ["spec.devices[0].attributes: Too long: may not be more than 32 bytes"]


def test_taints() -> None:
    device = gpu(taints=[{"key": "", "effect": "NoSchedule"}, {"key": "k", "value": "bad value"}, {"key": "k", "effect": "Nope"}])
    out = errors(a_slice([device]))
    assert out[0] == 'spec.devices[0].taints[0].key: Invalid value: "": name part must be non-empty'
    assert out[2].startswith('spec.devices[0].taints[1].value: Invalid value: "bad value": a valid label must be')
    assert out[3] == "spec.devices[0].taints[1].effect: Required value"
    assert out[4] == 'spec.devices[0].taints[2].effect: Unsupported value: "Nope": supported values: "NoExecute", "NoSchedule", "None"'
    many = gpu(taints=[{"key": "k", "effect": "None"}] * 17)
    assert errors(a_slice([many])) == ["spec.devices[0].taints: Too many: 17: must have at most 16 items"]


def test_counters() -> None:
    counters = {"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}, "Bad": {"value": "1"}}}
    obj = a_slice(sharedCounters=[counters, copy.deepcopy(counters), {"name": "", "counters": {}}])
    assert errors(obj) == [
        f'spec.sharedCounters[0].counters: Invalid value: "Bad": {LABEL_MSG}',
        f'spec.sharedCounters[1].counters: Invalid value: "Bad": {LABEL_MSG}',
        "spec.sharedCounters[2].name: Required value",
        "spec.sharedCounters[2].counters: Required value",
        'spec.sharedCounters[1]: Duplicate value: "gpu-0-counters"',
    ]
    sets = [{"name": f"s{i}", "counters": {"c": {"value": "1"}}} for i in range(9)]
    assert errors(a_slice(sharedCounters=sets)) == ["spec.sharedCounters: Too many: 9: must have at most 8 items"]
    both = a_slice([gpu()], sharedCounters=[{"name": "s", "counters": {"c": {"value": "1"}}}])
    assert errors(both) == ['spec: Invalid value: "": only one of `sharedCounters` or `devices` is allowed']
    consumer = gpu(consumesCounters=[{"counterSet": "s", "counters": {f"c{i}": {"value": "1"} for i in range(33)}}] * 3)
    assert errors(a_slice([consumer])) == ["spec.devices[0].consumesCounters: Too many: 3: must have at most 2 items"]
    consumer = gpu(consumesCounters=[{"counterSet": "s", "counters": {f"c{i}": {"value": "1"} for i in range(33)}}])
    assert errors(a_slice([consumer])) == ["spec.devices[0].consumesCounters[0].counters: Too many: 33: must have at most 32 items"]


def test_request_policy_needs_multiple_allocations() -> None:
    device = gpu()
    device["capacity"]["memory"]["requestPolicy"] = {"default": "1Gi"}
    assert errors(a_slice([device])) == [
        "spec.devices[0].capacity[memory].requestPolicy: Forbidden: allowMultipleAllocations must be true"
    ]
    device["allowMultipleAllocations"] = True
    assert errors(a_slice([device])) == []


def test_wrong_types_never_crash() -> None:
    obj = a_slice("not-a-list")  # type: ignore[arg-type]
    assert 'spec.devices: Invalid value: "not-a-list": must be a list' in errors(obj)
    obj = claim({"requests": [exact(selectors="x", tolerations=5)]})
    assert errors(obj) == [
        'spec.devices.requests[0].exactly.selectors: Invalid value: "x": must be a list',
        "spec.devices.requests[0].exactly.tolerations: Invalid value: 5: must be a list",
    ]
    assert errors({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": 3, "spec": None}) == [
        "metadata: Invalid value: 3: must be an object",
        "metadata.name: Required value: name or generateName is required",
        "metadata.namespace: Required value",
    ]


def test_all_errors_are_reported_together() -> None:
    obj = claim({"requests": [exact("A", count=-1), {"name": "b"}]}, name="X")
    assert len(errors(obj)) == 4


@pytest.mark.parametrize("node", ["node-1", "ip-10-0-0-1.ec2.internal"])
def test_node_names(node: str) -> None:
    assert errors(a_slice([gpu()], nodeName=node)) == []


def test_list_type_attributes_are_checked_element_by_element() -> None:
    """KEP-5491 list attributes (alpha): accepted as written, each element checked like the scalar of its kind,
    and at most 48 values per device (ResourceSliceMaxAttributeValuesPerDevice)."""
    from gpudra.validation import validate_object

    def slice_with(attributes: dict) -> dict:  # type: ignore[type-arg]
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"},
                "spec": {"driver": "gpu.nvidia.com", "nodeName": "n", "pool": {"name": "n", "resourceSliceCount": 1},
                         "devices": [{"name": "d0", "attributes": attributes}]}}

    assert validate_object(slice_with({"roots": {"strings": ["pci0000:00", "pci0000:01"]}})) == []
    errors = [str(e) for e in validate_object(slice_with({"v": {"versions": ["1.0", "2.0.0"]}, "s": {"strings": ["x"], "string": "y"}}))]
    assert any(e.startswith('spec.devices[0].attributes[v].versions[0]: Invalid value: "1.0"') for e in errors), errors
    assert any("attributes[s]" in e and "exactly one value must be specified" in e for e in errors), errors
    many = [str(e) for e in validate_object(slice_with({"n": {"ints": list(range(48))}, "x": {"int": 1}}))]
    assert any("must not exceed 48" in e for e in many), many
