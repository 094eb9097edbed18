"""The claims a pass's release and orphan checks look at: changed claims, claims of changed or deleted pods, and
all of them once per period."""

from __future__ import annotations

from typing import Any

from controller.informer import Store
from controller.watchlist import ClaimWatchlist


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _pod(name: str, rv: int, uid: str = "") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid or f"uid-{name}", "resourceVersion": str(rv)}}


def _claim(name: str, rv: int, owner: str | None = None, reserved: tuple[str, ...] = ()) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"c-{name}", "resourceVersion": str(rv)}
    if owner:
        meta["ownerReferences"] = [{"kind": "Pod", "name": owner, "uid": f"uid-{owner}", "controller": True}]
    obj: dict[str, Any] = {"metadata": meta}
    if reserved:
        obj["status"] = {"reservedFor": [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in reserved]}
    return obj


def test_claims_of_changed_and_deleted_pods_and_changed_claims_are_checked() -> None:
    pods, claims, clock = Store("Pod"), Store("ResourceClaim"), Clock()
    for p in ("a", "b", "c"):
        pods.upsert(_pod(p, 1))
    claims.upsert(_claim("owned-by-a", 1, owner="a"))
    claims.upsert(_claim("reserves-b", 1, reserved=("b",)))
    claims.upsert(_claim("quiet", 1, reserved=("c",)))
    w = ClaimWatchlist(pods, claims, full_every=30.0, clock=clock)
    names = lambda got: sorted(c["metadata"]["name"] for c in got)  # noqa: E731
    assert names(w.claims_to_check(claims.by_key())) == ["owned-by-a", "quiet", "reserves-b"]  # first pass: all
    clock.now = 1.0
    assert w.claims_to_check(claims.by_key()) == []  # nothing changed
    pods.remove(_pod("a", 2))  # the owner went
    pods.upsert(_pod("b", 3))  # the reserving pod changed (finished, say)
    assert names(w.claims_to_check(claims.by_key())) == ["owned-by-a", "reserves-b"]
    claims.upsert(_claim("quiet", 4))  # the claim itself changed (reservation dropped)
    assert names(w.claims_to_check(claims.by_key())) == ["quiet"]
    pods.upsert(_pod("c", 5))  # no claim reserves c any more
    assert w.claims_to_check(claims.by_key()) == []
    clock.now = 31.0
    assert len(w.claims_to_check(claims.by_key())) == 3  # the periodic full look
