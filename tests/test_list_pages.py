"""KubeApi.list_pages against the embedded control plane, and the device plugin shim's claim relist page by page."""

from __future__ import annotations

from typing import Any

import pytest

import driver.allocatedclaims as allocatedclaims
from driver.allocatedclaims import AllocatedClaims
from tests.plugin_helpers import DRIVER, NODE, create_allocated_claim


def test_pages_cover_the_list_once(apiserver: Any) -> None:
    api = apiserver.api
    for i in range(7):
        create_allocated_claim(api, f"c{i}", [("gpu", f"gpu-{i}")], allocate=False)
    pages = list(api.list_pages("ResourceClaim", limit=3))
    assert [len(p) for p, _ in pages] == [3, 3, 1]
    names = [c["metadata"]["name"] for p, _ in pages for c in p]
    assert sorted(names) == [f"c{i}" for i in range(7)] and all(c["kind"] == "ResourceClaim" for p, _ in pages for c in p)
    items, rv = api.list("ResourceClaim")
    assert len(items) == 7 and rv


def test_relist_keeps_this_nodes_claims_from_every_page(apiserver: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    api = apiserver.api
    monkeypatch.setattr(allocatedclaims, "LIST_PAGE_SIZE", 2)
    for i in range(5):
        create_allocated_claim(api, f"mine{i}", [("gpu", f"gpu-{i}")])
        create_allocated_claim(api, f"other{i}", [("gpu", f"gpu-{i}")], pool="node-b")
    view = AllocatedClaims(api, DRIVER, NODE)
    assert view.resync()
    assert sorted(view.snapshot()) == [f"gpu-{i}" for i in range(5)]
