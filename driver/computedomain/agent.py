"""The compute-domain.nvidia.com plugin of one node: its kubelet plugin (registration + DRA gRPC), its slice, the
node's `nvidia.com/gpu.clique` label, and the IMEX daemons of the domains whose daemon claim is prepared here,
each with its entry in the domain's ComputeDomainClique (IP, clique, index, Ready when `nvidia-imex-ctl -q`
says READY and the node's NVLink fabric is healthy)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driver.cdi import DeviceNumbers
from driver.computedomain.fabric import fabric_health, node_clique
from driver.computedomain.imex import ImexDaemons, ImexError
from driver.computedomain.preparer import Checkpoint, ComputeDomainPreparer, NodeContext
from driver.computedomain.slices import build_slice
from driver.inventory import Inventory
from driver.plugin.health import HealthBoard
from driver.plugin.server import KubeletPlugin, PluginPaths
from driver.prepare import ClaimNotFound
from driver.publisher import SlicePublisher
from gpudra import computedomain as cd
from gpudra.timestamps import rfc3339
from gpudra.kubeapi import AlreadyExists, ApiError, Conflict, KubeApi, NotFound

log = logging.getLogger("gpu-dra.compute-domain")
RECONCILE_S = 1.0


@dataclass(frozen=True)
class ComputeDomainSettings:
    node: str
    kubelet_dir: Path
    cdi_dir: Path
    namespace: str  # where the ComputeDomainCliques live (the driver's namespace)
    driver_root: Path | None
    proc_root: Path | None = None


class ComputeDomainAgent:
    def __init__(self, api: KubeApi, settings: ComputeDomainSettings, nvml: Any, inventory: Inventory) -> None:
        self.api = api
        self.settings = settings
        self.nvml = nvml
        self.inventory = inventory
        self.clique = node_clique(inventory)
        self.paths = PluginPaths(settings.kubelet_dir, cd.DRIVER)
        self.imex = ImexDaemons(self.paths.plugin_dir / "domains", settings.driver_root)
        self.checkpoint = Checkpoint(self.paths.plugin_dir / "checkpoint.json")
        self._stop = threading.Event()
        self._changed = threading.Event()
        self._threads: list[threading.Thread] = []
        self._last_reported: dict[str, str] = {}
        self.preparer = ComputeDomainPreparer(
            NodeContext(settings.node, self.clique, self.imex.domain_dir, self._device_numbers),
            self.checkpoint, settings.cdi_dir, get_claim=self._get_claim, get_domain=self._get_domain,
            daemon_ready=self._daemon_ready, label_node=self._label_domain, on_change=self._changed.set)
        # Published at start and again after every registration (a restarted kubelet wipes the node's slices).
        self._publish = threading.Event()
        self._publish.set()
        self.plugin = KubeletPlugin(self.paths, self.preparer, HealthBoard(), on_registered=self._publish.set)
        self.publisher = SlicePublisher(api, cd.DRIVER, settings.node)

    # ----- lookups -----------------------------------------------------------------------------------------

    def _device_numbers(self) -> DeviceNumbers:
        root = self.settings.proc_root
        return DeviceNumbers.read(root) if root is not None else DeviceNumbers()

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

    def _node_ip(self) -> str:
        node = self.api.get("Node", self.settings.node)
        for address in (node.get("status") or {}).get("addresses") or []:
            if address.get("type") == "InternalIP":
                return str(address["address"])
        raise ImexError(f"node {self.settings.node} has no InternalIP address for its IMEX daemon")

    # ----- the daemons -------------------------------------------------------------------------------------

    def _update_clique(self, domain: str, ip: str, status: str | None) -> list[dict[str, Any]]:
        """Add, update (status) or remove (status None) this node's entry; returns the clique's daemons."""
        name = self._clique_name(domain)
        ns = self.settings.namespace
        for _ in range(10):
            obj = self.api.try_get("ComputeDomainClique", name, namespace=ns)
            if obj is None:
                if status is None:
                    return []
                obj = {"apiVersion": cd.API_VERSION, "kind": "ComputeDomainClique",
                       "metadata": {"name": name, "namespace": ns, "labels": {cd.DOMAIN_LABEL: domain}}, "daemons": []}
                try:
                    obj = self.api.create("ComputeDomainClique", obj, namespace=ns)
                except AlreadyExists:
                    continue
            daemons = [dict(d) for d in obj.get("daemons") or []]
            mine = next((d for d in daemons if d.get("nodeName") == self.settings.node), None)
            if status is None:
                daemons = [d for d in daemons if d is not mine]
            elif mine is None:
                used = {d.get("index") for d in daemons}
                index = next(i for i in range(len(daemons) + 1) if i not in used)
                daemons.append({"nodeName": self.settings.node, "ipAddress": ip, "cliqueID": self.clique,
                                "index": index, "status": status})
            elif mine.get("status") != status or mine.get("ipAddress") != ip:
                mine.update(status=status, ipAddress=ip)
            else:
                return daemons
            try:
                self.api.replace("ComputeDomainClique", {**obj, "daemons": daemons})
                return daemons
            except Conflict:
                continue
        raise ImexError(f"ComputeDomainClique {ns}/{name}: too many concurrent writers")

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
        wanted = {c.domain for c in self.checkpoint.claims.values() if c.kind == "daemon"}
        for domain in sorted(wanted):
            try:
                self._reconcile_domain(domain)
            except (ApiError, ImexError, OSError) as exc:  # one domain's trouble must not stall the others
                log.warning("event=compute-domain-reconcile-failed domain=%s error=%r", domain, str(exc))
        for domain in self.imex.running() - wanted:
            self.imex.stop(domain)
            self._last_reported.pop(domain, None)
            try:
                self._update_clique(domain, "", None)
            except (ApiError, ImexError) as exc:
                log.warning("event=clique-leave-failed domain=%s error=%r", domain, str(exc))

    def _reconcile_domain(self, domain: str) -> None:
        ip = self._node_ip()
        previous = self._last_reported.get(domain)
        # Join (or stay in) the clique with the status last reported, to learn the peers first.
        daemons = self._update_clique(domain, ip, "Ready" if previous == "" else "NotReady")
        peers = tuple(str(d["ipAddress"]) for d in sorted(daemons, key=lambda d: int(d.get("index", 0))))
        self.imex.ensure(domain, ip, peers)
        ready, said = self.imex.ready(domain)
        health = fabric_health(self.nvml, self.inventory)
        if not health.healthy:
            why = f"NVLink fabric unhealthy on node {self.settings.node}: {'; '.join(health.problems)}"
        else:
            why = "" if ready else f"nvidia-imex-ctl -q: {said}"
        if previous != why:
            if why:
                log.warning("event=imex-not-ready domain=%s reason=%r", domain, why)
                self._event(domain, "FabricUnhealthy" if not health.healthy else "IMEXDaemonNotReady", why, True)
            else:
                self._event(domain, "IMEXDaemonReady", f"IMEX daemon on node {self.settings.node} is ready "
                                                       f"({len(peers)} peers)", False)
            self._last_reported[domain] = why
        self._update_clique(domain, ip, "NotReady" if why else "Ready")

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile()
            except (ApiError, ImexError, OSError) as exc:
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
            threading.Thread(target=self._loop, name="cd-imex", daemon=True)]
        for t in self._threads:
            t.start()
        log.info("event=compute-domain-plugin-started node=%s clique=%s", self.settings.node, self.clique)

    def stop(self) -> None:
        self._stop.set()
        self._changed.set()
        self.plugin.stop()
        for t in self._threads:
            t.join(timeout=5)
        self.imex.stop_all()
