"""What a damaged checkpoint leaves to be rebuilt: the pure part of the recovery `Preparer.start` runs.

A damaged journal line loses one transaction (driver.checkpoint keeps every verified one); a damaged snapshot loses
every claim folded into it. A claim whose record is gone still has what its prepare left on the node: its CDI spec
(written before PrepareCompleted) and, for MPS, its daemon's directories under the MPS root. Those name the claim
by UID; the API's allocation for this node gives back everything else (its devices and configs), so the record is
planned again exactly as prepare planned it. A PrepareStarted record whose PrepareCompleted was lost cannot be told
from a prepare that stopped half-way: with its CDI spec written, it is kept as completed (a container may run on
it), never rolled back.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from driver.checkpoint import DRA_HOLDER_PREFIX, ClaimPhase, ClaimRecord

# A GPU's device node in a claim's CDI spec (the MIG capability nodes are under /dev/nvidia-caps).
_GPU_NODE = re.compile(r"^/dev/nvidia(\d+)$")
# The MPS root's entry for GPUs shared by capacity (driver.sharing.shared_mps_dirs), not a claim's.
SHARED_MPS_DIR = "shared"
_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,127}$")


def mps_claim_uids(mps_root: Path) -> set[str]:
    """The claims that have MPS directories under the MPS root."""
    try:
        names = os.listdir(mps_root)
    except FileNotFoundError:
        return set()
    return {n for n in names if n != SHARED_MPS_DIR and _UID.match(n) and (mps_root / n).is_dir()}


def orphans(records: Mapping[str, ClaimRecord], spec_uids: Iterable[str], mps_uids: Iterable[str]) -> list[str]:
    """Claims the node has prepared something for (a CDI spec, MPS directories) that have no record."""
    return sorted((set(spec_uids) | set(mps_uids)) - set(records))


def to_promote(records: Mapping[str, ClaimRecord], spec_uids: Iterable[str]) -> list[ClaimRecord]:
    """PrepareStarted records whose CDI spec was written: after damage they count as completed."""
    specs = set(spec_uids)
    return [r for uid, r in sorted(records.items()) if r.phase is ClaimPhase.PREPARE_STARTED and uid in specs]


def claims_by_uid(claims: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    out: dict[str, Mapping[str, Any]] = {}
    for claim in claims:
        uid = (claim.get("metadata") or {}).get("uid")
        if isinstance(uid, str) and uid:
            out[uid] = claim
    return out


def spec_gpu_minors(spec: Mapping[str, Any]) -> set[int]:
    """The GPU minors a claim's CDI spec hands to containers."""
    minors: set[int] = set()
    for device in spec.get("devices") or []:
        for node in ((device.get("containerEdits") or {}).get("deviceNodes")) or []:
            match = _GPU_NODE.match(str(node.get("path", "")))
            if match:
                minors.add(int(match.group(1)))
    return minors


def stray_dra_holders(ledger: Mapping[str, list[str]], known: Iterable[str]) -> dict[str, list[str]]:
    """GPU uuid -> the DRA holders on it whose claim is not `known` (what a lost unprepare left held)."""
    keep = set(known)
    out: dict[str, list[str]] = {}
    for uuid, holders in ledger.items():
        stray = [h for h in holders if h.startswith(DRA_HOLDER_PREFIX) and h[len(DRA_HOLDER_PREFIX):] not in keep]
        if stray:
            out[uuid] = stray
    return out
