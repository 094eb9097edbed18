"""Who an explanation blames: the class when the class excludes the node's devices, a capacity or counter as used
up when others used it, and never "N in use" when the node has too few devices in all."""

from __future__ import annotations

from typing import Any

from controller.allocator import ClusterSnapshot, parse_claim
from controller.cel import CelEnvironment
from controller.diagnosis import Diagnoser, explain
from controller.pending import unavailable_message
from gpudra.features import Features
from tests.alloc_fixtures import allocation, claim, device, klass, request, slice_

GPU = "gpu.nvidia.com"
CEL = CelEnvironment()
H100_CLASS = klass("h100", selectors=[f'device.attributes["{GPU}"].productName.startsWith("NVIDIA H100")'])
MEMORY = f'device.capacity["{GPU}"].memory.compareTo(quantity("40Gi")) >= 0'


def gpus(node: str, product: str, n: int) -> dict[str, Any]:
    devices = [device(f"gpu-{i}", {"productName": product}, capacity={"memory": {"value": "81559Mi"}}) for i in range(n)]
    return slice_(f"{node}-gpus", node, node, devices, driver=GPU)


def test_the_class_is_blamed_on_a_node_it_excludes_even_where_the_request_selector_fails_too() -> None:
    # The request asks for more memory than the A100 node's GPUs have, but the class never wanted them at all.
    slices = [gpus("a100-node", "NVIDIA A100-SXM4-40GB", 4), gpus("h100-node", "NVIDIA H100 80GB HBM3", 2)]
    held = claim("training", requests=[request("gpu", cls="h100", count=2)],
                 allocation=allocation("h100-node", ("h100-node", "gpu-0"), ("h100-node", "gpu-1"), driver=GPU, request_name="gpu"))
    snapshot = ClusterSnapshot(slices, [H100_CLASS], [held])
    c = parse_claim(claim(requests=[request("gpu", cls="h100", selectors=[{"cel": {"expression": MEMORY}}])]))
    reasons = explain(snapshot, [c], ["a100-node", "h100-node"], cel_env=CEL)
    message = unavailable_message(2, reasons)
    assert message == ('0/2 nodes are available: 1 node: no device matches selector #0 of class h100: productName '
                       '"NVIDIA A100-SXM4-40GB" starts with "NVIDIA H100" is false on all 4 devices; 1 node: request gpu of '
                       'claim default/claim-0 needs 1 device; usable: 0 of 2 matching: 2 in use by default/training')
    assert "of request" not in message


def test_shared_counters_used_up_are_named_and_said_used_up() -> None:
    counters = slice_("counters", "n1", "pool", [], count=2, driver=GPU,
                      sharedCounters=[{"name": "gpu-0-counters", "counters": {"memorySlices": {"value": "8"}}}])
    del counters["spec"]["devices"]
    parts = [device(f"gpu-0-mig-{i}", consumesCounters=[{"counterSet": "gpu-0-counters", "counters": {"memorySlices": {"value": "4"}}}])
             for i in range(3)]
    held = claim("old", requests=[request("gpu", cls="any")],
                 allocation=allocation("n1", ("pool", "gpu-0-mig-0"), ("pool", "gpu-0-mig-1"), driver=GPU, request_name="gpu"))
    snapshot = ClusterSnapshot([counters, slice_("parts", "n1", "pool", parts, count=2, driver=GPU)], [klass("any")], [held])
    r = Diagnoser(snapshot, Features.parse(["DRAPartitionableDevices"]), cel_env=CEL).explain_node(
        "n1", [parse_claim(claim(requests=[request("gpu", cls="any")]))])
    assert r.code == "in-use"
    assert r.message.endswith("2 in use by default/old, 1 whose shared counters are used up by allocated devices "
                              "[gpu-0-counters/memorySlices: 0 of 8 left, 4 needed]")


def test_counters_with_the_gate_off_are_not_called_used_up() -> None:
    counters = slice_("counters", "n1", "pool", [], count=2, driver=GPU,
                      sharedCounters=[{"name": "gpu-0-counters", "counters": {"memorySlices": {"value": "8"}}}])
    del counters["spec"]["devices"]
    parts = [device(f"gpu-0-mig-{i}", consumesCounters=[{"counterSet": "gpu-0-counters", "counters": {"memorySlices": {"value": "4"}}}])
             for i in range(2)]
    snapshot = ClusterSnapshot([counters, slice_("parts", "n1", "pool", parts, count=2, driver=GPU)], [klass("any")], [])
    r = Diagnoser(snapshot, Features.parse(["DRAPartitionableDevices=false"]), cel_env=CEL).explain_node(
        "n1", [parse_claim(claim(requests=[request("gpu", cls="any")]))])
    assert r.code == "counters"
    assert r.message.endswith("usable: 0 of 2 matching: 2 that consume shared counters, which need the "
                              "DRAPartitionableDevices feature")
