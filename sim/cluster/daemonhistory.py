"""A DaemonSet's revision history as kube-controller-manager keeps it, in ControllerRevisions (what `kubectl
rollout history|undo daemonset` reads): one per pod template, named `<daemonset>-<controller-revision-hash>`,
labelled with the template's labels and the hash, annotated as the DaemonSet is (its change-cause), controlled by
the DaemonSet, holding the template as a strategic merge patch that replaces it; the current template's revision
is the highest (an undo to an old template renumbers that revision rather than copying it); old revisions beyond
`spec.revisionHistoryLimit` (default 10) that no live pod still runs are deleted, oldest first.

Pure: the DaemonSet, its revisions and the hashes its pods run in, what to write out."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.expand import pod_template_hash

REVISION_LABEL = "controller-revision-hash"
DEFAULT_HISTORY_LIMIT = 10


@dataclass
class HistoryPlan:
    create: list[dict[str, Any]] = field(default_factory=list)
    renumber: list[tuple[str, int]] = field(default_factory=list)  # (name, new revision)
    delete: list[str] = field(default_factory=list)


def revision_name(ds: Mapping[str, Any]) -> str:
    return f"{(ds.get('metadata') or {}).get('name')}-{pod_template_hash(_template(ds))}"


def _template(ds: Mapping[str, Any]) -> dict[str, Any]:
    return dict((ds.get("spec") or {}).get("template") or {})


def owned_by(ds: Mapping[str, Any], revisions: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    uid = (ds.get("metadata") or {}).get("uid")
    return [r for r in revisions if any(ref.get("controller") and ref.get("uid") == uid
                                        for ref in (r.get("metadata") or {}).get("ownerReferences") or [])]


def snapshot(ds: Mapping[str, Any], revision: int) -> dict[str, Any]:
    meta = ds.get("metadata") or {}
    template = copy.deepcopy(_template(ds))
    labels = {**((template.get("metadata") or {}).get("labels") or {}), REVISION_LABEL: pod_template_hash(template)}
    out_meta: dict[str, Any] = {
        "name": revision_name(ds), "namespace": meta.get("namespace") or "default", "labels": labels,
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": meta.get("name"),
                             "uid": meta.get("uid", ""), "controller": True, "blockOwnerDeletion": True}]}
    if meta.get("annotations"):
        out_meta["annotations"] = dict(meta["annotations"])
    return {"apiVersion": "apps/v1", "kind": "ControllerRevision", "metadata": out_meta,
            "data": {"spec": {"template": {**template, "$patch": "replace"}}}, "revision": revision}


def plan_history(ds: Mapping[str, Any], revisions: Iterable[Mapping[str, Any]], live_hashes: set[str]) -> HistoryPlan:
    out = HistoryPlan()
    mine = owned_by(ds, revisions)
    current_name = revision_name(ds)
    top = max((int(r.get("revision") or 0) for r in mine), default=0)
    current = next((r for r in mine if (r.get("metadata") or {}).get("name") == current_name), None)
    if current is None:
        out.create.append(snapshot(ds, top + 1))
    elif int(current.get("revision") or 0) < top:
        out.renumber.append((current_name, top + 1))
    limit = (ds.get("spec") or {}).get("revisionHistoryLimit")
    limit = limit if isinstance(limit, int) and limit >= 0 else DEFAULT_HISTORY_LIMIT
    old = sorted((r for r in mine if (r.get("metadata") or {}).get("name") != current_name
                  and ((r.get("metadata") or {}).get("labels") or {}).get(REVISION_LABEL) not in live_hashes),
                 key=lambda r: int(r.get("revision") or 0))
    out.delete = [str((r.get("metadata") or {}).get("name")) for r in old[:max(0, len(old) - limit)]]
    return out
