"""Upstream conformance: cases transcribed from Kubernetes' resource.k8s.io validation tests.

Each case mirrors one scenario of pkg/apis/resource/validation/validation_{resourceslice,resourceclaim,
deviceclass,resourceclaimtemplate}_test.go, written as the v1 object a user would submit, and runs through
the CLI contract (`gpu-dra validate -f FILE -o json`). Expected errors are (field path, message fragment);
the path list must match exactly (with multiplicity), the fragment must occur in that error's message.

Deliberate differences from the upstream tables (which test internal types, not v1 input):
- v1 defaulting runs first: an empty allocationMode becomes ExactCount with count 1, so upstream's
  "allocationMode: Unsupported value \"\"" cannot happen for v1 input.
- Opaque parameters are sized as compact JSON (what kubectl sends); upstream sizes its raw bytes, which
  contain a space, so the boundary strings here are one byte longer.
- Unparseable raw JSON (`{`, `xxx`) cannot be written in a YAML/JSON manifest and is not transcribed.
- Semantics follow 1.35: duplicates are reported at the list item, map-key errors at the map itself, and
  a list over its limit reports only TooMany.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cli.main import main

GOOD = "foo"
GOOD2 = "bar"
BAD = "!@#$%^"
DRIVER = "test.example.com"
NS = "ns"
PARAMS = {"kind": "foo", "apiVersion": "dra.example.com/v1"}
MAX_PARAMS = 10 * 1024

Expected = list[tuple[str, str]]
Obj = dict[str, Any]


# ---- object builders mirroring the upstream test fixtures ------------------------------------------


def test_attributes() -> dict[str, Any]:
    return {"int": {"int": 42}, "string": {"string": "hello world"}, "version": {"version": "1.2.3"}, "bool": {"bool": True}}


test_attributes.__test__ = False  # type: ignore[attr-defined]  # a fixture builder, not a test


def counters(n: int = 1) -> dict[str, Any]:
    if n == 1:
        return {"memory": {"value": "1Gi"}}
    return {f"memory-{i}": {"value": "1Gi"} for i in range(n)}


def rslice(name: str = GOOD, node: str = GOOD, driver: str = DRIVER, n: int = 1) -> Obj:
    devices = [
        {"name": f"device-{d}", "attributes": test_attributes(), "capacity": {"memory": {"value": "1Gi"}}} for d in range(n)
    ]
    meta: dict[str, Any] = {"name": name} if name else {}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {"nodeName": node, "driver": driver, "pool": {"name": node, "resourceSliceCount": 1}, "devices": devices},
    }


def shared_slice(n: int) -> Obj:
    obj = rslice()
    del obj["spec"]["devices"]
    obj["spec"]["sharedCounters"] = [{"name": f"counterset-{i}", "counters": counters()} for i in range(n)]
    return obj


def consumes(n: int) -> list[dict[str, Any]]:
    return [{"counterSet": f"counterset-{i}", "counters": counters()} for i in range(n)]


def exact_request(name: str = GOOD, **fields: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": GOOD, "allocationMode": "ExactCount", "count": 1, **fields}}


def rclaim(name: str = GOOD, namespace: str = NS, requests: list[dict[str, Any]] | None = None, **devices: Any) -> Obj:
    meta: dict[str, Any] = {}
    if name:
        meta["name"] = name
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {"devices": {"requests": requests if requests is not None else [exact_request()], **devices}},
    }


def first_available_claim() -> Obj:
    sub = [
        {"name": GOOD, "deviceClassName": GOOD, "allocationMode": "ExactCount", "count": 1},
        {"name": GOOD2, "deviceClassName": GOOD, "allocationMode": "ExactCount", "count": 1},
    ]
    return rclaim(requests=[{"name": GOOD, "firstAvailable": sub}])


def opaque(params: Any = PARAMS, driver: str = "dra.example.com", requests: list[str] | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {"opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        config["requests"] = requests
    return config


def big_params(extra: int) -> dict[str, str]:
    """Parameters whose compact JSON is exactly MAX_PARAMS + extra bytes."""
    return {"str": "x" * (MAX_PARAMS - len('{"str":""}') + extra)}


def dclass(name: str = GOOD, **spec: Any) -> Obj:
    meta: dict[str, Any] = {"name": name} if name else {}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": meta, "spec": spec}


def template(name: str = GOOD, namespace: str = NS, spec: dict[str, Any] | None = None, meta: dict[str, Any] | None = None) -> Obj:
    claim_spec = spec if spec is not None else {"devices": {"requests": [exact_request()]}}
    out: dict[str, Any] = {"spec": claim_spec}
    if meta is not None:
        out["metadata"] = meta
    metadata: dict[str, Any] = {}
    if name:
        metadata["name"] = name
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": metadata, "spec": out}


def edit(obj: Obj, change: Callable[[Obj], None]) -> Obj:
    out = copy.deepcopy(obj)
    change(out)
    return out


def sset(path: str, value: Any) -> Callable[[Obj], None]:
    """A change that sets a dotted path (integers index lists); value None deletes the key."""

    def change(obj: Obj) -> None:
        parts = path.split(".")
        cur: Any = obj
        for part in parts[:-1]:
            cur = cur[int(part)] if part.isdigit() else cur[part]
        last = parts[-1]
        if value is None:
            del cur[last]
        elif last.isdigit():
            cur[int(last)] = value
        else:
            cur[last] = value

    return change


def chain(*changes: Callable[[Obj], None]) -> Callable[[Obj], None]:
    def change(obj: Obj) -> None:
        for c in changes:
            c(obj)

    return change


SUBDOMAIN = "a lowercase RFC 1123 subdomain"
LABEL = "a lowercase RFC 1123 label"
C_ID = "a valid C identifier"
LABEL_VALUE = "a valid label must be an empty string"
QNAME = "name part must consist of alphanumeric characters"
REF = "must be the name of a request in the claim"
ONE_NODE = "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
ONE_DEV_NODE = "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required"
NODE_SEL = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["worker"]}]}]}
VALID_CEL = 'device.driver == "dra.example.com"'
COST_CEL = (
    "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(x, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(y, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"
    ".all(z, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z2, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z3, [1, 2, 3, 4, 5, 6, 7,"
    " 8, 9, 10].all(z4, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z5, int('1'.find('[0-9]*')) < 100)))))))"
)
META_EXTRAS: list[tuple[str, Any]] = [
    ("generateName", "prefix-"),
    ("uid", "ac051fac-2ead-46d9-b8b4-4e0fbeb7455d"),
    ("resourceVersion", "1"),
    ("generation", 100),
    ("creationTimestamp", "2025-01-01T00:00:00Z"),
    ("deletionGracePeriodSeconds", 10),
    ("ownerReferences", [{"apiVersion": "v1", "kind": "pod", "name": "foo", "uid": "ac051fac-2ead-46d9-b8b4-4e0fbeb7455d"}]),
    ("finalizers", ["example.com/foo"]),
    ("managedFields", [{"fieldsType": "FieldsV1", "operation": "Apply", "apiVersion": "apps/v1", "manager": "foo"}]),
]


def meta_cases(kind: str, base: Obj) -> list[Any]:
    """The metadata scenarios every upstream table repeats."""
    cases: list[Any] = []
    for field_name, value in META_EXTRAS:
        cases.append(pytest.param(edit(base, sset(f"metadata.{field_name}", value)), [], id=f"{kind}-{field_name}"))
    cases += [
        pytest.param(edit(base, sset("metadata.name", None)), [("metadata.name", "name or generateName is required")], id=f"{kind}-missing-name"),
        pytest.param(edit(base, sset("metadata.name", BAD)), [("metadata.name", SUBDOMAIN)], id=f"{kind}-bad-name"),
        pytest.param(edit(base, sset("metadata.labels", {"apps.kubernetes.io/name": "test"})), [], id=f"{kind}-good-labels"),
        pytest.param(edit(base, sset("metadata.labels", {"hello-world": "spaces not allowed"})), [("metadata.labels", LABEL_VALUE)], id=f"{kind}-bad-labels"),
        pytest.param(edit(base, sset("metadata.annotations", {"foo": "bar"})), [], id=f"{kind}-good-annotations"),
        pytest.param(edit(base, sset("metadata.annotations", {BAD: "hello world"})), [("metadata.annotations", QNAME)], id=f"{kind}-bad-annotations"),
    ]
    return cases


# ---- ResourceSlice (validation_resourceslice_test.go: TestValidateResourceSlice) -------------------


def _taint_all(n: int) -> Obj:
    obj = rslice(n=n)
    for device in obj["spec"]["devices"]:
        device["taints"] = [{"key": "example.com/taint", "effect": "NoExecute"}]
    return obj


def _consume_all(n: int) -> Obj:
    obj = rslice(n=n)
    for device in obj["spec"]["devices"]:
        device["consumesCounters"] = consumes(1)
    return obj


def _bad_attributes() -> Obj:
    obj = rslice(n=5)
    devs = obj["spec"]["devices"]
    devs[1]["attributes"] = {BAD: {}}
    devs[2]["attributes"] = {GOOD: {"string": "x", "version": "1.2.3"}}
    devs[3]["attributes"] = {GOOD: {"version": "x" * 65}}
    devs[4]["attributes"] = {GOOD: {"string": "x" * 65}}
    return obj


def _combined_length() -> Obj:
    obj = rslice(n=5)
    devs = obj["spec"]["devices"]
    attrs = {f"attr_{i}": {"string": "x"} for i in range(32)}
    devs[0]["attributes"], devs[0]["capacity"] = dict(attrs), {}
    devs[1]["attributes"], devs[1]["capacity"] = {}, {f"cap_{i}": {"value": "1Gi"} for i in range(32)}
    devs[3]["attributes"], devs[3]["capacity"] = dict(attrs), {"cap": {"value": "1Gi"}}
    return obj


def _policy(policy: dict[str, Any], value: str = "1Gi", multi: bool = True) -> Obj:
    obj = rslice(n=2)
    if multi:
        obj["spec"]["devices"][1]["allowMultipleAllocations"] = True
    obj["spec"]["devices"][1]["capacity"] = {"cap": {"value": value, "requestPolicy": policy}}
    return obj


def _consumable(updates: dict[int, dict[str, Any]]) -> Obj:
    obj = rslice(n=max(updates) + 1)
    for d, device in enumerate(obj["spec"]["devices"]):
        device.pop("attributes")
        device["allowMultipleAllocations"] = True
        cap: dict[str, Any] = {"value": "100", "requestPolicy": {"default": "10", "validValues": ["5", "10", "100"]}}
        for k, v in updates.get(d, {}).items():
            if k == "value":
                cap["value"] = v
            elif v is None:
                cap["requestPolicy"].pop(k, None)
            else:
                cap["requestPolicy"][k] = v
        device["capacity"] = {"a": cap}
    return obj


def _taints() -> Obj:
    obj = rslice(n=3)
    obj["spec"]["devices"][0]["taints"] = [
        {"key": "example.com/taint", "effect": "NoExecute"},
        {"key": "taint", "value": "tainted", "effect": "NoSchedule", "timeAdded": "2025-01-01T00:00:00Z"},
        {},
        {"key": BAD, "value": BAD, "effect": "some-other-effect"},
    ]
    return obj


def _binding(conditions: list[str] | None, failures: list[str] | None) -> Obj:
    obj = rslice()
    if conditions is not None:
        obj["spec"]["devices"][0]["bindingConditions"] = conditions
    if failures is not None:
        obj["spec"]["devices"][0]["bindingFailureConditions"] = failures
    return obj


D0 = "spec.devices[0]"
D1 = "spec.devices[1]"
CAP_A = "capacity[a].requestPolicy"
SLICE_CASES: list[Any] = meta_cases("slice", rslice()) + [
    pytest.param(rslice(n=128), [], id="slice-good"),
    pytest.param(rslice(n=129), [("spec.devices", "Too many: 129: must have at most 128 items")], id="slice-too-large"),
    pytest.param(_taint_all(64), [], id="slice-good-taints"),
    pytest.param(_taint_all(65), [("spec.devices", "Too many: 65: must have at most 64 items")], id="slice-too-large-taints"),
    pytest.param(rslice(node=BAD), [("spec.pool.name", SUBDOMAIN), ("spec.nodeName", SUBDOMAIN)], id="slice-bad-nodename"),
    pytest.param(
        rslice(node=BAD + "/" + BAD),
        [("spec.pool.name", SUBDOMAIN), ("spec.pool.name", SUBDOMAIN), ("spec.nodeName", SUBDOMAIN)],
        id="slice-bad-multi-pool-name",
    ),
    pytest.param(edit(rslice(), sset("spec.pool.name", "x" * 253)), [], id="slice-good-pool-name"),
    pytest.param(
        edit(rslice(), chain(sset("spec.pool.name", "x/" * 126 + "xy"), sset("spec.pool.resourceSliceCount", 0), sset("spec.pool.generation", -1))),
        [
            ("spec.pool.name", "Too long: may not be more than 253 bytes"),
            ("spec.pool.resourceSliceCount", "must be greater than zero"),
            ("spec.pool.generation", "must be greater than or equal to zero"),
        ],
        id="slice-bad-pool",
    ),
    pytest.param(edit(rslice(), sset("spec.pool.name", "")), [("spec.pool.name", "Required value")], id="slice-missing-pool-name"),
    pytest.param(
        edit(rslice(), chain(sset("spec.nodeName", None), sset("spec.nodeSelector", {}))),
        [
            ("spec.nodeSelector.nodeSelectorTerms", "must have at least one node selector term"),
            ("spec.nodeSelector.nodeSelectorTerms", "must have exactly one node selector term"),
        ],
        id="slice-bad-empty-node-selector",
    ),
    pytest.param(
        edit(rslice(), chain(sset("spec.nodeName", "worker"), sset("spec.nodeSelector", NODE_SEL))),
        [("spec", "{`nodeName`, `nodeSelector`}")],
        id="slice-bad-node-selection",
    ),
    pytest.param(
        edit(rslice(), chain(sset("spec.nodeName", "worker"), sset("spec.allNodes", True))),
        [("spec", "but multiple fields are set")],
        id="slice-bad-node-selection-all-nodes",
    ),
    pytest.param(edit(rslice(), sset("spec.nodeName", None)), [("spec", ONE_NODE)], id="slice-empty-node-selection"),
    pytest.param(rslice(driver=BAD), [("spec.driver", SUBDOMAIN)], id="slice-bad-drivername"),
    pytest.param(
        edit(rslice(), sset("spec.sharedCounters", [{"name": "counterset", "counters": counters()}])),
        [("spec", "only one of `sharedCounters` or `devices` is allowed")],
        id="slice-both-shared-counters-and-devices",
    ),
    pytest.param(edit(rslice(n=3), sset("spec.devices.1.name", BAD)), [(f"{D1}.name", LABEL)], id="slice-bad-devices"),
    pytest.param(
        _bad_attributes(),
        [
            (f"{D1}.attributes", C_ID),
            (f"{D1}.attributes[{BAD}]", "exactly one value must be specified"),
            ("spec.devices[2].attributes[foo]", "exactly one value must be specified"),
            ("spec.devices[3].attributes[foo].version", "semver.org spec 2.0.0"),
            ("spec.devices[3].attributes[foo].version", "Too long: may not be more than 64 bytes"),
            ("spec.devices[4].attributes[foo].string", "Too long: may not be more than 64 bytes"),
        ],
        id="slice-bad-attribute",
    ),
    pytest.param(
        edit(rslice(n=2), sset("spec.devices.1.attributes", {"x" * 32: {"string": "y"}, "x" * 63 + "/" + "y" * 32: {"string": "z"}})),
        [],
        id="slice-good-attribute-names",
    ),
    pytest.param(
        edit(rslice(n=2), sset("spec.devices.1.attributes", {"." * 33: {"string": "y"}})),
        [(f"{D1}.attributes", "Too long: may not be more than 32 bytes"), (f"{D1}.attributes", C_ID)],
        id="slice-bad-attribute-c-identifier",
    ),
    pytest.param(
        edit(rslice(n=2), sset("spec.devices.1.attributes", {"_" * 64 + "/y": {"string": "z"}})),
        [(f"{D1}.attributes", "Too long: may not be more than 63 bytes"), (f"{D1}.attributes", SUBDOMAIN)],
        id="slice-bad-attribute-domain",
    ),
    pytest.param(
        edit(rslice(n=2), sset("spec.devices.1.attributes", {"x" * 64 + "/" + "y" * 33: {"string": "z"}})),
        [(f"{D1}.attributes", "more than 63 bytes"), (f"{D1}.attributes", "more than 32 bytes")],
        id="slice-bad-key-too-long",
    ),
    pytest.param(
        edit(rslice(n=2), sset("spec.devices.1.attributes", {"/": {"string": "z"}})),
        [(f"{D1}.attributes", "the domain must not be empty"), (f"{D1}.attributes", "the name must not be empty")],
        id="slice-bad-attribute-empty-domain-and-c-identifier",
    ),
    pytest.param(
        _combined_length(),
        [("spec.devices[3]", "the total number of attributes and capacities must not exceed 32")],
        id="slice-combined-attributes-capacity-length",
    ),
    pytest.param(
        _policy({"default": "1Mi", "validRange": {"min": "1Mi"}}, multi=False),
        [(f"{D1}.capacity[cap].requestPolicy", "Forbidden: allowMultipleAllocations must be true")],
        id="slice-forbidden-request-policy-on-single-allocatable-capacity",
    ),
    pytest.param(
        _policy({"default": "10Mi", "validRange": {"min": "1Mi", "max": "100Mi", "step": "0"}}),
        [(f"{D1}.capacity[cap].requestPolicy.validRange.step", "must be greater than zero")],
        id="slice-invalid-request-policy-zero-step",
    ),
    pytest.param(
        _policy({"default": "10Mi", "validRange": {"min": "1Mi", "max": "100Mi", "step": "-1Mi"}}),
        [(f"{D1}.capacity[cap].requestPolicy.validRange.step", "must be greater than zero")],
        id="slice-invalid-request-policy-negative-step",
    ),
    pytest.param(
        _consumable(
            {
                1: {"value": "-1"},
                2: {"default": "-1"},
                3: {"validValues": None},
                4: {"validRange": {"min": "10"}},
                5: {"validRange": {"min": "1"}, "validValues": None},
                6: {"default": "10.1", "validValues": ["5.1", "10.1", "100"]},
                7: {"default": "1.05", "validRange": {"min": "1.1"}, "validValues": None},
                8: {"validValues": ["9.9", "10", "100"]},
            }
        ),
        [
            (f"spec.devices[1].{CAP_A}.validValues[0]", "option is larger than capacity value: -1"),
            (f"spec.devices[1].{CAP_A}.validValues[1]", "option is larger than capacity value: -1"),
            (f"spec.devices[1].{CAP_A}.validValues[2]", "option is larger than capacity value: -1"),
            (f"spec.devices[2].{CAP_A}.validValues", "default value is not valid according to the requestPolicy"),
            (f"spec.devices[4].{CAP_A}", "exactly one policy can be specified"),
            (f"spec.devices[7].{CAP_A}.validRange.min", "default is less than min: 1100m"),
            # Up to 1.36 validValues ["9.9", "10", "100"] held a duplicate (10 after rounding up); 1.37 compares
            # exact values (DRAFractionalCapacityRange): see test_fractional_capacity_rules.
        ],
        id="slice-consumable-capacity-integer",
    ),
    pytest.param(
        edit(
            rslice(n=3),
            chain(
                sset("spec.nodeName", None),
                sset("spec.nodeSelector", {"nodeSelectorTerms": [{"matchExpressions": [{"key": "foo", "operator": "In", "values": ["-1"]}]}]}),
            ),
        ),
        [("spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].values[0]", LABEL_VALUE)],
        id="slice-invalid-node-selector-label-value",
    ),
    pytest.param(
        _taints(),
        [
            (f"{D0}.taints[2].key", "name part must be non-empty"),
            (f"{D0}.taints[2].key", QNAME),
            (f"{D0}.taints[2].effect", "Required value"),
            (f"{D0}.taints[3].key", QNAME),
            (f"{D0}.taints[3].value", LABEL_VALUE),
            (f"{D0}.taints[3].effect", 'Unsupported value: "some-other-effect": supported values: "NoExecute", "NoSchedule", "None"'),
        ],
        id="slice-taints",
    ),
    pytest.param(
        edit(rslice(), sset("spec.devices.0.taints", [{"key": "example.com/taint", "effect": "NoExecute"}] * 17)),
        [(f"{D0}.taints", "Too many: 17: must have at most 16 items")],
        id="slice-too-many-taints",
    ),
    pytest.param(
        edit(rslice(), chain(sset("spec.nodeName", "worker"), sset("spec.perDeviceNodeSelection", True))),
        [("spec", "{`nodeName`, `perDeviceNodeSelection`}"), (D0, ONE_DEV_NODE)],
        id="slice-bad-PerDeviceNodeSelection",
    ),
    pytest.param(
        edit(rslice(), chain(sset("spec.nodeName", "worker"), sset("spec.perDeviceNodeSelection", False))),
        [("spec.perDeviceNodeSelection", "must be either unset or set to true")],
        id="slice-invalid-false-PerDeviceNodeSelection",
    ),
    pytest.param(
        edit(rslice(), chain(sset("spec.nodeName", "worker"), sset("spec.allNodes", False))),
        [("spec.allNodes", "must be either unset or set to true")],
        id="slice-invalid-false-AllNodes",
    ),
    pytest.param(
        edit(rslice(), chain(sset("spec.nodeName", ""), sset("spec.allNodes", True))),
        [("spec.nodeName", "must be either unset or set to a non-empty string")],
        id="slice-invalid-empty-NodeName",
    ),
    pytest.param(
        edit(
            rslice(),
            chain(sset("spec.perDeviceNodeSelection", True), sset("spec.nodeName", None), sset("spec.devices.0.nodeName", ""), sset("spec.devices.0.allNodes", False)),
        ),
        [(f"{D0}.nodeName", "must not be empty"), (f"{D0}.allNodes", "must be either unset or set to true"), (D0, ONE_DEV_NODE)],
        id="slice-invalid-node-selector-in-basicdevice",
    ),
    pytest.param(
        edit(
            rslice(),
            chain(sset("spec.perDeviceNodeSelection", True), sset("spec.nodeName", None), sset("spec.devices.0.nodeName", "worker"), sset("spec.devices.0.allNodes", True)),
        ),
        [(D0, "{`nodeName`, `allNodes`}")],
        id="slice-bad-node-selector-in-basicdevice",
    ),
    pytest.param(
        edit(rslice(), sset("spec.devices.0.nodeName", "worker")),
        [(D0, "can only be set if `perDeviceNodeSelection` is set to true")],
        id="slice-device-node-fields-without-per-device-selection",
    ),
    pytest.param(
        edit(shared_slice(1), sset("spec.sharedCounters", [{"counters": counters()}])),
        [("spec.sharedCounters[0].name", "Required value")],
        id="slice-missing-name-shared-counters",
    ),
    pytest.param(
        edit(shared_slice(0), sset("spec.sharedCounters", [{"name": BAD, "counters": counters()}])),
        [("spec.sharedCounters[0].name", LABEL)],
        id="slice-bad-name-shared-counters",
    ),
    pytest.param(
        edit(shared_slice(0), sset("spec.sharedCounters", [{"name": GOOD}])),
        [("spec.sharedCounters[0].counters", "Required value")],
        id="slice-missing-counter-shared-counters",
    ),
    pytest.param(
        edit(shared_slice(1), sset("spec.sharedCounters", [{"name": GOOD, "counters": {BAD: {"value": "1Gi"}}}])),
        [("spec.sharedCounters[0].counters", LABEL)],
        id="slice-bad-countername-shared-counters",
    ),
    pytest.param(
        edit(shared_slice(1), sset("spec.sharedCounters", [{"name": GOOD, "counters": counters()}] * 2)),
        [("spec.sharedCounters[1]", 'Duplicate value: "foo"')],
        id="slice-duplicate-shared-counters",
    ),
    pytest.param(shared_slice(8), [], id="slice-max-shared-counters"),
    pytest.param(shared_slice(9), [("spec.sharedCounters", "Too many: 9: must have at most 8 items")], id="slice-too-many-shared-counters"),
    pytest.param(edit(shared_slice(1), sset("spec.sharedCounters.0.counters", counters(32))), [], id="slice-max-counters-in-counter-set"),
    pytest.param(
        edit(shared_slice(1), sset("spec.sharedCounters.0.counters", counters(33))),
        [("spec.sharedCounters[0].counters", "Too many: 33: must have at most 32 items")],
        id="slice-too-many-counters-in-counter-set",
    ),
    pytest.param(
        edit(rslice(), sset("spec.devices.0.consumesCounters", [{"counters": counters()}])),
        [(f"{D0}.consumesCounters[0].counterSet", "Required value")],
        id="slice-missing-name-counterset-consumes-counter",
    ),
    pytest.param(
        edit(rslice(), sset("spec.devices.0.consumesCounters", [{"counterSet": BAD, "counters": counters()}])),
        [(f"{D0}.consumesCounters[0].counterSet", LABEL)],
        id="slice-bad-name-counterset-consumes-counter",
    ),
    pytest.param(
        edit(rslice(), sset("spec.devices.0.consumesCounters", [{"counterSet": GOOD, "counters": counters()}] * 2)),
        [(f"{D0}.consumesCounters[1]", 'Duplicate value: "foo"')],
        id="slice-duplicate-counterset-consumes-counter",
    ),
    pytest.param(
        edit(rslice(), sset("spec.devices.0.consumesCounters", [{"counterSet": "counterset-0"}])),
        [(f"{D0}.consumesCounters[0].counters", "Required value")],
        id="slice-missing-counter-consumes-counter",
    ),
    pytest.param(
        edit(rslice(), chain(sset("spec.devices.0.attributes", None), sset("spec.devices.0.capacity", None), sset("spec.devices.0.consumesCounters", consumes(2)))),
        [],
        id="slice-max-device-counter-consumption-for-device",
    ),
    pytest.param(
        edit(rslice(), sset("spec.devices.0.consumesCounters", consumes(3))),
        [(f"{D0}.consumesCounters", "Too many: 3: must have at most 2 items")],
        id="slice-too-many-device-counter-consumption-for-device",
    ),
    pytest.param(
        edit(rslice(), sset("spec.devices.0.consumesCounters", [{"counterSet": "counterset-0", "counters": counters(32)}])),
        [],
        id="slice-max-counters-in-device-counter-consumption",
    ),
    pytest.param(
        edit(rslice(), sset("spec.devices.0.consumesCounters", [{"counterSet": "counterset-0", "counters": counters(33)}])),
        [(f"{D0}.consumesCounters[0].counters", "Too many: 33: must have at most 32 items")],
        id="slice-too-many-counters-in-device-counter-consumption",
    ),
    pytest.param(_consume_all(64), [], id="slice-max-number-of-devices-with-consumes-counters"),
    pytest.param(
        edit(rslice(n=65), sset("spec.devices.0.consumesCounters", consumes(1))),
        [("spec.devices", "Too many: 65: must have at most 64 items")],
        id="slice-too-many-devices-with-consumes-counters",
    ),
    pytest.param(_binding(["example.com/condition1", "condition2"], ["example.com/condition3", "condition4"]), [], id="slice-good-binding-conditions"),
    pytest.param(
        _binding([f"condition{i}" for i in range(1, 6)], ["condition6", "condition7"]),
        [(f"{D0}.bindingConditions", "Too many: 5: must have at most 4 items")],
        id="slice-too-many-binding-conditions",
    ),
    pytest.param(
        _binding(["condition1", "condition2"], [f"condition{i}" for i in range(3, 8)]),
        [(f"{D0}.bindingFailureConditions", "Too many: 5: must have at most 4 items")],
        id="slice-too-many-binding-failure-conditions",
    ),
    pytest.param(_binding(["condition1", "condition2!"], ["condition3", "condition4"]), [(f"{D0}.bindingConditions[1]", QNAME)], id="slice-invalid-binding-conditions"),
    pytest.param(_binding(["condition1", "condition2"], ["condition3!", "condition4"]), [(f"{D0}.bindingFailureConditions[0]", QNAME)], id="slice-invalid-binding-failure-conditions"),
    pytest.param(
        _binding(None, ["condition1", "condition2"]),
        [(f"{D0}.bindingConditions", "bindingConditions are required to use bindingFailureConditions")],
        id="slice-binding-failure-without-binding-conditions",
    ),
    pytest.param(
        _binding(["condition1", "condition2"], None),
        [(f"{D0}.bindingFailureConditions", "bindingFailureConditions are required to use bindingConditions")],
        id="slice-binding-conditions-without-failure-conditions",
    ),
    pytest.param(_binding(["condition1", "condition1"], ["condition2", "condition3"]), [(f"{D0}.bindingConditions[1]", 'Duplicate value: "condition1"')], id="slice-duplicate-binding-conditions"),
    pytest.param(_binding(["condition1", "condition2"], ["condition3", "condition3"]), [(f"{D0}.bindingFailureConditions[1]", 'Duplicate value: "condition3"')], id="slice-duplicate-binding-failure-conditions"),
    pytest.param(
        _binding(["condition1", "condition2"], ["condition1", "condition3"]),
        [(f"{D0}.bindingFailureConditions[0]", "bindingFailureConditions must not overlap with bindingConditions")],
        id="slice-overlapping-binding-conditions",
    ),
]


# ---- ResourceClaim (validation_resourceclaim_test.go: TestValidateClaim, TestValidateClaimStatusUpdate) ---


def _n_requests(n: int) -> list[dict[str, Any]]:
    return [exact_request()] + [exact_request(f"{GOOD}{i}") for i in range(1, n)]


def _allocation_modes() -> Obj:
    return rclaim(
        requests=[
            exact_request(),
            exact_request("foo2", allocationMode="All", count=0),
            exact_request("foo3", count=-1),
            exact_request("foo4", allocationMode="other"),
            exact_request("foo5", allocationMode="All", count=2),
            exact_request(),
        ]
    )


def _bad_spec(n_constraints: int = 0, n_config: int = 0, n_requests: int = 1) -> Obj:
    constraints: list[dict[str, Any]] = [{"requests": [GOOD, BAD], "matchAttribute": "missing-domain"}, {"matchAttribute": ""}, {}]
    constraints += [{"matchAttribute": "foo/bar"}] * max(0, n_constraints - 3)
    configs = [opaque(requests=[GOOD, BAD])] + [opaque()] * max(0, n_config - 1)
    return rclaim(requests=_n_requests(n_requests), constraints=constraints, config=configs)


ALLOCATED: dict[str, Any] = {
    "allocation": {"devices": {"results": [{"request": GOOD, "driver": GOOD, "pool": GOOD, "device": GOOD, "adminAccess": False}]}}
}
RS = "status.allocation.devices"


def allocated(**status: Any) -> Obj:
    obj = rclaim()
    obj["status"] = {**copy.deepcopy(ALLOCATED), **status}
    return obj


def _reserved(n: int, **ref: Any) -> list[dict[str, Any]]:
    return [{"resource": "pods", "name": f"foo-{i}", "uid": str(i), **ref} for i in range(n)]


def _selectors(exprs: list[str]) -> Obj:
    return rclaim(requests=[exact_request(), exact_request("foo-2", selectors=[{"cel": {"expression": e}} for e in exprs])])


SEL1 = "spec.devices.requests[1].exactly.selectors[1].cel.expression"
FA = "spec.devices.requests[0].firstAvailable"
CLAIM_CASES: list[Any] = meta_cases("claim", rclaim()) + [
    pytest.param(rclaim(), [], id="claim-good"),
    # kubectl (and so `gpu-dra validate`) puts an object without a namespace into `default`; the API server's own
    # rule is checked on validate_object directly (test_namespace_is_required_by_the_api_rules).
    pytest.param(rclaim(namespace=""), [], id="claim-missing-namespace-reads-as-default"),
    pytest.param(
        edit(rclaim(), sset("spec.devices.requests.0.exactly.deviceClassName", BAD)),
        [("spec.devices.requests[0].exactly.deviceClassName", SUBDOMAIN)],
        id="claim-bad-classname",
    ),
    pytest.param(
        edit(rclaim(), sset("spec.devices.requests.0.exactly.deviceClassName", "")),
        [("spec.devices.requests[0].exactly.deviceClassName", "Required value")],
        id="claim-missing-classname",
    ),
    pytest.param(
        _bad_spec(33, 33, 33),
        [
            ("spec.devices.requests", "Too many: 33: must have at most 32 items"),
            ("spec.devices.constraints", "Too many: 33: must have at most 32 items"),
            ("spec.devices.config", "Too many: 33: must have at most 32 items"),
        ],
        id="claim-invalid-request",
    ),
    pytest.param(
        rclaim(requests=_n_requests(32), constraints=[{"matchAttribute": "foo/bar"}] * 32, config=[opaque()] * 32),
        [],
        id="claim-valid-request",
    ),
    pytest.param(
        _bad_spec(),
        [
            ("spec.devices.constraints[0].requests[1]", LABEL),
            ("spec.devices.constraints[0].requests[1]", REF),
            ("spec.devices.constraints[0].matchAttribute", C_ID),
            ("spec.devices.constraints[0].matchAttribute", "a fully qualified name must be a domain and a name separated by a slash"),
            ("spec.devices.constraints[1].matchAttribute", C_ID),
            ("spec.devices.constraints[1].matchAttribute", "a fully qualified name must be a domain"),
            ("spec.devices.constraints[2].matchAttribute", "Required value"),
            ("spec.devices.config[0].requests[1]", LABEL),
            ("spec.devices.config[0].requests[1]", REF),
        ],
        id="claim-invalid-spec",
    ),
    pytest.param(
        _allocation_modes(),
        [
            ("spec.devices.requests[2].exactly.count", "Invalid value: -1: must be greater than zero"),
            ("spec.devices.requests[3].exactly.allocationMode", 'Unsupported value: "other": supported values: "All", "ExactCount"'),
            ("spec.devices.requests[4].exactly.count", "Invalid value: 2: must not be specified when allocationMode is 'All'"),
            ("spec.devices.requests[5]", 'Duplicate value: "foo"'),
        ],
        id="claim-allocation-mode",
    ),
    pytest.param(
        rclaim(config=[{"opaque": {"driver": "dra.example.com"}}, opaque("hello-world"), opaque(None), opaque(big_params(0)), opaque(big_params(1))]),
        [
            ("spec.devices.config[0].opaque.parameters", "Required value"),
            ("spec.devices.config[1].opaque.parameters", "must be a valid JSON object"),
            ("spec.devices.config[2].opaque.parameters", "Required value"),
            ("spec.devices.config[4].opaque.parameters", "Too long: may not be more than 10240 bytes"),
        ],
        id="claim-configuration",
    ),
    pytest.param(
        _selectors([VALID_CEL, "device.attributes[true].someBoolean"]),
        [(SEL1, "compilation failed: ERROR: <input>:1:18: found no matching overload for '_[_]'")],
        id="claim-CEL-compile-errors",
    ),
    pytest.param(
        _selectors(['device.driver == "' + "x" * (10240 - 19) + '"', 'device.driver == "' + "x" * (10240 - 18) + '"']),
        [(SEL1, "Too long: may not be more than 10240 bytes")],
        id="claim-CEL-length",
    ),
    pytest.param(
        edit(rclaim(), sset("spec.devices.requests.0.exactly.selectors", [{"cel": {"expression": COST_CEL}}])),
        [("spec.devices.requests[0].exactly.selectors[0].cel.expression", "Forbidden: too complex, exceeds cost limit")],
        id="claim-CEL-cost",
    ),
    pytest.param(first_available_claim(), [], id="claim-prioritized-list-valid"),
    pytest.param(
        edit(first_available_claim(), sset("spec.devices.requests.0.exactly", {"deviceClassName": GOOD, "count": 2, "adminAccess": True})),
        [("spec.devices.requests[0]", "exactly one of `exactly` or `firstAvailable` is required")],
        id="claim-prioritized-list-both-first-available-and-exactly-set",
    ),
    pytest.param(
        edit(first_available_claim(), sset("spec.devices.requests.0.firstAvailable.0", {"name": BAD})),
        [(f"{FA}[0].name", LABEL), (f"{FA}[0].deviceClassName", "Required value")],
        id="claim-prioritized-list-invalid-nested-request",
    ),
    pytest.param(
        edit(first_available_claim(), sset("spec.devices.requests.0.firstAvailable.1.name", GOOD)),
        [(f"{FA}[1]", 'Duplicate value: "foo"')],
        id="claim-prioritized-list-nested-requests-same-name",
    ),
    pytest.param(
        rclaim(requests=[{"name": GOOD, "firstAvailable": [{"name": f"subreq-{i}", "deviceClassName": GOOD} for i in range(9)]}]),
        [(FA, "Too many: 9: must have at most 8 items")],
        id="claim-prioritized-list-too-many-subrequests",
    ),
    pytest.param(edit(first_available_claim(), sset("spec.devices.config", [opaque(requests=["foo/bar"])])), [], id="claim-prioritized-list-config-subrequest-ref"),
    pytest.param(edit(first_available_claim(), sset("spec.devices.config", [opaque(requests=["foo"])])), [], id="claim-prioritized-list-config-parent-ref"),
    pytest.param(
        edit(first_available_claim(), sset("spec.devices.config", [opaque(requests=["foo/baz"])])),
        [("spec.devices.config[0].requests[0]", REF)],
        id="claim-prioritized-list-config-invalid-subrequest-ref",
    ),
    pytest.param(
        edit(first_available_claim(), sset("spec.devices.constraints", [{"requests": ["foo/bar"], "matchAttribute": "dra.example.com/driverVersion"}])),
        [],
        id="claim-prioritized-list-constraints-subrequest-ref",
    ),
    pytest.param(
        edit(first_available_claim(), sset("spec.devices.constraints", [{"requests": ["foo/baz"], "matchAttribute": "dra.example.com/driverVersion"}])),
        [("spec.devices.constraints[0].requests[0]", REF)],
        id="claim-prioritized-list-constraints-invalid-subrequest-ref",
    ),
    pytest.param(
        edit(rclaim(), sset("spec.devices.requests.0.exactly.tolerations", [{"value": "v"}, {"key": "k", "operator": "Exists", "value": "v"}, {"operator": "Other", "effect": "Bad"}])),
        [
            ("spec.devices.requests[0].exactly.tolerations[1].value", "must be empty for operator `Exists`"),
            ("spec.devices.requests[0].exactly.tolerations[2].operator", 'Unsupported value: "Other"'),
            ("spec.devices.requests[0].exactly.tolerations[2].effect", 'Unsupported value: "Bad"'),
        ],
        id="claim-tolerations",
    ),
    pytest.param(
        edit(rclaim(), sset("spec.devices.requests.0.exactly.tolerations", [{"key": "k", "operator": "Exists"}] * 17)),
        [("spec.devices.requests[0].exactly.tolerations", "Too many: 17: must have at most 16 items")],
        id="claim-too-many-tolerations",
    ),
    # status (validated as written: an offline check of a claim with its status)
    pytest.param(allocated(), [], id="claim-status-valid-allocation"),
    pytest.param(edit(rclaim(), sset("status", {"allocation": {}})), [], id="claim-status-valid-allocation-empty"),
    pytest.param(
        edit(allocated(), sset("status.allocation.devices.results.0.request", BAD)),
        [(f"{RS}.results[0].request", LABEL), (f"{RS}.results[0].request", REF)],
        id="claim-status-bad-request",
    ),
    pytest.param(edit(allocated(), sset("status.allocation.devices.results.0.adminAccess", None)), [], id="claim-status-missing-admin-access"),
    pytest.param(
        edit(rclaim(), sset("status", {"allocation": {"nodeSelector": {}}})),
        [("status.allocation.nodeSelector.nodeSelectorTerms", "must have at least one node selector term")],
        id="claim-status-invalid-node-selector",
    ),
    pytest.param(allocated(reservedFor=_reserved(256)), [], id="claim-status-add-reservation"),
    pytest.param(
        allocated(reservedFor=_reserved(257)), [("status.reservedFor", "Too many: 257: must have at most 256 items")], id="claim-status-reserved-for-too-large"
    ),
    pytest.param(
        allocated(reservedFor=[{"resource": "pods", "name": "foo", "uid": "1"}] * 2),
        [("status.reservedFor[1]", 'Duplicate value: "1"')],
        id="claim-status-reserved-for-duplicate",
    ),
    pytest.param(
        edit(rclaim(), sset("status", {"reservedFor": [{"resource": "pods", "name": "foo", "uid": "1"}]})),
        [("status.reservedFor", "may not be specified when `allocated` is not set")],
        id="claim-status-reserved-for-no-allocation",
    ),
    pytest.param(allocated(reservedFor=[{"name": "foo", "uid": "1"}]), [("status.reservedFor[0].resource", "Required value")], id="claim-status-reserved-for-no-resource"),
    pytest.param(allocated(reservedFor=[{"resource": "pods", "uid": "1"}]), [("status.reservedFor[0].name", "Required value")], id="claim-status-reserved-for-no-name"),
    pytest.param(allocated(reservedFor=[{"resource": "pods", "name": "foo"}]), [("status.reservedFor[0].uid", "Required value")], id="claim-status-reserved-for-no-uid"),
    pytest.param(
        edit(allocated(), sset("status.allocation.devices.config", [{"source": "FromClaim", **opaque(requests=[GOOD, BAD])}])),
        [(f"{RS}.config[0].requests[1]", LABEL), (f"{RS}.config[0].requests[1]", REF)],
        id="claim-status-invalid-request-name",
    ),
    pytest.param(
        edit(
            allocated(),
            sset(
                "status.allocation.devices.config",
                [
                    {"source": "FromClaim", **opaque()},
                    opaque(),
                    {"source": "no-such-source", **opaque()},
                    {"source": "FromClaim"},
                    {"source": "FromClaim", "opaque": {}},
                    {"source": "FromClaim", **opaque(big_params(0), driver=GOOD)},
                    {"source": "FromClaim", **opaque(big_params(1), driver=GOOD)},
                ],
            ),
        ),
        [
            (f"{RS}.config[1].source", "Required value"),
            (f"{RS}.config[2].source", 'Unsupported value: "no-such-source": supported values: "FromClaim", "FromClass"'),
            (f"{RS}.config[3].opaque", "Required value"),
            (f"{RS}.config[4].opaque.driver", "Required value"),
            (f"{RS}.config[4].opaque.driver", SUBDOMAIN),
            (f"{RS}.config[4].opaque.parameters", "Required value"),
            (f"{RS}.config[6].opaque.parameters", "Too long: may not be more than 10240 bytes"),
        ],
        id="claim-status-configuration",
    ),
    pytest.param(
        allocated(
            devices=[
                {
                    "driver": GOOD,
                    "pool": GOOD,
                    "device": GOOD,
                    "conditions": [{"type": f"test-{i}", "status": "True", "reason": "test_reason", "lastTransitionTime": "2025-01-01T00:00:00Z"} for i in range(8)],
                    "data": PARAMS,
                    "networkData": {
                        "interfaceName": "x" * 256,
                        "hardwareAddress": "x" * 128,
                        "ips": ["10.9.8.0/24", "2001:db8::/64", "10.9.8.1/24", "2001:db8::1/64"] + [f"10.9.8.{i}/24" for i in range(2, 14)],
                    },
                }
            ]
        ),
        [],
        id="claim-status-valid-network-device-status",
    ),
    pytest.param(
        allocated(devices=[{"driver": GOOD, "pool": GOOD, "device": GOOD, "networkData": {"ips": ["2001:db8::1/64"] * 2}}, {"driver": GOOD, "pool": GOOD, "device": GOOD}]),
        [("status.devices[0].networkData.ips[1]", 'Duplicate value: "2001:db8::1/64"'), ("status.devices[1]", 'Duplicate value: "foo/foo/foo"')],
        id="claim-status-device-status-duplicate",
    ),
    pytest.param(
        allocated(
            devices=[
                {
                    "driver": GOOD,
                    "pool": GOOD,
                    "device": GOOD,
                    "networkData": {"interfaceName": "x" * 257, "hardwareAddress": "x" * 129, "ips": ["300.9.8.0/24", "010.009.008.000/24", "2001:0db8::1/64"]},
                }
            ]
        ),
        [
            ("status.devices[0].networkData.interfaceName", "Too long: may not be more than 256 bytes"),
            ("status.devices[0].networkData.hardwareAddress", "Too long: may not be more than 128 bytes"),
            ("status.devices[0].networkData.ips[0]", "must be a valid CIDR value"),
            ("status.devices[0].networkData.ips[1]", ""),
            ("status.devices[0].networkData.ips[2]", "must be in canonical form (2001:db8::1/64)"),
        ],
        id="claim-status-invalid-network-device-status",
    ),
    pytest.param(
        allocated(
            devices=[
                {
                    "driver": GOOD,
                    "pool": GOOD,
                    "device": GOOD,
                    "data": big_params(1),
                    "conditions": [{"type": f"test-{i}", "status": "True", "reason": "test_reason", "lastTransitionTime": "2025-01-01T00:00:00Z"} for i in range(9)],
                    "networkData": {"ips": [f"10.9.8.{i}/24" for i in range(17)]},
                }
            ]
        ),
        [
            ("status.devices[0].conditions", "Too many: 9: must have at most 8 items"),
            ("status.devices[0].data", "Too long: may not be more than 10240 bytes"),
            ("status.devices[0].networkData.ips", "Too many: 17: must have at most 16 items"),
        ],
        id="claim-status-device-status-limits",
    ),
    pytest.param(
        allocated(devices=[{"driver": "b", "pool": "a", "device": "r"}]),
        [("status.devices[0]", 'Invalid value: "b/a/r": must be an allocated device in the claim')],
        id="claim-status-device-status-no-device",
    ),
]


# ---- DeviceClass (validation_deviceclass_test.go: TestValidateClass) -------------------------------

VALID_CONFIG = {"opaque": {"driver": GOOD, "parameters": {"foo": 42}}}
CLASS_CASES: list[Any] = meta_cases("class", dclass()) + [
    pytest.param(dclass(), [], id="class-good"),
    pytest.param(dclass(extendedResourceName="example.com/gpu"), [], id="class-good-extended-resource-name"),
    pytest.param(
        dclass(extendedResourceName="example.com"),
        [("spec.extendedResourceName", 'Invalid value: "example.com": must be a valid extended resource name')],
        id="class-bad-extended-resource-name",
    ),
    pytest.param(
        dclass(selectors=[{"cel": {"expression": "true"}}, {}, {"cel": {"expression": "noSuchVar"}}] + [{"cel": {"expression": "true"}}] * 29),
        [
            ("spec.selectors[1].cel", "Required value"),
            ("spec.selectors[2].cel.expression", "compilation failed: ERROR: <input>:1:1: undeclared reference to 'noSuchVar'"),
        ],
        id="class-selectors",
    ),
    pytest.param(
        dclass(selectors=[{"cel": {"expression": "true"}}] * 33), [("spec.selectors", "Too many: 33: must have at most 32 items")], id="class-too-many-selectors"
    ),
    pytest.param(
        dclass(
            config=[
                VALID_CONFIG,
                {"opaque": {}},
                {"opaque": {"driver": GOOD, "parameters": "hello-world"}},
                {"opaque": {"driver": GOOD, "parameters": None}},
                {},
                {"opaque": {"driver": GOOD, "parameters": big_params(0)}},
                {"opaque": {"driver": GOOD, "parameters": big_params(1)}},
            ]
            + [VALID_CONFIG] * 25
        ),
        [
            ("spec.config[1].opaque.driver", "Required value"),
            ("spec.config[1].opaque.driver", SUBDOMAIN),
            ("spec.config[1].opaque.parameters", "Required value"),
            ("spec.config[2].opaque.parameters", "must be a valid JSON object"),
            ("spec.config[3].opaque.parameters", "Required value"),
            ("spec.config[4].opaque", "Required value"),
            ("spec.config[6].opaque.parameters", "Too long: may not be more than 10240 bytes"),
        ],
        id="class-configuration",
    ),
    pytest.param(dclass(config=[VALID_CONFIG] * 33), [("spec.config", "Too many: 33: must have at most 32 items")], id="class-too-many-configs"),
]


# ---- ResourceClaimTemplate (validation_resourceclaimtemplate_test.go) --------------------------------

TEMPLATE_CASES: list[Any] = meta_cases("template", template()) + [
    pytest.param(template(), [], id="template-good"),
    pytest.param(template(namespace=""), [], id="template-missing-namespace-reads-as-default"),
    pytest.param(
        template(spec={"devices": {"requests": [exact_request(deviceClassName=BAD)]}}),
        [("spec.spec.devices.requests[0].exactly.deviceClassName", SUBDOMAIN)],
        id="template-bad-classname",
    ),
    pytest.param(template(meta={"labels": {"apps.kubernetes.io/name": "test"}}), [], id="template-good-spec-labels"),
    pytest.param(
        template(meta={"labels": {"hello-world": "spaces not allowed"}}), [("spec.metadata.labels", LABEL_VALUE)], id="template-bad-spec-labels"
    ),
    pytest.param(template(meta={"annotations": {"foo": "bar"}}), [], id="template-good-spec-annotations"),
    pytest.param(template(meta={"annotations": {BAD: "hello world"}}), [("spec.metadata.annotations", QNAME)], id="template-bad-spec-annotations"),
    pytest.param(template(spec=first_available_claim()["spec"]), [], id="template-prioritized-list"),
    pytest.param(
        template(spec=edit(first_available_claim(), sset("spec.devices.requests.0.exactly", {"deviceClassName": GOOD, "allocationMode": "All"}))["spec"]),
        [("spec.spec.devices.requests[0]", "exactly one of `exactly` or `firstAvailable` is required, but multiple fields are set")],
        id="template-prioritized-list-both-first-available-and-exactly-set",
    ),
    pytest.param(
        template(spec=edit(first_available_claim(), sset("spec.devices.requests.0.firstAvailable.0.deviceClassName", BAD))["spec"]),
        [("spec.spec.devices.requests[0].firstAvailable[0].deviceClassName", SUBDOMAIN)],
        id="template-prioritized-list-bad-class-name-on-subrequest",
    ),
]

ALL_CASES = SLICE_CASES + CLAIM_CASES + CLASS_CASES + TEMPLATE_CASES


def _run_cli(tmp_path: Path, obj: Obj, capsys: pytest.CaptureFixture[str], version: str = "1.37") -> tuple[int, dict[str, Any]]:
    manifest = tmp_path / "object.json"
    manifest.write_text(json.dumps(obj))
    code = main(["validate", "-f", str(manifest), "--kubernetes-version", version, "-o", "json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("obj", "expected"), ALL_CASES)
def test_upstream_case(obj: Obj, expected: Expected, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _run_cli(tmp_path, obj, capsys)
    [result] = report["results"]
    assert result["checked"] is True
    errors = [e.partition(": ") for e in result["errors"]]
    assert sorted(path for path, _, _ in errors) == sorted(path for path, _ in expected), result["errors"]
    for path, fragment in expected:
        messages = [message for p, _, message in errors if p == path]
        assert any(fragment in m for m in messages), (path, fragment, messages)
    assert result["valid"] is (not expected)
    assert code == (1 if expected else 0)


def test_namespace_is_required_by_the_api_rules() -> None:
    from gpudra.validation import validate_object

    for obj in (rclaim(namespace=""), template(namespace="")):
        errors = [str(e) for e in validate_object(obj)]
        assert any(e.startswith("metadata.namespace: Required value") for e in errors), errors


# ---- admission: the embedded API server answers 422 with the same field errors ------------------------


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(edit(rslice(n=3), sset("spec.devices.1.name", BAD)), [(f"{D1}.name", LABEL)], id="slice-bad-device-name"),
        pytest.param(_allocation_modes(), [("spec.devices.requests[5]", "Duplicate value")], id="claim-allocation-mode"),
    ],
)
def test_admission_rejects_with_same_errors(apiserver: Any, obj: Obj, expected: Expected, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpudra.kubeapi import Invalid

    _, report = _run_cli(tmp_path, obj, capsys)
    cli_errors = report["results"][0]["errors"]
    namespace = obj["metadata"].get("namespace")
    with pytest.raises(Invalid) as err:
        apiserver.api.create(obj["kind"], obj, namespace=namespace)
    assert err.value.status == 422
    for error in cli_errors:
        assert error in err.value.message
    for path, fragment in expected:
        assert path in err.value.message and fragment in err.value.message


# ---- consumable capacity by release: pkg/apis/resource/validation TestValidateDeviceCapacity (1.37) ---------------

from gpudra.quantity import Quantity  # noqa: E402
from gpudra.validation.capacity import validate_request_policy  # noqa: E402

VR = "cap.requestPolicy.validRange"


def _range(default: str, lo: str | None, hi: str | None = None, step: str | None = None) -> dict[str, Any]:
    bounds = {k: v for k, v in (("min", lo), ("max", hi), ("step", step)) if v is not None}
    return {"default": default, "validRange": bounds}


@pytest.mark.parametrize(("capacity", "policy", "fractional", "expected"), [
    pytest.param("10Gi", _range("2Gi", "20Gi", "1Gi"), True, [
        (f"{VR}.min", "20Gi", "min is larger than capacity value: 10Gi"),
        (f"{VR}.min", "2Gi", "default is less than min: 20Gi"),
        (f"{VR}.max", "20Gi", "min is larger than max: 1Gi"),
        (f"{VR}.max", "2Gi", "default is more than max: 1Gi")], id="invalid-range-large-min-small-max"),
    pytest.param("10Gi", _range("2Gi", "1Gi", "10Gi", "2Gi"), True, [
        (f"{VR}.step", "2Gi", "value is not a multiple of a given step (2Gi) from (1Gi)"),
        (f"{VR}.step", "10Gi", "value is not a multiple of a given step (2Gi) from (1Gi)")], id="invalid-range-multiple-of-step"),
    pytest.param("1", _range("200m", "200m", "1", "100m"), True, [], id="valid-range-fractional-step"),
    pytest.param("1", _range("250m", "200m", "1", "100m"), True, [
        (f"{VR}.step", "250m", "value is not a multiple of a given step (100m) from (200m)")],
        id="invalid-range-fractional-step-not-aligned"),
    pytest.param("1", _range("200m", "200m", "1", "100m"), False, [], id="fractional-range-gate-disabled-valid"),
    pytest.param("1", _range("250m", "200m", "1", "100m"), False, [], id="fractional-range-gate-disabled-misaligned"),
    pytest.param("100P", _range("20P", "10P", None, "100m"), True, [
        (f"{VR}.default", "20P", "value cannot be represented as a milli value"),
        (f"{VR}.min", "10P", "value cannot be represented as a milli value")], id="fractional-range-overflow-min"),
    pytest.param("1", _range("20u", "10u"), True, [
        (f"{VR}.default", "20u", "value cannot be represented as a milli value"),
        (f"{VR}.min", "10u", "value cannot be represented as a milli value")], id="fractional-too-fine-precision"),
    pytest.param("10Gi", {"default": "100m", "validValues": ["100m", "200m", "1"]}, True, [], id="valid-fractional-values"),
    pytest.param("10Gi", {"default": "100m", "validValues": ["100m", "200m", "1"]}, False, [
        ("cap.requestPolicy.validValues[1]", "", 'Duplicate value: "1"'),
        ("cap.requestPolicy.validValues[2]", "", 'Duplicate value: "1"')], id="fractional-values-before-1.37"),
    pytest.param("10Gi", {"default": "1Gi", "validValues": ["1Gi", "1Gi"]}, True, [
        ("cap.requestPolicy.validValues[1]", "", "Duplicate value")], id="invalid-options-duplicate"),
])
def test_fractional_capacity_rules(capacity: str, policy: dict[str, Any], fractional: bool,
                                   expected: list[tuple[str, str, str]]) -> None:
    errors = [str(e) for e in validate_request_policy(policy, Quantity.parse(capacity), "cap.requestPolicy",
                                                      fractional=fractional)]
    assert len(errors) == len(expected), errors
    for (path, value, detail), error in zip(expected, errors):
        assert error.startswith(path + ":") and detail in error and (not value or f'"{value}"' in error), (error, path)


def test_validate_cli_selects_the_release(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    obj = _consumable({8: {"validValues": ["9.9", "10", "100"]}})
    code_137, report_137 = _run_cli(tmp_path, obj, capsys)
    code_136, report_136 = _run_cli(tmp_path, obj, capsys, "1.36")
    assert code_137 == 0 and code_136 == 1
    assert any('Duplicate value: "10"' in e for e in report_136["results"][0]["errors"])
