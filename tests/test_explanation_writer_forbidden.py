"""The explainer keeps posting when it may not read Events (403): no exception escapes, one log line."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

import pytest

from controller.explanation_writer import ExplanationWriter, event_name
from controller.metrics import ControllerMetrics
from controller.writes import Writer
from gpudra.kubeapi import ApiError, KubeApi

POD = {"metadata": {"name": "train-0", "namespace": "default", "uid": "uid-train-0"}}


class _ForbidEventReads:
    """Wraps the real API: GET of an Event answers 403 as an API server whose RBAC lacks `get events` does."""

    def __init__(self, api: KubeApi) -> None:
        self._api = api
        self.denied = 0

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        if kind == "Event":
            self.denied += 1
            raise ApiError(403, "Forbidden", f'events "{name}" is forbidden: User "system:serviceaccount:x" cannot get resource "events"')
        return self._api.get(kind, name, namespace=namespace)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)


def _explainer(api: Any, clock: list[float]) -> ExplanationWriter:
    writer = Writer(api, ControllerMetrics(), may_write=lambda: True, observe=lambda k, o: None, forget=lambda k, o: None)
    return ExplanationWriter(
        writer, ControllerMetrics(), driver_name="gpu.nvidia.com", identity="test", clock=lambda: clock[0],
        wall=lambda: datetime(2026, 1, 1, tzinfo=timezone.utc), repeat_interval=60.0,
    )


def _event(api: KubeApi) -> dict[str, Any]:
    return api.get("Event", event_name(POD, "GpuDraUnschedulable"), namespace="default")


def test_explainer_refreshes_events_by_patch_under_a_403_on_read(apiserver: Any, caplog: pytest.LogCaptureFixture) -> None:
    forbidden = _ForbidEventReads(apiserver.api)
    clock = [0.0]
    first = _explainer(forbidden, clock)
    assert first.event(POD, "GpuDraUnschedulable", "0/2 nodes: no free GPU")
    assert _event(apiserver.api)["count"] == 1

    with caplog.at_level(logging.WARNING, logger="gpudra.controller.explanation_writer"):
        # A changed message: the writer would read the stored event to update it; the read is refused.
        assert first.event(POD, "GpuDraUnschedulable", "0/2 nodes: 1 GPU free, 2 requested")
        stored = _event(apiserver.api)
        assert stored["message"] == "0/2 nodes: 1 GPU free, 2 requested" and stored["count"] == 2
        # A restarted controller (no memory): create says it exists, the read is refused, the patch refreshes it.
        second = _explainer(forbidden, clock)
        assert second.event(POD, "GpuDraUnschedulable", "0/2 nodes: still no free GPU")
        assert _event(apiserver.api)["message"] == "0/2 nodes: still no free GPU"
        # The same message again after the repeat interval: refreshed, and still no exception.
        clock[0] = 120.0
        assert second.event(POD, "GpuDraUnschedulable", "0/2 nodes: still no free GPU")
    assert forbidden.denied == 3
    warnings = [r for r in caplog.records if "cannot read events" in r.getMessage()]
    # Once per explainer (two here: the first and the "restarted" one), not once per refused read.
    assert len(warnings) == 2
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == warnings


def test_controller_pass_completes_when_event_reads_are_forbidden(apiserver: Any) -> None:
    """A restarted controller re-explains a pending pod whose Event exists: create says AlreadyExists, the read is
    refused. The pass must finish (gangs, the other pods' explanations) instead of aborting every tick."""
    from controller.explanation_writer import REASON_UNSCHEDULABLE
    from controller_helpers import claim, claims_of, create_all, events_for, gpu_class, gpu_slice, manager, node, pod

    api = apiserver.api
    create_all(api, [gpu_class(), node("node-a"), gpu_slice("node-a", [("g0", "nvl"), ("g1", "nvl")]),
                     claim("large", 3), pod("waiting", claims={"gpu": "large"})])
    assert manager(api, embedded=False).step().pods_unschedulable == 1
    forbidden = _ForbidEventReads(api)
    create_all(api, [claim("huge", 4), pod("waiting-2", claims={"gpu": "huge"})])
    report = manager(forbidden, embedded=False).step()  # type: ignore[arg-type]
    assert report.ran and report.pods_unschedulable == 2
    assert forbidden.denied >= 1
    (event,) = [e for e in events_for(api, "waiting") if e["reason"] == REASON_UNSCHEDULABLE]
    assert event["count"] == 1  # refreshed by a patch that leaves the stored count alone (no memory of it)
    assert [e for e in events_for(api, "waiting-2") if e["reason"] == REASON_UNSCHEDULABLE]
    assert "gpu.nvidia.com/explanation" in claims_of(api)["huge"]["metadata"]["annotations"]
