"""The compute-domain.nvidia.com plugin of one node: its kubelet plugin (registration + DRA gRPC), its slice, the
node's `nvidia.com/gpu.clique` label, and a Warning on each domain whose daemon claim is prepared here while the
node's NVLink fabric is unhealthy. The IMEX daemon itself and its ComputeDomainClique entry are the daemon pod's
(driver.computedomain.daemon); a channel claim waits for that entry to say Ready."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driver.cdi import DeviceNumbers
from driver.computedomain.fabric import fabric_health, node_clique
from driver.computedomain import imex
from driver.computedomain.preparer import DAEMON_WAIT_S, Checkpoint, ComputeDomainPreparer, NodeContext, NotReady
from driver.driverfiles import DriverFiles
from driver.computedomain.slices import build_slice
from driver.inventory import Inventory
from driver.plugin.health import HealthBoard
from driver.plugin.server import KubeletPlugin, PluginPaths
from driver.prepare import ClaimNotFound
from driver.publisher import SlicePublisher
from gpudra import computedomain as cd
from gpudra.timestamps import rfc3339
from gpudra.kubeapi import ApiError, KubeApi, NotFound

log = logging.getLogger("gpu-dra.compute-domain")
RECONCILE_S = 1.0


@dataclass(frozen=True)
class ComputeDomainSettings:
    node: str
    kubelet_dir: Path
    cdi_dir: Path
    namespace: str  # where the ComputeDomainCliques live (the driver's namespace)
    driver_root: Path | None  # the driver install as this process sees it
    proc_root: Path | None = None
    host_driver_root: str = "/"  # the same install's path on the host, which CDI specs name
    dev_root: Path | None = None  # the host's /dev as this process sees it (None on a simulated node)


class ComputeDomainAgent:
    def __init__(self, api: KubeApi, settings: ComputeDomainSettings, nvml: Any, inventory: Inventory,
                 driver_files: DriverFiles | None = None) -> None:
        self.api = api
        self.settings = settings
        self.nvml = nvml
        self.inventory = inventory
        self.clique = node_clique(inventory)
        self.paths = PluginPaths(settings.kubelet_dir, cd.DRIVER)
        self.domains_dir = self.paths.plugin_dir / "domains"
        self.checkpoint = Checkpoint(self.paths.plugin_dir / "checkpoint.json")
        self._stop = threading.Event()
        self._changed = threading.Event()
        self._threads: list[threading.Thread] = []
        self._last_reported: dict[str, str] = {}
        # The driver's libraries and tools (the node agent's discovery, driver.driverfiles), for the daemon pods.
        self.driver_files = driver_files or DriverFiles()
        self.preparer = ComputeDomainPreparer(
            NodeContext(settings.node, self.clique, lambda d: imex.write_domain_dir(self.domains_dir, d),
                        self._device_numbers, lambda: imex.binaries(settings.driver_root, settings.host_driver_root),
                        self._daemon_edits),
            self.checkpoint, settings.cdi_dir, get_claim=self._get_claim, get_domain=self._get_domain,
            daemon_ready=self._daemon_ready, label_node=self._label_domain, on_change=self._changed.set,
            daemon_wait_s=DAEMON_WAIT_S)
        # Published at start and again after every registration (a restarted kubelet wipes the node's slices).
        self._publish = threading.Event()
        self._publish.set()
        self.plugin = KubeletPlugin(self.paths, self.preparer, HealthBoard(), on_registered=self._publish.set)
        self.publisher = SlicePublisher(api, cd.DRIVER, settings.node)

    # ----- lookups -----------------------------------------------------------------------------------------

    def _device_numbers(self) -> DeviceNumbers:
        root = self.settings.proc_root
        return DeviceNumbers.read(root) if root is not None else DeviceNumbers()

    def _daemon_edits(self) -> dict[str, Any]:
        try:
            return imex.daemon_edits(self._device_numbers(), [g.minor for g in self.inventory.gpus], self.driver_files,
                                     imex.host_channel_nodes(self.settings.dev_root))
        except imex.ImexError as exc:
            raise NotReady(f"node {self.settings.node} cannot run an IMEX daemon: {exc}") from exc

    def _get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        try:
            return self.api.get("ResourceClaim", name, namespace=namespace)
        except NotFound as exc:
            raise ClaimNotFound(f"{namespace}/{name}") from exc

    def _get_domain(self, uid: str) -> Mapping[str, Any] | None:
        domains, _ = self.api.list("ComputeDomain")
        return next((d for d in domains if d["metadata"].get("uid") == uid), None)

    def _clique_name(self, domain: str) -> str:
        assert self.clique is not None
        return cd.clique_object_name(domain, self.clique)

    def _daemon_ready(self, domain: str) -> tuple[bool, str]:
        if self.clique is None:
            return False, "this node has no NVLink clique"
        obj = self.api.try_get("ComputeDomainClique", self._clique_name(domain), namespace=self.settings.namespace)
        entry = next((d for d in (obj or {}).get("daemons") or [] if d.get("nodeName") == self.settings.node), None)
        if entry is None:
            return False, "no IMEX daemon has joined from this node yet"
        if entry.get("status") != "Ready":
            return False, self._last_reported.get(domain) or "its IMEX daemon is not ready"
        return True, ""

    def _label_domain(self, domain: str | None) -> None:
        try:
            self.api.patch("Node", self.settings.node, {"metadata": {"labels": {cd.DOMAIN_LABEL: domain}}})
        except ApiError as exc:
            log.warning("event=node-label-failed node=%s error=%r", self.settings.node, str(exc))

    # ----- fabric health -------------------------------------------------------------------------------------

    def _event(self, domain: str, reason: str, message: str, warning: bool) -> None:
        cd_obj = self._get_domain(domain)
        if cd_obj is None:
            return
        meta = cd_obj["metadata"]
        stamp = rfc3339()
        try:
            self.api.create("Event", {
                "metadata": {"generateName": f"{meta['name']}.", "namespace": meta.get("namespace", "default")},
                "involvedObject": {"apiVersion": cd.API_VERSION, "kind": "ComputeDomain", "name": meta["name"],
                                   "namespace": meta.get("namespace"), "uid": meta.get("uid")},
                "reason": reason, "message": message, "type": "Warning" if warning else "Normal",
                "source": {"component": "compute-domain-kubelet-plugin", "host": self.settings.node},
                "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
                "reportingComponent": "compute-domain.nvidia.com", "reportingInstance": self.settings.node,
            }, namespace=meta.get("namespace"))
        except ApiError as exc:
            log.warning("event=event-failed domain=%s error=%r", domain, str(exc))

    def reconcile(self) -> None:
        """A Warning on each domain served here when the fabric goes unhealthy, a Normal event when it recovers
        (the IMEX stand-in, like the real daemon, reports NOT_READY meanwhile, so the domain shows it too)."""
        wanted = {c.domain for c in self.checkpoint.claims.values() if c.kind == "daemon"}
        health = fabric_health(self.nvml, self.inventory)
        why = "" if health.healthy else f"NVLink fabric unhealthy on node {self.settings.node}: " \
                                         f"{'; '.join(health.problems)}"
        for domain in sorted(wanted):
            previous = self._last_reported.get(domain, "")
            if previous == why:
                continue
            if why:
                log.warning("event=fabric-unhealthy domain=%s reason=%r", domain, why)
                self._event(domain, "FabricUnhealthy", why, True)
            else:
                self._event(domain, "FabricHealthy", f"NVLink fabric healthy again on node {self.settings.node}",
                            False)
            self._last_reported[domain] = why
        for domain in set(self._last_reported) - wanted:
            self._last_reported.pop(domain, None)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile()
            except (ApiError, OSError) as exc:
                log.warning("event=compute-domain-reconcile-failed error=%r", str(exc))
            self._changed.wait(RECONCILE_S)
            self._changed.clear()

    # ----- lifecycle ---------------------------------------------------------------------------------------

    def desired_slices(self) -> list[dict[str, Any]]:
        return [build_slice(self.settings.node, self.clique)]

    def start(self) -> None:
        if self.clique is not None:
            try:
                self.api.patch("Node", self.settings.node, {"metadata": {"labels": {cd.CLIQUE_LABEL: self.clique}}})
            except ApiError as exc:
                log.warning("event=clique-label-failed node=%s error=%r", self.settings.node, str(exc))
        self.preparer.rewrite_specs_on_start()
        self.plugin.start()
        self._threads = [
            threading.Thread(target=self.publisher.run, args=(self.desired_slices, self._publish, self._stop),
                             name="cd-slice-publisher", daemon=True),
            threading.Thread(target=self._loop, name="cd-fabric", daemon=True)]
        for t in self._threads:
            t.start()
        log.info("event=compute-domain-plugin-started node=%s clique=%s", self.settings.node, self.clique)

    def stop(self) -> None:
        self._stop.set()
        self._changed.set()
        self.plugin.stop()
        for t in self._threads:
            t.join(timeout=5)
