"""The CRD controllers inside the server (apiextensions-apiserver's naming, establishing and finalizer
controllers): a CustomResourceDefinition's names are checked against what is served, its type is served once
they are accepted (conditions NamesAccepted and Established, acceptedNames, storedVersions), and when it is
deleted its custom resources are deleted before its finalizer is removed and its type withdrawn."""

from __future__ import annotations

import sys
import threading
from typing import Any

from controlplane import status as st
from controlplane.crds import definition as d
from gpudra.timestamps import rfc3339
from controlplane.resources import ResourceType
from controlplane.store import Filter, Store
from gpudra.jsoncopy import copy_json

_RETRY_S = 1.0  # how soon a definition whose instances are still going is looked at again


def _condition(kind: str, status: str, reason: str, message: str, old: list[dict[str, Any]]) -> dict[str, Any]:
    previous = next((c for c in old if c.get("type") == kind), None)
    since = previous["lastTransitionTime"] if previous and previous.get("status") == status else rfc3339()
    return {"type": kind, "status": status, "lastTransitionTime": since, "reason": reason, "message": message}


class DefinitionController:
    """Reconciles every CRD whenever one changes; run() until `stopping` is set."""

    def __init__(self, store: Store, stopping: threading.Event) -> None:
        self.store = store
        self.stopping = stopping
        rt = store.registry.by_kind(d.KIND)
        assert rt is not None
        self.rt: ResourceType = rt

    def run(self) -> None:
        watcher = self.store.watch(Filter(self.rt), None, True)
        list(watcher.initial_events())
        self.reconcile_all()
        while not self.stopping.is_set() and not self.store.closed:
            try:
                events = watcher.next_events(_RETRY_S)
            except st.StatusError:
                watcher = self.store.watch(Filter(self.rt), None, True)
                list(watcher.initial_events())
                events = []
            del events  # every event, and every retry tick, reconciles all definitions
            try:
                self.reconcile_all()
            except Exception as exc:  # noqa: BLE001 - a bad definition must never stop the controller
                print(f"level=error component=apiserver-crds msg={str(exc)!r}", file=sys.stderr)

    def reconcile_all(self) -> None:
        crds, _ = self.store.list(Filter(self.rt))
        for crd in crds:
            if (crd.get("metadata") or {}).get("deletionTimestamp"):
                self._finalize(crd)
            else:
                self._establish(crd, crds)

    def _conflict(self, crd: dict[str, Any], crds: list[dict[str, Any]]) -> tuple[str, str] | None:
        spec = crd["spec"]
        names = spec["names"]
        mine = crd["metadata"]["name"]
        for other in crds:
            if other["metadata"]["name"] == mine or not d.established(other):
                continue
            oname = (other.get("status") or {}).get("acceptedNames") or {}
            if other["spec"].get("group") != spec["group"]:
                continue
            if oname.get("kind") == names["kind"] or oname.get("listKind") == names.get("listKind"):
                return "KindConflict", f'"{names["kind"]}" is already in use'
            taken = {oname.get("plural"), oname.get("singular"), *(oname.get("shortNames") or [])}
            for key in ("plural", "singular"):
                if names.get(key) in taken:
                    return f"{key.capitalize()}Conflict", f'"{names[key]}" is already in use'
            for short in names.get("shortNames") or []:
                if short in taken:
                    return "ShortNamesConflict", f'"{short}" is already in use'
        served = self.store.registry.by_kind(names["kind"])
        if served is not None and not (served.custom is not None and served.group == spec["group"]
                                       and served.plural == names["plural"]):
            # One kind name per server: the durable store keys objects by kind (a limitation of this server).
            return "KindConflict", (f'"{names["kind"]}" is already served by {served.qualified} here; this server '
                                    "serves each kind name from one group only")
        return None

    def _establish(self, crd: dict[str, Any], crds: list[dict[str, Any]]) -> None:
        status = crd.get("status") or {}
        old_conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
        conflict = self._conflict(crd, crds)
        new_status = copy_json(status)
        names = crd["spec"]["names"]
        if conflict is not None:
            conditions = [_condition("NamesAccepted", "False", conflict[0], conflict[1], old_conditions),
                          _condition("Established", "False", "NotAccepted", "not all names are accepted",
                                     old_conditions)]
        else:
            rt = d.served_type(crd)
            self.store.serve_type(rt)
            new_status["acceptedNames"] = {k: names[k] for k in ("plural", "singular", "shortNames", "kind",
                                                                  "listKind", "categories") if names.get(k)}
            conditions = [_condition("NamesAccepted", "True", "NoConflicts", "no conflicts found", old_conditions),
                          _condition("Established", "True", "InitialNamesAccepted",
                                     "the initial names have been accepted", old_conditions)]
            stored = list(new_status.get("storedVersions") or [])
            if rt.version not in stored:
                stored.append(rt.version)
            new_status["storedVersions"] = stored
        new_status["conditions"] = conditions
        new_status.setdefault("acceptedNames", {"plural": "", "kind": ""})
        if new_status != status:
            self._write_status(crd, new_status)

    def _write_status(self, crd: dict[str, Any], new_status: dict[str, Any]) -> None:
        try:
            self.store.update(self.rt, "", crd["metadata"]["name"], {**crd, "status": new_status}, "status")
        except st.StatusError as err:
            if err.code not in (404, 409):
                raise  # 409: it changed meanwhile; the watch brings it back

    def _finalize(self, crd: dict[str, Any]) -> None:
        finalizers = list(crd["metadata"].get("finalizers") or [])
        if d.CLEANUP_FINALIZER not in finalizers:
            return
        spec = crd["spec"]
        rt = self.store.registry.by_route(spec["group"], "", spec["names"]["plural"])
        rt = next((t for t in self.store.registry.types if t.custom is not None and t.group == spec["group"]
                   and t.plural == spec["names"]["plural"]), rt)
        if rt is not None:
            items, _ = self.store.list(Filter(rt))
            for item in items:
                m = item["metadata"]
                if not m.get("deletionTimestamp"):
                    try:
                        self.store.delete(rt, m.get("namespace", ""), m["name"], {})
                    except st.StatusError:
                        pass
            if self.store.list(Filter(rt))[0]:
                status = copy_json(crd.get("status") or {})
                old = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
                terminating = _condition("Terminating", "True", "InstanceDeletionInProgress",
                                         "CustomResource deletion is in progress", old)
                status["conditions"] = [c for c in old if c.get("type") != "Terminating"] + [terminating]
                if status != crd.get("status"):
                    self._write_status(crd, status)
                return  # instances with finalizers of their own: looked at again on the next tick
            self.store.withdraw_type(rt)
        finalizers.remove(d.CLEANUP_FINALIZER)
        current = self.store.get(self.rt, "", crd["metadata"]["name"])
        updated = {**current, "metadata": {**current["metadata"], "finalizers": finalizers}}
        try:
            self.store.update(self.rt, "", crd["metadata"]["name"], updated)
        except st.StatusError as err:
            if err.code not in (404, 409):
                raise
