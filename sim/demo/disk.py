"""What a node keeps on disk, read back for the demo's report: CDI specs and the node checkpoint."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from driver import cdi
from driver.checkpoint import Checkpoint


@dataclass(frozen=True)
class NodeDisk:
    """One node's CDI specs (claim UID -> spec) and checkpoint (prepared claims, GPU ledger)."""

    specs: dict[str, dict[str, Any]] = field(default_factory=dict)
    spec_errors: dict[str, list[str]] = field(default_factory=dict)  # claim UID -> validation errors
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)  # claim UID -> ClaimRecord as JSON
    ledger: dict[str, list[str]] = field(default_factory=dict)  # GPU uuid -> holders
    problems: tuple[str, ...] = ()

    def cdi_device_names(self, claim_uid: str) -> set[str]:
        spec = self.specs.get(claim_uid) or {}
        return {f"{spec.get('kind')}={d.get('name')}" for d in spec.get("devices") or []}


def read_node(cdi_dir: Path, plugin_dir: Path) -> NodeDisk:
    specs: dict[str, dict[str, Any]] = {}
    spec_errors: dict[str, list[str]] = {}
    problems: list[str] = []
    for uid in sorted(cdi.claim_spec_uids(cdi_dir)):
        path = cdi_dir / cdi.spec_file_name(uid)
        try:
            spec = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            problems.append(f"{path}: cannot be read as JSON: {exc}")
            continue
        specs[uid] = spec
        errors = cdi.validate_spec(spec)
        if errors:
            spec_errors[uid] = errors
    claims: dict[str, dict[str, Any]] = {}
    ledger: dict[str, list[str]] = {}
    if plugin_dir.is_dir():
        # Opening takes the node lock (flock), so a running agent's half-written transaction is never read.
        checkpoint, report = Checkpoint.open(plugin_dir)
        try:
            problems += report.problems
            state = checkpoint.state
            claims = {uid: rec.model_dump(mode="json") for uid, rec in state.claims.items()}
            ledger = {uuid: list(holders) for uuid, holders in state.ledger.items()}
        finally:
            checkpoint.close()
    else:
        problems.append(f"{plugin_dir}: no checkpoint directory")
    return NodeDisk(specs, spec_errors, claims, ledger, tuple(problems))
