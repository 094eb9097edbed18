"""The kubelet's record of the claims it prepared for each pod (its DRA manager checkpoint, dra_manager_state in
the kubelet dir): written after every prepare and unprepare, read when the kubelet starts, so that the claims of a
pod deleted while the kubelet was down are unprepared once it is back, as the real kubelet does from its
checkpoint. Pure data in, a JSON file out; a damaged or foreign file is ignored with a warning."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path

from gpudra.atomicfile import atomic_write
from sim.kubelet.dra import ClaimInfo

log = logging.getLogger("sim.kubelet.claimstate")
FILE_NAME = "dra_manager_state.json"
_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,127}$")


def save(kubelet_dir: Path, pods: Mapping[str, tuple[str, list[ClaimInfo]]]) -> None:
    """pods: pod uid -> (pod name, its prepared claims)."""
    data = {uid: {"pod": name, "claims": [{"namespace": c.namespace, "uid": c.uid, "name": c.name} for c in claims]}
            for uid, (name, claims) in sorted(pods.items()) if claims}
    atomic_write(kubelet_dir / FILE_NAME, json.dumps({"version": 1, "pods": data}, sort_keys=True).encode(),
                 durable=False)


def load(kubelet_dir: Path) -> dict[str, tuple[str, list[ClaimInfo]]]:
    path = kubelet_dir / FILE_NAME
    try:
        doc = json.loads(path.read_bytes())
        out = {}
        for uid, entry in (doc.get("pods") or {}).items():
            claims = [ClaimInfo(str(c["namespace"]), str(c["uid"]), str(c["name"])) for c in entry["claims"]]
            if _UID.match(str(uid)) and all(_UID.match(c.uid) for c in claims):
                out[str(uid)] = (str(entry["pod"]), claims)
        return out
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("event=claim-state-unreadable path=%s error=%r", path, str(exc))
        return {}
