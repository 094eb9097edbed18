"""Explanations name the top-level term of a selector that is false, with the device's value (a user once had to
bisect `memory >= 80Gi` by hand: an H100 80GB publishes 81559Mi)."""

from __future__ import annotations

from typing import Any

import pytest

from controller.allocator import ClusterSnapshot, parse_claim
from controller.cel import CelEnvironment, DeviceView
from controller.cel.terms import describe, false_terms, top_level_terms
from controller.diagnosis import Diagnoser
from controller_helpers import DRIVER, create_all, events_for, gpu_class, manager, node, pod, sim_slices
from tests.alloc_fixtures import claim, device, klass, request, slice_

GPU = "gpu.nvidia.com"
CEL = CelEnvironment()
MEMORY_80GI = f'device.capacity["{GPU}"].memory.compareTo(quantity("80Gi")) >= 0'


def gpu(name: str, product: str = "NVIDIA H100 80GB HBM3", memory: str = "81559Mi") -> dict[str, Any]:
    return device(name, {"type": "gpu", "productName": product}, capacity={"memory": {"value": memory}})


def node_with(devices: list[dict[str, Any]], class_selectors: list[str] | None = None) -> Diagnoser:
    cls = klass(GPU, selectors=class_selectors or [f'device.driver == "{GPU}"'])
    return Diagnoser(ClusterSnapshot([slice_("s", "n1", "p", devices, driver=GPU)], [cls], []), cel_env=CEL)


def asking(*selectors: str) -> Any:
    return parse_claim(claim(requests=[request("gpu", cls=GPU, selectors=[{"cel": {"expression": e}} for e in selectors])]))


def test_the_false_term_is_named_with_the_devices_value() -> None:
    h100s = node_with([gpu(f"gpu-{i}") for i in range(8)])
    r = h100s.explain_node("n1", [asking(MEMORY_80GI)])
    assert r.code == "selector"
    assert r.message == (f"none of the 8 devices of class {GPU} matches selector #0 of request gpu of claim default/claim-0: "
                         "memory 81559Mi >= 80Gi is false on all 8 devices")


def test_only_the_false_term_of_a_conjunction_is_named() -> None:
    selector = (f'device.attributes["{GPU}"].type == "gpu" && ({MEMORY_80GI} && '
                f'device.attributes["{GPU}"].productName.startsWith("NVIDIA H100"))')
    r = node_with([gpu(f"gpu-{i}") for i in range(2)]).explain_node("n1", [asking(selector)])
    assert r.message.endswith(": memory 81559Mi >= 80Gi is false on all 2 devices")


def test_devices_that_fail_different_terms_are_counted_apart() -> None:
    selector = f'device.attributes["{GPU}"].productName.contains("H100") && device.capacity["{GPU}"].memory.isGreaterThan(quantity("90Gi"))'
    devices = [gpu(f"a{i}", "NVIDIA A100-SXM4-40GB", "40Gi") for i in range(3)] + [gpu("h0")]
    r = node_with(devices).explain_node("n1", [asking(selector)])
    assert r.message.endswith(': productName "NVIDIA A100-SXM4-40GB" contains "H100" is false on 3 devices; '
                              "memory 81559Mi > 90Gi is false on 1 device")


def test_a_class_selector_is_explained_alike() -> None:
    class_selector = f'device.driver == "{GPU}" && device.attributes["{GPU}"].productName == "NVIDIA B200"'
    r = node_with([gpu("gpu-0"), gpu("gpu-1", memory="80Gi")], [class_selector]).explain_node("n1", [asking()])
    assert r.message == (f'no device matches selector #0 of class {GPU}: productName "NVIDIA H100 80GB HBM3" == "NVIDIA B200" '
                         "is false on all 2 devices")


@pytest.mark.parametrize(("expression", "terms"), [
    ('a && b', ["a", "b"]),
    ('((a)) && (b || c) && d', ["a", "b || c", "d"]),
    ('(a && (b)) && c', ["a", "b", "c"]),
    ('x.contains("(&&") && y == \'))\'', ['x.contains("(&&")', "y == '))'"]),
    ('a || b && c', ["a || b && c"]),  # && binds tighter: not a conjunction at the top
    ('f(a && b)', ["f(a && b)"]),
])
def test_terms_are_split_at_top_level_ands_only(expression: str, terms: list[str]) -> None:
    assert [t.text for t in top_level_terms(expression, CEL.parse(expression))] == terms


def test_an_unrecognised_form_is_shown_as_written_with_the_values_it_reads() -> None:
    view = DeviceView.from_slice_device(GPU, gpu("gpu-0"))
    expression = f'device.attributes["{GPU}"].productName.lowerAscii().contains("a100")'
    (term,) = top_level_terms(expression, CEL.parse(expression))
    assert describe(term, [view]) == f'{expression} (productName "NVIDIA H100 80GB HBM3")'
    assert false_terms([term], CEL.compile, [view]) == f'{expression} (productName "NVIDIA H100 80GB HBM3") is false on 1 device'


def test_a_term_that_fails_to_run_is_passed_over() -> None:
    # `has(...) && ...`-style guards: the second term errors where the first is false, and && is false there.
    expression = f'device.attributes["{GPU}"].profile == "1g.10gb" && device.attributes["{GPU}"].type == "mig"'
    view = DeviceView.from_slice_device(GPU, gpu("gpu-0"))
    assert false_terms(top_level_terms(expression, CEL.parse(expression)), CEL.compile, [view]) == \
        'type "gpu" == "mig" is false on 1 device'


def test_the_controllers_event_names_the_false_term(apiserver: Any) -> None:
    """The embedded scheduler's explanation (Event and claim annotation) on a DGX H100 node, whose GPUs publish
    81559Mi of memory: a selector asking for 80Gi is false on every one of them."""
    api = apiserver.api
    create_all(api, [gpu_class(), node("h100"), *sim_slices("h100", "sim:dgx-h100")])
    selector = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("80Gi")) >= 0'
    create_all(api, [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                      "metadata": {"name": "big", "namespace": "default"},
                      "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                          "deviceClassName": GPU, "selectors": [{"cel": {"expression": selector}}]}}]}}}},
                     pod("trainer", templates={"gpu": "big"})])
    ctl = manager(api)
    for _ in range(2):
        ctl.step()
    messages = [e["message"] for e in events_for(api, "trainer") if e["reason"] == "GpuDraUnschedulable"]
    assert messages and messages[-1].endswith("memory 81559Mi >= 80Gi is false on all 8 devices")
