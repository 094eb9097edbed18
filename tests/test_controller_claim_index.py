"""Resolving pods' template claims through the per-pass index gives what a scan of every claim gives."""

from __future__ import annotations

from typing import Any

from controller.claims import GeneratedClaims, generated_claim_for, resolve_pod_claims
from controller.objects import POD_CLAIM_NAME_ANNOTATION


def _pod(name: str, uid: str, namespace: str = "default", status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one"},
                                        {"name": "shared", "resourceClaimName": "team-claim"}]},
            "status": status or {}}


def _generated(name: str, owner_uid: str, pod_claim: str = "gpu", namespace: str = "default",
               controller: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "annotations": {POD_CLAIM_NAME_ANNOTATION: pod_claim},
                         "ownerReferences": [{"kind": "Pod", "name": "x", "uid": owner_uid, "controller": controller}]}}


CLAIMS = [
    _generated("other-ns", "uid-a", namespace="elsewhere"),
    _generated("other-pod", "uid-b"),
    _generated("other-pod-claim", "uid-a", pod_claim="scratch"),
    _generated("not-controller", "uid-a", controller=False),
    _generated("first", "uid-a"),
    _generated("second", "uid-a"),
]


def test_index_and_scan_agree_and_the_first_match_wins() -> None:
    pod = _pod("a", "uid-a")
    by_scan = resolve_pod_claims(pod, CLAIMS)
    by_index = resolve_pod_claims(pod, GeneratedClaims(CLAIMS))
    assert by_scan == by_index
    assert [(pc.pod_claim_name, pc.template, pc.claim_name) for pc in by_index] == [
        ("gpu", "one", "first"), ("shared", None, "team-claim")]
    assert generated_claim_for(pod, "gpu", CLAIMS) == CLAIMS[4]


def test_no_claim_yet_and_status_takes_precedence() -> None:
    index = GeneratedClaims(CLAIMS)
    assert resolve_pod_claims(_pod("c", "uid-c"), index)[0].claim_name is None
    recorded = _pod("a", "uid-a", status={"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "recorded"}]})
    assert resolve_pod_claims(recorded, index)[0].claim_name == "recorded"


def test_claims_added_during_a_pass_are_found() -> None:
    index = GeneratedClaims()
    pod = _pod("d", "uid-d")
    assert index.find(pod, "gpu") is None
    index.add(_generated("d-gpu-x1", "uid-d"))
    index.add(_generated("d-gpu-x2", "uid-d"))
    found = index.find(pod, "gpu")
    assert found is not None and found["metadata"]["name"] == "d-gpu-x1"


def test_malformed_claims_are_skipped_not_fatal() -> None:
    odd: list[dict[str, Any]] = [
        {"metadata": {"name": "no-owner", "annotations": {POD_CLAIM_NAME_ANNOTATION: "gpu"}}},
        {"metadata": {"name": "list-annotation", "annotations": {POD_CLAIM_NAME_ANNOTATION: ["gpu"]},
                      "ownerReferences": [{"uid": "uid-a", "controller": True}]}},
        {"metadata": None},
    ]
    assert GeneratedClaims(odd).find(_pod("a", "uid-a"), "gpu") is None
