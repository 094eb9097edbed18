"""The node agent: NVML inventory + health monitor + slice publisher + preparer + kubelet plugin, wired together.

`NodeAgent` is what `gpu-dra plugin` runs and what tests and the prepare benchmark start in-process.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from driver import cdihook, stickyhealth
from driver.binder import MigBinder
from driver.cdi import DeviceNumbers
from driver.checkpoint import Checkpoint
from driver.driverfiles import DriverFiles
from driver.driverfiles import discover as discover_driver_files
from driver.inventory import Health, Inventory
from driver.nvmlapi import NvmlBackend
from driver.plugin.health import DeviceHealthEntry, HealthBoard
from driver.plugin.metrics import PluginMetrics
from driver.plugin.server import KubeletPlugin, PluginPaths
from driver.prepare import ClaimGetter, ClaimLister, ClaimNotFound, FaultHook, Preparer, StartReport
from driver.publisherseat import Holder, PublisherSeat
from driver.rediscovery import Rediscoverer
from driver.sharing import MpsDaemons, NvmlSharing
from driver.slices import SliceSettings, build_slices, gpu_device_name, mig_device_name, mig_health, mig_mode_switchable
from gpudra.logfmt import quote

log = logging.getLogger("gpu-dra.agent")

# "Waiting for a kubelet" is reported after 5 s, then at doubling intervals up to every 5 minutes.
KUBELET_WAIT_FIRST_S = 5.0
KUBELET_WAIT_MAX_S = 300.0
# While a damaged checkpoint's lost claims cannot be rebuilt (the API away), try again this often.
RECOVERY_RETRY_S = 5.0
# Test-only fault hook: SIGKILL this process right after the named prepare/unprepare step (see tests/test_crash.py).
CRASH_AFTER_ENV = "GPU_DRA_TEST_CRASH_AFTER"


def crash_hook_from_env(environ: Mapping[str, str] = os.environ) -> FaultHook | None:
    step = environ.get(CRASH_AFTER_ENV, "")
    if not step:
        return None

    def hook(reached: str) -> None:
        if reached == step:
            log.warning("event=test-crash step=%s", reached)
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def kubeapi_claim_lister(api: Any) -> ClaimLister:
    """Every ResourceClaim, page by page (what rebuilding a damaged checkpoint's lost records reads)."""
    from driver.allocatedclaims import LIST_PAGE_SIZE

    def list_all() -> Iterator[Mapping[str, Any]]:
        for page, _ in api.list_pages("ResourceClaim", limit=LIST_PAGE_SIZE):
            yield from page

    return list_all


def kubeapi_claim_getter(api: Any) -> ClaimGetter:
    from gpudra.kubeapi import NotFound

    def get(namespace: str, name: str) -> Mapping[str, Any]:
        try:
            return api.get("ResourceClaim", name, namespace=namespace)
        except NotFound as exc:
            raise ClaimNotFound(f"{namespace}/{name}") from exc

    return get


@dataclass
class AgentSettings:
    node_name: str
    driver_name: str
    kubelet_dir: Path
    cdi_dir: Path
    partitionable: bool = False
    shared_capacity: bool = False  # full GPUs shared by capacity (DRAConsumableCapacity)
    reserved_uuids: frozenset[str] = frozenset()
    metrics_port: int | None = None
    watch_seconds: float = 1.0
    boot_id_path: Path | None = None
    # Where the host's driver install is visible to the agent (None: add no driver files to the specs), and
    # where that same tree is on the host, which is what the specs must name.
    driver_root: Path | None = None
    host_driver_root: str = "/"
    # procfs the driver's device numbers are read from (real GPUs); None: the backend's (`device_numbers()`, the
    # simulator's), else CDI device nodes by path only.
    proc_root: Path | None = None
    # An nvidia-cdi-hook (1.18+) on the host, for the forward-compat and device-node hooks (driver.driverfiles).
    cdi_hook_path: str | None = None
    # Install the agent's own CDI hook (driver.cdihook) and have every spec rebuild the container's ld.so.cache.
    ldcache_hook: bool = True
    # Rediscover every this many seconds and on health events (driver.rediscovery); None: never.
    rediscover_interval_s: float | None = None
    # With `partitionable`: MIG placements carry KEP-5007 binding conditions and the agent creates the instance
    # when a claim is allocated to one (driver.binder), before the scheduler binds the pod.
    binding_conditions: bool = False
    # The agent pod's UID: per-pod socket names, so that two agent pods overlap safely in a rolling update.
    instance: str = ""


def _health_entry(pool: str, device: str, health: Health) -> DeviceHealthEntry:
    # Application Xids leave the device HEALTHY but are still worth a message (their taint has effect None).
    msg = "" if health == Health() else f"xids={list(health.xids)} lost={health.lost}" + (
        " unmonitored=True" if health.unmonitored else "")
    return DeviceHealthEntry(pool, device, health.healthy, msg)


class NodeAgent:
    def __init__(
        self,
        settings: AgentSettings,
        *,
        nvml: NvmlBackend,
        inventory: Inventory,
        get_claim: ClaimGetter,
        publisher: Any | None = None,
        fault_hook: FaultHook | None = None,
        monitor_factory: Callable[[Any, Inventory, Callable[[str, Health], None]], Any] | None = None,
        binding_api: Any | None = None,
        list_claims: ClaimLister | None = None,
        mps_daemons: MpsDaemons | None = None,
    ) -> None:
        self.settings = settings
        self.paths = PluginPaths(settings.kubelet_dir, settings.driver_name, settings.instance)
        self._nvml = nvml
        self._inventory = inventory
        self._health: dict[str, Health] = {}
        self._lock = threading.Lock()
        self._publisher = publisher
        self._publish_changed = threading.Event()
        # Why the slices are withheld (driver.nodeguard: another device plugin serves these GPUs); None: publish.
        self._withheld: str | None = None
        # Device name -> extra slice taints; the device plugin shim sets it (ledger holds become NoSchedule taints).
        self.extra_taints: Callable[[], Mapping[str, Sequence[Mapping[str, str]]]] = dict
        self._stop = threading.Event()
        self._publisher_thread: threading.Thread | None = None
        self._registered = threading.Event()
        kwargs: dict[str, Any] = {}
        if settings.boot_id_path is not None:
            kwargs["boot_id_path"] = settings.boot_id_path
        self.checkpoint, self.load_report = Checkpoint.open(self.paths.plugin_dir, **kwargs)
        for problem in self.load_report.problems:
            log.error("event=checkpoint-corrupt problem=%r", problem)
        for note in self.load_report.notes:
            log.info("event=checkpoint-note note=%r", note)
        self._restore_health()
        self.driver_files = self._discover_driver_files(inventory)
        self.preparer = Preparer(
            driver_name=settings.driver_name, node_name=settings.node_name, get_claim=get_claim,
            inventory=self.inventory, checkpoint=self.checkpoint, cdi_dir=settings.cdi_dir,
            sharing_backend=NvmlSharing(nvml, mps_daemons), mps_root=self.paths.plugin_dir / "mps",
            reserved=settings.reserved_uuids, fault_hook=fault_hook,
            partitionable=settings.partitionable, nvml=nvml, on_inventory_change=self.refresh_inventory,
            common_edits=self.driver_files.container_edits(),
            device_numbers=self.device_numbers, list_claims=list_claims,
        )
        # One publisher per node across overlapping instances (rolling update): the newest registered one.
        self.seat = PublisherSeat(
            self.paths.plugin_dir, Holder(settings.instance, time.time_ns()),
            lambda other: PluginPaths(settings.kubelet_dir, settings.driver_name, other).serving(),
        )
        self.board = HealthBoard(self._health_entries())
        self.metrics = PluginMetrics()
        self.plugin = KubeletPlugin(
            self.paths, self.preparer, self.board, metrics=self.metrics, on_registered=self._on_registered,
            watch_seconds=settings.watch_seconds,
        )
        self._monitor = monitor_factory(nvml, inventory, self._on_health) if monitor_factory is not None else None
        self.binder: MigBinder | None = None
        if self.binding_conditions and binding_api is not None:
            self.binder = MigBinder(binding_api, self.preparer, settings.driver_name, settings.node_name,
                                    interval=settings.watch_seconds)
        self.start_report: StartReport | None = None
        # ---- rediscovery (driver.rediscovery): set once the driver changed under the agent; the caller exits.
        self.exit_requested = threading.Event()
        self._nvml_released: str | None = None
        self._walk_lock = threading.Lock()
        self.rediscoverer: Rediscoverer | None = None
        if settings.rediscover_interval_s is not None:
            self.rediscoverer = Rediscoverer(
                self._walk, lambda: self._inventory, self._install_inventory, self._on_driver_change,
                interval_s=settings.rediscover_interval_s, library_changed=self._nvml_library_changed(),
                lock=self._walk_lock,
            )

    def _restore_health(self) -> None:
        """Before anything is published: the sticky health the checkpoint kept (driver.stickyhealth), and the lost
        GPUs it describes that discovery cannot see, so that a tainted GPU stays tainted across restarts."""
        records = self.checkpoint.state.health
        self._restored = {uuid: stickyhealth.from_record(r) for uuid, r in records.items()}
        self._health.update(self._restored)
        gpus, notes = stickyhealth.lost_gpus(records, self._inventory)
        for note in notes:
            log.error("event=health-restore-problem note=%r", note)
        if gpus:
            self._inventory = replace(
                self._inventory, gpus=tuple(sorted([*self._inventory.gpus, *gpus], key=lambda g: g.index)))
        if records:
            log.warning("event=health-restored node=%s devices=%s", self.settings.node_name, ",".join(
                f"{uuid}(xids={'/'.join(map(str, r.xids))} lost={r.lost} unmonitored={r.unmonitored})"
                for uuid, r in sorted(records.items())))

    def _persist_health(self, uuid: str, health: Health) -> None:
        gpu = next((g for g in self._inventory.gpus if g.uuid == uuid), None)
        record = stickyhealth.to_record(health, gpu)
        try:
            with self.checkpoint.locked():
                if self.checkpoint.state.health.get(uuid) != record:
                    self.checkpoint.commit([self.checkpoint.put_health_op(uuid, record)])
        except Exception:  # noqa: BLE001 - the health is applied in memory all the same; only its survival is lost
            log.exception("event=health-persist-failed uuid=%s", uuid)

    def _walk(self) -> Inventory:
        from driver.discovery import discover

        return self._with_lost_gpus(discover(self._nvml, self.settings.node_name))

    def _with_lost_gpus(self, fresh: Inventory) -> Inventory:
        """A GPU that fell off the bus fails discovery's queries (the walk lists it as skipped) but is still in the
        node: it stays published, tainted gpu-lost and UNHEALTHY on the health stream, until the agent restarts
        (health is sticky), instead of vanishing from the slices and the stream as if it had never been there."""
        with self._lock:
            lost = {uuid for uuid, health in self._health.items() if health.lost}
            old = self._inventory
        present = {g.uuid for g in fresh.gpus}
        kept = [g for g in old.gpus if g.uuid in lost and g.uuid not in present]
        if not kept:
            return fresh
        return replace(fresh, gpus=tuple(sorted([*fresh.gpus, *kept], key=lambda g: g.index)))

    def _nvml_library_changed(self) -> Callable[[], str | None]:
        """What tells that the driver root now holds another driver: its libnvidia-ml.so.1 resolves elsewhere."""
        root = self.settings.driver_root
        if root is None:
            return lambda: None
        from driver.driverroot import DriverRoot, DriverRootError

        driver_root = DriverRoot(root)
        try:
            loaded = driver_root.find_library()
        except DriverRootError:
            return lambda: None

        def changed() -> str | None:
            try:
                now = driver_root.find_library()
            except DriverRootError as exc:
                return f"the driver root no longer holds NVML: {exc}"
            return None if now == loaded else f"libnvidia-ml.so.1 now resolves to {now}, the agent loaded {loaded}"

        return changed

    # ---- GPU Operator driver upgrades (driver.driverupgrade)

    @property
    def nvml_released(self) -> str | None:
        """Why NVML is released (a driver upgrade), or None while the agent holds it."""
        return self._nvml_released

    def release_nvml(self, reason: str) -> None:
        """Let the driver's modules be unloaded: stop everything that holds NVML (the health monitor's event set,
        rediscovery), then shut NVML down, which closes its /dev/nvidia* descriptors. The plugin keeps serving
        from the last inventory; claims that need NVML (MIG, sharing) fail until the agent is back."""
        if self._nvml_released is not None:
            return
        self._nvml_released = reason
        if self._monitor is not None:
            self._monitor.stop()
        if self.rediscoverer is not None:
            self.rediscoverer.stop()
        with self._walk_lock:
            try:
                self._nvml.nvmlShutdown()
            except Exception as exc:  # noqa: BLE001 - already shut down or the driver already gone: nothing held
                log.warning("event=nvml-shutdown-failed error=%r", str(exc))
        log.warning("event=nvml-released node=%s reason=%s", self.settings.node_name, quote(reason))

    def driver_ready(self) -> str | None:
        """None when a driver is there to come back to; else what is still missing."""
        root = self.settings.driver_root
        if root is None:
            # No driver root to look at (a simulator): ask the backend itself.
            try:
                self._nvml.nvmlInit()
            except Exception as exc:  # noqa: BLE001 - any failure means not there yet
                return f"nvmlInit failed: {exc}"
            self._nvml.nvmlShutdown()
            return None
        from driver.driverroot import DriverRoot, DriverRootError

        try:
            DriverRoot(root).find_library()
        except DriverRootError as exc:
            return str(exc)
        proc = self.settings.proc_root
        if proc is not None and not (proc / "driver" / "nvidia" / "version").is_file():
            return f"{proc}/driver/nvidia/version is missing: the NVIDIA kernel module is not loaded"
        return None

    def restart_on_new_driver(self) -> None:
        """The caller exits (code 3) and the DaemonSet starts the agent again, which loads the new driver's NVML."""
        self.exit_requested.set()

    def _on_driver_change(self, reason: str) -> None:
        log.error("event=exit-for-driver-change node=%s reason=%r msg=%s", self.settings.node_name, reason,
                  quote("the loaded NVML and the driver files in the specs belong to the old driver; exiting so that "
                        "the DaemonSet restarts the agent on the new one"))
        self.exit_requested.set()
        # ---- end of rediscovery

    def device_numbers(self) -> DeviceNumbers:
        root = self.settings.proc_root
        if root is not None:
            return DeviceNumbers.read(root)
        simulated = getattr(self._nvml, "device_numbers", None)
        return simulated() if callable(simulated) else DeviceNumbers()

    def _discover_driver_files(self, inventory: Inventory) -> DriverFiles:
        """Once per agent start: a new driver under a running agent makes it exit (driver.rediscovery), and the
        next start finds the new files."""
        root = self.settings.driver_root
        if root is None:
            return DriverFiles()
        ldcache_hook = self._install_ldcache_hook()
        try:
            files = discover_driver_files(root, inventory.driver_version, host_root=self.settings.host_driver_root,
                                          hook_path=self.settings.cdi_hook_path, ldcache_hook=ldcache_hook)
        except Exception:  # noqa: BLE001 - an unreadable driver root must not stop the agent; specs stay minimal
            log.exception("event=driver-files-failed root=%s", root)
            return DriverFiles()
        for note in files.notes:
            log.warning("event=driver-files-note root=%s note=%r", root, note)
        log.info(
            "event=driver-files root=%s host_root=%s version=%s mounts=%d hooks=%d",
            root, self.settings.host_driver_root, inventory.driver_version, len(files.mounts), len(files.hooks),
        )
        return files

    def _install_ldcache_hook(self) -> str | None:
        """The installed hook's path (the same on the host: the kubelet dir is mounted at its host path), or None
        after saying why containers will get no loader-cache update."""
        if not self.settings.ldcache_hook:
            return None
        try:
            path = cdihook.install(self.paths.hook_dir)
        except cdihook.HookInstallError as exc:
            log.warning("event=cdi-hook-not-installed msg=%s", quote(
                f"{exc}; containers get the driver's libraries but no ld.so.cache listing them (`ldconfig -p` "
                "finds no libcuda, Triton and torch.compile fail)"))
            return None
        log.info("event=cdi-hook-installed path=%s", path)
        return str(path)

    def inventory(self) -> Inventory:
        """The discovered inventory with the monitor's health folded in, per GPU and per MIG device (by UUID)."""
        with self._lock:
            if not self._health:
                return self._inventory
            gpus = []
            for gpu in self._inventory.gpus:
                migs = tuple(replace(m, health=self._health.get(m.uuid, m.health)) for m in gpu.mig_devices)
                gpus.append(replace(gpu, health=self._health.get(gpu.uuid, gpu.health), mig_devices=migs))
            return replace(self._inventory, gpus=tuple(gpus))

    def refresh_inventory(self) -> None:
        """Rediscover after MIG instances were created or destroyed, then republish slices and health.

        Health seen by the monitor is kept (it is keyed by UUID); a failed rediscovery keeps the old inventory, so
        prepare's checks then fail per claim instead of crashing the agent."""
        with self._walk_lock:
            try:
                fresh = self._walk()
            except Exception:  # noqa: BLE001 - a long-running agent must not die on one failed NVML walk
                log.exception("event=rediscover-failed node=%s", self.settings.node_name)
                return
            self._install_inventory(fresh)

    def _install_inventory(self, fresh: Inventory) -> None:
        with self._lock:
            self._inventory = fresh
        update = getattr(self._monitor, "update_inventory", None)
        if update is not None:
            update(fresh)
        self.board.update(self._health_entries())
        self._publish_changed.set()

    def _health_entries(self) -> list[DeviceHealthEntry]:
        inv = self.inventory()
        pool = self.settings.node_name
        entries = []
        for gpu in inv.gpus:
            if gpu.uuid in self.settings.reserved_uuids:
                continue
            # Whole GPUs as the slices publish them (partitionable Ampere with MIG on offers placements only).
            if not gpu.mig_enabled or (self.settings.partitionable and mig_mode_switchable(gpu)):
                entries.append(_health_entry(pool, gpu_device_name(gpu), gpu.health))
            for mig in gpu.mig_devices:
                # The same combination the slices are tainted from, so stream and taints agree.
                entries.append(_health_entry(pool, mig_device_name(gpu, mig), mig_health(gpu, mig)))
        return entries

    def _on_health(self, uuid: str, live: Health) -> None:
        health = stickyhealth.merged(self._restored.get(uuid), live)
        with self._lock:
            self._health[uuid] = health
        self._persist_health(uuid, health)
        log.warning("event=health-change uuid=%s healthy=%s xids=%s lost=%s", uuid, health.healthy, list(health.xids), health.lost)
        self.board.update(self._health_entries())
        self._publish_changed.set()
        if self.rediscoverer is not None:
            self.rediscoverer.poke()  # a lost GPU or a reset may have changed what NVML reports

    def withhold(self, reason: str | None) -> None:
        """Publish no devices while `reason` is set (existing slices are withdrawn); None publishes again."""
        with self._lock:
            changed, self._withheld = self._withheld != reason, reason
        if changed:
            if reason is None:
                log.info("event=slices-released node=%s", self.settings.node_name)
            else:
                log.error("event=slices-withheld node=%s reason=%s", self.settings.node_name, quote(reason))
            self._publish_changed.set()

    @property
    def withheld(self) -> str | None:
        return self._withheld

    def desired_slices(self) -> list[dict[str, Any]]:
        if self._withheld is not None:
            return []
        return build_slices(
            self.inventory(),
            SliceSettings(
                node_name=self.settings.node_name, driver_name=self.settings.driver_name,
                partitionable=self.settings.partitionable, reserved_uuids=self.settings.reserved_uuids,
                extra_taints=self.extra_taints(), binding_conditions=self.binding_conditions,
                shared_capacity=self.settings.shared_capacity,
            ),
        )

    @property
    def binding_conditions(self) -> bool:
        return self.settings.partitionable and self.settings.binding_conditions

    def request_publish(self) -> None:
        """Have the publisher rebuild and write the slices (e.g. after a ledger change)."""
        self._publish_changed.set()

    def _on_registered(self) -> None:
        if not self._registered.is_set():
            log.info("event=kubelet-registered node=%s socket=%s", self.settings.node_name, self.paths.registration_socket)
        self._registered.set()
        if self._publisher is None:
            return
        if self._publisher_thread is None:
            self._publisher_thread = threading.Thread(
                target=self._publisher.run, args=(self.desired_slices, self._publish_changed, self._stop),
                kwargs={"gate": self.seat.publishing}, name="slice-publisher", daemon=True,
            )
            self._publisher_thread.start()
        else:
            # Re-registration (kubelet restart): the kubelet wiped our slices, publish again.
            self._publish_changed.set()

    def start(self) -> None:
        self.start_report = self.preparer.start(self.load_report)
        r = self.start_report
        log.info(
            "event=start node=%s driver=%s claims=%d rolled_back=%d orphans_removed=%d specs_rewritten=%d reapplied=%d",
            self.settings.node_name, self.settings.driver_name, len(self.checkpoint.state.claims), len(r.rolled_back),
            len(r.orphans_removed), len(r.specs_rewritten), len(r.reapplied),
        )
        for problem in r.problems:
            log.error("event=start-problem problem=%r", problem)
        if r.rebuilt or r.promoted or r.cleaned:
            log.warning("event=checkpoint-recovered rebuilt=%d kept_as_completed=%d cleaned=%d", len(r.rebuilt),
                        len(r.promoted), len(r.cleaned))
        if self.preparer.recovery_pending is not None:
            log.error("event=serving-refused reason=%s", quote(self.preparer.recovery_pending))
            threading.Thread(target=self._retry_recovery, name="checkpoint-recovery", daemon=True).start()
        if self.settings.metrics_port is not None:
            self.metrics.serve(self.settings.metrics_port)
        if self._monitor is not None:
            self._monitor.start()
        if self.rediscoverer is not None:
            self.rediscoverer.start()
        self.plugin.start()
        if self.binder is not None:
            self.binder.start(self._stop)
        threading.Thread(target=self._report_waiting_for_kubelet, name="kubelet-wait", daemon=True).start()

    def _retry_recovery(self) -> None:
        """Rebuild what the damaged checkpoint lost as soon as the API answers, also when no kubelet request comes
        (the device plugin shim refuses meanwhile too)."""
        while not self._stop.wait(RECOVERY_RETRY_S):
            try:
                if self.preparer.retry_recovery() is None:
                    log.warning("event=serving-resumed node=%s", self.settings.node_name)
                    return
            except Exception:  # noqa: BLE001 - a long-running agent must not die on one failed attempt
                log.exception("event=checkpoint-recovery-failed")

    def _report_waiting_for_kubelet(self) -> None:
        """Until a kubelet registers the plugin nothing is published; say so, with backoff, so that an agent started
        without a kubelet (e.g. beside `gpu-dra apiserver` only) does not look stuck for no reason."""
        delay = KUBELET_WAIT_FIRST_S
        waited = 0.0
        while not self._registered.wait(delay) and not self._stop.is_set():
            waited += delay
            log.warning(
                "event=waiting-for-kubelet node=%s socket=%s waited_s=%d next_report_s=%d msg=%s",
                self.settings.node_name, self.paths.registration_socket, waited, min(delay * 2, KUBELET_WAIT_MAX_S),
                quote("no kubelet has registered this plugin yet; ResourceSlices are published once one does "
                      "(a kubelet watches <kubelet-dir>/plugins_registry; check --kubelet-dir)"),
            )
            delay = min(delay * 2, KUBELET_WAIT_MAX_S)

    def stop(self) -> None:
        self._stop.set()
        self._registered.set()
        if self.binder is not None:
            self.binder.join()
        if self.rediscoverer is not None:
            self.rediscoverer.stop()
        if self._monitor is not None:
            self._monitor.stop()
        self.plugin.stop()
        if self._publisher_thread is not None:
            self._publisher_thread.join(timeout=5)
        self.checkpoint.close()
