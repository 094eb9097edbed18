""""Did you mean" for the names users get wrong outside selectors: constraint attributes and DeviceClasses."""

from __future__ import annotations

from typing import Any

import pytest

from controller.allocator import AllocationError, Allocator, ClusterSnapshot, parse_claim
from controller.cel import CelEnvironment
from controller.cel.errors import closest_class
from controller.diagnosis import Diagnoser
from gpudra.features import Features
from tests.alloc_fixtures import claim, device, klass, request, slice_

GPU = "gpu.nvidia.com"
CEL = CelEnvironment()
# NVIDIA's DeviceClasses (manifests/), where a GPU and a MIG class differ in their first label only.
CLASSES = ["compute-domain-daemon.nvidia.com", "compute-domain-default-channel.nvidia.com", "gpu.nvidia.com",
           "mig.nvidia.com"]


def snapshot() -> ClusterSnapshot:
    devices = [device(f"gpu-{i}", {"type": "gpu", "productName": "NVIDIA H100 80GB HBM3", "nvlinkDomain": "d0",
                                   "pcieRoot": f"pci000{i // 2}"}) for i in range(4)]
    return ClusterSnapshot([slice_("s", "n1", "p", devices, driver=GPU)], [klass(n) for n in CLASSES], [])


def constrained(kind: str, attribute: str) -> Any:
    return parse_claim(claim(requests=[request("gpus", cls=GPU, count=2)], constraints=[{kind: attribute}]))


def test_a_misspelt_match_attribute_is_named_with_what_the_devices_publish() -> None:
    r = Diagnoser(snapshot(), cel_env=CEL).explain_node("n1", [constrained("matchAttribute", f"{GPU}/nvlinkDomian")])
    assert r.code == "constraint"
    assert r.message == (f"constraint #0 of claim default/claim-0 (matchAttribute: {GPU}/nvlinkDomian): none of the 4 free "
                         f"devices has attribute {GPU}/nvlinkDomian; did you mean {GPU}/nvlinkDomain?")
    # A wrong domain, and a name of the same meaning.
    r = Diagnoser(snapshot(), cel_env=CEL).explain_node("n1", [constrained("matchAttribute", "nvidia.com/nvlinkDomain")])
    assert r.message.endswith(f"; did you mean {GPU}/nvlinkDomain?")
    r = Diagnoser(snapshot(), cel_env=CEL).explain_node("n1", [constrained("matchAttribute", f"{GPU}/numa")])
    assert r.message.endswith(f"has attribute {GPU}/numa")  # no device publishes numaNode: nothing to offer


def test_a_misspelt_distinct_attribute_is_named_too() -> None:
    features = Features.parse(["DRAConsumableCapacity"])
    r = Diagnoser(snapshot(), features, cel_env=CEL).explain_node("n1", [constrained("distinctAttribute", f"{GPU}/pciRoot")])
    assert r.code == "constraint" and r.message.endswith(f"; did you mean {GPU}/pcieRoot?")


@pytest.mark.parametrize("typed", ["nvidia.com/gpu", "nvidia-gpu", "gpus.nvidia.com", "gpu.nvidia.co", "nvidia.gpu.com",
                                   "h100.nvidia.com", "gpu.example.com", "GPU"])
def test_a_wrong_class_name_is_offered_the_class_it_means(typed: str) -> None:
    c = parse_claim(claim(requests=[request("gpu", cls=typed)]))
    with pytest.raises(AllocationError) as err:
        Allocator(snapshot(), cel_env=CEL).allocate("n1", [c])
    assert f'deviceclass.resource.k8s.io "{typed}" not found; did you mean gpu.nvidia.com? (DeviceClasses: ' in str(err.value)


def test_class_hints_by_meaning_and_none_when_unsure() -> None:
    assert closest_class("nvidia-mig", CLASSES) == "mig.nvidia.com"
    assert closest_class("mig-1g.10gb", CLASSES) == "mig.nvidia.com"
    assert closest_class("compute-domain.nvidia.com", CLASSES) == "compute-domain-daemon.nvidia.com"
    assert closest_class("nvidia.com", CLASSES) is None  # as close to gpu as to mig: no guess
    assert closest_class("tpu.google.com", CLASSES) is None
