"""DeviceTaintRules applied to ResourceSlices, as kube-scheduler's ResourceSlice tracker applies them.

A rule adds its one taint to every device its selector matches (driver, pool and device name, all set
fields must match; an empty selector matches every device, a missing one none), with the same effect as if
the driver had published the taint in the slice. The result is new slice dicts; the inputs are untouched.
Each added taint also carries the rule's name under RULE_KEY (never written to the API) so that
explanations can name the rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

RULE_KEY = "deviceTaintRule"


def _selects(selector: Mapping[str, Any], driver: Any, pool: Any, device: Any) -> bool:
    for field, value in (("driver", driver), ("pool", pool), ("device", device)):
        wanted = selector.get(field)
        if wanted is not None and wanted != value:
            return False
    return True


def _rules(rules: Iterable[Mapping[str, Any]]) -> list[tuple[str, Mapping[str, Any], dict[str, Any]]]:
    out = []
    for rule in rules:
        spec = rule.get("spec")
        if not isinstance(spec, Mapping):
            spec = {}
        selector = spec.get("deviceSelector")
        taint = spec.get("taint")
        if not isinstance(selector, Mapping) or not isinstance(taint, Mapping) or not taint.get("key"):
            continue  # no selector matches no device; a rule without a taint adds nothing
        meta = rule.get("metadata")
        if not isinstance(meta, Mapping):
            meta = {}
        added = {k: taint[k] for k in ("key", "value", "effect", "timeAdded") if taint.get(k) is not None}
        if not added.get("timeAdded") and meta.get("creationTimestamp"):
            added["timeAdded"] = meta["creationTimestamp"]
        out.append((str(meta.get("name") or ""), selector, {**added, RULE_KEY: str(meta.get("name") or "")}))
    return out


def apply_taint_rules(slices: Iterable[Mapping[str, Any]], rules: Iterable[Mapping[str, Any]]) -> list[Any]:
    """The slices with every rule's taint added to the devices it selects."""
    parsed = _rules(rules)
    items = list(slices)
    if not parsed:
        return items
    out: list[Any] = []
    for sl in items:
        spec = sl.get("spec")
        if not isinstance(spec, Mapping) or not isinstance(spec.get("devices"), list):
            out.append(sl)
            continue
        devices = spec["devices"]
        driver = spec.get("driver")
        pool = (spec.get("pool") or {}).get("name") if isinstance(spec.get("pool"), Mapping) else None
        new_devices = []
        changed = False
        for dev in devices:
            if not isinstance(dev, Mapping):
                new_devices.append(dev)
                continue
            extra = [taint for _, selector, taint in parsed if _selects(selector, driver, pool, dev.get("name"))]
            if extra:
                taints = list(dev.get("taints") or []) + extra
                new_devices.append({**dev, "taints": taints})
                changed = True
            else:
                new_devices.append(dev)
        out.append({**sl, "spec": {**spec, "devices": new_devices}} if changed else sl)
    return out
