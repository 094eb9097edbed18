"""One publisher per node: which of the node's agent instances writes the pool's ResourceSlices.

During a rolling update (the DaemonSet's `maxSurge: 1`) two agent pods of one driver run on a node. Both would
publish the same pool, and each would republish when its slice watch saw the other's write: a new pool generation
every round, for as long as they overlap. The newest instance that the kubelet registered publishes instead; an
older one stops as soon as a newer one is registered.

The instances know of each other through the plugin directory they share on the host (the checkpoint's): the file
`publisher.json` names the seat's holder (`{"instance": <pod UID>, "startedNs": <its start, wall clock>}`), written
atomically, and `publisher.lock` is flock'ed around every publish (which takes the seat when it may), so an
instance that has lost the seat is never halfway through a write when the new holder starts its own. An instance
publishes only once the kubelet registered it, and then takes the seat unless a holder that started later is alive
(a restarted container counts as started then); a holder is alive while its DRA socket (per pod:
driver.plugin.server.PluginPaths) accepts connections, so a newer pod that is deleted or crashes (a rollout rolled
back) hands the seat back to the older one at its next resync. A kubelet restart registers both instances again:
the start times keep the newer one in the seat.

This works the same on a real node (a hostPath both pods mount) and in the testbed; it needs no API object, so
the agent's RBAC does not change and nothing is left behind in the cluster.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from driver.checkpoint import NodeLock
from gpudra.atomicfile import atomic_write

log = logging.getLogger("gpu-dra.publisherseat")

SEAT_NAME = "publisher.json"
SEAT_LOCK_NAME = "publisher.lock"


@dataclass(frozen=True)
class Holder:
    instance: str
    started_ns: int


def read_holder(path: Path) -> Holder | None:
    """The seat's holder, or None when nobody holds it (no file, or one that is not ours: it is then taken anew)."""
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("instance"), str) or not isinstance(doc.get("startedNs"), int):
        return None
    return Holder(doc["instance"], doc["startedNs"])


class PublisherSeat:
    """This instance's view of the seat. `alive(instance)` says whether another instance still serves."""

    def __init__(self, plugin_dir: Path, me: Holder, alive: Callable[[str], bool]) -> None:
        self._path = plugin_dir / SEAT_NAME
        self._lock = NodeLock(plugin_dir / SEAT_LOCK_NAME)
        self.me = me
        self._alive = alive
        self._yielded_to: str | None = None

    def holder(self) -> Holder | None:
        return read_holder(self._path)

    def _write(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self._path, json.dumps({"instance": self.me.instance, "startedNs": self.me.started_ns}).encode())

    def _newer_alive(self, current: Holder) -> bool:
        """Whether `current` is another instance, started after this one, that still serves."""
        if current.instance == self.me.instance:
            return False
        newer = (current.started_ns, current.instance) > (self.me.started_ns, self.me.instance)
        return newer and self._alive(current.instance)

    @contextmanager
    def publishing(self) -> Iterator[bool]:
        """Around one publish: True when this instance holds the seat, taking it unless a newer live instance holds
        it; the seat's lock stays held until the publish is done."""
        with self._lock.held():
            current = self.holder()
            if current is not None and self._newer_alive(current):
                if self._yielded_to != current.instance:
                    log.info("event=publisher-seat-yielded instance=%s holder=%s msg=%r", self.me.instance or "-",
                             current.instance or "-",
                             "a newer agent instance on this node publishes the pool; this one stops publishing")
                    self._yielded_to = current.instance
                yield False
                return
            if current != self.me:
                self._write()
                log.info("event=publisher-seat-taken instance=%s previous=%s", self.me.instance or "-",
                         (current.instance or "-") if current else "none")
            self._yielded_to = None
            yield True
