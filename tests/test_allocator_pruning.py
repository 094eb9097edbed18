"""The allocator's early failure for matchAttribute (`_Run._cannot_complete`) changes no outcome.

Random nodes, classes and claims are allocated twice, with the early failure and without it: the results,
and the errors raised (a selector that fails on some devices, an attribute of unknown type), must be equal,
and the early failure must actually have cut searches short in the run.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from controller.allocator import AllocationError, Allocator, ClusterSnapshot, Unschedulable
from controller.allocator.allocator import _Run
from controller.cel import CelEnvironment
from gpudra.features import Features
from tests.alloc_fixtures import DRIVER, claim, klass, request, slice_

NODE = "node-1"
SELECTORS = [
    None,
    f'device.attributes["{DRIVER}"].model == "a"',
    # Fails (no such key) on devices without `extra` unless their model is "a".
    f'device.attributes["{DRIVER}"].model == "a" || device.attributes["{DRIVER}"].extra > 0',
    f'device.attributes["{DRIVER}"].index % 3 != 1',
]


def _device(rng: random.Random, i: int) -> dict[str, Any]:
    attrs: dict[str, Any] = {"index": {"int": i}, "model": {"string": rng.choice("aab")}}
    if rng.random() < 0.9:
        attrs["domain"] = {"string": f"nvl{rng.randrange(3)}"}
    if rng.random() < 0.8:
        attrs["numa"] = {"int": rng.randrange(2)}
    if rng.random() < 0.15:
        attrs["numa"] = {}  # a type this version does not know
    if rng.random() < 0.3:
        attrs["extra"] = {"int": rng.randrange(2)}
    return {"name": f"dev-{i}", "attributes": attrs}


def _case(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    devices = [_device(rng, i) for i in range(rng.randrange(4, 11))]
    pools = rng.choice([1, 1, 2])
    slices = [slice_(f"s{p}", NODE, f"pool-{p}", devices[p::pools]) for p in range(pools)]
    classes = []
    for c in range(2):
        expr = rng.choice(SELECTORS)
        classes.append(klass(f"class-{c}", [expr] if expr else None))
    claims = []
    for n in range(rng.randrange(1, 3)):
        requests = [request(f"r{r}", f"class-{rng.randrange(2)}", count=rng.randrange(1, 5))
                    for r in range(rng.randrange(1, 3))]
        constraints = []
        for _ in range(rng.randrange(0, 4)):
            scope = rng.choice([None, [requests[0]["name"]], [r["name"] for r in requests]])
            c: dict[str, Any] = {"matchAttribute": f"{DRIVER}/{rng.choice(['domain', 'domain', 'numa', 'model'])}"}
            if scope:
                c["requests"] = scope
            constraints.append(c)
        claims.append(claim(f"claim-{n}", requests, constraints))
    taken = [d["name"] for d in devices if rng.random() < 0.2]
    return slices, classes, claims, taken


def _allocate(slices: list[dict[str, Any]], classes: list[dict[str, Any]], claims: list[dict[str, Any]],
              taken: list[str], env: CelEnvironment) -> Any:
    snapshot = ClusterSnapshot(slices, classes)
    for name in taken:
        pool = next(s["spec"]["pool"]["name"] for s in slices if any(d["name"] == name for d in s["spec"]["devices"]))
        snapshot.commit("other/claim", {"devices": {"results": [
            {"request": "r", "driver": DRIVER, "pool": pool, "device": name}]}})
    try:
        outcome = Allocator(snapshot, Features(), env).allocate(NODE, claims)
    except AllocationError as err:
        return ("error", str(err))
    if isinstance(outcome, Unschedulable):
        return ("unschedulable", outcome.reason)
    return ("ok", outcome)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_early_failure_keeps_every_outcome(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    env = CelEnvironment()
    cases = [_case(rng) for _ in range(300)]
    real = _Run._cannot_complete
    cut = 0

    def counting(self: _Run, *args: Any) -> bool:
        nonlocal cut
        out = real(self, *args)
        cut += out
        return out

    monkeypatch.setattr(_Run, "_cannot_complete", counting)
    pruned = [_allocate(*case, env) for case in cases]
    monkeypatch.setattr(_Run, "_cannot_complete", lambda self, *args: False)
    full = [_allocate(*case, env) for case in cases]
    for case, got, want in zip(cases, pruned, full):
        assert got == want, case
    kinds = {kind for kind, _ in full}
    assert kinds == {"ok", "unschedulable", "error"}  # the cases reach every kind of outcome
    assert cut > 0  # and the early failure did cut searches short


def test_device_of_unknown_attribute_type_still_raises_where_the_full_search_does() -> None:
    # dev-3 matches the first constraint's value once dev-1 is picked and then reaches the second constraint,
    # whose attribute it holds with a type this version does not know: the full search raises there, before
    # it would find dev-2 + dev-4. Cutting dev-1's branch short (no free device shares domain and numa) must not
    # skip that.
    def dev(i: int, domain: str, numa: Any) -> dict[str, Any]:
        return {"name": f"dev-{i}", "attributes": {"domain": {"string": domain}, "numa": numa}}

    devices = [dev(0, "nvl1", {"int": 0}), dev(1, "nvl0", {"int": 0}), dev(2, "nvl2", {"int": 1}),
               dev(3, "nvl0", {}), dev(4, "nvl2", {"int": 1})]
    c = claim("claim-0", [request("r0", "class-0", count=2)],
              [{"matchAttribute": f"{DRIVER}/domain"}, {"matchAttribute": f"{DRIVER}/numa"}])
    kind, text = _allocate([slice_("s0", NODE, "pool-0", devices)], [klass("class-0")], [c], [], CelEnvironment())
    assert kind == "error" and "dev-3" in text and "unsupported attribute value" in text
