"""Device health that survives the agent: what the checkpoint keeps (checkpoint.HealthRecord) and how it comes back.

Health is sticky (driver.health): NVML has no event that says a GPU recovered. Kept only in memory, it was lost at
every agent restart or upgrade, and a GPU with a double-bit ECC error or one off the bus was published clean
again. What makes a device unhealthy or unwatched (critical Xids, lost, unmonitored) is therefore recorded in the
checkpoint when the monitor sees it and restored before the agent first publishes; application Xids (an
informational taint, the device stays healthy) are not kept. A lost GPU is kept with its inventory entry, since
discovery cannot see a GPU that is still off the bus and it must stay published, tainted.

Pure: conversions between driver.inventory.Health and the record, and the merge of restored and live health.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pydantic import TypeAdapter, ValidationError

from driver.checkpoint import HealthRecord
from driver.inventory import APPLICATION_XIDS, Gpu, Health, Inventory

# driver.health keeps this many Xids per device; a restored history is cut the same way.
XID_HISTORY = 16

_GPU = TypeAdapter(Gpu)


def to_record(health: Health, gpu: Gpu | None = None) -> HealthRecord | None:
    """What must survive of `health` (None: nothing); `gpu` is kept for a lost GPU."""
    critical = [x for x in health.xids if x not in APPLICATION_XIDS]
    if not (critical or health.lost or health.unmonitored):
        return None
    described = _GPU.dump_python(replace(gpu, health=Health()), mode="json") if health.lost and gpu is not None else None
    return HealthRecord(xids=critical, lost=health.lost, unmonitored=health.unmonitored, gpu=described)


def from_record(record: HealthRecord) -> Health:
    return Health(xids=tuple(record.xids[-XID_HISTORY:]), lost=record.lost, unmonitored=record.unmonitored)


def merged(restored: Health | None, live: Health) -> Health:
    """A device's health from what the checkpoint restored and what the monitor saw since the agent started (the
    monitor starts from nothing, so its view holds only the faults of this run)."""
    if restored is None:
        return live
    return Health(xids=(*restored.xids, *live.xids)[-XID_HISTORY:], lost=restored.lost or live.lost,
                  unmonitored=restored.unmonitored or live.unmonitored)


def lost_gpus(records: Mapping[str, HealthRecord], inventory: Inventory) -> tuple[list[Gpu], list[str]]:
    """The lost GPUs the checkpoint describes that discovery did not find (to be published, tainted), and a note
    for each description that cannot be read (that GPU then stays unpublished, as discovery left it)."""
    present = {g.uuid for g in inventory.gpus}
    found: list[Gpu] = []
    notes: list[str] = []
    for uuid, record in sorted(records.items()):
        if not record.lost or record.gpu is None or uuid in present:
            continue
        try:
            gpu = _GPU.validate_python(record.gpu)
        except ValidationError as exc:
            notes.append(f"health record of lost GPU {uuid}: its inventory entry cannot be read ({exc.error_count()} "
                         "errors); it is not published until discovery sees it again")
            continue
        if gpu.uuid == uuid:
            found.append(gpu)
    return found, notes
