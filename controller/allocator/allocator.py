"""Kubernetes 1.35 structured-parameters allocation for one node (the scheduler's Filter).

A port of the semantics of k8s.io/dynamic-resource-allocation/structured (the "experimental"
variant, which is a superset; gated paths follow the feature gates): a depth-first search over
claims, requests and device slots, first full solution wins. Deliberate differences, none of which
changes which devices a successful search picks:
- pools are searched sorted by (driver, pool) instead of Go's random map order;
- counters consumed by a candidate are always rolled back when a later check (taints,
  constraints, capacity) rejects it (upstream leaks them in that case);
- shareIDs are derived deterministically from the claim and device instead of random bytes;
- failed sub-searches are memoised by (position, devices picked so far) so that permutations of
  the same devices are not re-explored: they would fail the same way;
- a request whose devices a matchAttribute value already narrows fails at once when fewer free devices
  have that value than it still needs, once every free device has been checked for it in the call (so
  no error the full search would raise is skipped).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.allocator import capacity as cap
from controller.cel.errors import closest_class, missing_key_hint
from controller.allocator.errors import CANNOT_ALLOCATE, INVALID_POOLS, AllocationError, Unschedulable
from controller.allocator.model import (
    LIST_KINDS,
    MAX_RESULTS,
    UNKNOWN_ATTRIBUTE,
    AttrValue,
    Claim,
    Constraint,
    Device,
    DeviceClass,
    DeviceID,
    Request,
    device_id_str,
    parse_claim,
)
from controller.allocator.nodes import node_matches
from controller.allocator.pools import Pool, binding_enabled
from controller.allocator.snapshot import ClusterSnapshot
from gpudra.features import Features
from gpudra.quantity import Quantity

# Separates Kubernetes' text of a selector error from our suggestion, which the message puts last.
HINT_SEPARATOR = "\x00"

_OK, _FAIL, _MAX = 1, 0, 2  # allocateOne outcomes; _MAX = the 32-results limit was hit
_SHARE_NS = uuid.UUID("6b1f3c1e-2a57-4c55-9a8e-6d1b8f0f5a31")


@dataclass
class _ReqData:
    request: Request
    klass: DeviceClass
    num: int
    is_sub: bool
    all_devices: list[tuple[Device, Pool]] | None = None
    selected_sub: int = 0


@dataclass
class _DeviceResult:
    request: Request
    device: Device
    share_id: str | None = None
    consumed: dict[str, Quantity] | None = None


def _comparable(state: "_MatchState", dev: Device) -> AttrValue | None:
    """The device's value of the constrained attribute; None when it has none. A value of unknown type
    cannot be compared with anything: that is an error in the input, not a mismatch."""
    value = dev.attribute(state.attribute)
    if value == UNKNOWN_ATTRIBUTE:
        raise AllocationError(f"claim {state.claim}, constraint #{state.index}: device {device_id_str(dev.id)}: "
                              f"attribute {state.attribute}: unsupported attribute value (none of int, bool, string, version is set)")
    return value


def _as_set(value: AttrValue) -> tuple[str, frozenset[Any]]:
    """KEP-5491's attributeAsSet: a scalar or a list as (element kind, set of values)."""
    kind, raw = value
    if kind in LIST_KINDS:
        return LIST_KINDS[kind], frozenset(raw)
    return kind, frozenset((raw,))


def _intersects(a: tuple[str, frozenset[Any]], b: tuple[str, frozenset[Any]]) -> bool:
    return a[0] == b[0] and bool(a[1] & b[1])


class _MatchState:
    """matchAttribute: every device in scope has the attribute with one value (type and value). With
    DRAListTypeAttributes (`lists`), the devices' values taken as sets must have a common element."""

    __slots__ = ("attribute", "requests", "value", "count", "claim", "index", "lists", "common")

    def __init__(self, c: Constraint, claim: str = "", index: int = 0, lists: bool = False) -> None:
        self.attribute, self.requests = c.attribute, c.requests
        self.claim, self.index = claim, index
        self.value: AttrValue | None = None
        self.count = 0
        self.lists = lists
        self.common: tuple[str, frozenset[Any]] | None = None

    def applies(self, req: Request) -> bool:
        if not self.requests:
            return True
        if req.parent is None:
            return req.name in self.requests
        return req.parent in self.requests or req.full_name in self.requests

    def add(self, req: Request, dev: Device) -> bool:
        if not self.applies(req):
            return True
        value = _comparable(self, dev)
        if value is None:
            return False
        if self.lists:
            as_set = _as_set(value)
            if self.count == 0:
                self.common, self.count = as_set, 1
                return True
            if self.common is None or not _intersects(self.common, as_set):
                return False
            # Like Kubernetes, the running intersection only narrows: removing a device does not widen it again.
            self.common = (as_set[0], self.common[1] & as_set[1])
            self.count += 1
            return True
        if value[0] in LIST_KINDS:
            return False  # without the gate a list value matches nothing
        if self.count == 0:
            self.value, self.count = value, 1
            return True
        if value != self.value:
            return False
        self.count += 1
        return True

    def remove(self, req: Request, dev: Device) -> None:
        if self.applies(req):
            self.count -= 1


class _DistinctState(_MatchState):
    """distinctAttribute: like Kubernetes, the values seen are keyed by request name (the base request),
    so devices of one request are only compared against the last device picked for each request."""

    __slots__ = ("seen",)

    def __init__(self, c: Constraint, claim: str = "", index: int = 0, lists: bool = False) -> None:
        super().__init__(c, claim, index, lists)
        self.seen: dict[str, AttrValue] = {}

    def add(self, req: Request, dev: Device) -> bool:
        if not self.applies(req):
            return True
        value = _comparable(self, dev)
        if value is None:
            return False
        base = req.parent or req.name
        if self.lists:
            # DRAListTypeAttributes: the new value set must be disjoint from every one seen.
            if self.count and any(_intersects(_as_set(v), _as_set(value)) for v in self.seen.values()):
                return False
        elif value[0] in LIST_KINDS:
            return False  # without the gate a list value is of no known type
        elif self.count and any(v == value for v in self.seen.values()):
            return False
        self.seen[base] = value
        self.count += 1
        return True

    def remove(self, req: Request, dev: Device) -> None:
        if self.applies(req):
            self.seen.pop(req.parent or req.name, None)
            self.count -= 1


class Allocator:
    """Allocates claims on one node at a time against a ClusterSnapshot.

    `cel_env` is a `controller.cel.CelEnvironment` (anything with `compile(expr) -> Selector`); it may be
    None when no class or request has selectors. Selector results are cached per (device, expression)
    in the snapshot, so repeated calls for many nodes and claims evaluate each pair once.
    """

    def __init__(self, snapshot: ClusterSnapshot, features: Features | None = None, cel_env: Any = None) -> None:
        self.snapshot = snapshot
        self.features = features or Features()
        self.cel_env = cel_env
        self._compiled: dict[str, Any] = {}
        # The view last built for a device that does not keep one: its class and request selectors run one
        # after the other, so they share it.
        self._recent_view: tuple[Device, Any] | None = None

    def allocate(self, node_name: str, claims: Sequence[Claim | Mapping[str, Any]]) -> list[dict[str, Any]] | Unschedulable:
        """One Filter call: all claims together on `node_name`. Raises AllocationError for fatal errors."""
        parsed = [c if isinstance(c, Claim) else parse_claim(c) for c in claims]
        run = _Run(self, node_name, parsed)
        return run.execute()

    # ---- selectors ------------------------------------------------------------------------------

    def first_selector_miss(self, dev: Device, selectors: Sequence[str | None], owner: str) -> int | None:
        """Index of the first selector `dev` does not match, None when it matches them all. A selector that
        fails to compile or evaluate is fatal for the claim, as in kube-scheduler: AllocationError naming `owner`."""
        for i, expr in enumerate(selectors):
            if expr is None:
                continue
            res = self.selector_matches(dev, expr)
            if isinstance(res, str):
                raise AllocationError(self._selector_error(owner, i, dev, res))
            if not res:
                return i
        return None

    def _selector_error(self, owner: str, index: int, dev: Device, text: str) -> str:
        """Kubernetes' wording for a selector failure. Since 1.37 a runtime error names the device and a
        missing key gets a hint (cel.EnhanceRuntimeError); compile errors are unchanged. Our own suggestion for a
        mistyped attribute (after HINT_SEPARATOR in `text`) comes last, after Kubernetes' text."""
        text, _, ours = text.partition(HINT_SEPARATOR)
        if not self.features.at_least("1.37") or not text.startswith("CEL runtime error: "):
            return f"{owner}: selector #{index}: {text}{ours}"
        if "no such key:" in text:
            text += (". consider using CEL optional chaining (.? followed by orValue()) or guarding the check "
                     "with has() for optional fields")
        return f"{owner}: selector #{index} on device {dev.slice.driver}/{dev.slice.pool}/{dev.name}: {text}{ours}"

    def _view(self, dev: Device) -> Any:
        """The device's CEL view. Most selectors are answered from results shared by devices of one model
        (Selector's footprint) without evaluation data, so a view is kept on the device only once an evaluation
        stored some in it: thousands of views kept only to be read once would be collected again and again."""
        recent = self._recent_view
        if recent is not None and recent[0] is dev:
            return recent[1]
        view = dev.cel_view(keep=False)
        self._recent_view = (dev, view)
        return view

    def selector_matches(self, dev: Device, expr: str) -> bool | str:
        """True/False, or the error text (compile errors start with 'CEL compile error: ')."""
        key = (dev.uid, expr)
        cache = self.snapshot.selector_cache
        hit = cache.get(key)
        if hit is not None:
            return hit if isinstance(hit, bool) else str(hit)
        result: bool | str
        program = self._compiled.get(expr)
        if program is None:
            if self.cel_env is None:
                raise AllocationError(f"selector {expr!r} needs a CEL environment, but none was configured")
            try:
                program = self.cel_env.compile(expr)
            except Exception as exc:  # noqa: BLE001 - any compile failure is reported with Kubernetes' text
                program = exc
            self._compiled[expr] = program
        if isinstance(program, Exception):
            result = f"CEL compile error: {program}"
        else:
            view = self._view(dev)
            try:
                result = bool(program.matches(view))
            except Exception as exc:  # noqa: BLE001 - any runtime failure is fatal, with Kubernetes' text
                # Kubernetes' text, then (placed last by _selector_error) what the device has and the closest name.
                hint = missing_key_hint(str(exc), view.attributes, view.capacity, view.name or dev.name)
                result = f"CEL runtime error: {exc}" + (HINT_SEPARATOR + hint if hint else "")
            if view.holds_evaluation_data and dev._view is None:
                dev._view = view  # it holds evaluation data now: keep it for the device's other selectors
        cache[key] = result if isinstance(result, bool) else AllocationError(result)
        return result


class _Run:
    """The state of one Allocate call."""

    def __init__(self, owner: Allocator, node_name: str, claims: list[Claim]) -> None:
        self.a = owner
        self.f = owner.features
        self.snap = owner.snapshot
        self.node = self.snap.node(node_name)
        self.claims = claims
        self.pools: list[Pool] = []
        self.req: dict[tuple[int, int, int], _ReqData] = {}
        self.constraints: list[list[_MatchState]] = []
        self.allocating: dict[DeviceID, set[int]] = {}
        self.allocating_capacity: dict[DeviceID, dict[str, Quantity]] = {}
        self.consumed_counters: dict[str, dict[str, dict[str, Quantity]]] = {}
        self.available_counters: dict[str, dict[str, dict[str, Quantity]]] = {}
        self.results: list[list[_DeviceResult]] = [[] for _ in claims]
        self.match_cache: dict[tuple[int, int, int, int], bool] = {}
        self.failed: set[tuple[Any, ...]] = set()
        self.chosen: list[tuple[DeviceID, int, str]] = []
        self.memo_ok = True
        self.binding = binding_enabled(self.f)
        self._usable: list[Device] | None = None
        self._unknown: dict[str, bool] = {}

    # ---- setup ----------------------------------------------------------------------------------

    def execute(self) -> list[dict[str, Any]] | Unschedulable:
        self.pools = self.snap.pools(self.node.name, self.f)
        for ci, claim in enumerate(self.claims):
            self._prepare_claim(ci, claim)
        # Memoising failures is only sound when the outcome of a sub-search depends on the set of
        # devices picked so far, not on their order: distinctAttribute and shared devices break that.
        # A list-type matchAttribute's running intersection depends on the order of picks too.
        self.memo_ok = not any(isinstance(c, _DistinctState) or c.lists for cs in self.constraints for c in cs) and not (
            self.f.consumable_capacity and any(d.allow_multiple for p in self.pools for s in p.slices for d in s.devices)
        )
        outcome = self._one(0, 0, 0, 0, False)
        if outcome != _OK:
            if any(p.invalid for p in self.pools):
                return Unschedulable(INVALID_POOLS)
            return Unschedulable(CANNOT_ALLOCATE)
        return [self._result(ci, claim) for ci, claim in enumerate(self.claims)]

    def _prepare_claim(self, ci: int, claim: Claim) -> None:
        key = claim.key
        min_total = 0
        for ri, entry in enumerate(claim.requests):
            if entry.subrequests and not self.f.prioritized_list:
                raise AllocationError(f"claim {key}, request {entry.name}: has subrequests, but the DRAPrioritizedList feature is disabled")
            if not self.f.consumable_capacity:
                if entry.exact is not None and entry.exact.has_capacity:
                    raise AllocationError(f"claim {key}, request {entry.name}: has capacity requests, but the DRAConsumableCapacity feature is disabled")
                for sub in entry.subrequests:
                    if sub.has_capacity:
                        raise AllocationError(f"claim {key}, subrequest {sub.name}: has capacity requests, but the DRAConsumableCapacity feature is disabled")
            if entry.subrequests:
                least = None
                for si, sub in enumerate(entry.subrequests):
                    rd = self._validate(ci, ri, si, sub, True)
                    self.req[(ci, ri, si)] = rd
                    least = rd.num if least is None else min(least, rd.num)
                min_total += least or 0
            else:
                if entry.exact is None:
                    raise AllocationError(f"claim {key}, request {entry.name}: neither exactly nor firstAvailable is set")
                rd = self._validate(ci, ri, 0, entry.exact, False)
                self.req[(ci, ri, 0)] = rd
                min_total += rd.num
        if min_total > MAX_RESULTS:
            raise AllocationError(f"claim {key}: number of requested devices {min_total} exceeds the claim limit of {MAX_RESULTS}")
        states: list[_MatchState] = []
        for i, c in enumerate(claim.constraints):
            if c.kind == "match":
                states.append(_MatchState(c, key, i, self.f.list_type_attributes))
            elif c.kind == "distinct" and self.f.consumable_capacity:
                states.append(_DistinctState(c, key, i, self.f.list_type_attributes))
            else:
                # With DRAConsumableCapacity off the API server drops distinctAttribute, leaving an empty constraint.
                raise AllocationError(f"claim {key}, constraint #{i}: empty constraint (unsupported constraint type?)")
        self.constraints.append(states)

    def _validate(self, ci: int, ri: int, si: int, request: Request, is_sub: bool) -> _ReqData:
        key = self.claims[ci].key
        for i, sel in enumerate(request.selectors):
            if sel is None:
                raise AllocationError(f"claim {key}, request {request.name}, selector #{i}: CEL expression empty (unsupported selector type?)")
        if not self.f.admin_access and request.admin_access is not None:
            raise AllocationError(f"claim {key}, request {request.name}: admin access is requested, but the feature is disabled")
        if not request.class_name:
            raise AllocationError(f"claim {key}, request {request.name}: missing device class name (unsupported request type?)")
        klass = self.snap.classes.get(request.class_name)
        if klass is None:
            known = sorted(self.snap.classes)
            best = closest_class(request.class_name, known)
            raise AllocationError(
                f"claim {key}, request {request.name}: could not retrieve device class {request.class_name}: "
                f'deviceclass.resource.k8s.io "{request.class_name}" not found'
                + (f"; did you mean {best}?" if best else "")
                + f" (DeviceClasses: {', '.join(known) if known else 'none'})"
            )
        rd = _ReqData(request, klass, 0, is_sub)
        if request.mode == "ExactCount":
            rd.num = request.count
        elif request.mode == "All":
            rd.all_devices = []
            for pool in self.pools:
                if pool.incomplete:
                    raise AllocationError(f"claim {key}, request {request.name}: asks for all devices, but resource pool {pool.id} is currently being updated")
                if pool.invalid:
                    raise AllocationError(f"claim {key}, request {request.name}: asks for all devices, but resource pool {pool.id} is currently invalid")
                for sl in pool.slices:
                    for dev in sl.devices:
                        if not self._selectable(ci, ri, si, rd, dev):
                            continue
                        if self.f.consumable_capacity and not self._capacity_fits(request, dev):
                            continue
                        rd.all_devices.append((dev, pool))
            rd.num = len(rd.all_devices)
        else:
            raise AllocationError(f"claim {key}, request {request.name}: unsupported count mode {request.mode}")
        return rd

    # ---- search ---------------------------------------------------------------------------------

    def _one(self, ci: int, ri: int, si: int, di: int, in_sub: bool) -> int:
        if ci >= len(self.claims):
            return _OK
        claim = self.claims[ci]
        if ri >= len(claim.requests):
            out = self._one(ci + 1, 0, 0, 0, False)
            return _FAIL if out == _MAX else out
        rd = self.req[(ci, ri, si)]
        if not in_sub and rd.is_sub:
            all_exceeded = True
            n = len(claim.requests[ri].subrequests)
            for sub in range(n):
                out = self._one(ci, ri, sub, di, True)
                if out == _MAX:
                    continue
                all_exceeded = False
                if out == _OK:
                    self.req[(ci, ri, 0)].selected_sub = sub
                    return _OK
            return _MAX if all_exceeded else _FAIL
        request = rd.request
        if rd.all_devices is not None and not rd.all_devices:
            return _FAIL
        if di >= rd.num:
            return self._one(ci, ri + 1, 0, 0, False)
        if len(self.results[ci]) + rd.num - di > MAX_RESULTS:
            return _MAX

        memo_key: tuple[Any, ...] | None = None
        if self.memo_ok:
            memo_key = (ci, ri, si, di, frozenset(self.chosen))
            if memo_key in self.failed:
                return _FAIL

        if rd.all_devices is not None:
            dev, pool = rd.all_devices[di]
            undo = self._allocate_device(ci, rd, dev, pool, must=True)
            if undo is None:
                return _FAIL
            out = self._one(ci, ri, si, di + 1, in_sub)
            if out != _OK:
                undo()
            return out

        admin = request.admin
        if self.memo_ok and not admin and self._cannot_complete(ci, ri, si, rd, rd.num - di):
            if memo_key is not None:
                self.failed.add(memo_key)
            return _FAIL
        in_use = self.snap.allocated
        allocating = self.allocating
        for pool in self.pools:
            if pool.incomplete or pool.invalid:
                continue
            for sl in pool.slices:
                for dev in sl.devices:
                    did = dev.id
                    if admin:
                        users = allocating.get(did)
                        if users and ci in users:
                            continue
                    elif did in in_use or allocating.get(did):
                        continue
                    if not self._selectable(ci, ri, si, rd, dev):
                        continue
                    if self.f.consumable_capacity and not self._capacity_fits(request, dev):
                        continue
                    undo = self._allocate_device(ci, rd, dev, pool, must=False, capacity_checked=True)
                    if undo is None:
                        continue
                    out = self._one(ci, ri, si, di + 1, in_sub)
                    if out == _OK:
                        return _OK
                    undo()
                    if out == _MAX:
                        return _MAX
        if memo_key is not None:
            self.failed.add(memo_key)
        return _FAIL

    def _cannot_complete(self, ci: int, ri: int, si: int, rd: _ReqData, need: int) -> bool:
        """Whether the loop over devices below is sure to fail without raising: a matchAttribute of the claim
        already holds a value, and fewer free devices have it (and are selectable) than the request still needs.

        Only sound where the search depends on the set of devices picked (memo_ok) and every free device has
        been through this request's checks earlier in the run (its selector results are in match_cache): the
        loop would then evaluate nothing new, so it cannot raise a selector error; a device whose constrained
        attribute has an unknown type could raise in a constraint check, so one on the node disables this.
        Counters and taints only ever reject more devices, so the count is an upper bound."""
        request = rd.request
        fixed: list[tuple[str, AttrValue | None]] = []
        for st in self.constraints[ci]:
            if st.applies(request):
                if self._has_unknown(st.attribute):
                    return False
                if st.count:
                    fixed.append((st.attribute, st.value))
        if not fixed:
            return False
        in_use = self.snap.allocated
        allocating = self.allocating
        cache = self.match_cache
        binding = self.binding
        left = 0
        for dev in self._usable_devices():
            did = dev.id
            if did in in_use or allocating.get(did):
                continue
            if not binding and dev.binding_conditions:
                continue  # never selectable
            selectable = cache.get((dev.uid, ci, ri, si))
            if selectable is None:
                return False  # not looked at yet in this run: the loop would evaluate it
            if selectable:
                for attribute, value in fixed:
                    if dev.attribute(attribute) != value:
                        break
                else:
                    left += 1
                    if left >= need:
                        return False
        return True

    def _usable_devices(self) -> list[Device]:
        """The devices the search loop walks (pools neither incomplete nor invalid), in its order."""
        if self._usable is None:
            self._usable = [dev for pool in self.pools if not (pool.incomplete or pool.invalid)
                            for sl in pool.slices for dev in sl.devices]
        return self._usable

    def _has_unknown(self, attribute: str) -> bool:
        """Whether a device the search may look at has `attribute` with a value of unknown type."""
        found = self._unknown.get(attribute)
        if found is None:
            found = self._unknown[attribute] = any(dev.attribute(attribute) == UNKNOWN_ATTRIBUTE
                                                   for dev in self._usable_devices())
        return found

    def _selectable(self, ci: int, ri: int, si: int, rd: _ReqData, dev: Device) -> bool:
        if not self.binding and dev.binding_conditions:
            return False
        key = (dev.uid, ci, ri, si)
        hit = self.match_cache.get(key)
        if hit is not None:
            return hit
        ok = (self.a.first_selector_miss(dev, rd.klass.selectors, f"class {rd.klass.name}") is None
              and self.a.first_selector_miss(dev, rd.request.selectors, f"claim {self.claims[ci].key}") is None)
        if ok and dev.slice.per_device:
            ok = node_matches(self.node, dev.node_name, dev.all_nodes, dev.node_selector)
        self.match_cache[key] = ok
        return ok

    def _capacity_fits(self, request: Request, dev: Device) -> bool:
        did = dev.id
        shared = self.snap.shared_consumed.get(did, ())
        allocating = self.allocating_capacity.get(did, {})
        if request.capacity is None and not shared and not allocating:
            # Nothing requested and nothing consumed: the answer depends on the device alone (its capacities'
            # policies and values), and the search asks it for every candidate device of every claim.
            key = (dev.uid, self.f.fractional_capacity_range)
            known = self.snap.idle_capacity_fits.get(key)
            if known is None:
                known = cap.fits(dev.raw.get("capacity") or {}, None, {}, {}, self.f.fractional_capacity_range)
                self.snap.idle_capacity_fits[key] = known
            return known
        consumed: dict[str, Quantity] = {}
        for entry in shared:
            cap.add_into(consumed, entry)
        return cap.fits(dev.raw.get("capacity") or {}, request.capacity, consumed, allocating,
                        self.f.fractional_capacity_range)

    def _allocate_device(self, ci: int, rd: _ReqData, dev: Device, pool: Pool, must: bool,
                         capacity_checked: bool = False) -> Callable[[], None] | None:
        """Add `dev` to claim `ci` for `rd`; the undo, or None when it cannot be. `capacity_checked`: the caller has
        just found that the request fits the device's capacity (nothing in between changes that)."""
        request = rd.request
        did = dev.id
        multi = self.f.consumable_capacity and dev.allow_multiple
        users = self.allocating.get(did)
        if not multi and request.admin and users and ci in users:
            return None
        if not request.admin and (did in self.snap.allocated or users):
            return None
        if not self.f.partitionable_devices and dev.consumes_counters:
            return None
        counted = False
        if dev.consumes_counters and not (multi and self._capacity_in_use(did)):
            if not self._take_counters(dev, pool):
                return None
            counted = True

        def release_counters() -> None:
            if counted:
                self._return_counters(dev, pool)

        if self.f.device_taints:
            for taint in dev.taints:
                if taint.effect in ("NoSchedule", "NoExecute") and not any(t.tolerates(taint) for t in request.tolerations):
                    release_counters()
                    return None
        consumed: dict[str, Quantity] | None = None
        share_id: str | None = None
        if self.f.consumable_capacity:
            if not capacity_checked and not self._capacity_fits(request, dev):
                release_counters()
                return None
            if multi:
                consumed = cap.consumption(dev.raw.get("capacity") or {}, request.capacity, self.f.fractional_capacity_range)
                share_id = self._share_id(ci, did)
        states = self.constraints[ci]
        for i, state in enumerate(states):
            if not state.add(request, dev):
                if must:
                    raise AllocationError(
                        f"claim {self.claims[ci].key}, request {request.name}: cannot add device {device_id_str(did)} "
                        "because a claim constraint would not be satisfied"
                    )
                for prev in states[:i]:
                    prev.remove(request, dev)
                release_counters()
                return None
        if not multi:
            self.allocating.setdefault(did, set()).add(ci)
        if consumed is not None:
            cap.add_into(self.allocating_capacity.setdefault(did, {}), consumed)
        results = self.results[ci]
        results.append(_DeviceResult(request, dev, share_id, consumed or None))
        mark = (did, ci, request.full_name)
        self.chosen.append(mark)

        def undo() -> None:
            for state in states:
                state.remove(request, dev)
            if not multi:
                self.allocating[did].discard(ci)
            if consumed is not None:
                cap.sub_from(self.allocating_capacity[did], consumed)
                if all(q.is_zero() for q in self.allocating_capacity[did].values()):
                    del self.allocating_capacity[did]
            release_counters()
            results.pop()
            self.chosen.pop()

        return undo

    def _share_id(self, ci: int, did: DeviceID) -> str:
        claim = self.claims[ci]
        n = sum(1 for r in self.results[ci] if r.device.id == did)
        return str(uuid.uuid5(_SHARE_NS, f"{claim.uid or claim.key}|{device_id_str(did)}|{n}"))

    def _capacity_in_use(self, did: DeviceID) -> bool:
        return did in self.snap.shared_consumed or did in self.allocating_capacity

    # ---- counters (DRAPartitionableDevices) ------------------------------------------------------

    def _available(self, pool: Pool) -> dict[str, dict[str, Quantity]]:
        found = self.available_counters.get(pool.id)
        if found is not None:
            return found
        avail: dict[str, dict[str, Quantity]] = {}
        for set_name, counters in pool.counter_sets.items():
            avail[set_name] = {n: cap._q((c or {}).get("value", "0")) for n, c in counters.items()}
        for sl in [*pool.slices, *pool.other_slices]:
            for dev in sl.devices:
                # A device held through shares consumes its counters too (kubernetes#138893, 1.36).
                did = (sl.driver, sl.pool, dev.name)
                if did not in self.snap.allocated and did not in self.snap.shared_allocated:
                    continue
                for set_name, counters in dev.consumes_counters:
                    target = avail.get(set_name, {})
                    for n, c in counters.items():
                        if n in target:
                            target[n] = target[n] - cap._q((c or {}).get("value", "0"))
        self.available_counters[pool.id] = avail
        return avail

    def _take_counters(self, dev: Device, pool: Pool) -> bool:
        avail = self._available(pool)
        consumed = self.consumed_counters.setdefault(pool.id, {})
        for set_name, counters in dev.consumes_counters:
            target = consumed.setdefault(set_name, {})
            for n, c in counters.items():
                q = cap._q((c or {}).get("value", "0"))
                target[n] = target[n] + q if n in target else q
        for set_name, counters in avail.items():
            used = consumed.get(set_name, {})
            for n, value in counters.items():
                if n in used and value < used[n]:
                    self._return_counters(dev, pool)
                    return False
        return True

    def _return_counters(self, dev: Device, pool: Pool) -> None:
        consumed = self.consumed_counters[pool.id]
        for set_name, counters in dev.consumes_counters:
            target = consumed[set_name]
            for n, c in counters.items():
                target[n] = target[n] - cap._q((c or {}).get("value", "0"))

    # ---- result ---------------------------------------------------------------------------------

    def _result(self, ci: int, claim: Claim) -> dict[str, Any]:
        out_results: list[dict[str, Any]] = []
        for r in self.results[ci]:
            dev = r.device
            item: dict[str, Any] = {
                "request": r.request.full_name,
                "driver": dev.slice.driver,
                "pool": dev.slice.pool,
                "device": dev.name,
            }
            if r.request.admin:
                item["adminAccess"] = True
            if r.request.raw_tolerations:
                item["tolerations"] = [dict(t) for t in r.request.raw_tolerations]
            if self.binding and dev.binding_conditions:
                item["bindingConditions"] = list(dev.binding_conditions)
                item["bindingFailureConditions"] = list(dev.binding_failure_conditions)
            if r.share_id:
                item["shareID"] = r.share_id
            if r.consumed:
                item["consumedCapacity"] = {k: str(v) for k, v in r.consumed.items()}
            out_results.append(item)
        config: list[dict[str, Any]] = []
        class_ranges: dict[str, tuple[int, int]] = {}
        for ri in range(len(claim.requests)):
            rd = self.req[(ci, ri, 0)]
            if rd.is_sub:
                rd = self.req[(ci, ri, rd.selected_sub)]
            name = rd.request.full_name
            span = class_ranges.get(rd.klass.name)
            if span is not None:
                for i in range(*span):
                    config[i]["requests"].append(name)
                continue
            start = len(config)
            for c in rd.klass.config:
                config.append({"source": "FromClass", "requests": [name], **{k: v for k, v in c.items() if k != "requests"}})
            class_ranges[rd.klass.name] = (start, len(config))
        for c in claim.config:
            body = {k: v for k, v in c.items() if k != "requests"}
            wanted = list(c.get("requests") or [])
            if not wanted:
                config.append({"source": "FromClaim", **body})
                continue
            # Up to 1.36 Kubernetes appended the config once per request (or chosen subrequest) it names;
            # 1.37 appends it once (kubernetes#138990).
            once = self.f.at_least("1.37")
            for ri, entry in enumerate(claim.requests):
                if entry.name in wanted or self._chosen_sub(ci, ri) in wanted:
                    config.append({"source": "FromClaim", "requests": wanted, **body})
                    if once:
                        break
        if self.f.at_least("1.37"):
            # 1.37: a config that covers every request (by name or by its chosen subrequest) is written with
            # empty `requests`, which means "all".
            for item in config:
                requests = item.get("requests")
                if requests and all(entry.name in requests or self._chosen_sub(ci, ri) in requests
                                    for ri, entry in enumerate(claim.requests)):
                    item.pop("requests")
        alloc: dict[str, Any] = {"devices": {"results": out_results}}
        if config:
            alloc["devices"]["config"] = config
        selector = self._node_selector(ci)
        if selector is not None:
            alloc["nodeSelector"] = selector
        return alloc

    def _chosen_sub(self, ci: int, ri: int) -> str | None:
        """`request/subrequest` chosen for a firstAvailable request, None for an exactly request."""
        rd = self.req[(ci, ri, 0)]
        return self.req[(ci, ri, rd.selected_sub)].request.full_name if rd.is_sub else None

    def _node_selector(self, ci: int) -> dict[str, Any] | None:
        fields: list[dict[str, Any]] = []
        exprs: list[dict[str, Any]] = []
        for r in self.results[ci]:
            dev, sl = r.device, r.device.slice
            if sl.per_device:
                node_name, selector = dev.node_name, dev.node_selector
            else:
                node_name, selector = sl.node_name, sl.node_selector
            if node_name or (self.binding and dev.binds_to_node):
                return {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [self.node.name]}]}]}
            if selector is None:
                continue
            terms = selector.raw.get("nodeSelectorTerms") or []
            if len(terms) > 1:
                raise AllocationError(
                    f"create NodeSelector for claim {self.claims[ci].name}: unsupported ResourceSlice.NodeSelector with {len(terms)} terms")
            if terms:
                _merge(terms[0].get("matchFields") or [], fields)
                _merge(terms[0].get("matchExpressions") or [], exprs)
        if not fields and not exprs:
            return None
        term: dict[str, Any] = {}
        if exprs:
            term["matchExpressions"] = exprs
        if fields:
            term["matchFields"] = fields
        return {"nodeSelectorTerms": [term]}


def _merge(source: Sequence[Mapping[str, Any]], target: list[dict[str, Any]]) -> None:
    for req in source:
        values = set(req.get("values") or [])
        if not any(t.get("key") == req.get("key") and t.get("operator") == req.get("operator")
                   and set(t.get("values") or []) == values for t in target):
            target.append(dict(req))
