"""The allocator keeps a device's CEL view only when an evaluation stored data in it."""

from __future__ import annotations

from controller.allocator import Allocator, ClusterSnapshot
from controller.cel import CelEnvironment
from gpudra.features import Features
from tests.alloc_fixtures import DRIVER, claim, device, klass, request, slice_

NODE = "node-1"


def _kept_views(selector: str) -> list[bool]:
    devices = [device(f"dev-{i}", {"model": "a", "index": i}) for i in range(4)]
    snapshot = ClusterSnapshot([slice_("s", NODE, "pool", devices)], [klass("class-a", [selector])])
    out = Allocator(snapshot, Features(), CelEnvironment()).allocate(NODE, [claim(requests=[request(count=4)])])
    assert isinstance(out, list) and len(out[0]["devices"]["results"]) == 4
    return [d._view is not None for d in snapshot.slices[0].devices]


def test_devices_answered_from_shared_results_keep_no_view() -> None:
    # One evaluation (the first device) answers the other three by the value they share.
    assert _kept_views(f'device.attributes["{DRIVER}"].model == "a"') == [True, False, False, False]


def test_devices_evaluated_one_by_one_keep_their_view() -> None:
    # Reads the whole attribute map: no shared results, every device is evaluated and keeps its data.
    assert _kept_views(f'size(device.attributes["{DRIVER}"]) == 2') == [True, True, True, True]
