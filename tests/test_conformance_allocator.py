"""Kubernetes' shared allocator test table (allocatortesting/allocator_testing.go, 1.34+), transcribed case by case
and run through `gpu-dra allocate --node N -o json`: exact results, node selectors, configs and error texts.

Claims live in namespace "default", so upstream's "claim claim-0, ..." reads "claim default/claim-0, ..." here, as
kube-scheduler prints it (klog.KObj). Every case runs at 1.35 and at 1.37 (`--kubernetes-version`) where those
releases can run it; cases whose outcome changed in 1.37 carry both expectations (`changed_in_1_37`). Cases of the
alpha DRAListTypeAttributes (list-valued attributes, off by default through 1.37) run with the gate turned on
(and the two "disabled" cases with it off)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli.main import main
from tests.conformance_builders import (
    ALL, CLASS_A, CLASS_B, DRIVER_A, DRIVER_B, MAX, NODE1, NODE2, PER_DEVICE, REGION1, TAINT_NO_EXECUTE,
    TAINT_NO_SCHEDULE, TAINT_NONE, TOL_NO_EXECUTE, TOL_NO_SCHEDULE, TOL_NO_SCHEDULE_KEY1, Case, alloc, all_req, attrs,
    cfg, claim, dev, distinct, first, klass, klass_multi, label_selector, local, local_selector, match, memory_at_least,
    multi_devices, opaque, req, res, slice_, sub,
)

A, B = DRIVER_A, DRIVER_B
P1, P2, P3, P4 = "pool-1", "pool-2", "pool-3", "pool-4"
D0, D1, D2, D3, D4 = "device-0", "device-1", "device-2", "device-3", "device-4"
CA, CB = klass(CLASS_A, A), klass(CLASS_B, B)
V = "version"


def one(name: str, where: Any, pool: str, driver: str, **kw: Any) -> dict[str, Any]:
    return slice_(name, where, pool, driver, dev(D1), **kw)


def c0(*requests: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return claim("claim-0", *requests, **kw)


def c1(*requests: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return claim("claim-1", *requests, **kw)


def simple_claim(request: str = "req-0", cls: str = CLASS_A, **kw: Any) -> dict[str, Any]:
    return c0(req(request, cls, 1), **kw)


def err(text: str) -> str:
    return text.replace("claim claim-0", "claim default/claim-0")


def mem(name: str, q: str, attributes: dict[str, Any] | None = None) -> dict[str, Any]:
    return dev(name, {"memory": q}, attributes)


def ctr(q: str, counter_set: str = "counter-set-1", name: str = "memory") -> list[tuple[str, dict[str, str]]]:
    return [(counter_set, {name: q})]


def cs(q: str, name: str = "memory") -> list[tuple[str, dict[str, str] | None]]:
    return [("counter-set-1", {name: q})]


def changed_in_1_37(case: Case, expect_1_37: Any) -> list[Case]:
    """A case whose expected outcome changed in 1.37: the transcription before the change for 1.35/1.36 and the
    newest table's expectation for 1.37 (e.g. a config covering every request has empty `requests` since
    kubernetes#138990/#139086)."""
    return [replace(case, versions=("1.35",)), replace(case, expect=expect_1_37, versions=("1.37",))]


VER_ATTRS = dict(driverVersion=(V, "1.0.0"), numa=1, stringAttribute="stringAttributeValue", boolAttribute=True)
TYPE = 'device.attributes["driver-a"].type == "{}"'
GEN = 'device.attributes["driver-a"].generation == "{}"'

CASES: list[Case] = [
    Case("empty", [], expect=[]),
    Case("simple", [simple_claim()], [CA], [one("slice-1", NODE1, P1, A)], [local(res("req-0", A, P1, D1))]),
    Case("other-node", [simple_claim()], [CA], [one("slice-1", NODE1, P1, B), one("slice-2", NODE2, P2, A)],
         [alloc(local_selector(NODE2), res("req-0", A, P2, D1))], node=NODE2),
    Case("small-and-large", [c0(req("req-0", CLASS_A, 1, memory_at_least("1Gi")), req("req-1", CLASS_A, 1, memory_at_least("2Gi")))],
         [CA], [slice_("slice-1", NODE1, P1, A, mem(D1, "1Gi"), mem(D2, "2Gi"))],
         [local(res("req-0", A, P1, D1), res("req-1", A, P1, D2))]),
    Case("small-and-large-backtrack-requests",
         [c0(req("req-0", CLASS_A, 1, memory_at_least("1Gi")), req("req-1", CLASS_A, 1, memory_at_least("2Gi")))],
         [CA], [slice_("slice-1", NODE1, P1, A, mem(D2, "2Gi"), mem(D1, "1Gi"))],
         [local(res("req-0", A, P1, D1), res("req-1", A, P1, D2))]),
    Case("small-and-large-backtrack-claims",
         [c0(req("req-0", CLASS_A, 1, memory_at_least("1Gi"))), c1(req("req-1", CLASS_A, 1, memory_at_least("2Gi")))],
         [CA], [slice_("slice-1", NODE1, P1, A, mem(D2, "2Gi"), mem(D1, "1Gi"))],
         [local(res("req-0", A, P1, D1)), local(res("req-1", A, P1, D2))]),
    Case("devices-split-across-different-slices", [c0(req("req-0", CLASS_A, 2))], [CA],
         [one("slice-1", NODE1, P1, A), one("slice-2", NODE1, P2, A)],
         [local(res("req-0", A, P1, D1), res("req-0", A, P2, D1))]),
    Case("obsolete-slice", [simple_claim()], [CA],
         [slice_("slice-1-obsolete", NODE1, P1, A, dev(D1), count=2),
          slice_("slice-1-obsolete", NODE1, P1, A, dev(D2), count=2, generation=2)], None),
    Case("duplicate-slice", [simple_claim()], [CA],
         [one("slice-1", NODE1, P1, A, count=2), one("slice-1-2", NODE1, P1, A, count=2)],
         "invalid resource pools were encountered"),
    Case("no-slices", [simple_claim()], [CA], [], None),
    Case("not-enough-suitable-devices", [simple_claim(), claim("claim-0b", req("req-1", CLASS_A, 1))], [CA], [one("slice-1", NODE1, P1, A)], None),
    Case("no-classes", [simple_claim()], [], [one("slice-1", NODE1, P1, A)],
         err("claim claim-0, request req-0: could not retrieve device class class-a")),
    Case("unknown-class", [simple_claim(cls="unknown-class")], [CA], [one("slice-1", NODE1, P1, A)],
         err("claim claim-0, request req-0: could not retrieve device class unknown-class")),
    Case("empty-class", [simple_claim(cls="")], [CA], [one("slice-1", NODE1, P1, A)],
         err("claim claim-0, request req-0: missing device class name (unsupported request type?)")),
    Case("no-claims-to-allocate", [], [CA], [one("slice-1", NODE1, P1, A)], []),
    Case("all-devices-single", [c0(all_req("req-0", CLASS_A))], [CA], [one("slice-1", NODE1, P1, A)],
         [local(res("req-0", A, P1, D1))]),
    Case("all-devices-many", [c0(all_req("req-0", CLASS_A))], [CA], [one("slice-1", NODE1, P1, A), one("slice-1", NODE1, P2, A)],
         [local(res("req-0", A, P1, D1), res("req-0", A, P2, D1))]),
    Case("all-devices-of-the-incomplete-pool", [c0(req("req-0", CLASS_A, 1, mode="All"))], [CA],
         [one("slice-1", NODE1, P1, A, count=2)],
         err("claim claim-0, request req-0: asks for all devices, but resource pool driver-a/pool-1 is currently being updated")),
    Case("all-devices-plus-another", [c0(all_req("req-0", CLASS_A)), c1(req("req-0", CLASS_B, 1))], [CA, CB],
         [one("slice-1", NODE1, P1, A), one("slice-1", NODE1, P1, B)],
         [local(res("req-0", A, P1, D1)), local(res("req-0", B, P1, D1))]),
    Case("all-devices-plus-another-reversed", [c1(req("req-0", CLASS_B, 1)), c0(all_req("req-0", CLASS_A))], [CA, CB],
         [one("slice-1", NODE1, P1, A), one("slice-1", NODE1, P1, B)],
         [local(res("req-0", B, P1, D1)), local(res("req-0", A, P1, D1))]),
    Case("all-devices-many-plus-another", [c0(all_req("req-0", CLASS_A)), c1(req("req-0", CLASS_B, 1))], [CA, CB],
         [slice_("slice-1", NODE1, P1, A, dev(D1), dev(D2)), one("slice-1", NODE1, P1, B)],
         [local(res("req-0", A, P1, D1), res("req-0", A, P1, D2)), local(res("req-0", B, P1, D1))]),
    Case("all-devices-many-plus-another-reversed", [c1(req("req-0", CLASS_B, 1)), c0(all_req("req-0", CLASS_A))], [CA, CB],
         [slice_("slice-1", NODE1, P1, A, dev(D1), dev(D2)), one("slice-1", NODE1, P1, B)],
         [local(res("req-0", B, P1, D1)), local(res("req-0", A, P1, D1), res("req-0", A, P1, D2))]),
    Case("all-devices-no-solution", [c1(req("req-0", CLASS_A, 1)), c0(all_req("req-0", CLASS_A))], [CA],
         [one("slice-1", NODE1, P1, A)], None),
    Case("all-devices-no-solution-reversed", [c0(all_req("req-0", CLASS_A)), c1(req("req-0", CLASS_A, 1))], [CA],
         [one("slice-1", NODE1, P1, A)], None),
    Case("all-devices-slice-without-devices", [c0(all_req("req-0", CLASS_A))], [CA], [slice_("slice-1", NODE1, P1, A)], None),
    Case("all-devices-no-slices", [c0(all_req("req-0", CLASS_A))], [CA], [], None),
    Case("all-devices-some-allocated", [c0(all_req("req-0", CLASS_A))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1), dev(D2))], None, allocated=[(A, P1, D1)]),
    Case("all-devices-some-allocated-admin-access", [c0(all_req("req-0", CLASS_A, admin=True))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1), dev(D2))],
         [local(res("req-0", A, P1, D1, admin=True), res("req-0", A, P1, D2, admin=True))],
         features=("AdminAccess",), allocated=[(A, P1, D1)]),
    Case("all-devices-some-allocating-admin-access", [c0(req("req-0", CLASS_A, 1, admin=True), all_req("req-1", CLASS_A, admin=True))],
         [CA], [slice_("slice-1", NODE1, P1, A, dev(D1), dev(D2))], None, features=("AdminAccess",)),
    Case("count-devices-some-allocated-admin-access", [c0(req("req-0", CLASS_A, 2, admin=True))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1), dev(D2))],
         [local(res("req-0", A, P1, D1, admin=True), res("req-0", A, P1, D2, admin=True))],
         features=("AdminAccess",), allocated=[(A, P1, D1)]),
    Case("separate-claims-share-device-admin-access", [c0(req("req-0", CLASS_A, 1, admin=True)), c1(req("req-0", CLASS_A, 1, admin=True))],
         [CA], [slice_("slice-1", NODE1, P1, A, dev(D1), dev(D2))],
         [local(res("req-0", A, P1, D1, admin=True)), local(res("req-0", A, P1, D1, admin=True))], features=("AdminAccess",)),
    Case("admin-access-claims-device-allocating-for-non-admin-access", [c0(req("req-0", CLASS_A, 1)), c1(req("req-0", CLASS_A, 1, admin=True))],
         [CA], [slice_("slice-1", NODE1, P1, A, dev(D1), dev(D2))],
         [local(res("req-0", A, P1, D1)), local(res("req-0", A, P1, D1, admin=True))], features=("AdminAccess",)),
    Case("all-devices-slice-without-devices-prioritized-list", [c0(first("req-0", sub("subReq-0", CLASS_A, 0, mode="All"), sub("subReq-1", CLASS_B, 1)))],
         [CA, CB], [slice_("slice-1", NODE1, P1, A), one("slice-2", NODE1, P2, B)],
         [local(res("req-0/subReq-1", B, P2, D1))], features=("PrioritizedList",)),
    Case("all-devices-no-slices-prioritized-list", [c0(first("req-0", sub("subReq-0", CLASS_A, 0, mode="All"), sub("subReq-1", CLASS_B, 1)))],
         [CA, CB], [one("slice-2", NODE1, P2, B)], [local(res("req-0/subReq-1", B, P2, D1))], features=("PrioritizedList",)),
    Case("all-devices-some-allocated-prioritized-list", [c0(first("req-0", sub("subReq-0", CLASS_A, 0, mode="All"), sub("subReq-1", CLASS_B, 1)))],
         [CA, CB], [slice_("slice-1", NODE1, P1, A, dev(D1), dev(D2)), one("slice-2", NODE1, P2, B)],
         [local(res("req-0/subReq-1", B, P2, D1))], features=("PrioritizedList",), allocated=[(A, P1, D1)]),
    Case("network-attached-device", [simple_claim()], [CA], [one("slice-1", label_selector("region", REGION1), P1, A)],
         [alloc(label_selector("region", REGION1), res("req-0", A, P1, D1))]),
    Case("unsuccessful-allocation-network-attached-device", [simple_claim()], [CA],
         [one("slice-1", label_selector("region", REGION1), P1, A)], None, node=NODE2),
    Case("many-network-attached-devices", [c0(req("req-0", CLASS_A, 4))], [CA],
         [one("slice-1", label_selector("region", REGION1), P1, A), one("slice-1", ALL, P2, A),
          one("slice-1", label_selector("planet", "earth"), P3, A), one("slice-1", local_selector(NODE1), P4, A)],
         [alloc({"nodeSelectorTerms": [{"matchExpressions": [{"key": "region", "operator": "In", "values": [REGION1]},
                                                              {"key": "planet", "operator": "In", "values": ["earth"]}],
                                        "matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE1]}]}]},
                res("req-0", A, P1, D1), res("req-0", A, P2, D1), res("req-0", A, P3, D1), res("req-0", A, P4, D1))]),
    Case("local-and-network-attached-devices", [c0(req("req-0", CLASS_A, 2))], [CA],
         [one("slice-1", label_selector("region", REGION1), P1, A), one("slice-1", NODE1, P2, A)],
         [local(res("req-0", A, P1, D1), res("req-0", A, P2, D1))]),
    Case("several-different-drivers", [simple_claim(), claim("claim-0b", req("req-0", CLASS_B, 1))], [CA, CB],
         [slice_("slice-1", NODE1, P1, A, dev(D1), dev(D2)), one("slice-1", NODE1, P1, B)],
         [local(res("req-0", A, P1, D1)), local(res("req-0", B, P1, D1))]),
    Case("already-allocated-devices", [simple_claim()], [CA], [one("slice-1", NODE1, P1, A)], None,
         allocated=[(A, P1, D1), (A, P1, D2)]),
    Case("admin-access-disabled", [c0(req("req-0", CLASS_A, 1, admin=True))], [CA], [one("slice-1", NODE1, P1, A)],
         err("claim claim-0, request req-0: admin access is requested, but the feature is disabled")),
    Case("admin-access-enabled", [c0(req("req-0", CLASS_A, 1, admin=True))], [CA], [one("slice-1", NODE1, P1, A)],
         [local(res("req-0", A, P1, D1, admin=True))], features=("AdminAccess",), allocated=[(A, P1, D1), (A, P1, D2)]),
    Case("with-constraint", [c0(req("req-0", CLASS_A, 1), req("req-1", CLASS_A, 1),
                                constraints=[match("numa"), match("driverVersion"), match("stringAttribute"), match("boolAttribute")])],
         [CA], [slice_("slice-1", NODE1, P1, A, dev(D1, None, attrs(**VER_ATTRS)), dev(D2, None, attrs(**VER_ATTRS)))],
         [local(res("req-0", A, P1, D1), res("req-1", A, P1, D2))]),
    Case("with-constraint-non-existent-attribute", [simple_claim(constraints=[match("NonExistentAttribute")])], [CA],
         [one("slice-1", NODE1, P1, A)], None),
    Case("with-constraint-not-matching-int-attribute", [c0(req("req-0", CLASS_A, 2), constraints=[match("numa")])], [CA, CB],
         [slice_("slice-1", NODE1, P1, A, dev(D1, None, attrs(numa=1)), dev(D2, None, attrs(numa=2)))], None),
    Case("with-constraint-not-matching-int-attribute-all-devices", [c0(all_req("req-0", CLASS_A), constraints=[match("numa")])], [CA, CB],
         [slice_("slice-1", NODE1, P1, A, dev(D1, None, attrs(numa=1)), dev(D2, None, attrs(numa=2)))],
         err("claim claim-0, request req-0: cannot add device driver-a/pool-1/device-2 because a claim constraint would not be satisfied")),
    Case("with-constraint-not-matching-string-attribute", [c0(req("req-0", CLASS_A, 2), constraints=[match("stringAttribute")])], [CA, CB],
         [slice_("slice-1", NODE1, P1, A, dev(D1, None, attrs(stringAttribute="stringAttributeValue")),
                 dev(D2, None, attrs(stringAttribute="stringAttributeValue2")))], None),
    Case("with-constraint-not-matching-bool-attribute", [c0(req("req-0", CLASS_A, 2), constraints=[match("boolAttribute")])], [CA, CB],
         [slice_("slice-1", NODE1, P1, A, dev(D1, None, attrs(boolAttribute=True)), dev(D2, None, attrs(boolAttribute=False)))], None),
    Case("with-constraint-not-matching-version-attribute", [c0(req("req-0", CLASS_A, 2), constraints=[match("driverVersion")])], [CA, CB],
         [slice_("slice-1", NODE1, P1, A, dev(D1, None, attrs(driverVersion=(V, "1.0.0"))), dev(D2, None, attrs(driverVersion=(V, "2.0.0"))))], None),
    Case("with-constraint-for-request", [c0(req("req-0", CLASS_A, 1), req("req-1", CLASS_A, 1), constraints=[match("driverVersion", "req-0")])],
         [CA, CB], [slice_("slice-1", NODE1, P1, A, dev(D1, None, attrs(driverVersion=(V, "1.0.0"))), dev(D2, None, attrs(driverVersion=(V, "2.0.0"))))],
         [local(res("req-0", A, P1, D1), res("req-1", A, P1, D2))]),
    Case("with-constraint-for-request-retry",
         [c0(req("req-0", CLASS_A, 1), req("req-1", CLASS_A, 1), constraints=[match("driverVersion", "req-0"), match("stringAttribute")])],
         [CA, CB], [slice_("slice-1", NODE1, P1, A, dev(D1, None, attrs(driverVersion=(V, "1.0.0"), stringAttribute="a")),
                          dev(D2, None, attrs(driverVersion=(V, "2.0.0"), stringAttribute="b")),
                          dev(D3, None, attrs(driverVersion=(V, "3.0.0"), stringAttribute="b")))],
         [local(res("req-0", A, P1, D2), res("req-1", A, P1, D3))]),
    *changed_in_1_37(Case("with-class-device-config", [simple_claim()], [klass(CLASS_A, A, config_attr="classAttribute")], [one("slice-1", NODE1, P1, A)],
                          [local(res("req-0", A, P1, D1), config=[cfg("FromClass", ["req-0"], A, "classAttribute")])]),
                     [local(res("req-0", A, P1, D1), config=[cfg("FromClass", None, A, "classAttribute")])]),
    Case("with-class-device-config-with-multiple-request-and-configs",
         [c0(req("req-0", CLASS_A, 1), req("req-1", CLASS_A, 1), req("req-2", CLASS_B, 1), constraints=[])],
         [klass(CLASS_A, A, config_attr="classAttribute-A"), klass(CLASS_B, B, config_attr="classAttribute-B")],
         [slice_("slice-1", NODE1, P1, A, *multi_devices(2)), one("slice-2", NODE1, P1, B)],
         [local(res("req-0", A, P1, D0), res("req-1", A, P1, D1), res("req-2", B, P1, D1),
                config=[cfg("FromClass", ["req-0", "req-1"], A, "classAttribute-A"), cfg("FromClass", ["req-2"], B, "classAttribute-B")])]),
    Case("claim-with-device-config", [simple_claim(config=[{"opaque": {"driver": A, "parameters": {"deviceAttribute": "deviceAttributeValue"}}}])],
         [CA], [one("slice-1", NODE1, P1, A)],
         [local(res("req-0", A, P1, D1), config=[cfg("FromClaim", None, A, "deviceAttribute")])]),
    Case("unknown-selector", [c0(req("req-0", CLASS_A, 1, ""))], [CA], [one("slice-1", NODE1, P1, A)],
         "CEL expression empty (unsupported selector type?)"),
    Case("unknown-allocation-mode", [c0(req("req-0", CLASS_A, 1, mode="future-mode"))], [CA], [one("slice-1", NODE1, P1, A)],
         "unsupported count mode future-mode"),
    Case("unknown-constraint", [simple_claim(constraints=[{}])], [CA], [one("slice-1", NODE1, P1, A)],
         "empty constraint (unsupported constraint type?)"),
    Case("invalid-CEL-one-device", [c0(req("req-0", CLASS_A, 1, "noSuchVar"))], [CA], [one("slice-1", NODE1, P1, A)],
         "undeclared reference"),
    Case("invalid-CEL-one-device-class", [simple_claim()], [klass(CLASS_A, A, "noSuchVar")], [one("slice-1", NODE1, P1, A)],
         "undeclared reference"),
    Case("invalid-CEL-all-devices", [c0(all_req("req-0", CLASS_A, "noSuchVar"))], [CA], [one("slice-1", NODE1, P1, A)],
         "undeclared reference"),
    Case("too-many-devices-single-request", [c0(req("req-0", CLASS_A, 500))], [CA], [], "exceeds the claim limit"),
    Case("many-devices-okay", [c0(req("req-0", CLASS_A, MAX))], [CA], [], None),
    Case("too-many-devices-total", [c0(req("req-0", CLASS_A, MAX), req("req-1", CLASS_A, 1))], [CA],
         [slice_("slice-1", NODE1, P1, A, *multi_devices(MAX + 1))], "exceeds the claim limit"),
    Case("prioritized-list-first-unavailable", [c0(first("req-0", sub("subReq-0", CLASS_B, 1), sub("subReq-1", CLASS_A, 1)))],
         [CA, CB], [one("slice-1", NODE1, P1, A)], [local(res("req-0/subReq-1", A, P1, D1))], features=("PrioritizedList",)),
    Case("prioritized-list-non-available", [c0(first("req-0", sub("subReq-0", CLASS_B, 2), sub("subReq-1", CLASS_A, 2)))],
         [CA, CB], [one("slice-1", NODE1, P1, A), one("slice-2", NODE1, P2, B)], None, features=("PrioritizedList",)),
    *changed_in_1_37(Case("prioritized-list-device-config",
         [c0(first("req-0", sub("subReq-0", CLASS_A, 1), sub("subReq-1", CLASS_B, 2)),
             config=[{"requests": ["req-0/subReq-0"], "opaque": {"driver": A, "parameters": {"foo": "fooValue"}}},
                     {"requests": ["req-0/subReq-1"], "opaque": {"driver": B, "parameters": {"bar": "barValue"}}}])],
         [CA, CB], [slice_("slice-1", NODE1, P1, B, dev(D1, None, {}), dev(D2, None, {}))],
         [local(res("req-0/subReq-1", B, P1, D1), res("req-0/subReq-1", B, P1, D2),
                config=[cfg("FromClaim", ["req-0/subReq-1"], B, "bar")])], features=("PrioritizedList",)),
        [local(res("req-0/subReq-1", B, P1, D1), res("req-0/subReq-1", B, P1, D2),
               config=[cfg("FromClaim", None, B, "bar")])]),
    *changed_in_1_37(Case("prioritized-list-class-config", [c0(first("req-0", sub("subReq-0", CLASS_A, 2), sub("subReq-1", CLASS_B, 2)))],
         [klass(CLASS_A, A, config_attr="foo"), klass(CLASS_B, B, config_attr="bar")],
         [slice_("slice-1", NODE1, P1, B, dev(D1), dev(D2)), slice_("slice-2", NODE1, P2, A, dev(D3))],
         [local(res("req-0/subReq-1", B, P1, D1), res("req-0/subReq-1", B, P1, D2),
                config=[cfg("FromClass", ["req-0/subReq-1"], B, "bar")])], features=("PrioritizedList",)),
        [local(res("req-0/subReq-1", B, P1, D1), res("req-0/subReq-1", B, P1, D2),
               config=[cfg("FromClass", None, B, "bar")])]),
    Case("prioritized-list-subrequests-with-expressions",
         [c0(req("req-0", CLASS_A, 1, memory_at_least("1Gi")),
             first("req-1", sub("subReq-0", CLASS_A, 1, memory_at_least("4Gi")), sub("subReq-1", CLASS_A, 2, memory_at_least("2Gi"))))],
         [CA], [slice_("slice-1", NODE1, P1, A, mem(D1, "2Gi"), mem(D2, "2Gi"), mem(D3, "1Gi"))],
         [local(res("req-0", A, P1, D3), res("req-1/subReq-1", A, P1, D1), res("req-1/subReq-1", A, P1, D2))], features=("PrioritizedList",)),
    Case("prioritized-list-subrequests-with-constraints-ref-parent-request",
         [c0(req("req-0", CLASS_A, 1, memory_at_least("8Gi")),
             first("req-1", sub("subReq-0", CLASS_A, 1, memory_at_least("2Gi")), sub("subReq-1", CLASS_A, 1, memory_at_least("1Gi"))),
             constraints=[match("driverVersion", "req-0", "req-1")])],
         [CA], [slice_("slice-1", NODE1, P1, A, mem(D1, "8Gi", attrs(driverVersion=(V, "1.0.0")))),
                slice_("slice-2", NODE1, P2, A, mem(D2, "2Gi", attrs(driverVersion=(V, "2.0.0"))), mem(D3, "1Gi", attrs(driverVersion=(V, "1.0.0"))))],
         [local(res("req-0", A, P1, D1), res("req-1/subReq-1", A, P2, D3))], features=("PrioritizedList",)),
    Case("prioritized-list-subrequests-with-constraints-ref-sub-request",
         [c0(req("req-0", CLASS_A, 1, memory_at_least("8Gi")),
             first("req-1", sub("subReq-0", CLASS_A, 1, memory_at_least("2Gi")), sub("subReq-1", CLASS_A, 1, memory_at_least("1Gi"))),
             constraints=[match("driverVersion", "req-0", "req-1/subReq-0")])],
         [CA], [slice_("slice-1", NODE1, P1, A, mem(D1, "8Gi", attrs(driverVersion=(V, "1.0.0")))),
                slice_("slice-2", NODE1, P2, A, mem(D2, "2Gi", attrs(driverVersion=(V, "2.0.0"))))],
         [local(res("req-0", A, P1, D1), res("req-1/subReq-1", A, P2, D2))], features=("PrioritizedList",)),
    Case("prioritized-list-subrequests-with-allocation-mode-all",
         [c0(first("req-0", sub("subReq-0", CLASS_A, 0, mode="All"), sub("subReq-1", CLASS_A, 1)))],
         [CA], [slice_("slice-1", NODE1, P1, A, dev(D1), dev(D2))], [local(res("req-0/subReq-1", A, P1, D2))],
         features=("PrioritizedList",), allocated=[(A, P1, D1)]),
    Case("prioritized-list-allocation-mode-all-multiple-requests",
         [c0(req("req-0", CLASS_A, 1), first("req-1", sub("subReq-0", CLASS_A, 0, mode="All"), sub("subReq-1", CLASS_A, 1)))],
         [CA], [slice_("slice-1", NODE1, P1, A, dev(D1), dev(D2))],
         [local(res("req-0", A, P1, D1), res("req-1/subReq-1", A, P1, D2))], features=("PrioritizedList",)),
    Case("prioritized-list-disabled", [c0(first("req-0", sub("subReq-0", CLASS_A, 1)))], [CA], [one("slice-1", NODE1, P1, A)],
         err("claim claim-0, request req-0: has subrequests, but the DRAPrioritizedList feature is disabled")),
    Case("prioritized-list-multi-request",
         [c0(req("req-1", CLASS_A, 1, memory_at_least("8Gi")),
             first("req-0", sub("subReq-0", CLASS_A, 1, memory_at_least("8Gi")), sub("subReq-1", CLASS_A, 1, memory_at_least("4Gi"))))],
         [CA], [slice_("slice-1", NODE1, P1, A, mem(D1, "8Gi", {})), slice_("slice-2", NODE1, P2, A, mem(D2, "4Gi", {}))],
         [local(res("req-1", A, P1, D1), res("req-0/subReq-1", A, P2, D2))], features=("PrioritizedList",)),
    Case("prioritized-list-with-backtracking",
         [c0(first("req-0", sub("subReq-0", CLASS_A, 1, memory_at_least("8Gi")), sub("subReq-1", CLASS_A, 1, memory_at_least("4Gi"))),
             req("req-1", CLASS_A, 1, memory_at_least("8Gi")))],
         [CA], [slice_("slice-1", NODE1, P1, A, mem(D1, "8Gi", {})), slice_("slice-2", NODE1, P2, A, mem(D2, "4Gi", {}))],
         [local(res("req-0/subReq-1", A, P2, D2), res("req-1", A, P1, D1))], features=("PrioritizedList",)),
    Case("prioritized-list-too-many-in-first-subrequest", [c0(first("req-0", sub("subReq-0", CLASS_B, 500), sub("subReq-1", CLASS_A, 1)))],
         [CA, CB], [one("slice-1", NODE1, P1, A)], [local(res("req-0/subReq-1", A, P1, D1))], features=("PrioritizedList",)),
]

PART = ("PartitionableDevices",)
PART_PL = ("PartitionableDevices", "PrioritizedList")
BIND = ("DeviceBindingAndStatus",)
CC = ("ConsumableCapacity",)
PL = ("PrioritizedList",)
SUBREQ_MEM = (sub("subReq-0", CLASS_A, 1, memory_at_least("6Gi")), sub("subReq-1", CLASS_A, 1, memory_at_least("4Gi")))


def pdev(name: str, q: str, **kw: Any) -> dict[str, Any]:
    """A partition consuming `q` of counter-set-1/memory, with capacity from its counters."""
    return dev(name, counters=ctr(q), from_counters=True, **kw)


CASES += [
    Case("all-devices-invalid-CEL", [c0(req("req-0", CLASS_A, 500))], [CA], [], "exceeds the claim limit"),
    Case("partitionable-devices-single-device", [c0(req("req-0", CLASS_A, 1))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1, counters=ctr("4Gi")), count=2),
          slice_("slice-2", NODE1, P1, A, count=2, counter_sets=cs("8Gi"))],
         [local(res("req-0", A, P1, D1))], features=PART),
    Case("partitionable-devices-prioritized-list", [c0(req("req-0", CLASS_A, 1), first("req-1", *SUBREQ_MEM))], [CA],
         [slice_("slice-1", NODE1, P1, A, pdev(D1, "4Gi"), pdev(D2, "6Gi"), pdev(D3, "4Gi"), count=2),
          slice_("slice-2", NODE1, P1, A, count=2, counter_sets=cs("8Gi"))],
         [local(res("req-0", A, P1, D1), res("req-1/subReq-1", A, P1, D3))], features=PART_PL),
    Case("partitionable-devices-multiple-devices", [c0(req("req-0", CLASS_A, 1), req("req-1", CLASS_A, 1))], [CA],
         [slice_("slice-1", NODE1, P1, A, pdev(D1, "4Gi"), pdev(D2, "6Gi"), pdev(D3, "4Gi"), count=2),
          slice_("slice-2", NODE1, P1, A, count=2, counter_sets=cs("8Gi"))],
         [local(res("req-0", A, P1, D1), res("req-1", A, P1, D3))], features=PART),
    Case("partitionable-devices-multiple-capacity-pools", [c0(req("req-0", CLASS_A, 1), first("req-1", *SUBREQ_MEM))], [CA],
         [slice_("slice-1", NODE1, P1, A,
                 *[dev(n, counters=[("counter-set-1", {"memory": m}), ("counter-set-2", {"cpus": c})], from_counters=True)
                   for n, m, c in ((D1, "4Gi", "4"), (D2, "6Gi", "6"), (D3, "4Gi", "4"))], count=2),
          slice_("slice-2", NODE1, P1, A, count=2, counter_sets=[("counter-set-1", {"memory": "18Gi"}), ("counter-set-2", {"cpus": "8"})])],
         [local(res("req-0", A, P1, D1), res("req-1/subReq-1", A, P1, D3))], features=PART_PL),
    Case("partitionable-devices-multiple-counters", [c0(req("req-0", CLASS_A, 1), req("req-1", CLASS_A, 1))], [CA],
         [slice_("slice-1", NODE1, P1, A,
                 *[dev(n, counters=[("counter-set-1", {"memory": m1, "cpus": c1_}), ("counter-set-2", {"cpus": c2, "memory": m2})], from_counters=True)
                   for n, m1, c1_, c2, m2 in ((D1, "4Gi", "6", "4", "2Gi"), (D2, "6Gi", "4", "6", "6Gi"), (D3, "4Gi", "4", "4", "4Gi"))], count=2),
          slice_("slice-2", NODE1, P1, A, count=2, counter_sets=[("counter-set-1", {"cpus": "8", "memory": "18Gi"}),
                                                                ("counter-set-2", {"cpus": "12", "memory": "18Gi"})])],
         [local(res("req-0", A, P1, D2), res("req-1", A, P1, D3))], features=PART),
    Case("partitionable-devices-multiple-pools", [c0(req("req-0", CLASS_A, 1), req("req-1", CLASS_A, 1))], [CA],
         [slice_("slice-1", NODE1, P1, A, *[dev(n, counters=[("counter-set-1", {"cpus": c, "memory": m})], from_counters=True)
                                          for n, c, m in ((D1, "6", "4Gi"), (D2, "4", "6Gi"), (D3, "4", "4Gi"))], count=2),
          slice_("slice-2", NODE1, P1, A, count=2, counter_sets=[("counter-set-1", {"cpus": "8", "memory": "18Gi"})]),
          slice_("slice-3", NODE1, P2, A, *[dev(n, counters=[("counter-set-1", {"cpus": c, "memory": m})], from_counters=True)
                                          for n, c, m in ((D1, "6", "4Gi"), (D2, "1", "7Gi"), (D3, "1", "7Gi"))], count=2),
          slice_("slice-4", NODE1, P2, A, count=2, counter_sets=[("counter-set-1", {"cpus": "8", "memory": "18Gi"})])],
         [local(res("req-0", A, P2, D2), res("req-1", A, P2, D3))], features=PART, allocated=[(A, P1, D2), (A, P1, D3), (A, P2, D1)]),
    Case("partitionable-devices-unused-counters-in-counter-set", [c0(req("req-0", CLASS_A, 2))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1, counters=ctr("5Gi")), dev(D2, counters=ctr("4Gi")), dev(D3, counters=ctr("4Gi")), count=2),
          slice_("slice-2", NODE1, P1, A, count=2, counter_sets=[("counter-set-1", {"memory": "8Gi", "unused": "1Gi"})])],
         [local(res("req-0", A, P1, D2), res("req-0", A, P1, D3))], features=PART),
    Case("partitionable-devices-no-capacity-available", [c0(req("req-0", CLASS_A, 1))], [CA],
         [slice_("slice-1", NODE1, P1, A, pdev(D1, "4Gi"), pdev(D2, "16Gi")), slice_("slice-2", NODE1, P1, A, counter_sets=cs("18Gi"))],
         None, features=PART, allocated=[(A, P1, D2)]),
    Case("partitionable-devices-overallocated-capacity-pool", [c0(req("req-0", CLASS_A, 1))], [CA],
         [slice_("slice-1", NODE1, P1, A, pdev(D1, "4Gi"), pdev(D2, "20Gi")), slice_("slice-2", NODE1, P1, A, counter_sets=cs("18Gi"))],
         None, features=PART, allocated=[(A, P1, D2)]),
    Case("partitionable-devices-disabled-device-consumes-counters", [c0(req("req-0", CLASS_A, 1))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1, counters=ctr("4Gi"))), slice_("slice-2", NODE1, P1, A, counter_sets=cs("18Gi"))], None),
    Case("partitionable-devices-disabled-other-device-do-not-consume-counters", [c0(req("req-0", CLASS_A, 1))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1, counters=ctr("4Gi")), dev(D2), count=2),
          slice_("slice-2", NODE1, P1, A, count=2, counter_sets=cs("18Gi"))],
         [local(res("req-0", A, P1, D2))]),
    Case("partitionable-devices-disabled-per-device-node-selection", [c0(req("req-0", CLASS_A, 1))], [CA],
         [slice_("slice-1", PER_DEVICE, P1, A, dev(D2, node_name=NODE1))], None),
    Case("partitionable-devices-per-device-node-selection-nodename", [c0(first("req-0", *SUBREQ_MEM))], [CA],
         [slice_("slice-1", PER_DEVICE, P1, A, pdev(D1, "4Gi", node_name=NODE1), pdev(D2, "6Gi", node_name=NODE2), count=2),
          slice_("slice-2", PER_DEVICE, P1, A, count=2, counter_sets=cs("18Gi"))],
         [local(res("req-0/subReq-1", A, P1, D1))], features=PART_PL),
    Case("partitionable-devices-per-device-node-selection-node-selector", [c0(req("req-0", CLASS_A, 1))], [CA],
         [slice_("slice-1", PER_DEVICE, P1, A, pdev(D1, "4Gi", node_selector=label_selector("region", REGION1)), count=2),
          slice_("slice-2", PER_DEVICE, P1, A, count=2, counter_sets=cs("18Gi"))],
         [alloc(label_selector("region", REGION1), res("req-0", A, P1, D1))], features=PART_PL),
    Case("partitionable-devices-per-device-node-selection-node-selector-multiple-devices",
         [c0(req("req-0", CLASS_A, 3), req("req-1", CLASS_B, 3))], [CA, CB],
         [slice_("slice-1", PER_DEVICE, P1, A, pdev(D1, "4Gi", node_selector=label_selector("region", REGION1)),
                 pdev(D2, "4Gi", node_name=NODE1), pdev(D3, "4Gi", all_nodes=True), count=2),
          slice_("slice-2", PER_DEVICE, P1, A, count=2, counter_sets=cs("18Gi")),
          slice_("slice-3", NODE1, P2, B, *[dev(n, counters=ctr("4Gi", "counter-set-2"), from_counters=True) for n in (D1, D2, D3)], count=2),
          slice_("slice-4", NODE1, P2, B, count=2, counter_sets=[("counter-set-2", {"memory": "12Gi"})])],
         [local(res("req-0", A, P1, D1), res("req-0", A, P1, D2), res("req-0", A, P1, D3),
                res("req-1", B, P2, D1), res("req-1", B, P2, D2), res("req-1", B, P2, D3))], features=PART_PL),
    Case("tainted-two-devices", [simple_claim()], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1, taints=[TAINT_NO_SCHEDULE]), dev(D2, taints=[TAINT_NO_EXECUTE]))], None,
         features=("DeviceTaints",)),
    Case("tainted-one-device-two-taints", [simple_claim()], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1, taints=[TAINT_NO_SCHEDULE, TAINT_NO_EXECUTE]))], None, features=("DeviceTaints",)),
    Case("tainted-two-devices-tolerated", [c0(req("req-0", CLASS_A, 1, tolerations=[TOL_NO_EXECUTE]))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1, taints=[TAINT_NO_SCHEDULE]), dev(D2, taints=[TAINT_NO_EXECUTE]))],
         [local(res("req-0", A, P1, D2, tolerations=[TOL_NO_EXECUTE]))], features=("DeviceTaints",)),
    Case("tainted-two-devices-prioritized-list-tolerated",
         [c0(first("req-0", sub("subReq-0", CLASS_A, 1), sub("subReq-1", CLASS_A, 1, tolerations=[TOL_NO_EXECUTE])))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1, taints=[TAINT_NO_SCHEDULE]), dev(D2, taints=[TAINT_NO_EXECUTE]))],
         [local(res("req-0/subReq-1", A, P1, D2, tolerations=[TOL_NO_EXECUTE]))], features=("DeviceTaints", "PrioritizedList")),
    Case("tainted-no-effect", [simple_claim()], [CA], [slice_("slice-1", NODE1, P1, A, dev(D1, taints=[TAINT_NONE]))],
         [local(res("req-0", A, P1, D1))], features=("DeviceTaints",)),
    Case("tainted-one-device-two-taints-both-tolerated", [c0(req("req-0", CLASS_A, 1, tolerations=[TOL_NO_SCHEDULE, TOL_NO_EXECUTE]))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1, taints=[TAINT_NO_SCHEDULE, TAINT_NO_EXECUTE]))],
         [local(res("req-0", A, P1, D1, tolerations=[TOL_NO_SCHEDULE, TOL_NO_EXECUTE]))], features=("DeviceTaints",)),
    Case("tainted-disabled", [simple_claim()], [CA], [slice_("slice-1", NODE1, P1, A, dev(D1, taints=[TAINT_NO_SCHEDULE, TAINT_NO_EXECUTE]))],
         [local(res("req-0", A, P1, D1))]),
    Case("tainted-prioritized-list", [c0(first("req-0", sub("subReq-0", CLASS_B, 1), sub("subReq-1", CLASS_A, 1)))], [CA, CB],
         [slice_("slice-1", NODE1, P1, A, dev(D1, taints=[TAINT_NO_SCHEDULE]))], None, features=("DeviceTaints", "PrioritizedList")),
    Case("tainted-prioritized-list-disabled", [c0(first("req-0", sub("subReq-0", CLASS_B, 1), sub("subReq-1", CLASS_A, 1)))], [CA, CB],
         [slice_("slice-1", NODE1, P1, A, dev(D1, taints=[TAINT_NO_SCHEDULE]))], [local(res("req-0/subReq-1", A, P1, D1))], features=PL),
    Case("tainted-admin-access", [c0(req("req-0", CLASS_A, 1, admin=True))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1, taints=[TAINT_NO_SCHEDULE]))], None,
         features=("DeviceTaints", "AdminAccess"), allocated=[(A, P1, D1), (A, P1, D2)]),
    Case("tainted-admin-access-disabled", [c0(req("req-0", CLASS_A, 1, admin=True))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1, taints=[TAINT_NO_SCHEDULE]))], [local(res("req-0", A, P1, D1, admin=True))],
         features=("AdminAccess",), allocated=[(A, P1, D1), (A, P1, D2)]),
    Case("tainted-all-devices-single", [c0(all_req("req-0", CLASS_A))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1, taints=[TAINT_NO_SCHEDULE]))], None, features=("DeviceTaints",)),
    Case("tainted-all-devices-single-disabled", [c0(all_req("req-0", CLASS_A))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1, taints=[TAINT_NO_SCHEDULE]))], [local(res("req-0", A, P1, D1))]),
    Case("prioritized-list-allocation-mode-all", [c0(first("req-0", sub("subReq-0", CLASS_A, 0, mode="All"), sub("subReq-1", CLASS_A, 1)))],
         [CA], [slice_("slice-1", NODE1, P1, A, dev(D1), dev(D2))], [local(res("req-0/subReq-1", A, P1, D1))],
         features=PL, allocated=[(A, P1, D2)]),
    Case("prioritized-list-allocation-mode-all-with-selectors",
         [c0(first("req-0", sub("subReq-0", CLASS_A, 0, GEN.format("v6"), mode="All"), sub("subReq-1", CLASS_A, 0, GEN.format("v5"), mode="All")))],
         [CA], [slice_("slice-1", NODE1, P1, A, dev(D1, None, attrs(generation="v5")))],
         [local(res("req-0/subReq-1", A, P1, D1))], features=PL),
    Case("prioritized-list-allocation-mode-all-with-selectors-multiple-pools",
         [c0(first("req-0", sub("subReq-0", CLASS_A, 0, GEN.format("v6"), mode="All"), sub("subReq-1", CLASS_A, 0, GEN.format("v5"), mode="All")))],
         [CA], [slice_("slice-1", NODE1, P1, A, dev(D1, None, attrs(generation="v5"))),
                slice_("slice-2", NODE1, P2, A, dev(D1, None, attrs(generation="v5")))],
         [local(res("req-0/subReq-1", A, P1, D1), res("req-0/subReq-1", A, P2, D1))], features=PL),
    Case("prioritized-list-allocation-mode-all-with-selectors-multiple-pools-across-nodes",
         [c0(first("req-0", sub("subReq-0", CLASS_A, 0, GEN.format("v6"), mode="All"), sub("subReq-1", CLASS_A, 0, GEN.format("v5"), mode="All")))],
         [CA], [slice_("slice-1", NODE1, P1, A, dev(D1, None, attrs(generation="v5"))),
                slice_("slice-2", NODE2, P2, A, dev(D1, None, attrs(generation="v5")), dev(D2, None, attrs(generation="v6")))],
         [local(res("req-0/subReq-1", A, P1, D1))], features=PL),
    Case("prioritized-list-allocation-mode-all-with-selectors-deviceclass-subset",
         [c0(first("req-0", sub("subReq-0", CLASS_A, 0, GEN.format("v6"), mode="All"), sub("subReq-1", CLASS_A, 0, GEN.format("v5"), mode="All")))],
         [klass(CLASS_A, A, 'device.driver == "driver-a" && device.attributes["driver-a"].selected')],
         [slice_("slice-1", NODE1, P1, A, dev(D1, None, attrs(generation="v6", selected=False)),
                 dev(D2, None, attrs(generation="v5", selected=False)), dev(D3, None, attrs(generation="v5", selected=True)))],
         [local(res("req-0/subReq-1", A, P1, D3))], features=PL),
    Case("max-number-devices", [c0(req("req-0", CLASS_A, MAX))], [CA], [slice_("slice-1", NODE1, P1, A, *multi_devices(MAX))],
         [local(*[res("req-0", A, P1, f"device-{i}") for i in range(MAX)])]),
    Case("partitionable-devices-with-attribute-selector",
         [c0(req("req-0", CLASS_A, 2), req("req-1", CLASS_A, 1, 'device.attributes["driver-a"].special'))], [CA],
         [slice_("slice-1", NODE1, P1, A, *[dev(n, None, attrs(special=s), counters=[("counter-set-1", {c: "1"}), ("counter-set-2", {"mem": "10Gi"})])
                                          for n, s, c in ((D1, True, "cpu1"), (D2, False, "cpu2"), (D3, False, "cpu3"))], count=2),
          slice_("slice-2", NODE1, P1, A, count=2, counter_sets=[("counter-set-1", {"cpu1": "1", "cpu2": "1", "cpu3": "1"}),
                                                                ("counter-set-2", {"mem": "30Gi"})])],
         [local(res("req-0", A, P1, D2), res("req-0", A, P1, D3), res("req-1", A, P1, D1))], features=PART),
    Case("prioritized-list-max-allocation-limit-request",
         [c0(first("req-0", sub("subReq-0", CLASS_A, MAX), sub("subReq-1", CLASS_A, MAX // 2)),
             first("req-1", sub("subReq-0", CLASS_A, MAX), sub("subReq-1", CLASS_A, MAX // 2)))],
         [CA], [slice_("slice-1", NODE1, P1, A, *multi_devices(MAX * 2))],
         [local(*[res("req-0/subReq-1", A, P1, f"device-{i}") for i in range(MAX // 2)],
                *[res("req-1/subReq-1", A, P1, f"device-{i}") for i in range(MAX // 2, MAX)])], features=PL),
    Case("prioritized-list-max-allocation-allocation-mode-all",
         [c0(first("req-0", sub("subReq-0", CLASS_A, 0, mode="All"), sub("subReq-1", CLASS_A, 2)), req("req-1", CLASS_B, 2))],
         [CA, CB], [slice_("slice-1", NODE1, P1, A, *multi_devices(MAX - 1)), slice_("slice-2", NODE1, P2, B, *multi_devices(2))],
         [local(res("req-0/subReq-1", A, P1, D0), res("req-0/subReq-1", A, P1, D1), res("req-1", B, P2, D0), res("req-1", B, P2, D1))],
         features=PL),
]

PREP, FAIL = (["IsPrepare"], ["BindingFailed"]), (["IsPrepare2"], ["BindingFailed2"])
PART_BIND = ("PartitionableDevices", "DeviceBindingAndStatus")
CC_PL = ("ConsumableCapacity", "PrioritizedList")
MULTI_A = klass_multi(CLASS_A, A, True)
X = (A, P1, D1)


def sdev(name: str, capacity: dict[str, str] | None = None, attributes: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    return dev(name, capacity, attributes, multi=True, **kw)


def shared(request: str, device: str, consumed: dict[str, str] | None, pool: str = P1) -> dict[str, Any]:
    return res(request, A, pool, device, consumed=consumed)


def cap_req(name: str, q: str | None, count: int = 1, cls: str = CLASS_A) -> dict[str, Any]:
    return req(name, cls, count, capacity=q)


def held_gen(name: str, where: str, device: str, generation: int) -> dict[str, Any]:
    return slice_(name, where, P1, A, dev(device), count=2, generation=generation)


CASES += [
    Case("device-binding-conditions", [c0(req("req-0", CLASS_A, 1))], [CA], [slice_("slice-1", NODE1, P1, A, dev(D1, binding=PREP))],
         [local(res("req-0", A, P1, D1, binding=PREP))], features=BIND),
    Case("binding-conditions-multiple-devices", [c0(req("req-0", CLASS_A, 2), req("req-1", CLASS_A, 1))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1, binding=PREP), dev(D2, binding=FAIL), dev(D3, binding=(["IsPrepare3"], ["BindingFailed3"])))],
         [local(res("req-0", A, P1, D1, binding=PREP), res("req-0", A, P1, D2, binding=FAIL),
                res("req-1", A, P1, D3, binding=(["IsPrepare3"], ["BindingFailed3"])))], features=BIND),
    Case("binding-conditions-with-and-without", [c0(req("req-0", CLASS_A, 1), req("req-1", CLASS_A, 1))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1), dev(D2, binding=PREP))],
         [local(res("req-0", A, P1, D1), res("req-1", A, P1, D2, binding=PREP))], features=BIND),
    Case("binding-conditions-without-feature-gate", [c0(req("req-0", CLASS_A, 1))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1, binding=PREP))], None),
    Case("node-restriction", [simple_claim()], [CA], [slice_("slice-1", label_selector("planet", "earth"), P1, A, dev(D1, binds_to_node=True))],
         [local(res("req-0", A, P1, D1))], features=BIND),
    Case("partitionable-devices-with-binding-conditions", [c0(req("req-0", CLASS_A, 1))], [CA],
         [slice_("slice-1", NODE1, P1, A, pdev(D1, "4Gi", binding=PREP), count=2), slice_("slice-2", NODE1, P1, A, count=2, counter_sets=cs("8Gi"))],
         [local(res("req-0", A, P1, D1, binding=PREP))], features=PART_BIND),
    Case("partitionable-devices-with-binding-conditions-multiple", [c0(req("req-0", CLASS_A, 2))], [CA],
         [slice_("slice-1", NODE1, P1, A, pdev(D1, "4Gi", binding=PREP), pdev(D2, "4Gi", binding=FAIL), count=2),
          slice_("slice-2", NODE1, P1, A, count=2, counter_sets=cs("8Gi"))],
         [local(res("req-0", A, P1, D1, binding=PREP), res("req-0", A, P1, D2, binding=FAIL))], features=PART_BIND),
    Case("partitionable-devices-with-binding-conditions-some-devices-no-conditions", [c0(req("req-0", CLASS_A, 3))], [CA],
         [slice_("slice-1", NODE1, P1, A, pdev(D1, "2Gi", binding=PREP), pdev(D2, "2Gi"), pdev(D3, "4Gi", binding=(["IsReady"], ["BindingTimeout"])), count=2),
          slice_("slice-2", NODE1, P1, A, count=2, counter_sets=cs("8Gi"))],
         [local(res("req-0", A, P1, D1, binding=PREP), res("req-0", A, P1, D2), res("req-0", A, P1, D3, binding=(["IsReady"], ["BindingTimeout"])))],
         features=PART_BIND),
    Case("partitionable-devices-with-binding-conditions-multi-slices", [c0(req("req-0", CLASS_A, 2))], [CA],
         [slice_("slice-4", NODE1, P1, A, pdev(D1, "4Gi", binding=PREP), count=4),
          slice_("slice-3", NODE1, P1, A, count=4, counter_sets=cs("8Gi")),
          slice_("slice-2", NODE1, P1, A, dev(D2, counters=ctr("4Gi", "counter-set-2"), from_counters=True), count=4),
          slice_("slice-1", NODE1, P1, A, count=4, counter_sets=[("counter-set-2", {"memory": "8Gi"})])],
         [local(res("req-0", A, P1, D2), res("req-0", A, P1, D1, binding=PREP))], features=PART_BIND),
    Case("partitionable-devices-with-binding-conditions-and-taints", [c0(req("req-0", CLASS_A, 2))], [CA],
         [slice_("slice-1", NODE1, P1, A, pdev(D1, "4Gi", binding=PREP, taints=[{"key": "key1", "value": "value1", "effect": "NoSchedule"}]),
                 pdev(D2, "4Gi")), slice_("slice-2", NODE1, P1, A, counter_sets=cs("8Gi"))],
         None, features=(*PART_BIND, "DeviceTaints")),
    Case("partitionable-devices-with-binding-conditions-and-taints-tolerated", [c0(req("req-0", CLASS_A, 2, tolerations=[TOL_NO_SCHEDULE_KEY1]))], [CA],
         [slice_("slice-1", NODE1, P1, A, pdev(D1, "4Gi", binding=PREP, taints=[{"key": "key1", "value": "value1", "effect": "NoSchedule"}]),
                 pdev(D2, "4Gi"), count=2), slice_("slice-2", NODE1, P1, A, count=2, counter_sets=cs("8Gi"))],
         [local(res("req-0", A, P1, D1, binding=PREP, tolerations=[TOL_NO_SCHEDULE_KEY1]), res("req-0", A, P1, D2, tolerations=[TOL_NO_SCHEDULE_KEY1]))],
         features=(*PART_BIND, "DeviceTaints")),
    Case("consumable-capacity-disabled-feature", [c0(cap_req("req-0", "1"))], [CA], [one("slice-1", NODE1, P1, A)],
         err("claim claim-0, request req-0: has capacity requests, but the DRAConsumableCapacity feature is disabled"), features=BIND),
    Case("consumable-capacity-disabled-feature-with-prioritized-list",
         [c0(first("req-0", sub("subReq-0", CLASS_A, 1, capacity="1"), sub("subReq-1", CLASS_A, 1, capacity="1")))], [CA],
         [one("slice-1", NODE1, P1, A)],
         err("claim claim-0, subrequest subReq-0: has capacity requests, but the DRAConsumableCapacity feature is disabled"), features=(*BIND, "PrioritizedList")),
    Case("consumable-capacity-multi-allocatable-device-with-missing-capacity-request", [c0(cap_req("req-0", "1"))], [CA],
         [slice_("slice-1", NODE1, P1, A, sdev(D1, {"capacity-1": "1"}))], None, features=CC),
    Case("consumable-capacity-multi-allocatable-device-allocation-mode-all-with-missing-capacity-request",
         [c0(all_req("req-0", CLASS_A, capacity="1"))], [MULTI_A], [slice_("slice-1", NODE1, P1, A, sdev(D1, {"capacity-1": "1"}))], None, features=CC),
    Case("consumable-capacity-multi-allocatable-device-without-capacity-without-capacity-request",
         [c0(req("req-0", CLASS_A, 1)), c1(req("req-0", CLASS_A, 1))], [MULTI_A], [slice_("slice-1", NODE1, P1, A, sdev(D1))],
         [local(shared("req-0", D1, None)), local(shared("req-0", D1, None))], features=CC),
    Case("consumable-capacity-multi-allocatable-device-without-policy-without-capacity-request",
         [c0(req("req-0", CLASS_A, 1)), c1(req("req-0", CLASS_A, 1))], [MULTI_A],
         [slice_("slice-1", NODE1, P1, A, sdev(D1, {"capacity-0": "1"}), sdev(D2, {"capacity-0": "1"}))],
         [local(shared("req-0", D1, {"capacity-0": "1"})), local(shared("req-0", D2, {"capacity-0": "1"}))], features=CC),
    Case("consumable-capacity-multi-allocatable-device-without-policy-without-capacity-request-block",
         [c0(req("req-0", CLASS_A, 1)), c1(req("req-0", CLASS_A, 1))], [MULTI_A],
         [slice_("slice-1", NODE1, P1, A, sdev(D1, {"capacity-0": "2"}))], None, features=CC),
    Case("consumable-capacity-multi-allocatable-device-without-policy-with-capacity-request",
         [c0(cap_req("req-0", "1")), c1(cap_req("req-0", "1"))], [MULTI_A], [slice_("slice-1", NODE1, P1, A, sdev(D1, {"capacity-0": "2"}))],
         [local(shared("req-0", D1, {"capacity-0": "1"})), local(shared("req-0", D1, {"capacity-0": "1"}))], features=CC),
    Case("consumable-capacity-multi-allocatable-device-with-policy-without-capacity-request",
         [c0(req("req-0", CLASS_A, 1)), c1(req("req-0", CLASS_A, 1))], [MULTI_A],
         [slice_("slice-1", NODE1, P1, A, sdev(D1, policy_range={"capacity-0": "4"}))],
         [local(shared("req-0", D1, {"capacity-0": "2"})), local(shared("req-0", D1, {"capacity-0": "2"}))], features=CC),
    Case("consumable-capacity-multi-allocatable-device-with-zero-request-policy",
         [c0(req("req-0", CLASS_A, 1)), c1(req("req-0", CLASS_A, 1))], [MULTI_A],
         [slice_("slice-1", NODE1, P1, A, sdev(D1, policy_values=("0", {"capacity-0": "1"}, [])))],
         [local(shared("req-0", D1, {"capacity-0": "0"})), local(shared("req-0", D1, {"capacity-0": "0"}))], features=CC),
    Case("consumable-capacity-multi-allocatable-device-violates-zero-request-policy", [c0(cap_req("req-0", "1"))], [MULTI_A],
         [slice_("slice-1", NODE1, P1, A, sdev(D1, policy_values=("0", {"capacity-0": "1"}, [])))], None, features=CC),
    Case("consumable-capacity-multi-allocatable-device-with-range-policy-with-capacity-request",
         [c0(cap_req("req-0", "1")), c1(cap_req("req-0", "1"))], [MULTI_A], [slice_("slice-1", NODE1, P1, A, sdev(D1, policy_range={"capacity-0": "4"}))],
         [local(shared("req-0", D1, {"capacity-0": "2"})), local(shared("req-0", D1, {"capacity-0": "2"}))], features=CC),
    Case("consumable-capacity-multi-allocatable-device-with-range-policy-step", [c0(cap_req("req-0", "3"))], [MULTI_A],
         [slice_("slice-1", NODE1, P1, A, sdev(D1, policy_range={"capacity-0": "4"}))], [local(shared("req-0", D1, {"capacity-0": "4"}))], features=CC),
    Case("consumable-capacity-multi-allocatable-device-with-valid-values-policy", [c0(cap_req("req-0", "2"))], [MULTI_A],
         [slice_("slice-1", NODE1, P1, A, sdev(D1, policy_values=("1", {"capacity-0": "4"}, ["2"])))],
         [local(shared("req-0", D1, {"capacity-0": "2"}))], features=CC),
    Case("consumable-capacity-multi-allocatable-device-with-valid-values-policy-round-up", [c0(cap_req("req-0", "2"))], [MULTI_A],
         [slice_("slice-1", NODE1, P1, A, sdev(D1, policy_values=("1", {"capacity-0": "3"}, ["3"])))],
         [local(shared("req-0", D1, {"capacity-0": "3"}))], features=CC),
    Case("consumable-capacity-multi-allocatable-device-with-exceeded-consumable-capacity-request",
         [c0(cap_req("req-0", "1")), c1(cap_req("req-0", "2"))], [MULTI_A],
         [slice_("slice-1", NODE1, P1, A, sdev(D1, policy_range={"capacity-0": "2"}))], None, features=CC),
    Case("consumable-capacity-multi-allocatable-device-with-request-over-max-sharing-policy", [c0(cap_req("req-0", "6"))], [MULTI_A],
         [slice_("slice-1", NODE1, P1, A, sdev(D1, policy_range={"capacity-0": "10"}))], None, features=CC),
    Case("consumable-capacity-multi-allocatable-device-with-allocated-capacity-use-remaining", [c0(cap_req("req-0", "2"))], [MULTI_A],
         [slice_("slice-1", NODE1, P1, A, sdev(D1, policy_range={"capacity-0": "4"}))], [local(shared("req-0", D1, {"capacity-0": "2"}))],
         features=CC, allocated_capacity={X: {"capacity-0": "2"}}),
    Case("consumable-capacity-multi-allocatable-device-with-allocated-capacity-next-device", [c0(cap_req("req-0", "2"))], [MULTI_A],
         [slice_("slice-1", NODE1, P1, A, sdev(D1, policy_range={"capacity-0": "2"}), sdev(D2, policy_range={"capacity-0": "2"}))],
         [local(shared("req-0", D2, {"capacity-0": "2"}))], features=CC, allocated_capacity={X: {"capacity-0": "2"}}),
    Case("consumable-capacity-with-multi-allocatable-device-backtrack",
         [c0(cap_req("req-0", "2"), cap_req("req-1", "2"), constraints=[match("stringAttribute")]), c1(cap_req("req-0", "2"))], [CA],
         [slice_("slice-1", NODE1, P1, A, sdev(D2, None, attrs(stringAttribute="stringAttributeValue1"), policy_range={"capacity-0": "2"}),
                 sdev(D1, None, attrs(stringAttribute="stringAttributeValue2"), policy_range={"capacity-0": "4"}))],
         [local(shared("req-0", D1, {"capacity-0": "2"}), shared("req-1", D1, {"capacity-0": "2"})), local(shared("req-0", D2, {"capacity-0": "2"}))],
         features=CC),
    Case("consumable-capacity-multi-allocatable-device-with-subrequest",
         [c0(first("req-0", sub("subReq-0", CLASS_A, 1, capacity="4"), sub("subReq-1", CLASS_A, 1, capacity="2"), sub("subReq-1", CLASS_A, 1)))],
         [MULTI_A], [slice_("slice-1", NODE1, P1, A, sdev(D1, policy_range={"capacity-0": "2"}))],
         [local(shared("req-0/subReq-1", D1, {"capacity-0": "2"}))], features=CC_PL),
    Case("consumable-capacity-multi-allocatable-device-with-no-available-consumable-capacity", [c0(cap_req("req-0", "2"))], [MULTI_A],
         [slice_("slice-1", NODE1, P1, A, sdev(D1, policy_range={"capacity-0": "2"}))], None, features=CC, allocated_capacity={X: {"capacity-0": "2"}}),
    Case("consumable-capacity-multi-allocatable-device-allocation-mode-all-filter-out-no-capacity",
         [c0(all_req("req-0", CLASS_A, capacity="2"))], [MULTI_A], [slice_("slice-1", NODE1, P1, A, sdev(D1, {"capacity-0": "2"}), sdev(D2))],
         [local(shared("req-0", D1, {"capacity-0": "2"}))], features=CC),
    Case("consumable-capacity-multi-allocatable-device-allocation-mode-all-filter-out-insufficient-capacity",
         [c0(all_req("req-0", CLASS_A, capacity="2"))], [MULTI_A],
         [slice_("slice-1", NODE1, P1, A, sdev(D1, {"capacity-0": "2"}), sdev(D2, {"capacity-0": "1"}))],
         [local(shared("req-0", D1, {"capacity-0": "2"}))], features=CC),
    Case("consumable-capacity-multi-allocatable-device-allocation-mode-all-allocating-sufficient",
         [c0(cap_req("req-0", "1"), all_req("req-1", CLASS_A, capacity="1"))], [CA],
         [slice_("slice-1", NODE1, P1, A, sdev(D1, {"capacity-0": "2"}), sdev(D2, {"capacity-0": "1"}))],
         [local(shared("req-0", D1, {"capacity-0": "1"}), shared("req-1", D1, {"capacity-0": "1"}), shared("req-1", D2, {"capacity-0": "1"}))],
         features=CC),
    Case("consumable-capacity-multi-allocatable-device-allocation-mode-all-in-use-sufficient",
         [c0(all_req("req-0", CLASS_A, capacity="1"))], [CA],
         [slice_("slice-1", NODE1, P1, A, sdev(D1, {"capacity-0": "2"}), sdev(D2, {"capacity-0": "1"}))],
         [local(shared("req-0", D1, {"capacity-0": "1"}), shared("req-0", D2, {"capacity-0": "1"}))],
         features=CC, allocated_capacity={X: {"capacity-0": "1"}}),
    Case("consumable-capacity-multi-allocatable-device-allocation-mode-all-allocating-insufficient",
         [c0(cap_req("req-0", "1"), all_req("req-1", CLASS_A, capacity="1"))], [CA],
         [slice_("slice-1", NODE1, P1, A, sdev(D1, {"capacity-0": "1"}), sdev(D2, {"capacity-0": "1"}))], None, features=CC),
    Case("consumable-capacity-multi-allocatable-device-allocation-mode-all-in-use-insufficient",
         [c0(all_req("req-0", CLASS_A, capacity="1"))], [CA],
         [slice_("slice-1", NODE1, P1, A, sdev(D1, {"capacity-0": "1"}), sdev(D2, {"capacity-0": "1"}))],
         [local(shared("req-0", D2, {"capacity-0": "1"}))], features=CC, allocated_capacity={X: {"capacity-0": "1"}}),
    Case("consumable-capacity-dedicated-device-with-consumable-capacity-request", [c0(cap_req("req-0", "1"))], [klass_multi(CLASS_A, A, False)],
         [slice_("slice-1", NODE1, P1, A, dev(D1, {"capacity-0": "1"}))], [local(res("req-0", A, P1, D1))], features=CC),
    Case("consumable-capacity-dedicated-device-with-multiple-consumable-capacity-request",
         [c0(cap_req("req-0", "1")), c1(cap_req("req-0", "1"))], [klass_multi(CLASS_A, A, False)],
         [slice_("slice-1", NODE1, P1, A, dev(D1, policy_range={"capacity-0": "2"}))], None, features=CC),
    Case("allow-multiple-allocations-exclude-multi-allocatable-device-by-class-selector", [c0(cap_req("req-0", "1"))],
         [klass_multi(CLASS_A, A, False)], [slice_("slice-1", NODE1, P1, A, sdev(D1, {"capacity-0": "1"}))], None, features=CC),
    Case("allow-multiple-allocations-not-allocate-multi-allocatable-device-which-already-dedicated", [c0(cap_req("req-0", "1"))], [MULTI_A],
         [slice_("slice-1", NODE1, P1, A, sdev(D1, policy_range={"capacity-0": "2"}))], None, features=CC, allocated=[X]),
    Case("allow-multiple-allocations-not-allocate-dedicated-device-which-change-from-multi-allocatable", [c0(cap_req("req-0", "1"))], [MULTI_A],
         [slice_("slice-1", NODE1, P1, A, dev(D1, policy_range={"capacity-0": "2"}))], None, features=CC, allocated_capacity={X: {"capacity-0": "1"}}),
    Case("allow-multiple-allocations-with-partitionable-device", [c0(req("req-0", CLASS_A, 1), first("req-1", *SUBREQ_MEM))], [MULTI_A],
         [slice_("slice-1", NODE1, P1, A, pdev(D1, "4Gi", multi=True), pdev(D2, "6Gi", multi=True), pdev(D3, "4Gi", multi=True), count=2),
          slice_("slice-2", NODE1, P1, A, count=2, counter_sets=cs("8Gi"))],
         [local(shared("req-0", D1, {"memory": "4Gi"}), shared("req-1/subReq-1", D3, {"memory": "4Gi"}))],
         features=("PrioritizedList", "PartitionableDevices", "ConsumableCapacity")),
    Case("consumable-capacity-with-partitionable-device-multiple-capacity-pools",
         [c0(cap_req("req-0", "1"), cap_req("req-2", "2"),
             first("req-1", sub("subReq-0", CLASS_A, 1, 'device.capacity["driver-a"]["capacity-0"].compareTo(quantity("4")) >= 0', capacity="1"),
                   sub("subReq-1", CLASS_A, 1, 'device.capacity["driver-a"]["capacity-0"].compareTo(quantity("2")) >= 0', capacity="1")))],
         [CA],
         [slice_("slice-1", NODE1, P1, A, *[dev(n, counters=[("counter-set-1", {"capacity-0": c0_}), ("counter-set-2", {"capacity-1": "4"})],
                                              from_counters=True, multi=True, policy_range={"capacity-1": "4"})
                                          for n, c0_ in ((D1, "2"), (D2, "4"), (D3, "2"))], count=2),
          slice_("slice-2", NODE1, P1, A, count=2, counter_sets=[("counter-set-1", {"capacity-0": "4"}), ("counter-set-2", {"capacity-1": "8"})])],
         [local(shared("req-0", D1, {"capacity-0": "1", "capacity-1": "2"}), shared("req-2", D3, {"capacity-0": "2", "capacity-1": "2"}),
                shared("req-1/subReq-1", D1, {"capacity-0": "1", "capacity-1": "2"}))],
         features=("PrioritizedList", "PartitionableDevices", "ConsumableCapacity")),
    Case("with-distinct-constraints",
         [c0(*[req(f"req-{i}", CLASS_A, 1) for i in range(4)],
             constraints=[distinct("boolAttribute", "req-0", "req-1"), distinct("driverVersion", "req-0", "req-1", "req-2"),
                          distinct("numa", "req-0", "req-1", "req-2", "req-3")])], [CA],
         [slice_("slice-1", NODE1, P1, A, *[sdev(n, None, attrs(driverVersion=(V, v), numa=i, boolAttribute=b))
                                          for n, v, i, b in ((D1, "1.0.0", 0, True), (D2, "1.0.1", 1, False), (D3, "1.0.2", 2, True), (D4, "1.0.0", 3, True))])],
         [local(shared("req-0", D1, None), shared("req-1", D2, None), shared("req-2", D3, None), shared("req-3", D4, None))], features=CC),
    Case("with-distinct-constraints-attribute-not-set", [c0(req("req-0", CLASS_A, 1), constraints=[distinct("boolAttribute", "req-0")])], [CA],
         [slice_("slice-1", NODE1, P1, A, sdev(D1))], None, features=CC),
    Case("with-distinct-constraints-unknown-type-attribute", [c0(req("req-0", CLASS_A, 1), constraints=[distinct("boolAttribute", "req-0")])], [CA],
         [slice_("slice-1", NODE1, P1, A, sdev(D1, None, {"boolAttribute": {}}))], "unsupported attribute value", features=CC),
    Case("with-distinct-constraints-with-subrequests",
         [c0(*[first(f"req-{i}", sub("subReq-0", CLASS_A, 1, 'device.attributes["driver-a"].boolAttribute'), sub("subReq-1", CLASS_A, 1))
               for i in range(3)], constraints=[distinct("boolAttribute", "req-0", "req-1")])], [CA],
         [slice_("slice-1", NODE1, P1, A, sdev(D1, None, attrs(boolAttribute=True)), sdev(D2, None, attrs(boolAttribute=False)))],
         [local(shared("req-0/subReq-0", D1, None), shared("req-1/subReq-1", D2, None), shared("req-2/subReq-0", D1, None))], features=CC_PL),
    Case("distinct-constraint-one-multi-allocatable-device-with-distinct-constraint",
         [c0(cap_req("req-0", "1"), cap_req("req-1", "1"), constraints=[distinct("stringAttribute")])], [MULTI_A],
         [slice_("slice-1", NODE1, P1, A, sdev(D1, None, attrs(stringAttribute="stringAttributeValue"), policy_range={"capacity-0": "2"}))],
         None, features=CC),
    Case("distinct-constraint-two-multi-allocatable-devices-with-distinct-constraint",
         [c0(cap_req("req-0", "2"), cap_req("req-1", "2"), constraints=[distinct("stringAttribute")])], [MULTI_A],
         [slice_("slice-1", NODE1, P1, A, sdev(D1, None, attrs(stringAttribute="stringAttributeValue1"), policy_range={"capacity-0": "4"}), count=2),
          slice_("slice-1", NODE1, P1, A, sdev(D2, None, attrs(stringAttribute="stringAttributeValue2"), policy_range={"capacity-0": "4"}), count=2)],
         [local(shared("req-0", D1, {"capacity-0": "2"}), shared("req-1", D2, {"capacity-0": "2"}))], features=CC),
    Case("allocation-mode-all-with-multi-host-resource-pool", [c0(all_req("req-0", CLASS_A))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1), count=2), slice_("slice-2", NODE2, P1, A, dev(D2), count=2)],
         [local(res("req-0", A, P1, D1))]),
    Case("multi-host-resource-pool-with-stale-slice-for-current-node", [simple_claim()], [CA],
         [held_gen("slice-1", NODE1, D1, 1), held_gen("slice-2", NODE2, D2, 2)], None),
    Case("multi-host-resource-pool-complete-update-from-node-1-to-node-2", [simple_claim()], [CA],
         [held_gen("slice-1", NODE1, D1, 1), held_gen("slice-1", NODE1, D2, 1), held_gen("slice-2", NODE2, D1, 2), held_gen("slice-2", NODE2, D2, 2)],
         [local(res("req-0", A, P1, D1))]),
    Case("multi-host-resource-pool-complete-update-from-node-2-to-node-1", [simple_claim()], [CA],
         [held_gen("slice-1", NODE2, D1, 1), held_gen("slice-1", NODE2, D2, 1), held_gen("slice-2", NODE1, D1, 2), held_gen("slice-2", NODE1, D2, 2)],
         [local(res("req-0", A, P1, D1))]),
    Case("multi-host-resource-pool-incomplete-update-from-node-1-to-node-2", [simple_claim()], [CA],
         [held_gen("slice-1", NODE1, D1, 1), held_gen("slice-1", NODE1, D2, 1), held_gen("slice-2", NODE2, D1, 2)],
         [local(res("req-0", A, P1, D1))]),
    Case("multi-host-resource-pool-incomplete-update-from-node-2-to-node-1", [simple_claim()], [CA],
         [held_gen("slice-1", NODE2, D1, 1), held_gen("slice-1", NODE2, D2, 1), held_gen("slice-2", NODE1, D1, 2)], None),
    Case("partitionable-devices-same-counter-set-name-in-different-resource-slices", [c0(req("req-0", CLASS_A, 1))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1), count=4), slice_("slice-2", NODE1, P1, A, count=4, counter_sets=[("counter-set-1", None)]),
          slice_("slice-3", NODE1, P1, A, dev(D2), count=4), slice_("slice-4", NODE1, P1, A, count=4, counter_sets=[("counter-set-1", None)])],
         "invalid resource pools were encountered", features=PART),
    Case("partitionable-devices-device-counter-consumption-references-unknown-counter-set", [c0(req("req-0", CLASS_A, 1))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1, counters=[("counter-set-2", {})]), count=2),
          slice_("slice-2", NODE1, P1, A, count=2, counter_sets=[("counter-set-1", None)])],
         "invalid resource pools were encountered", features=PART),
    Case("partitionable-devices-device-counter-consumption-references-unknown-counter-in-counter-set", [c0(req("req-0", CLASS_A, 1))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1, counters=ctr("8Gi")), count=2),
          slice_("slice-2", NODE1, P1, A, count=2, counter_sets=[("counter-set-1", {"other-memory": "8Gi"})])],
         "invalid resource pools were encountered", features=PART),
    Case("partitionable-devices-device-counter-consumption-references-counter-set-in-other-pool", [c0(req("req-0", CLASS_A, 1))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1, counters=ctr("8Gi"))), slice_("slice-2", NODE1, P2, A, counter_sets=cs("8Gi"))],
         "invalid resource pools were encountered", features=PART),
    Case("partitionable-devices-devices-on-different-nodes-consume-same-counter-set",
         [c0(first("req-0", sub("subReq-0", CLASS_A, 1, memory_at_least("6Gi")), sub("subReq-1", CLASS_A, 1, memory_at_least("2Gi"))))], [CA],
         [slice_("slice-1", NODE1, P1, A, count=3, counter_sets=cs("8Gi")),
          slice_("slice-2", NODE1, P1, A, pdev(D1, "6Gi"), pdev(D2, "2Gi"), count=3),
          slice_("slice-3", NODE2, P1, A, dev(D3, counters=ctr("6Gi")), count=3)],
         [local(res("req-0/subReq-1", A, P1, D2))], features=PART_PL, allocated=[(A, P1, D3)]),
    Case("partitionable-devices-validation-error-on-non-targeting-slice", [c0(req("req-0", CLASS_A, 1))], [CA],
         [slice_("slice-1", NODE1, P1, A, count=3, counter_sets=cs("8Gi")), slice_("slice-2", NODE1, P1, A, pdev(D1, "6Gi"), count=3),
          slice_("slice-3", NODE2, P1, A, dev(D3, counters=ctr("6Gi", "counter-set-2")), count=3)],
         "invalid resource pools were encountered", features=PART),
    Case("different-resourceslices-in-pool-can-target-different-nodes", [c0(req("req-0", CLASS_A, 1))], [CA],
         [slice_("slice-1", NODE2, P1, A, dev(D1), count=2), slice_("slice-2", NODE1, P1, A, dev(D2), count=2)],
         [local(res("req-0", A, P1, D2))]),
    Case("invalid-pool-is-ok-if-devices-can-be-allocated-from-other", [c0(req("req-0", CLASS_A, 1))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1), count=2), slice_("slice-2", NODE1, P1, A, dev(D1), count=2),
          slice_("slice-3", NODE1, P2, A, dev(D2))], [local(res("req-0", A, P2, D2))]),
    Case("invalid-pool-is-error-if-no-other-device-can-be-allocated", [c0(req("req-0", CLASS_A, 1))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1), count=2), slice_("slice-2", NODE1, P1, A, dev(D1), count=2),
          slice_("slice-3", NODE1, P2, A, dev(D2))], "invalid resource pools were encountered", allocated=[(A, P2, D2)]),
    Case("no-allocation-from-incomplete-pools", [c0(req("req-0", CLASS_A, 1))], [CA], [slice_("slice-1", NODE1, P1, A, dev(D1), count=2)], None),
    Case("check-combinations-within-single-request-single-pool-single-slice", [c0(req("req-0", CLASS_A, 5))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1), dev(D2), dev(D3), dev(D4))], None),
    Case("check-combinations-within-single-request-single-pool-multiple-slices", [c0(req("req-0", CLASS_A, 5))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1), dev(D2), count=2), slice_("slice-2", NODE1, P1, A, dev(D3), dev(D4), count=2)], None),
    Case("check-combinations-within-single-request-multiple-pools-multiple-slices", [c0(req("req-0", CLASS_A, 5))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1), count=2), slice_("slice-2", NODE1, P1, A, dev(D2), count=2),
          slice_("slice-3", NODE1, P2, A, dev(D3), dev(D4))], None),
    Case("check-combinations-within-single-request-many-pools", [c0(req("req-0", CLASS_A, 5))], [CA],
         [slice_(f"slice-{i}", NODE1, f"pool-{i}", A, dev(f"device-{i}")) for i in range(1, 5)], None),
    Case("check-combinations-with-backtracking", [c0(req("req-1", CLASS_A, 2), req("req-2", CLASS_A, 1, TYPE.format("X")))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1, None, attrs(type="X")), dev(D2, None, attrs(type="Y")), dev(D3, None, attrs(type="Y")))],
         [local(res("req-1", A, P1, D2), res("req-1", A, P1, D3), res("req-2", A, P1, D1))]),
    Case("check-combinations-with-backtracking-across-slices-and-pools",
         [c0(req("req-1", CLASS_A, 2), req("req-2", CLASS_A, 1, TYPE.format("X")))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1, None, attrs(type="X")), count=2), slice_("slice-2", NODE1, P1, A, dev(D2, None, attrs(type="Y")), count=2),
          slice_("slice-3", NODE1, P2, A, dev(D3, None, attrs(type="Y"), binding=(["IsPrepare"], [])))],
         [local(res("req-1", A, P1, D2), res("req-1", A, P2, D3, binding=(["IsPrepare"], [])), res("req-2", A, P1, D1))], features=BIND),
    Case("check-combinations-with-prioritized-list",
         [c0(first("req-1", sub("subReq-0", CLASS_A, 3, TYPE.format("Y")), sub("subReq-1", CLASS_A, 2)),
             first("req-2", sub("subReq-0", CLASS_A, 2), sub("subReq-1", CLASS_A, 1, TYPE.format("X"))))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1, None, attrs(type="X")), dev(D2, None, attrs(type="Y")), dev(D3, None, attrs(type="Y")))],
         [local(res("req-1/subReq-1", A, P1, D2), res("req-1/subReq-1", A, P1, D3), res("req-2/subReq-1", A, P1, D1))], features=PL),
]

# Added to the table in 1.36 and 1.37 (allocator fixes; the config cases describe the 1.37 result and, where 1.35
# and 1.36 wrote it differently, that older result too).
SCOPED = {"opaque": opaque(A, "scoped")}
CASES += [
    Case("all-devices-with-consumed-counters", [c0(all_req("req-0", CLASS_A))], [CA],
         [slice_("slice-1", NODE1, P1, A, dev(D1, counters=ctr("4Gi")), count=2),
          slice_("slice-2", NODE1, P1, A, count=2, counter_sets=cs("8Gi"))],
         [local(res("req-0", A, P1, D1))], features=("PartitionableDevices",)),
    Case("allow-multiple-allocations-with-shared-device-counter-cross-cycle",
         [c0(req("req-0", CLASS_A, 1, 'device.attributes["driver-a"].mode == "b"', capacity="1"))], [MULTI_A],
         [slice_("slice-1", NODE1, P1, A,
                 dev(D1, attributes=attrs(mode="a"), counters=[("counter-set-1", {"capacity-0": "1"})], from_counters=True, multi=True),
                 dev(D2, attributes=attrs(mode="b"), counters=[("counter-set-1", {"capacity-0": "1"})], from_counters=True, multi=True),
                 count=2),
          slice_("slice-2", NODE1, P1, A, count=2, counter_sets=[("counter-set-1", {"capacity-0": "1"})])],
         None, features=("PartitionableDevices", "ConsumableCapacity"), allocated_capacity={X: {"capacity-0": "1"}}),
    Case("partitionable-devices-devices-consume-counter-set-in-different-nodes", [c0(req("req-0", CLASS_A, 1))], [CA],
         [slice_("slice-1", NODE1, P1, A, count=3, counter_sets=cs("8Gi")),
          slice_("slice-2", NODE1, P1, A, dev(D1, counters=ctr("6Gi"), from_counters=True), count=3),
          slice_("slice-3", NODE2, P1, A, dev(D2, counters=ctr("6Gi"), from_counters=True),
                 dev(D3, counters=ctr("2Gi"), from_counters=True), count=3)],
         [alloc(local_selector(NODE2), res("req-0", A, P1, D3))], features=("PartitionableDevices",),
         allocated=[(A, P1, D1)], node=NODE2),
    *changed_in_1_37(
        Case("with-claim-config-for-two-requests",
             [c0(req("req-0", CLASS_A, 1), req("req-1", CLASS_A, 1), req("req-2", CLASS_A, 1),
                 config=[{"requests": ["req-0", "req-1"], "opaque": opaque(A, "deviceAttribute")}])],
             [CA], [slice_("slice-1", NODE1, P1, A, *multi_devices(3))],
             [local(res("req-0", A, P1, D0), res("req-1", A, P1, D1), res("req-2", A, P1, D2),
                    config=[cfg("FromClaim", ["req-0", "req-1"], A, "deviceAttribute")] * 2)]),
        [local(res("req-0", A, P1, D0), res("req-1", A, P1, D1), res("req-2", A, P1, D2),
               config=[cfg("FromClaim", ["req-0", "req-1"], A, "deviceAttribute")])]),
    Case("claim-config-scoped-to-subrequests-of-one-request",
         [c0(first("req-0", sub("subReq-0", CLASS_A, 1), sub("subReq-1", CLASS_B, 1)), req("req-1", CLASS_A, 1),
             config=[{"requests": ["req-0/subReq-0", "req-0/subReq-1"], **SCOPED}])],
         [CA, CB], [slice_("slice-1", NODE1, P1, A, *multi_devices(2))],
         [local(res("req-0/subReq-0", A, P1, D0), res("req-1", A, P1, D1),
                config=[cfg("FromClaim", ["req-0/subReq-0", "req-0/subReq-1"], A, "scoped")])], features=PL),
    *changed_in_1_37(
        Case("claim-config-covering-all-requests-is-cleared",
             [c0(first("req-0", sub("subReq-0", CLASS_A, 1), sub("subReq-1", CLASS_B, 1)), req("req-1", CLASS_A, 1),
                 config=[{"requests": ["req-0/subReq-0", "req-1"], "opaque": opaque(A, "all")}])],
             [CA, CB], [slice_("slice-1", NODE1, P1, A, *multi_devices(2))],
             [local(res("req-0/subReq-0", A, P1, D0), res("req-1", A, P1, D1),
                    config=[cfg("FromClaim", ["req-0/subReq-0", "req-1"], A, "all")] * 2)], features=PL),
        [local(res("req-0/subReq-0", A, P1, D0), res("req-1", A, P1, D1), config=[cfg("FromClaim", None, A, "all")])]),
]


def _normalize(alloc_result: dict[str, Any]) -> dict[str, Any]:
    """Order inside node selectors is irrelevant (upstream compares with ConsistOf); share IDs are random."""
    out = json.loads(json.dumps(alloc_result))
    for r in out["devices"]["results"]:
        if "shareID" in r:
            r["shareID"] = "<share>"
    for term in (out.get("nodeSelector") or {}).get("nodeSelectorTerms", []):
        for key in ("matchExpressions", "matchFields"):
            if key in term:
                term[key] = sorted(({**r, "values": sorted(r["values"])} for r in term[key]), key=json.dumps)
    return out


def run_case(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str],
             version: str = "1.37") -> tuple[int, list[dict[str, Any]]]:
    path = tmp_path / "in.yaml"
    path.write_text(yaml.safe_dump_all(case.objects()))
    rc = main(["allocate", "-f", str(path), "--node", case.node, *case.feature_args(version), "-o", "json"])
    return rc, json.loads(capsys.readouterr().out)["results"]


# Every case runs with the semantics of each release it describes, where that release lets its gates be set as
# the case needs (1.37 locks DRAPrioritizedList and DRAAdminAccess on, so cases that turn them off run at 1.35).
RUNS = [(c, v) for c in CASES for v in c.versions if c.runs_at(v)]


@pytest.mark.parametrize(("case", "version"), RUNS, ids=[f"{c.name}@{v}" for c, v in RUNS])
def test_upstream_allocator_case(case: Case, version: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, results = run_case(case, tmp_path, capsys, version)
    assert [r["claim"] for r in results] == [f"default/{c['metadata']['name']}" for c in case.claims]
    if isinstance(case.expect, str):
        assert rc == 1 and results
        for r in results:
            assert r["outcome"] in ("error", "unschedulable") and case.expect in r["message"], r
        if case.expect != "invalid resource pools were encountered":
            assert {r["outcome"] for r in results} == {"error"}
    elif case.expect is None:
        assert rc == 1 and all(r["outcome"] == "unschedulable" and r["allocation"] is None for r in results), results
        assert all(r["message"].startswith("cannot allocate all claims") for r in results)
    else:
        assert rc == 0, results
        assert [r["outcome"] for r in results] == ["allocated"] * len(case.expect)
        assert [r["node"] for r in results] == [case.node] * len(case.expect)
        assert [_normalize(r["allocation"]) for r in results] == [_normalize(e) for e in case.expect]


def test_transcribed_case_count() -> None:
    assert len({(c.name, c.versions) for c in CASES}) == len(CASES) and len({c.name for c in CASES}) >= 150
    assert len([r for r in RUNS if r[1] == "1.37"]) >= 150


def _write(tmp_path: Path, objs: list[dict[str, Any]]) -> str:
    path = tmp_path / "in.yaml"
    path.write_text(yaml.safe_dump_all(objs))
    return str(path)


def test_unknown_feature_gate_is_an_input_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, CASES[1].objects())
    assert main(["allocate", "-f", path, "--feature", "DRANoSuchGate", "-o", "json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert "unknown feature gate 'DRANoSuchGate'" in doc["errors"][0] and "DRAPrioritizedList" in doc["errors"][0]


def _kubernetes_text_then_hint(message: str, text: str) -> bool:
    """Kubernetes' text ends the message, or is followed only by our suggestion (what the device has, the closest
    attribute name)."""
    head, found, tail = message.partition(text)
    return bool(found) and (tail == "" or tail.startswith(("; did you mean ", " (device ")))


HINT = (". consider using CEL optional chaining (.? followed by orValue()) or guarding the check with has() for "
        "optional fields")


@pytest.mark.parametrize(("version", "text"), [
    ("1.35", "claim default/claim-0: selector #0: CEL runtime error: no such key: missing"),
    ("1.36", "claim default/claim-0: selector #0: CEL runtime error: no such key: missing"),
    ("1.37", "claim default/claim-0: selector #0 on device driver-a/pool-1/device-1: CEL runtime error: "
             "no such key: missing" + HINT),
])
def test_cel_runtime_error_is_fatal_with_kubernetes_text(version: str, text: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    case = Case("runtime", [c0(req("req-0", CLASS_A, 1, 'device.attributes["driver-a"].missing'))], [CA],
                [one("slice-1", NODE1, P1, A)], text)
    rc, results = run_case(case, tmp_path, capsys, version)
    assert rc == 1 and results[0]["outcome"] == "error" and _kubernetes_text_then_hint(results[0]["message"], text), results


@pytest.mark.parametrize(("version", "text"), [
    ("1.35", "class class-a: selector #0: CEL runtime error: no such key: missing"),
    ("1.37", "class class-a: selector #0 on device driver-a/pool-1/device-1: CEL runtime error: no such key: missing"
             + HINT),
])
def test_class_selector_runtime_error_names_the_class(version: str, text: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    case = Case("runtime", [simple_claim()], [klass(CLASS_A, A, 'device.attributes["driver-a"].missing')],
                [one("slice-1", NODE1, P1, A)], text)
    rc, results = run_case(case, tmp_path, capsys, version)
    assert rc == 1 and results[0]["outcome"] == "error" and _kubernetes_text_then_hint(results[0]["message"], text), results


def test_other_runtime_errors_get_no_hint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = Case("runtime", [c0(req("req-0", CLASS_A, 1, '1/0 == 1'))], [CA], [one("slice-1", NODE1, P1, A)], "")
    rc, results = run_case(case, tmp_path, capsys, "1.37")
    message = results[0]["message"]
    assert rc == 1 and "selector #0 on device driver-a/pool-1/device-1: CEL runtime error: " in message
    assert "optional chaining" not in message


def test_locked_gate_cannot_be_turned_off_at_1_37(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, CASES[1].objects())
    assert main(["allocate", "-f", path, "--feature", "DRAPrioritizedList=false", "-o", "json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["errors"] == ["--feature 'DRAPrioritizedList=false': cannot set feature gate DRAPrioritizedList to "
                             "false, feature is locked to true in Kubernetes 1.37"]
    assert main(["allocate", "-f", path, "--kubernetes-version", "1.35", "--feature", "DRAPrioritizedList=false",
                 "-o", "json"]) == 0
    capsys.readouterr()


def test_unsupported_kubernetes_version_is_an_input_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, CASES[1].objects())
    assert main(["allocate", "-f", path, "--kubernetes-version", "1.33", "-o", "json"]) == 2
    assert "supported versions are 1.34, 1.35, 1.36, 1.37" in json.loads(capsys.readouterr().out)["errors"][0]


# ---- list-type attributes (KEP-5491, DRAListTypeAttributes: alpha in 1.36 and 1.37) -----------------------------
# Upstream's Features{ListTypeAttributes: true} is `--feature DRAListTypeAttributes=true` at 1.37.

def s_(value: str) -> dict[str, Any]:
    return {"string": value}


def _la(*devices: tuple[str, str, Any]) -> list[dict[str, Any]]:
    return [slice_("slice-1", NODE1, P1, A, *(dev(d, None, {attr: value}) for d, attr, value in devices))]


def _lc(kind: str, attr: str, *counts: int) -> dict[str, Any]:
    constraint = {kind: f"{A}/{attr}"}
    return c0(*(req("req-0", CLASS_A, n) for n in counts), constraints=[constraint])


M, DA = "matchAttribute", "distinctAttribute"
STR, INT_, BOOL_, VER = "stringAttribute", "numa", "boolAttribute", "driverVersion"
LIST_RUNS = [
    Case("list-attributes-match-constaint-scalar-string-values", [_lc(M, STR, 2)], [CA],
         _la((D1, STR, s_("value1")), (D2, STR, s_("value1"))), [local(res("req-0", A, P1, D1), res("req-0", A, P1, D2))]),
    Case("list-attributes-match-constaint-list-of-string-values-with-common-elements", [_lc(M, STR, 2)], [CA],
         _la((D1, STR, {"strings": ["value1", "value2", "value3"]}), (D2, STR, {"strings": ["value2", "value3", "value4"]})),
         [local(res("req-0", A, P1, D1), res("req-0", A, P1, D2))]),
    Case("list-attributes-match-constaint-list-of-string-values-with-partially-common-elements", [_lc(M, STR, 3)], [CA],
         _la((D1, STR, {"strings": ["value1", "value2"]}), (D2, STR, {"strings": ["value2", "value3"]}),
             (D3, STR, {"strings": ["value3", "value1"]})), None),
    Case("list-attributes-match-constaint-list-of-string-values-without-common-elements", [_lc(M, STR, 1, 1)], [CA],
         _la((D1, STR, {"strings": ["value1", "value2"]}), (D2, STR, {"strings": ["value3", "value4"]})), None),
    Case("list-attributes-match-constaint-mixed-scalar-and-list-of-string-values-with-common-elements", [_lc(M, STR, 2)], [CA],
         _la((D1, STR, s_("value1")), (D2, STR, {"strings": ["value1", "value2"]})),
         [local(res("req-0", A, P1, D1), res("req-0", A, P1, D2))]),
    Case("list-attributes-match-constaint-mixed-scalar-and-list-of-string-values-with-partially-common-elements",
         [_lc(M, STR, 3)], [CA],
         _la((D1, STR, s_("value1")), (D2, STR, {"strings": ["value1", "value2"]}), (D3, STR, {"strings": ["value2", "value3"]})),
         None),
    Case("list-attributes-match-constaint-mixed-scalar-and-list-of-string-values-without-common-elements", [_lc(M, STR, 2)], [CA],
         _la((D1, STR, s_("value1")), (D2, STR, {"strings": ["value2", "value3"]})), None),
    Case("list-attributes-match-constaint-list-of-int-values-with-common-elements", [_lc(M, INT_, 2)], [CA],
         _la((D1, INT_, {"ints": [0, 1, 2]}), (D2, INT_, {"ints": [1, 2, 3]})), [local(res("req-0", A, P1, D1), res("req-0", A, P1, D2))]),
    Case("list-attributes-match-constaint-list-of-bool-values-with-common-elements", [_lc(M, BOOL_, 2)], [CA],
         _la((D1, BOOL_, {"bools": [True, False]}), (D2, BOOL_, {"bools": [True]})),
         [local(res("req-0", A, P1, D1), res("req-0", A, P1, D2))]),
    Case("list-attributes-match-constaint-list-of-version-values-with-common-elements", [_lc(M, VER, 2)], [CA],
         _la((D1, VER, {"versions": ["1.0.0", "1.1.0", "2.0.0"]}), (D2, VER, {"versions": ["1.1.0", "2.0.0", "2.1.0"]})),
         [local(res("req-0", A, P1, D1), res("req-0", A, P1, D2))]),
    Case("list-attributes-match-constaint-with-empty-or-unknown-type", [_lc(M, STR, 2)], [CA],
         _la((D1, STR, {}), (D2, STR, {"strings": []})), "unsupported attribute value"),
    Case("list-attributes-distinct-constraint-scalar-string-values-all-distinct", [_lc(DA, STR, 2)], [CA],
         _la((D1, STR, s_("value1")), (D2, STR, s_("value2"))), [local(res("req-0", A, P1, D1), res("req-0", A, P1, D2))]),
    Case("list-attributes-distinct-constraint-scalar-string-values-not-distinct", [_lc(DA, STR, 2)], [CA],
         _la((D1, STR, s_("value1")), (D2, STR, s_("value1"))), None),
    Case("list-attributes-distinct-constraint-list-of-string-values-all-distinct", [_lc(DA, STR, 2)], [CA],
         _la((D1, STR, {"strings": ["value1", "value2"]}), (D2, STR, {"strings": ["value2", "value3"]}),
             (D3, STR, {"strings": ["value3", "value4"]})), [local(res("req-0", A, P1, D1), res("req-0", A, P1, D3))]),
    Case("list-attributes-distinct-constraint-list-of-string-values-with-common-elements", [_lc(DA, STR, 2)], [CA],
         _la((D1, STR, {"strings": ["value1", "value2", "value3"]}), (D2, STR, {"strings": ["value2", "value4", "value5"]})), None),
    Case("list-attributes-distinct-constraint-mixed-scalar-and-list-all-distinct", [_lc(DA, STR, 2)], [CA],
         _la((D1, STR, s_("value1")), (D2, STR, {"strings": ["value1", "value2"]}), (D3, STR, {"strings": ["value2", "value3"]})),
         [local(res("req-0", A, P1, D1), res("req-0", A, P1, D3))]),
    Case("list-attributes-distinct-constraint-mixed-scalar-and-list-with-common-elements", [_lc(DA, STR, 2)], [CA],
         _la((D1, STR, s_("value1")), (D2, STR, {"strings": ["value1", "value2"]})), None),
    Case("list-attributes-distinct-constraint-list-of-int-values-all-distinct", [_lc(DA, INT_, 2)], [CA],
         _la((D1, INT_, {"ints": [0, 1]}), (D2, INT_, {"ints": [1, 2]}), (D3, INT_, {"ints": [2, 3]})),
         [local(res("req-0", A, P1, D1), res("req-0", A, P1, D3))]),
    Case("list-attributes-distinct-constraint-list-of-bool-values-all-distinct", [_lc(DA, BOOL_, 2)], [CA],
         _la((D1, BOOL_, {"bools": [True]}), (D2, BOOL_, {"bools": [True, False]}), (D3, BOOL_, {"bools": [False]})),
         [local(res("req-0", A, P1, D1), res("req-0", A, P1, D3))]),
    Case("list-attributes-distinct-constraint-list-of-version-values-all-distinct", [_lc(DA, VER, 2)], [CA],
         _la((D1, VER, {"versions": ["1.0.0", "1.1.0"]}), (D2, VER, {"versions": ["1.1.0", "2.0.0"]}),
             (D3, VER, {"versions": ["2.0.0", "2.1.0"]})), [local(res("req-0", A, P1, D1), res("req-0", A, P1, D3))]),
    Case("list-attributes-distinct-constaint-with-empty-or-unknown-type", [_lc(DA, VER, 2)], [CA],
         _la((D1, VER, {"versions": []}), (D2, VER, {})), "unsupported attribute value"),
]
LIST_DISABLED = [
    Case("list-attributes-disabled-match-constraint-with-lists", [_lc(M, STR, 2)], [CA],
         _la((D1, STR, {"strings": ["value1", "value2", "value3"]}), (D2, STR, {"strings": ["value2", "value3", "value4"]})), None),
    Case("list-attributes-disabled-distinct-constraint-with-lists", [_lc(DA, STR, 2)], [CA],
         _la((D1, STR, {"strings": ["value1", "value2", "value3"]}), (D2, STR, {"strings": ["value2", "value3", "value4"]})), None,
         features=("ConsumableCapacity",)),
]


@pytest.mark.parametrize("case", LIST_RUNS, ids=[c.name for c in LIST_RUNS])
def test_upstream_list_attribute_case(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "in.yaml"
    path.write_text(yaml.safe_dump_all(case.objects()))
    rc = main(["allocate", "-f", str(path), "--node", case.node, "--feature", "DRAListTypeAttributes=true", "-o", "json"])
    results = json.loads(capsys.readouterr().out)["results"]
    _check(case, rc, results)


@pytest.mark.parametrize("case", LIST_DISABLED, ids=[c.name for c in LIST_DISABLED])
def test_upstream_list_attribute_case_gate_off(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, results = run_case(case, tmp_path, capsys, "1.37")
    _check(case, rc, results)


def _check(case: Case, rc: int, results: list[dict[str, Any]]) -> None:
    if isinstance(case.expect, str):
        assert rc == 1 and all(r["outcome"] == "error" and case.expect in r["message"] for r in results), results
    elif case.expect is None:
        assert rc == 1 and all(r["outcome"] == "unschedulable" for r in results), results
    else:
        assert rc == 0, results
        assert [_normalize(r["allocation"]) for r in results] == [_normalize(e) for e in case.expect]
