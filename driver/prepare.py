"""Claim preparation on the node: NodePrepareResources / NodeUnprepareResources without the gRPC.

The pure part (`plan_claim`) checks one ResourceClaim against this node and turns its allocation into the
devices, configs and ledger holds to apply. `Preparer` does the I/O around it in a crash-safe order:

    prepare:   checkpoint PrepareStarted (+ ledger holds)  ->  [MIG instances created, PrepareStarted again with
               their ids]  ->  sharing  ->  CDI spec  ->  checkpoint PrepareCompleted
    unprepare: CDI spec removed  ->  sharing undone  ->  [MIG instances destroyed]  ->  checkpoint record deleted
               (+ ledger released)

Partitionable MIG (`partitionable=True`): a device allocated from a MIG placement that has no MIG device yet is
created on demand at exactly that placement (MIG mode switched on first when the GPU holds no other claim); the
intent is in the PrepareStarted record before anything is created, so a rollback finds and destroys it. A full GPU
of a partitionable GPU is prepared only with no MIG instances on it (MIG mode is switched off for it).

A crash between the steps leaves a PrepareStarted record (rolled back at the next start: its CDI spec and
sharing are undone and the kubelet asks again) or a completed record whose unprepare is simply repeated.
CDI spec files with no checkpoint record are orphans and removed at start.

Locking: every state change (checkpoint and ledger, and the hardware and files they record) happens under the
checkpoint's node-wide lock (a thread lock plus flock on `<plugin dir>/serialize.lock`), so two plugin instances
during a rolling update and the device plugin shim never interleave. Waiting does not: a claim's MPS control
daemons are launched under the lock with the claim recorded as PrepareStarted, and waited for (up to the
daemon's ready timeout) after the lock is released, so other claims on the node are prepared meanwhile; the
PrepareCompleted commit (or, when a daemon does not come up, the rollback) takes the lock again. Each claim's
own lock (driver.claimlock), held across its whole prepare or unprepare, keeps a retry, an unprepare or a
starting instance off a claim that is half-prepared on purpose. An agent that dies while waiting leaves the
PrepareStarted record and its claim lock is released with it: the next start rolls the claim back.

Per-claim problems become per-claim errors; nothing here raises for bad input.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from driver import cdi, miginstances, recovery, sharing
from driver.allocatedclaims import allocated_devices
from driver.claimlock import ClaimLocks
from driver.checkpoint import (
    Checkpoint, ClaimPhase, ClaimRecord, Ledger, LedgerConflict, LoadReport, MigCreation, MpsDaemonRecord, Op,
    PreparedDevice,
)
from gpudra.deviceconfig import GPU_DEVICE, MIG_DEVICE, Candidate, ConfigError, GpuConfig, parse, select
from driver.gputools import MpsDirs
from driver.inventory import Gpu, Inventory, MigDevice, MigPlacement, MigProfile
from driver.nvmlapi import NvmlBackend
from driver.slices import gpu_device_name, mig_device_name

log = logging.getLogger("gpu-dra.prepare")

FaultHook = Callable[[str], None]


@dataclass(frozen=True)
class ClaimRef:
    uid: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"ResourceClaim {self.namespace}/{self.name} (uid {self.uid})"


@dataclass(frozen=True)
class DeviceResult:
    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True)
class ClaimResult:
    devices: tuple[DeviceResult, ...] = ()
    error: str = ""


class ClaimNotFound(Exception):
    pass


# (namespace, name) -> the ResourceClaim as a v1 dict; raises ClaimNotFound, or anything for API trouble.
ClaimGetter = Callable[[str, str], Mapping[str, Any]]
# Every ResourceClaim in the API as v1 dicts (for rebuilding records a damaged checkpoint lost); raises on API trouble.
ClaimLister = Callable[[], Iterable[Mapping[str, Any]]]


@dataclass(frozen=True)
class DeviceTarget:
    gpu: Gpu
    mig: MigDevice | None = None
    # A partitionable MIG placement with no MIG device yet: prepare creates it.
    placement: tuple[MigProfile, MigPlacement] | None = None

    @property
    def uuid(self) -> str:
        """The device's UUID; empty for a placement whose MIG device does not exist yet."""
        if self.placement is not None:
            return ""
        return self.mig.uuid if self.mig is not None else self.gpu.uuid


def device_index(
    inventory: Inventory, reserved: frozenset[str] = frozenset(), *, partitionable: bool = False
) -> dict[str, DeviceTarget]:
    """Device name -> the hardware behind it, with the names the slices publish.

    An existing MIG device and the placement it occupies share one name; the existing device wins."""
    out: dict[str, DeviceTarget] = {}
    for gpu in inventory.gpus:
        if gpu.uuid in reserved:
            continue
        out[gpu_device_name(gpu)] = DeviceTarget(gpu)
        for mig in gpu.mig_devices:
            out[mig_device_name(gpu, mig)] = DeviceTarget(gpu, mig)
        if partitionable and gpu.mig_capable:
            for profile in gpu.mig_profiles:
                for pl in profile.placements:
                    out.setdefault(mig_device_name(gpu, profile, pl), DeviceTarget(gpu, placement=(profile, pl)))
    return out


@dataclass(frozen=True)
class PlannedDevice:
    request: str  # the top-level request name (containers reference these)
    device_name: str
    share_id: str | None
    target: DeviceTarget
    config: GpuConfig | None
    parameters: Mapping[str, Any] | None  # the winning opaque parameters, kept in the checkpoint
    consumed: Mapping[str, str] | None = None  # consumedCapacity of a GPU shared by capacity
    admin_access: bool = False


@dataclass(frozen=True)
class Plan:
    ref: ClaimRef
    pool: str
    devices: tuple[PlannedDevice, ...]
    notes: tuple[str, ...] = field(default=())


def _base_request(request: str) -> str:
    return request.split("/", 1)[0]


def plan_claim(
    ref: ClaimRef, claim: Mapping[str, Any], *, driver_name: str, pool_name: str, index: Mapping[str, DeviceTarget]
) -> Plan | str:
    """Check a claim against this node and work out its devices and configs; an error string if it cannot be."""
    meta = claim.get("metadata") or {}
    if meta.get("uid") != ref.uid:
        return f"{ref}: the claim in the API has uid {meta.get('uid')!r}, it got replaced; not preparing a different claim"
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        return f"{ref}: status.allocation is empty, the claim is not allocated"
    devices = allocation.get("devices") or {}
    results = [r for r in devices.get("results") or [] if r.get("driver") == driver_name]
    if not results:
        return f"{ref}: status.allocation.devices.results has no device of driver {driver_name}"
    wrong_pool = sorted({str(r.get("pool")) for r in results if r.get("pool") != pool_name})
    if wrong_pool:
        return (
            f"{ref}: status.allocation.devices.results: allocated from pool(s) {', '.join(wrong_pool)}, "
            f"but this node serves pool {pool_name}"
        )
    # Our configs, class configs before claim configs (NVIDIA's precedence: later wins), each parsed once.
    candidates: list[Candidate] = []
    raw_by_config: dict[int, Any] = {}
    raw_configs = devices.get("config") or []
    ordered = sorted(enumerate(raw_configs), key=lambda ic: 0 if ic[1].get("source") == "FromClass" else 1)
    for i, entry in ordered:
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver_name:
            continue
        parameters = opaque.get("parameters")
        where = f"status.allocation.devices.config[{i}].opaque.parameters"
        try:
            parsed = parse(parameters)
        except ConfigError as exc:
            return f"{ref}: {where}: " + "; ".join(f"{where}.{e}" if not e.startswith("parameters") else e for e in exc.errors)
        candidates.append(Candidate(config=parsed, requests=tuple(entry.get("requests") or ()), where=where))
        raw_by_config[id(parsed)] = parameters
    planned: list[PlannedDevice] = []
    for r in results:
        name = str(r.get("device"))
        target = index.get(name)
        if target is None:
            return f"{ref}: device {name} of pool {pool_name} is not a device this node has (or it is reserved for the device plugin)"
        request = str(r.get("request", ""))
        is_mig = target.mig is not None or target.placement is not None
        try:
            config = select(candidates, request, MIG_DEVICE if is_mig else GPU_DEVICE)
        except ConfigError as exc:
            return f"{ref}: device {name}: " + "; ".join(exc.errors)
        parameters = raw_by_config[id(config)] if config is not None else None
        consumed = r.get("consumedCapacity") or None
        if consumed and not is_mig:
            # A GPU shared by capacity: the claim's part is enforced through MPS, whatever else was configured.
            consumed = {str(k): str(v) for k, v in consumed.items()}
            parameters = sharing.capacity_parameters(consumed)
            try:
                config = parse(parameters)
            except ConfigError as exc:
                return f"{ref}: device {name}: status.allocation.devices.results consumedCapacity: " + "; ".join(exc.errors)
        planned.append(
            PlannedDevice(
                request=_base_request(request), device_name=name, share_id=r.get("shareID"), target=target,
                config=config, parameters=parameters, consumed=consumed if consumed and not is_mig else None,
                admin_access=r.get("adminAccess") is True,
            )
        )
    return Plan(ref=ref, pool=pool_name, devices=tuple(planned))


def _asks_for_sharing(device: PreparedDevice) -> bool:
    return bool(((device.sharing or {}).get("sharing") or {}).get("strategy"))


def _overlap(a: PreparedDevice, b: PreparedDevice) -> str:
    """How two prepared devices use the same hardware ("" when they do not): the same GPU or MIG device, or a
    full GPU and a MIG device on it. Different MIG devices of one GPU are isolated from each other."""
    if not a.uuid or not b.uuid:
        return ""  # an on-demand MIG placement not created yet (its GPU is checked by the MIG preconditions)
    if a.uuid == b.uuid:
        return f"{'MIG device' if a.uuid.startswith('MIG-') else 'GPU'} {a.uuid}"
    if a.uuid == b.gpu_uuid:
        return f"GPU {a.uuid}, whose MIG device {b.uuid} is"
    if b.uuid == a.gpu_uuid:
        return f"MIG device {a.uuid}, whose GPU {b.uuid} is"
    return ""


def exclusivity_conflict(devices: Sequence[PreparedDevice], others: Sequence[ClaimRecord]) -> str:
    """Why the devices cannot be prepared next to the other prepared claims ("" when they can), pure.

    The scheduler never allocates one device to two claims unless they may share it, but a node must not rely on
    that (a stale or hand-written allocation, a second scheduler): two claims use the same hardware only when
    both ask for sharing (a GpuConfig sharing strategy on both), both results carry a shareID (a device with
    allowMultipleAllocations), or either has adminAccess."""
    for d in devices:
        for record in others:
            for o in record.devices:
                what = _overlap(d, o)
                if not what:
                    continue
                if (_asks_for_sharing(d) and _asks_for_sharing(o)) or (d.share_id and o.share_id) or d.admin_access or o.admin_access:
                    continue
                return (
                    f"device {d.device_name}: {what} already prepared for ResourceClaim {record.namespace}/{record.name} "
                    f"(uid {record.uid}, device {o.device_name}); a device is prepared for two claims only when both "
                    "ask for sharing (GpuConfig sharing), it allows multiple allocations (shareID) or one has adminAccess"
                )
    return ""


@dataclass
class StartReport:
    rolled_back: list[str] = field(default_factory=list)
    orphans_removed: list[str] = field(default_factory=list)
    specs_rewritten: list[str] = field(default_factory=list)
    reapplied: list[str] = field(default_factory=list)
    mps_restarted: list[str] = field(default_factory=list)  # completed claims whose MPS daemon was found dead
    problems: list[str] = field(default_factory=list)
    # After a damaged checkpoint (driver.recovery): records rebuilt from the API, PrepareStarted records with a
    # CDI spec kept as completed, claims gone from the API whose leftovers were cleaned up.
    rebuilt: list[str] = field(default_factory=list)
    promoted: list[str] = field(default_factory=list)
    cleaned: list[str] = field(default_factory=list)


class Preparer:
    def __init__(
        self,
        *,
        driver_name: str,
        node_name: str,
        get_claim: ClaimGetter,
        inventory: Callable[[], Inventory],
        checkpoint: Checkpoint,
        cdi_dir: Path,
        sharing_backend: sharing.SharingBackend,
        mps_root: Path,
        reserved: frozenset[str] = frozenset(),
        fault_hook: FaultHook | None = None,
        partitionable: bool = False,
        nvml: NvmlBackend | None = None,
        on_inventory_change: Callable[[], None] | None = None,
        common_edits: Mapping[str, Any] | None = None,
        device_numbers: Callable[[], cdi.DeviceNumbers] | None = None,
        list_claims: ClaimLister | None = None,
    ) -> None:
        self.driver_name = driver_name
        self._list_claims = list_claims
        # Why claims are refused: a damaged checkpoint whose lost records could not be rebuilt yet (None: serving).
        self.recovery_pending: str | None = None
        # Edits every claim spec carries at its top level: the driver's files (driver/driverfiles.py).
        self._common_edits: Mapping[str, Any] = dict(common_edits or {})
        # Device node numbers from the driver's procfs, read per spec (MIG capability minors come and go).
        self._device_numbers = device_numbers or cdi.DeviceNumbers
        self.pool_name = node_name
        self._get_claim = get_claim
        self._inventory = inventory
        self.checkpoint = checkpoint
        self.ledger = Ledger(checkpoint)
        self._claim_locks = ClaimLocks(checkpoint.directory / "claim-locks")
        self._cdi_dir = cdi_dir
        self._sharing = sharing_backend
        self._mps_root = mps_root
        self._reserved = reserved
        self._fault = fault_hook or (lambda step: None)
        self._partitionable = partitionable
        # Creating MIG devices needs the NVML backend; without it placements stay unpreparable.
        self._nvml = nvml
        # Called after MIG instances were created or destroyed: the inventory (and the slices) changed.
        self._inventory_changed = on_inventory_change or (lambda: None)

    # ---- start ---------------------------------------------------------------------------------------------

    def start(self, load_report: LoadReport) -> StartReport:
        report = StartReport(problems=list(load_report.problems))
        with self.checkpoint.locked():
            if load_report.corrupt:
                self._recover(report)
            for uid, record in sorted(self.checkpoint.state.claims.items()):
                if record.phase is ClaimPhase.PREPARE_STARTED:
                    with self._claim_locks.try_held(uid) as ours:
                        if not ours:
                            continue  # another instance is preparing it right now (waiting for its MPS daemon)
                        error = self._rollback(record)
                        if error:
                            report.problems.append(error)
                        else:
                            report.rolled_back.append(uid)
            completed = {u: r for u, r in self.checkpoint.state.claims.items() if r.phase is ClaimPhase.PREPARE_COMPLETED}
            if self.recovery_pending is not None:
                # Records are missing: a spec without one may belong to a running container, keep it.
                report.problems.append(self.recovery_pending)
            else:
                report.orphans_removed = cdi.remove_orphans(self._cdi_dir, completed)
            existing = cdi.claim_spec_uids(self._cdi_dir)
            # Every completed claim's spec is rewritten: specs are written without fsync (see cdi.write_claim_spec),
            # so after a power loss this is what makes them whole again; after a reboot sharing is re-applied too.
            for uid, record in sorted(completed.items()):
                try:
                    if load_report.new_boot:
                        record = self._recreate_migs(record)
                    elif self._restore_mps(record):
                        report.mps_restarted.append(uid)
                    self._write_spec(record, reapply_sharing=load_report.new_boot)
                except (sharing.SharingError, miginstances.MigError, KeyError, OSError) as exc:
                    report.problems.append(f"claim {record.namespace}/{record.name} (uid {uid}): restoring it failed: {exc}")
                    continue
                if load_report.new_boot:
                    report.reapplied.append(uid)
                elif uid not in existing:
                    report.specs_rewritten.append(uid)
        return report

    # ---- recovery from a damaged checkpoint (driver.recovery) ------------------------------------------------

    def _recover(self, report: StartReport) -> None:
        """Rebuild what a damaged checkpoint lost (call with the node's lock held): PrepareStarted records with a
        CDI spec become completed, claims with a spec or MPS directories but no record are planned again from the
        API (or cleaned up when the API no longer allocates them here), and the ledger holds every recorded claim's
        GPUs. Without the API the lost claims cannot be rebuilt: `recovery_pending` says so and prepare refuses
        every claim until a later attempt succeeds (each prepare and unprepare tries again)."""
        specs = cdi.claim_spec_uids(self._cdi_dir)
        records = self.checkpoint.state.claims
        promoted = recovery.to_promote(records, specs)
        if promoted:
            self.checkpoint.commit([self.checkpoint.put_claim_op(r.model_copy(update={"phase": ClaimPhase.PREPARE_COMPLETED}))
                                    for r in promoted])
            report.promoted += [r.uid for r in promoted]
        lost = recovery.orphans(self.checkpoint.state.claims, specs, recovery.mps_claim_uids(self._mps_root))
        if lost:
            try:
                if self._list_claims is None:
                    raise RuntimeError("no API access is configured")
                in_api = recovery.claims_by_uid(self._list_claims())
            except Exception as exc:  # any API trouble: try again later, serve nothing meanwhile
                self.recovery_pending = (
                    f"the node checkpoint was damaged and {len(lost)} prepared claim(s) it lost (uid "
                    f"{', '.join(lost)}) could not be rebuilt: listing ResourceClaims failed: {exc}; no claim is "
                    "prepared on this node until they are (tried again at every request and every few seconds)"
                )
                log.error("event=checkpoint-recovery-pending claims=%s error=%r", ",".join(lost), str(exc))
                return
            for uid in lost:
                self._rebuild(uid, in_api.get(uid), uid in specs, report)
        self._rebuild_ledger(report, cdi.claim_spec_uids(self._cdi_dir))
        self.recovery_pending = None
        log.warning("event=checkpoint-recovered promoted=%s rebuilt=%s cleaned=%s", ",".join(report.promoted),
                    ",".join(report.rebuilt), ",".join(report.cleaned))

    def _rebuild(self, uid: str, claim: Mapping[str, Any] | None, has_spec: bool, report: StartReport) -> None:
        """Record a lost claim again from its API object, or clean up after it when the API no longer has it
        allocated here (no pod can use it then)."""
        if claim is None or not allocated_devices(claim, self.driver_name, self.pool_name):
            report.problems += self._clean_orphan(uid)
            report.cleaned.append(uid)
            log.warning("event=checkpoint-orphan-cleaned uid=%s reason=%r", uid,
                        "not in the API" if claim is None else "no longer allocated on this node")
            return
        meta = claim.get("metadata") or {}
        ref = ClaimRef(uid=uid, namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""))
        plan = plan_claim(
            ref, claim, driver_name=self.driver_name, pool_name=self.pool_name,
            index=device_index(self._inventory(), self._reserved, partitionable=self._partitionable),
        )
        if isinstance(plan, str):
            # Allocated here but not plannable now (a GPU gone): its spec stays for whatever still runs on it.
            report.problems.append(f"a claim the damaged checkpoint lost cannot be rebuilt: {plan}")
            return
        record = self._record(plan, ClaimPhase.PREPARE_COMPLETED if has_spec else ClaimPhase.PREPARE_STARTED, rebuilt=True)
        self.checkpoint.commit([self.checkpoint.put_claim_op(record)])
        if not has_spec:
            # Its prepare stopped before the spec: nothing uses it, undo what was applied (its MPS daemon).
            error = self._rollback(record)
            if error:
                report.problems.append(error)
            report.cleaned.append(uid)
            return
        report.rebuilt.append(uid)
        log.warning("event=checkpoint-claim-rebuilt claim=%s/%s uid=%s", ref.namespace, ref.name, uid)

    def _clean_orphan(self, uid: str) -> list[str]:
        """Undo what a claim no record and no API object is left for still holds on the node: its MPS daemons and
        directories, the compute mode of its GPUs (unless a recorded claim shares them), its CDI spec."""
        problems: list[str] = []
        claim_dir = self._mps_root / uid
        daemons = [sharing.mps_dirs(self._mps_root, uid, i) for i in range(64)]
        daemons = [d for d in daemons if d.pipe.exists() or d.log.exists()]
        for dirs in daemons:
            try:
                self._sharing.mps_stop(dirs)
            except sharing.SharingError as exc:
                problems.append(f"claim uid {uid}: stopping its MPS daemon at {dirs.pipe} failed: {exc}")
        shutil.rmtree(claim_dir, ignore_errors=True)
        try:
            spec = json.loads((self._cdi_dir / cdi.spec_file_name(uid)).read_text())
        except (OSError, ValueError):
            spec = {}
        if daemons:
            minors = recovery.spec_gpu_minors(spec) if isinstance(spec, dict) else set()
            shared = {d.gpu_uuid for r in self.checkpoint.state.claims.values() for d in r.devices if _asks_for_sharing(d)}
            for gpu in self._inventory().gpus:
                if gpu.minor in minors and gpu.uuid not in shared:
                    try:
                        self._sharing.set_compute_mode(gpu.uuid, sharing.COMPUTE_MODE_DEFAULT)
                    except sharing.SharingError as exc:
                        problems.append(f"claim uid {uid}: restoring the compute mode of GPU {gpu.uuid} failed: {exc}")
        cdi.remove_claim_spec(self._cdi_dir, uid)
        return problems

    def _rebuild_ledger(self, report: StartReport, specs: set[str]) -> None:
        """Every recorded claim holds its GPUs; a DRA hold whose claim has neither a record nor a CDI spec is
        released."""
        state = self.checkpoint.state
        stray = recovery.stray_dra_holders(state.ledger, {*state.claims, *specs})
        wanted = {uuid: [h for h in holders if h not in stray.get(uuid, ())] for uuid, holders in state.ledger.items()}
        for uid, record in sorted(state.claims.items()):
            holder = Ledger.dra_holder(uid)
            gpus = {d.gpu_uuid for d in record.devices}
            conflicts = self.ledger.conflicts(holder, gpus)
            if conflicts:
                report.problems.append(f"claim {record.namespace}/{record.name} (uid {uid}): "
                                       f"{LedgerConflict(holder, conflicts)}")
                continue
            for uuid in gpus:
                wanted.setdefault(uuid, [])
                if holder not in wanted[uuid]:
                    wanted[uuid].append(holder)
        self.checkpoint.commit([Op("ledger", uuid, sorted(holders) or None) for uuid, holders in sorted(wanted.items())
                                if sorted(holders) != sorted(state.ledger.get(uuid, []))])

    def retry_recovery(self) -> str | None:
        """While recovery is pending, try again; the reason it still is, or None."""
        if self.recovery_pending is None:
            return None
        with self.checkpoint.locked():
            if self.recovery_pending is not None:
                report = StartReport()
                self._recover(report)
                for uid in report.rebuilt:
                    record = self.checkpoint.claim(uid)
                    if record is not None:
                        try:
                            self._write_spec(record, reapply_sharing=False)
                        except (sharing.SharingError, KeyError, OSError) as exc:
                            log.error("event=checkpoint-rebuilt-spec-failed uid=%s error=%r", uid, str(exc))
                for problem in report.problems:
                    log.error("event=checkpoint-recovery-problem problem=%r", problem)
        return self.recovery_pending

    # ---- prepare -------------------------------------------------------------------------------------------

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]:
        out: dict[str, ClaimResult] = {}
        pending = self.retry_recovery() if claims else None
        if pending is not None:
            return {ref.uid: ClaimResult(error=f"{ref}: not prepared: {pending}") for ref in claims}
        for ref in claims:
            try:
                out[ref.uid] = self._prepare_one(ref)
            except Exception as exc:  # one claim's trouble must not fail the others or the server
                log.exception("event=prepare-failed claim=%s/%s uid=%s", ref.namespace, ref.name, ref.uid)
                out[ref.uid] = ClaimResult(error=f"{ref}: prepare failed: {exc}")
        return out

    def _result(self, record: ClaimRecord) -> ClaimResult:
        return ClaimResult(
            devices=tuple(
                DeviceResult(
                    request_names=tuple(d.request_names), pool_name=d.pool_name, device_name=d.device_name,
                    cdi_device_ids=tuple(d.cdi_device_ids), share_id=d.share_id,
                )
                for d in record.devices
            )
        )

    def _prepare_one(self, ref: ClaimRef) -> ClaimResult:
        if not ref.uid or not ref.name or not ref.namespace:
            return ClaimResult(error=f"{ref}: namespace, name and uid are all required")
        with self._claim_locks.held(ref.uid):
            result = self._prepare_locked(ref)
            if result.error and self.checkpoint.claim(ref.uid) is None:
                self._claim_locks.forget(ref.uid)
            return result

    def _prepare_locked(self, ref: ClaimRef) -> ClaimResult:
        with self.checkpoint.locked():
            existing = self.checkpoint.claim(ref.uid)
            if existing is not None and existing.phase is ClaimPhase.PREPARE_COMPLETED:
                return self._result(existing)
            if existing is not None and not existing.mps_kept:
                error = self._rollback(existing)
                if error:
                    return ClaimResult(error=error)
        # The API read happens outside the lock: it is the slow part and changes nothing locally.
        try:
            claim = self._get_claim(ref.namespace, ref.name)
        except ClaimNotFound:
            return ClaimResult(error=f"{ref}: not found in the API server")
        except Exception as exc:
            return ClaimResult(error=f"{ref}: reading it from the API server failed: {exc}")
        plan = plan_claim(
            ref, claim, driver_name=self.driver_name, pool_name=self.pool_name,
            index=device_index(self._inventory(), self._reserved, partitionable=self._partitionable),
        )
        if isinstance(plan, str):
            return ClaimResult(error=plan)
        with self.checkpoint.locked():
            existing = self.checkpoint.claim(ref.uid)
            if existing is not None and existing.phase is ClaimPhase.PREPARE_COMPLETED:
                return self._result(existing)  # another instance finished it meanwhile
            if existing is not None and existing.mps_kept and _layout(existing) != _layout(plan):
                error = self._rollback(existing)  # allocated anew since: the kept daemons serve other devices
                if error:
                    return ClaimResult(error=error)
            started = self._apply(plan)
        if isinstance(started, ClaimResult):
            return started
        # Outside the node's lock: other claims are prepared while this one's MPS daemons come up.
        wait_error = self._wait_mps(started)
        with self.checkpoint.locked():
            if wait_error and self._keep_for_retry(started):
                return ClaimResult(error=f"{ref}: {wait_error}; its MPS daemon Deployment is kept, so the kubelet's "
                                         "retry waits for the same pod")
            if wait_error:
                rollback_error = self._rollback(started)
                return ClaimResult(error=f"{ref}: {wait_error}" + (f"; {rollback_error}" if rollback_error else ""))
            completed = started.model_copy(update={"phase": ClaimPhase.PREPARE_COMPLETED})
            self.checkpoint.commit([self.checkpoint.put_claim_op(completed)])
        self._fault("prepare-completed")
        log.info("event=prepared claim=%s/%s uid=%s devices=%s", ref.namespace, ref.name, ref.uid,
                 ",".join(d.device_name for d in completed.devices))
        return self._result(completed)

    def _keep_for_retry(self, record: ClaimRecord) -> bool:
        """After its MPS daemons did not come up in time: unprepare the claim for the kubelet (no CDI spec) but keep
        its daemons, their directories and its holds, recorded as PrepareStarted with `mps_kept`, so that the
        kubelet's retry reuses the Deployments instead of deleting and recreating them in a loop on a busy node. An
        unprepare, the stale-claim sweep or an agent restart roll such a record back in full. Claims with on-demand
        MIG devices are rolled back in full at once (their instances are destroyed, a daemon kept on them would
        serve nothing). Call with the node's lock held; False when the claim is to be rolled back instead."""
        if not record.mps_daemons or any(d.mig_created is not None for d in record.devices):
            return False
        cdi.remove_claim_spec(self._cdi_dir, record.uid)
        self.checkpoint.commit([self.checkpoint.put_claim_op(record.model_copy(update={"mps_kept": True}))])
        log.warning("event=mps-daemon-kept claim=%s/%s uid=%s daemons=%s", record.namespace, record.name, record.uid,
                    ",".join(d.pipe_dir for d in record.mps_daemons))
        return True

    def _wait_mps(self, record: ClaimRecord) -> str:
        """Wait for each MPS daemon the record's prepare launched; the first error text or ""."""
        for daemon in record.mps_daemons:
            try:
                self._sharing.mps_wait(MpsDirs(pipe=Path(daemon.pipe_dir), log=Path(daemon.log_dir)))
            except sharing.SharingError as exc:
                return str(exc)
        return ""

    def _record(self, plan: Plan, phase: ClaimPhase, *, rebuilt: bool = False) -> ClaimRecord:
        """The claim's record for a plan, with its MPS daemons' directories (pure but for reading the inventory).

        `rebuilt`: the claim was prepared before and its record lost (driver.recovery); a MIG device on a
        partitionable GPU is then recorded as created for it, so that unprepare destroys it as it would have."""
        ref = plan.ref
        devices = []
        for p in plan.devices:
            created = None
            if p.target.placement is not None:
                profile, pl = p.target.placement
                created = MigCreation(profile_id=profile.profile_id, profile=profile.name, start=pl.start, size=pl.size)
            elif rebuilt and p.target.mig is not None and self._partitionable and p.target.gpu.mig_capable:
                mig = p.target.mig
                profile_id = next((m.profile_id for m in p.target.gpu.mig_profiles if m.name == mig.profile), None)
                if profile_id is not None:
                    created = MigCreation(profile_id=profile_id, profile=mig.profile, start=mig.placement.start,
                                          size=mig.placement.size, gpu_instance_id=mig.gpu_instance_id,
                                          compute_instance_id=mig.compute_instance_id)
            devices.append(PreparedDevice(
                request_names=[p.request], pool_name=plan.pool, device_name=p.device_name,
                cdi_device_ids=[cdi.qualified_id(cdi.cdi_device_name(ref.uid, p.device_name))],
                share_id=p.share_id, uuid=p.target.uuid, gpu_uuid=p.target.gpu.uuid,
                sharing=dict(p.parameters) if p.parameters is not None else None,
                consumed_capacity=dict(p.consumed) if p.consumed is not None else None,
                mig_created=created, admin_access=p.admin_access,
            ))
        record = ClaimRecord(uid=ref.uid, namespace=ref.namespace, name=ref.name, phase=phase, devices=devices)
        return record.model_copy(update={"mps_daemons": self._planned_mps_daemons(record)})

    def _apply(self, plan: Plan) -> ClaimResult | ClaimRecord:
        """Record the claim as PrepareStarted and apply it (call with the node's lock held): an error, or the
        PrepareStarted record once everything is applied but its MPS daemons may still be coming up."""
        ref = plan.ref
        holder = Ledger.dra_holder(ref.uid)
        started = self._record(plan, ClaimPhase.PREPARE_STARTED)
        devices = started.devices
        try:
            hold = self.ledger.hold_ops(holder, {d.gpu_uuid for d in devices})
        except LedgerConflict as exc:
            return ClaimResult(error=f"{ref}: {exc}; the device plugin must release these GPUs first")
        mig_error = self._mig_preconditions(plan)
        if mig_error:
            return ClaimResult(error=f"{ref}: {mig_error}")
        conflict = exclusivity_conflict(devices, [r for u, r in sorted(self.checkpoint.state.claims.items()) if u != ref.uid])
        if conflict:
            return ClaimResult(error=f"{ref}: {conflict}")
        # Not fsynced: kill -9 keeps it (page cache) and a power loss also wipes the CDI dir, MIG instances and GPU
        # settings it guards; the PrepareCompleted commit below flushes it with itself.
        self.checkpoint.commit([self.checkpoint.put_claim_op(started), *hold], durable=False)
        self._fault("prepare-started")
        try:
            started = self._create_migs(started)
            self._write_spec(started, reapply_sharing=True)
        except Exception as exc:
            rollback_error = self._rollback(started)
            return ClaimResult(error=f"{ref}: {exc}" + (f"; {rollback_error}" if rollback_error else ""))
        self._fault("cdi-written")
        return started

    # ---- partitionable MIG -----------------------------------------------------------------------------------

    def _other_claims_on(self, gpu_uuid: str, uid: str) -> list[ClaimRecord]:
        return [
            r for u, r in sorted(self.checkpoint.state.claims.items())
            if u != uid and any(d.gpu_uuid == gpu_uuid for d in r.devices)
        ]

    def _mig_preconditions(self, plan: Plan) -> str:
        """Check (and switch) MIG mode for the plan's devices on partitionable GPUs; an error text or ""."""
        for p in plan.devices:
            gpu = p.target.gpu
            others = self._other_claims_on(gpu.uuid, plan.ref.uid)
            names = ", ".join(f"{r.namespace}/{r.name}" for r in others)
            if p.target.mig is not None:
                owner = next(
                    (r for r in others for d in r.devices if d.mig_created is not None and d.uuid == p.target.mig.uuid), None
                )
                if owner is not None:
                    return (
                        f"device {p.device_name}: MIG device {p.target.mig.uuid} was created for ResourceClaim "
                        f"{owner.namespace}/{owner.name} and is still prepared for it"
                    )
                continue
            if not (self._partitionable and gpu.mig_capable):
                continue
            if self._nvml is None:
                return f"device {p.device_name}: preparing partitionable MIG devices needs the NVML backend, none is configured"
            try:
                current, _ = miginstances.mig_mode(self._nvml, gpu.uuid)
                if p.target.placement is not None:
                    full_holder = next((r for r in others for d in r.devices if d.uuid == gpu.uuid), None)
                    if full_holder is not None:
                        return (
                            f"device {p.device_name}: GPU {gpu.uuid} is prepared as a full GPU for ResourceClaim "
                            f"{full_holder.namespace}/{full_holder.name}; a MIG placement on it cannot be created"
                        )
                    _, placement = p.target.placement
                    error = self._make_room(p.device_name, gpu, others, placement)
                    if error:
                        return error
                    if not current:
                        if others:
                            return (
                                f"device {p.device_name}: MIG mode is off on GPU {gpu.uuid} and the GPU is in use by "
                                f"ResourceClaim(s) {names}; MIG mode is only switched on when the GPU holds no other claim"
                            )
                        miginstances.set_mig_mode(self._nvml, gpu.uuid, True)
                else:
                    # A full GPU of a partitionable GPU: only without MIG instances, with MIG mode off.
                    error = self._make_room(p.device_name, gpu, others, None)
                    if error:
                        return error
                    gpu = next((g for g in self._inventory().gpus if g.uuid == gpu.uuid), gpu)
                    if gpu.mig_devices:
                        return (
                            f"device {p.device_name}: GPU {gpu.uuid} has {len(gpu.mig_devices)} MIG device(s); a full GPU "
                            "is prepared only when MIG mode is off and no MIG instances exist"
                        )
                    if current:
                        if others:
                            return (
                                f"device {p.device_name}: MIG mode is on on GPU {gpu.uuid} and the GPU is in use by "
                                f"ResourceClaim(s) {names}; MIG mode is only switched off when the GPU holds no other claim"
                            )
                        miginstances.set_mig_mode(self._nvml, gpu.uuid, False)
            except miginstances.MigError as exc:
                return f"device {p.device_name}: {exc}"
        return ""

    def _make_room(self, device_name: str, gpu: Gpu, others: Sequence[ClaimRecord], placement: MigPlacement | None) -> str:
        """Destroy the MIG instances on `gpu` that overlap `placement` (all of them for the full GPU, None) and that
        no claim on this node uses; an error text when one that a claim uses is in the way, or "".

        On a partitionable GPU the node owns the layout: the slices publish every placement, an existing instance
        is only a placement that happens to exist, and the scheduler's memory-slice counters keep the placements
        of allocated claims apart. An instance made beforehand (mig-parted, a profile, an earlier agent) that no
        claim holds takes no counters, so the scheduler may allocate a placement overlapping it; creating that
        placement fails (NVML: insufficient resources) until the idle instance is gone."""
        in_use = {d.uuid: r for r in others for d in r.devices}
        overlapping = [
            m for m in gpu.mig_devices
            if placement is None or (
                m.placement.start < placement.start + placement.size and placement.start < m.placement.start + m.placement.size)
        ]
        held = [(m, in_use[m.uuid]) for m in overlapping if m.uuid in in_use]
        if held:
            mig, owner = held[0]
            which = (f"MIG device {mig.uuid} ({mig.profile} at memory slice {mig.placement.start}), prepared for "
                     f"ResourceClaim {owner.namespace}/{owner.name}")
            if placement is None:
                return (f"device {device_name}: GPU {gpu.uuid} has {len(held)} MIG device(s) in use ({which}); a full "
                        "GPU is prepared only when MIG mode is off and no MIG instances exist")
            return (f"device {device_name}: the placement start={placement.start} size={placement.size} overlaps an "
                    f"existing MIG instance, {which}")
        idle = overlapping
        if not idle:
            return ""
        assert self._nvml is not None  # the caller checked
        try:
            for mig in idle:
                miginstances.destroy_by_id(self._nvml, gpu.uuid, mig.gpu_instance_id)
                log.info("event=mig-idle-destroyed gpu=%s mig=%s profile=%s start=%d for=%s", gpu.uuid, mig.uuid,
                         mig.profile, mig.placement.start, device_name)
        except miginstances.MigError as exc:
            return f"device {device_name}: removing the idle MIG device in its way failed: {exc}"
        finally:
            self._inventory_changed()
        return ""

    def _create_migs(self, record: ClaimRecord) -> ClaimRecord:
        """Create the record's on-demand MIG devices and commit their ids; raises MigError (the caller rolls back)."""
        if not any(d.mig_created is not None and d.mig_created.gpu_instance_id is None for d in record.devices):
            return record
        assert self._nvml is not None  # _mig_preconditions refused the claim otherwise
        devices: list[PreparedDevice] = []
        try:
            for d in record.devices:
                m = d.mig_created
                if m is None or m.gpu_instance_id is not None:
                    devices.append(d)
                    continue
                created = miginstances.create(self._nvml, d.gpu_uuid, m.profile_id, m.start, m.size)
                self._fault("mig-created")
                devices.append(
                    d.model_copy(update={
                        "uuid": created.uuid,
                        "mig_created": m.model_copy(update={
                            "gpu_instance_id": created.gpu_instance_id, "compute_instance_id": created.compute_instance_id,
                        }),
                    })
                )
        finally:
            self._inventory_changed()
        updated = record.model_copy(update={"devices": devices})
        self.checkpoint.commit([self.checkpoint.put_claim_op(updated)], durable=False)
        log.info(
            "event=mig-created claim=%s/%s uid=%s devices=%s", record.namespace, record.name, record.uid,
            ",".join(f"{d.device_name}={d.uuid}" for d in devices if d.mig_created is not None),
        )
        return updated

    def _recreate_migs(self, record: ClaimRecord) -> ClaimRecord:
        """After a reboot: MIG instances are gone (MIG mode survives), so create the record's again, same placement."""
        existing = {m.uuid for g in self._inventory().gpus for m in g.mig_devices}
        missing = [d for d in record.devices if d.mig_created is not None and d.uuid not in existing]
        if not missing or self._nvml is None:
            return record
        for d in missing:
            if not miginstances.mig_mode(self._nvml, d.gpu_uuid)[0]:
                miginstances.set_mig_mode(self._nvml, d.gpu_uuid, True)
        pending = [
            d.model_copy(update={"mig_created": d.mig_created.model_copy(update={"gpu_instance_id": None, "compute_instance_id": None})})
            if d in missing and d.mig_created is not None
            else d
            for d in record.devices
        ]
        restored = self._create_migs(record.model_copy(update={"devices": pending}))
        self.checkpoint.commit([self.checkpoint.put_claim_op(restored)])
        return restored

    def _destroy_migs(self, record: ClaimRecord) -> str:
        """Destroy the MIG devices prepare created for the record (CI, then GI); an error text or ""."""
        created = [d for d in record.devices if d.mig_created is not None]
        if not created:
            return ""
        if self._nvml is None:
            return (
                f"ResourceClaim {record.namespace}/{record.name} (uid {record.uid}): it holds MIG devices this node "
                "created, and no NVML backend is configured to destroy them"
            )
        try:
            for d in created:
                assert d.mig_created is not None
                miginstances.destroy(self._nvml, d.gpu_uuid, d.mig_created.profile_id, d.mig_created.start)
        except miginstances.MigError as exc:
            return f"ResourceClaim {record.namespace}/{record.name} (uid {record.uid}): destroying its MIG device failed: {exc}"
        finally:
            self._inventory_changed()
        return ""

    def _groups(self, record: ClaimRecord) -> list[tuple[GpuConfig | None, list[PreparedDevice]]]:
        """The claim's devices grouped by their effective config (one sharing application per group)."""
        groups: dict[str, tuple[GpuConfig | None, list[PreparedDevice]]] = {}
        for d in record.devices:
            key = repr(sorted((d.sharing or {}).items()))
            if key not in groups:
                groups[key] = (parse(d.sharing) if d.sharing is not None else None, [])
            groups[key][1].append(d)
        return list(groups.values())

    def _planned_mps_daemons(self, record: ClaimRecord) -> list[MpsDaemonRecord]:
        """One MPS daemon per MPS config group of the claim, with its directories (recorded before it starts)."""
        out: list[MpsDaemonRecord] = []
        for config, devices in self._groups(record):
            if sharing.is_mps(config):
                dirs = (
                    sharing.shared_mps_dirs(self._mps_root, devices[0].gpu_uuid) if _by_capacity(devices)
                    else sharing.mps_dirs(self._mps_root, record.uid, len(out))
                )
                out.append(
                    MpsDaemonRecord(pipe_dir=str(dirs.pipe), log_dir=str(dirs.log), device_names=[d.device_name for d in devices])
                )
        return out

    def _mps_dirs(self, record: ClaimRecord, config: GpuConfig | None, devices: Sequence[PreparedDevice]) -> MpsDirs | None:
        if not sharing.is_mps(config):
            return None
        names = [d.device_name for d in devices]
        for daemon in record.mps_daemons:
            if daemon.device_names == names:
                recorded = MpsDirs(pipe=Path(daemon.pipe_dir), log=Path(daemon.log_dir))
                if all(p.is_relative_to(self._mps_root) for p in (recorded.pipe, recorded.log)):
                    return recorded  # the checkpoint names them; only ones under our MPS root are ever used
                break
        # A record written before daemons were recorded: its claim's directories were the first daemon's.
        return sharing.mps_dirs(self._mps_root, record.uid)

    def _restore_mps(self, record: ClaimRecord) -> bool:
        """After an agent restart: start a completed claim's MPS daemons again if they died; True if any did."""
        restarted = False
        for config, devices in self._groups(record):
            dirs = self._mps_dirs(record, config, devices)
            if dirs is not None and config is not None and not self._sharing.mps_running(dirs):
                sharing.start_mps(self._sharing, config, self._shared_devices(devices), dirs, shared=_by_capacity(devices))
                log.warning(
                    "event=mps-daemon-restarted claim=%s/%s uid=%s pipe_dir=%s", record.namespace, record.name, record.uid, dirs.pipe,
                )
                restarted = True
        return restarted

    def _shared_devices(self, devices: Sequence[PreparedDevice]) -> list[sharing.SharedDevice]:
        by_uuid = {g.uuid: g for g in self._inventory().gpus}
        # A device with no uuid is a MIG device that was never created: nothing was shared on it.
        return [
            sharing.SharedDevice(
                uuid=d.uuid, gpu_uuid=d.gpu_uuid, gpu_index=by_uuid[d.gpu_uuid].index if d.gpu_uuid in by_uuid else -1,
                compute_capability=by_uuid[d.gpu_uuid].cuda_compute_capability if d.gpu_uuid in by_uuid else "",
            )
            for d in devices
            if d.uuid
        ]

    def _write_spec(self, record: ClaimRecord, *, reapply_sharing: bool) -> None:
        inventory = self._inventory()
        gpus = {g.uuid: g for g in inventory.gpus}
        edits: list[cdi.DeviceEdits] = []
        for config, devices in self._groups(record):
            container = sharing.ContainerSharing()
            if config is not None:
                dirs = self._mps_dirs(record, config, devices)
                backend: sharing.SharingBackend = self._sharing if reapply_sharing else _NoHardware()
                container = sharing.apply(backend, config, self._shared_devices(devices), dirs, shared=_by_capacity(devices))
                for note in container.notes:
                    log.warning("event=sharing-note claim=%s/%s uid=%s note=%r", record.namespace, record.name, record.uid, note)
            for d in devices:
                gpu = gpus.get(d.gpu_uuid)
                if gpu is None:
                    raise KeyError(f"GPU {d.gpu_uuid} of device {d.device_name} is no longer on this node")
                mig = next((m for m in gpu.mig_devices if m.uuid == d.uuid), None)
                if d.uuid != d.gpu_uuid and mig is None:
                    raise KeyError(f"MIG device {d.uuid} ({d.device_name}) is no longer on GPU {d.gpu_uuid}")
                edits.append(
                    cdi.DeviceEdits(
                        device_name=d.device_name, uuid=d.uuid, gpu_minor=gpu.minor,
                        mig=(mig.gpu_instance_id, mig.compute_instance_id) if mig is not None else None,
                        env=container.env, mounts=container.mounts,
                    )
                )
        # Keep the claim's device order in the spec.
        order = {d.device_name: i for i, d in enumerate(record.devices)}
        edits.sort(key=lambda e: order[e.device_name])
        spec = cdi.claim_spec(record.uid, edits, self._common_edits, self._device_numbers())
        cdi.write_claim_spec(self._cdi_dir, record.uid, spec)

    # ---- unprepare -----------------------------------------------------------------------------------------

    def mark_prepared_ahead(self, uid: str) -> None:
        """Record in the checkpoint that a prepared claim was prepared ahead of the kubelet (driver.binder)."""
        with self.checkpoint.locked():
            record = self.checkpoint.claim(uid)
            if record is not None and not record.prepared_ahead:
                self.checkpoint.commit([self.checkpoint.put_claim_op(record.model_copy(update={"prepared_ahead": True}))])

    def prepared_ahead(self) -> list[ClaimRef]:
        """The claims the checkpoint says were prepared ahead of the kubelet."""
        return [ClaimRef(uid=r.uid, namespace=r.namespace, name=r.name)
                for _, r in sorted(self.checkpoint.state.claims.items()) if r.prepared_ahead]

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        out: dict[str, str] = {}
        pending = self.retry_recovery() if claims else None
        for ref in claims:
            if pending is not None and self.checkpoint.claim(ref.uid) is None:
                # Its record may be one the damage lost: unpreparing "nothing" would leave its MPS daemon and GPU
                # settings behind. The kubelet retries until the record is rebuilt.
                out[ref.uid] = f"{ref}: not unprepared: {pending}"
                continue
            try:
                # The claim's lock first: an unprepare waits for a prepare of the same claim still in flight.
                with self._claim_locks.held(ref.uid), self.checkpoint.locked():
                    record = self.checkpoint.claim(ref.uid)
                    if record is None:
                        # Not prepared here (or already unprepared): not an error; a stray spec still goes.
                        cdi.remove_claim_spec(self._cdi_dir, ref.uid)
                        self._claim_locks.forget(ref.uid)
                        out[ref.uid] = ""
                        continue
                    out[ref.uid] = self._rollback(record)
                    if not out[ref.uid]:
                        self._claim_locks.forget(ref.uid)
                        log.info("event=unprepared claim=%s/%s uid=%s", ref.namespace, ref.name, ref.uid)
            except Exception as exc:
                log.exception("event=unprepare-failed claim=%s/%s uid=%s", ref.namespace, ref.name, ref.uid)
                out[ref.uid] = f"{ref}: unprepare failed: {exc}"
        return out

    def _rollback(self, record: ClaimRecord) -> str:
        """Undo a claim (completed or half-prepared); the record stays if undoing the sharing fails."""
        cdi.remove_claim_spec(self._cdi_dir, record.uid)
        self._fault("unprepare-cdi-removed")
        others = [r for u, r in self.checkpoint.state.claims.items() if u != record.uid]
        still_shared = {d.gpu_uuid for r in others for d in r.devices if d.sharing is not None and (d.sharing.get("sharing"))}
        groups = self._groups(record)
        try:
            for config, devices in groups:
                dirs = self._mps_dirs(record, config, devices)
                if _by_capacity(devices) and any(
                    d.consumed_capacity is not None and d.gpu_uuid == devices[0].gpu_uuid for r in others for d in r.devices
                ):
                    dirs = None  # the GPU's shared daemon still serves other claims
                for note in sharing.undo(self._sharing, config, still_shared, self._shared_devices(devices), dirs):
                    log.warning("event=sharing-note claim=%s/%s uid=%s note=%r", record.namespace, record.name, record.uid, note)
        except sharing.SharingError as exc:
            return f"ResourceClaim {record.namespace}/{record.name} (uid {record.uid}): undoing its sharing setting failed: {exc}"
        if record.mps_daemons or any(sharing.is_mps(config) for config, _ in groups):
            # undo removed each daemon's pipe and log dirs; this removes the claim's dir holding them.
            shutil.rmtree(self._mps_root / record.uid, ignore_errors=True)
        mig_error = self._destroy_migs(record)
        if mig_error:
            return mig_error
        self.checkpoint.commit(
            [self.checkpoint.delete_claim_op(record.uid), *self.ledger.release_ops(Ledger.dra_holder(record.uid))]
        )
        self._fault("unprepare-committed")
        return ""


def _layout(claim: ClaimRecord | Plan) -> list[tuple[str, str]]:
    """The devices and sharing settings a record holds or a plan asks for: a kept record is reused only for the same."""
    if isinstance(claim, ClaimRecord):
        pairs = [(d.device_name, d.sharing) for d in claim.devices]
    else:
        pairs = [(p.device_name, dict(p.parameters) if p.parameters is not None else None) for p in claim.devices]
    return sorted((name, json.dumps(config, sort_keys=True)) for name, config in pairs)


def _by_capacity(devices: Sequence[PreparedDevice]) -> bool:
    """Devices of a GPU shared by capacity: served by that GPU's one MPS daemon."""
    return any(d.consumed_capacity is not None for d in devices)


class _NoHardware:
    """A sharing backend that touches nothing: rebuilding a spec's edits for an already-applied config
    (an MPS daemon counts as running, so none is started)."""

    def set_compute_mode(self, gpu_uuid: str, mode: int) -> None:
        return None

    def set_timeslice(self, gpu_uuid: str, level: int) -> None:
        return None

    def mps_start(
        self, dirs: MpsDirs, device_uuids: Sequence[str], commands: Sequence[str] = (), *, multi_user: bool = False,
    ) -> None:
        return None

    def mps_wait(self, dirs: MpsDirs) -> None:
        return None

    def mps_command(self, dirs: MpsDirs, command: str) -> str:
        return ""

    def mps_stop(self, dirs: MpsDirs) -> None:
        return None

    def mps_running(self, dirs: MpsDirs) -> bool:
        return True
