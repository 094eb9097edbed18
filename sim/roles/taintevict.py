"""Device taint eviction, as kube-controller-manager's devicetainteviction controller does it (embedded mode).

A pod whose allocated devices carry a `NoExecute` taint (published in its ResourceSlice or added by a
DeviceTaintRule) that the allocation's tolerations do not tolerate is evicted: its status gets the
`DisruptionTarget` condition (reason `DeletionByDeviceTaintManager`) and it is deleted (UID precondition).
A toleration with `tolerationSeconds` delays that until `timeAdded + tolerationSeconds`. Each
DeviceTaintRule's status carries the `EvictionInProgress` condition with upstream's reasons and messages.

`plan` is pure (objects and a clock in, decisions out); `TaintEvictor` applies a plan through the writer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from controller import objects as o
from controller.allocator.model import Taint, Toleration
from controller.explanation_writer import ExplanationWriter
from sim.roles.podconditions import mark_disrupted
from controller.taintrules import RULE_KEY
from controller.writes import Writer
from gpudra.timestamps import parse_rfc3339, rfc3339

CONDITION = "EvictionInProgress"
POD_CONDITION = {"status": "True", "reason": "DeletionByDeviceTaintManager",
                 "message": "Device Taint manager: deleting due to NoExecute taint"}
EVENT_REASON = "DeviceTaintManagerEviction"
RULE_STATUS_PERIOD = timedelta(seconds=10)  # upstream's shortest time between status updates of one rule



@dataclass(frozen=True)
class PodEviction:
    pod: Mapping[str, Any]
    when: datetime
    rules: tuple[str, ...]  # the DeviceTaintRules behind it (empty when only slice taints are)


@dataclass
class Plan:
    evict_now: list[PodEviction] = field(default_factory=list)
    later: list[PodEviction] = field(default_factory=list)  # tolerated for a while: evicted when `when` comes


def _device_taints(slices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], list[Mapping[str, Any]]]:
    """NoExecute taints per (driver, pool, device), from the newest generation of each pool."""
    newest: dict[tuple[str, str], int] = {}
    slices = list(slices)
    for sl in slices:
        spec = o.section(sl, "spec")
        pool = o.section(spec, "pool")
        pool_id = (str(spec.get("driver", "")), str(pool.get("name", "")))
        newest[pool_id] = max(newest.get(pool_id, -(2**63)), int(pool.get("generation") or 0))
    out: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for sl in slices:
        spec = o.section(sl, "spec")
        pool = o.section(spec, "pool")
        pool_id = (str(spec.get("driver", "")), str(pool.get("name", "")))
        if int(pool.get("generation") or 0) != newest[pool_id]:
            continue
        for dev in o.list_field(spec, "devices"):
            if not isinstance(dev, Mapping):
                continue
            taints = [t for t in dev.get("taints") or [] if isinstance(t, Mapping) and t.get("effect") == "NoExecute"]
            if taints:
                out[(*pool_id, str(dev.get("name", "")))] = taints
    return out


def _eviction_time(taint: Mapping[str, Any], tolerations: list[Mapping[str, Any]], now: datetime) -> datetime | None:
    """When a pod must go because of this taint: never (None) when a toleration without seconds tolerates it."""
    added = parse_rfc3339(taint.get("timeAdded")) or now
    model = Taint(str(taint.get("key", "")), str(taint.get("value", "") or ""), "NoExecute", taint)
    seconds: list[int] = []
    for tol in tolerations:
        # As kube-controller-manager 1.37's device-taint-eviction controller: only a toleration that names the
        # NoExecute effect keeps the pod (one without an effect let the allocator pick the device, nothing more).
        if tol.get("effect") != "NoExecute":
            continue
        parsed = Toleration(str(tol.get("key", "") or ""), str(tol.get("operator", "") or "Equal"),
                            str(tol.get("value", "") or ""), str(tol.get("effect", "") or ""))
        if not parsed.tolerates(model):
            continue
        if tol.get("tolerationSeconds") is None:
            return None
        seconds.append(max(0, int(tol["tolerationSeconds"])))
    # Not tolerated at all: now (a timeAdded ahead of this clock must not postpone an eviction).
    return added + timedelta(seconds=max(seconds)) if seconds else min(added, now)


def plan(pods: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]],
         now: datetime, *, taints: Mapping[tuple[str, str, str], list[Mapping[str, Any]]] | None = None) -> Plan:
    """Which pods must be evicted now, and which later, because of the NoExecute taints on their devices
    (`taints`: those of `slices`, when the caller has them already)."""
    if taints is None:
        taints = _device_taints(slices)
    if not taints:
        return Plan()
    by_uid = {o.uid(p): p for p in pods if o.uid(p)}
    found: dict[str, PodEviction] = {}
    for claim in claims:
        alloc = o.allocation(claim)
        if alloc is None:
            continue
        when: datetime | None = None
        rules: set[str] = set()
        for result in o.list_field(o.section(alloc, "devices"), "results"):
            if not isinstance(result, Mapping):
                continue
            device = (str(result.get("driver", "")), str(result.get("pool", "")), str(result.get("device", "")))
            tolerations = [t for t in result.get("tolerations") or [] if isinstance(t, Mapping)]
            for taint in taints.get(device, []):
                at = _eviction_time(taint, tolerations, now)
                if at is None:
                    continue
                when = at if when is None else min(when, at)
                if taint.get(RULE_KEY):
                    rules.add(str(taint[RULE_KEY]))
        if when is None:
            continue
        for ref in o.reserved_for(claim):
            pod = by_uid.get(str(ref.get("uid", "")))
            if pod is None or o.deleting(pod) or o.section(pod, "status").get("phase") in ("Succeeded", "Failed"):
                continue
            # A pod with several tainted claims goes at the earliest of their times, for all their rules.
            previous = found.get(o.uid(pod))
            earliest = when if previous is None else min(when, previous.when)
            names = rules | set(previous.rules if previous else ())
            found[o.uid(pod)] = PodEviction(pod, earliest, tuple(sorted(names)))
    result = Plan()
    for uid in sorted(found, key=lambda u: o.key(found[u].pod)):
        (result.evict_now if found[uid].when <= now else result.later).append(found[uid])
    return result


def _count(n: int, one: str, many: str) -> str:
    return one if n == 1 else many.format(n)


def rule_condition(rule: Mapping[str, Any], pending: list[PodEviction], evicted: int,
                   published_devices: int, allocated_devices: int) -> dict[str, Any]:
    """The EvictionInProgress condition (without lastTransitionTime), with upstream's reasons and messages.
    For effect None, `pending` is what NoExecute would evict."""
    effect = str(o.section(o.section(rule, "spec"), "taint").get("effect") or "")
    namespaces = len({o.namespace(p.pod) for p in pending})
    cond: dict[str, Any] = {"type": CONDITION, "status": "False", "reason": f"Effect{effect}", "message": "",
                            "observedGeneration": int(o.meta(rule).get("generation") or 0)}
    if effect == "NoExecute":
        if pending:
            cond["reason"], cond["status"] = "PodsPendingEviction", "True"
            cond["message"] = (_count(len(pending), "1 pod needs to be evicted in ", "{} pods need to be evicted in ")
                               + _count(namespaces, "1 namespace.", "{} different namespaces."))
        else:
            cond["reason"] = "Completed" if evicted else "NotStarted"
    elif effect == "None":
        cond["reason"] = "NoEffect"
        cond["message"] = (_count(published_devices, "1 published device selected. ",
                                  "{} published devices selected. ")
                           + _count(allocated_devices, "1 allocated device selected. ",
                                    "{} allocated devices selected. ")
                           + _count(len(pending), "1 pod would be evicted in ", "{} pods would be evicted in ")
                           + _count(namespaces, "1 namespace ", "{} different namespaces ")
                           + "if the effect was NoExecute. This information will not be updated again. Recreate "
                             "the DeviceTaintRule to trigger an update.")
    else:
        cond["reason"] = "OtherEffect"
        cond["message"] = "Eviction only happens for the NoExecute effect."
    if evicted:
        cond["message"] += (" " if cond["message"] else "") + _count(evicted, "1 pod ", "{} pods ") + \
            "evicted since starting the controller."
    return cond


def _selects(rule: Mapping[str, Any], driver: str, pool: str, device: str) -> bool:
    selector = o.section(o.section(rule, "spec"), "deviceSelector")
    if "deviceSelector" not in o.section(rule, "spec"):
        return False
    return all(selector.get(f) is None or selector.get(f) == v
               for f, v in (("driver", driver), ("pool", pool), ("device", device)))


class TaintEvictor:
    """Applies plans: DisruptionTarget, delete, an Event; and keeps each rule's EvictionInProgress condition."""

    def __init__(self, writer: Writer, explainer: ExplanationWriter) -> None:
        self._writer = writer
        self._explainer = explainer
        self._evicted: dict[str, int] = {}  # rule uid -> pods evicted because of it since start
        # The NoExecute taints of the slices of the last call that read them: walking every device of every slice
        # each pass was this concern's cost, for taints that change rarely.
        self._taints: dict[tuple[str, str, str], list[Mapping[str, Any]]] | None = None

    def reconcile(self, pods: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]],
                  slices: Callable[[], Sequence[Mapping[str, Any]]], rules: Iterable[Mapping[str, Any]], now: datetime,
                  *, slices_changed: bool = True) -> int:
        """`slices` gives the slices (with the DeviceTaintRules' taints) when they are needed; `slices_changed`
        False says they are the same as at the last call (no slice or rule changed)."""
        rules = list(rules)
        current: Sequence[Mapping[str, Any]] | None = None
        if slices_changed or self._taints is None:
            current = slices()
            self._taints = _device_taints(current)
        taints = self._taints
        if not taints and not rules:
            return 0  # nothing tainted, nothing to report: the usual pass costs no walk over pods and claims
        slices_now = current if current is not None else slices()
        pods, claims = list(pods), list(claims)
        decided = plan(pods, claims, slices_now, now, taints=taints)
        rules_by_name = {o.name(r): r for r in rules}
        for eviction in decided.evict_now:
            self._evict(eviction.pod)
            for name in eviction.rules:
                if name in rules_by_name:
                    uid = o.uid(rules_by_name[name])
                    self._evicted[uid] = self._evicted.get(uid, 0) + 1
        for rule in rules:
            self._rule_status(rule, pods, claims, slices_now, decided, now)
        return len(decided.evict_now)

    def _evict(self, pod: Mapping[str, Any]) -> None:
        self._explainer.event(pod, EVENT_REASON, "Marking for deletion", warning=False)
        mark_disrupted(self._writer, pod, POD_CONDITION)
        self._writer.delete("Pod", pod)

    def _rule_status(self, rule: Mapping[str, Any], pods: list[Mapping[str, Any]], claims: list[Mapping[str, Any]],
                     slices: Sequence[Mapping[str, Any]], decided: Plan, now: datetime) -> None:
        name = o.name(rule)
        effect = str(o.section(o.section(rule, "spec"), "taint").get("effect") or "")
        if effect == "None":
            # What NoExecute would do: the same rule with that effect, over the slices without this rule's taint.
            as_evict = {**rule, "spec": {**o.section(rule, "spec"),
                                         "taint": {**o.section(o.section(rule, "spec"), "taint"),
                                                   "effect": "NoExecute", RULE_KEY: name}}}
            simulated = [{**sl, "spec": {**o.section(sl, "spec"), "devices": [
                {**d, "taints": list(d.get("taints") or []) + [o.section(as_evict["spec"], "taint")]}
                if isinstance(d, Mapping) and _selects(rule, str(o.section(sl, "spec").get("driver", "")),
                                                       str(o.section(o.section(sl, "spec"), "pool").get("name", "")),
                                                       str(d.get("name", ""))) else d
                for d in o.list_field(o.section(sl, "spec"), "devices")]}} for sl in slices]
            sim = plan(pods, claims, simulated, now)
            pending = [e for e in sim.evict_now + sim.later if name in e.rules]
        else:
            pending = [e for e in decided.evict_now + decided.later if name in e.rules]
        published = sum(1 for sl in slices for d in o.list_field(o.section(sl, "spec"), "devices")
                        if isinstance(d, Mapping) and _selects(rule, str(o.section(sl, "spec").get("driver", "")),
                                                               str(o.section(o.section(sl, "spec"), "pool")
                                                                   .get("name", "")), str(d.get("name", ""))))
        allocated = sum(1 for c in claims for dev in o.allocated_devices(c) if _selects(rule, *dev))
        wanted = rule_condition(rule, pending, self._evicted.get(o.uid(rule), 0), published, allocated)
        current = next((c for c in o.list_field(o.section(rule, "status"), "conditions")
                        if isinstance(c, Mapping) and c.get("type") == CONDITION), None)
        if current is not None:
            same = all(current.get(k) == v for k, v in wanted.items())
            changed_at = parse_rfc3339(current.get("lastTransitionTime"))
            recent = changed_at is not None and now - changed_at < RULE_STATUS_PERIOD
            if same or (recent and current.get("observedGeneration") == wanted["observedGeneration"]):
                return
        others = [dict(c) for c in o.list_field(o.section(rule, "status"), "conditions")
                  if isinstance(c, Mapping) and c.get("type") != CONDITION]
        self._writer.patch_status("DeviceTaintRule", rule, {"status": {"conditions": others + [
            {**wanted, "lastTransitionTime": rfc3339(now)}]}})
