"""The node's crash-safe checkpoint: prepared claims and the GPU ledger shared by DRA and the device plugin shim.

On disk, in the plugin data dir:

- `checkpoint.json`  — a snapshot `{"version", "checksum": "sha256:<hex>", "data": {...}}`; the checksum covers
  the canonical JSON of `data` (sorted keys, no spaces). Written atomically (temp, fsync, rename, fsync dir).
- `checkpoint.journal` — transactions appended after the snapshot, one line each: `<sha256 hex> <json>`, fsynced
  before the operation that needed them is acknowledged. A prepare costs two short appends (PrepareStarted,
  PrepareCompleted) instead of rewriting every prepared claim; the journal is folded into a new snapshot every
  `compact_every` transactions.
- `serialize.lock` — flock'ed around every read-modify-write, so that two plugin instances (rolling update) and
  the device plugin shim never interleave.

NVIDIA's DRA driver keeps its checkpoint under the same name in the same plugin dir (both serve `gpu.nvidia.com`).
Met at load, it is not corruption: it is moved aside as `checkpoint.json.nvidia-<n>` and the claims it held are
named in `LoadReport.notes` (their CDI specs go as orphans at start; see docs/deployment.md, migrating).

Corruption (bad checksum, unparsable snapshot, a damaged journal line that is not the torn tail of an interrupted
append) is reported in `LoadReport.problems` and the bad file is kept aside as `<name>.corrupt-<n>`; every verified
transaction is kept, those after a damaged line too, and what is lost is rebuilt at start (driver.recovery). A torn last journal line is an append that never completed (its
operation was never acknowledged), so dropping it is correct and only noted.

The boot id (`/proc/sys/kernel/random/boot_id`) is recorded: after a reboot the device plugin's allocations are
gone (the kubelet re-allocates), so its ledger holds are dropped, and `LoadReport.new_boot` tells the preparer to
re-apply sharing settings, which the GPU forgot when it reset.

Sticky device health (`health`: critical Xids, GPU lost, unmonitored, per GPU or MIG UUID) is kept too, so that a
tainted GPU stays tainted across agent restarts and upgrades; a reboot resets every GPU and drops it, and
`forget_health` drops it after a GPU reset (`gpu-dra node-health --forget`).

Versions: `version` is the envelope's (checksum + data; every agent release reads version 1, so it stays 1 and
an older agent overlapping a newer one in a rolling update keeps reading the file); `data.schema_version` is the
content's. Content of an older schema is migrated when it is loaded (1 -> 2: no health known); sections of a
newer one that this agent does not know are kept as they are (an older agent ignores them: pydantic drops unknown
fields on validation but the raw data, which is what is written back, keeps them).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpudra.atomicfile import atomic_write, fsync_dir

CHECKPOINT_VERSION = 1
# The content's schema: 1 claims + ledger; 2 adds `health`.
SCHEMA_VERSION = 2
SNAPSHOT_NAME = "checkpoint.json"
JOURNAL_NAME = "checkpoint.journal"
LOCK_NAME = "serialize.lock"
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")

DRA_HOLDER_PREFIX = "dra:"
DEVICE_PLUGIN_HOLDER_PREFIX = "deviceplugin:"


class ClaimPhase(str, Enum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"


class MigCreation(BaseModel):
    """A MIG instance prepare creates for a partitionable placement (and unprepare or rollback destroys).

    Recorded before it is created (PrepareStarted), so that a crash right after creating it still finds it."""

    model_config = ConfigDict(frozen=True)
    profile_id: int  # NVML's GPU-instance profile id (MigProfile.profile_id)
    profile: str  # e.g. "3g.40gb", for messages
    start: int
    size: int
    gpu_instance_id: int | None = None  # known once created
    compute_instance_id: int | None = None


class PreparedDevice(BaseModel):
    """One allocated device of a claim, as the kubelet will be told about it."""

    model_config = ConfigDict(frozen=True)
    request_names: list[str]
    pool_name: str
    device_name: str
    cdi_device_ids: list[str] = Field(default_factory=list)
    share_id: str | None = None
    uuid: str  # the device's own UUID (GPU-... or MIG-...)
    gpu_uuid: str  # the physical GPU (the ledger key)
    sharing: dict[str, Any] | None = None  # the applied sharing config (GpuConfig model dump), None = exclusive
    mig_created: MigCreation | None = None  # set when prepare creates the MIG device itself (partitionable)
    admin_access: bool = False  # allocated with adminAccess: it takes no exclusive hold on the device
    # The claim's part of a GPU shared by capacity (allocation result consumedCapacity), None otherwise.
    consumed_capacity: dict[str, str] | None = None


class MpsDaemonRecord(BaseModel):
    """An MPS control daemon prepare runs for some of a claim's devices (one per MPS config group).

    Recorded with PrepareStarted, before the daemon starts, so that a rollback after a crash stops it and a
    restarted agent can check a completed claim's daemon and start it again."""

    model_config = ConfigDict(frozen=True)
    pipe_dir: str
    log_dir: str
    device_names: list[str]  # the claim's devices it serves (their UUIDs are in `devices`)


class ClaimRecord(BaseModel):
    model_config = ConfigDict(frozen=True)
    uid: str
    namespace: str
    name: str
    phase: ClaimPhase
    devices: list[PreparedDevice]
    mps_daemons: list[MpsDaemonRecord] = Field(default_factory=list)
    # Prepared by the binder (KEP-5007 binding conditions) before the kubelet asked: released by the binder if
    # the binding fails, also after an agent restart.
    prepared_ahead: bool = False
    # Its MPS daemons did not come up within their timeout: the claim is not prepared (no CDI spec) but the daemons'
    # Deployments, directories and the ledger holds are kept for the kubelet's retry (driver.prepare).
    mps_kept: bool = False


class HealthRecord(BaseModel):
    """What must survive of one device's health (driver.health): the faults that make it unhealthy or unwatched."""

    model_config = ConfigDict(frozen=True)
    xids: list[int] = Field(default_factory=list)  # critical Xids, most recent last
    lost: bool = False
    unmonitored: bool = False
    # A lost GPU's inventory entry (driver.inventory.Gpu as JSON): discovery cannot see a GPU that is still off the
    # bus, and it stays published, tainted, from this description.
    gpu: dict[str, Any] | None = None


class CheckpointData(BaseModel):
    model_config = ConfigDict(frozen=True)
    schema_version: int = SCHEMA_VERSION
    seq: int = 0  # the last journal transaction folded into this snapshot
    boot_id: str = ""
    claims: dict[str, ClaimRecord] = Field(default_factory=dict)
    # GPU uuid -> holders ("dra:<claimUID>" / "deviceplugin:<allocation id>"), sorted.
    ledger: dict[str, list[str]] = Field(default_factory=dict)
    # GPU or MIG device uuid -> its sticky health (schema 2).
    health: dict[str, HealthRecord] = Field(default_factory=dict)


def migrate(data: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """Raw checkpoint content of any schema, as this agent's schema (`notes` says what was done)."""
    version = data.get("schema_version", 1)
    if not isinstance(version, int) or version < 1:
        return data  # the schema check in _set_data reports it
    if version > SCHEMA_VERSION:
        notes.append(f"checkpoint content of schema {version}, written by a newer agent (this one knows "
                     f"{SCHEMA_VERSION}); what this agent does not know is kept as it is")
        return data
    out = dict(data)
    if version < 2:
        out.setdefault("health", {})  # schema 1 kept no health: nothing is known to be unhealthy
    out["schema_version"] = SCHEMA_VERSION
    return out


# Kubernetes UIDs are UUIDs; any single path component of these characters is accepted (tests use short names),
# which is what matters: a claim's CDI spec, MPS dirs and MIG bookkeeping are named after it.
_CLAIM_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,127}$")
# Where a journal transaction line may begin: its checksum and the space after it.
_TXN_START = re.compile(rb"[0-9a-f]{64} ")


def claim_record_problem(key: str, record: ClaimRecord) -> str | None:
    """Why no path may be built from a checkpointed claim, or None: a uid that is not a plain name (no "/", "..",
    NUL) or differs from its key, MPS directories that are relative or step out with "..". Read from disk, a
    checkpoint is input like any other."""
    if not _CLAIM_UID.match(key) or record.uid != key:
        return f"claim record {key!r}: uid {record.uid!r} is not a Kubernetes UID (letters, digits, '-')"
    for daemon in record.mps_daemons:
        for label, raw in (("pipe_dir", daemon.pipe_dir), ("log_dir", daemon.log_dir)):
            path = Path(raw)
            if not path.is_absolute() or ".." in path.parts or "\x00" in raw:
                return f"claim record {key!r}: MPS {label} {raw!r} is not an absolute path without '..'"
    return None


def invalid_claim_records(data: CheckpointData) -> dict[str, str]:
    """The claims of `data` that `claim_record_problem` refuses (key -> why)."""
    return {k: p for k, r in data.claims.items() if (p := claim_record_problem(k, r)) is not None}


@dataclass(frozen=True)
class Op:
    """One change in a transaction: put (value) or delete (value None) one key of one section."""

    section: str  # "claims" | "ledger" | "health"
    key: str
    value: Any | None

    def as_json(self) -> list[Any]:
        return [self.section, self.key, self.value]


@dataclass
class LoadReport:
    problems: list[str] = field(default_factory=list)  # corruption found and kept aside
    notes: list[str] = field(default_factory=list)  # benign: torn tail dropped, missing files
    new_boot: bool = False
    corrupt: bool = False
    lost_transactions: int = 0  # damaged journal lines nothing could be recovered from


class CheckpointCorrupt(Exception):
    pass


def nvidia_checkpoint_claims(path: Path) -> list[str] | None:
    """The claim UIDs in NVIDIA's DRA driver checkpoint at `path` (`{"checksum": N, "v1"|"v2": {"preparedClaims":
    {uid: ...}}}`), or None when the file is not one."""
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict) or "data" in doc or not isinstance(doc.get("checksum"), int):
        return None
    versions = [doc[k] for k in doc if k.startswith("v") and k[1:].isdigit() and isinstance(doc[k], dict)]
    if not versions:
        return None
    claims: set[str] = set()
    for v in versions:
        prepared = v.get("preparedClaims")
        if isinstance(prepared, dict):
            claims.update(str(k) for k in prepared)
    return sorted(claims)


class LedgerConflict(Exception):
    """A GPU is already held by a holder that excludes the requested one."""

    def __init__(self, holder: str, conflicts: dict[str, tuple[str, ...]]) -> None:
        parts = ", ".join(f"{uuid} is held by {' and '.join(holders)}" for uuid, holders in sorted(conflicts.items()))
        super().__init__(f"cannot give {holder} the GPUs it needs: {parts}")
        self.holder = holder
        self.conflicts = conflicts


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _apply(data: dict[str, Any], ops: Iterable[list[Any]]) -> None:
    for section, key, value in ops:
        table = data.setdefault(section, {})
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value


class NodeLock:
    """Reentrant across threads of one process (RLock) and exclusive across processes (flock)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._rlock = threading.RLock()
        self._depth = 0
        self._fd: int | None = None

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._rlock:
            if self._depth == 0:
                fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._fd = fd
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._fd is not None:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
                    os.close(self._fd)
                    self._fd = None


class Checkpoint:
    """The node checkpoint in `directory`. Use `with cp.locked():` around read-modify-write sequences."""

    def __init__(
        self,
        directory: Path,
        *,
        boot_id_path: Path = BOOT_ID_PATH,
        compact_every: int = 512,
    ) -> None:
        self.directory = directory
        self.snapshot_path = directory / SNAPSHOT_NAME
        self.journal_path = directory / JOURNAL_NAME
        self.lock = NodeLock(directory / LOCK_NAME)
        self._boot_id_path = boot_id_path
        self._compact_every = compact_every
        self._data: dict[str, Any] = CheckpointData().model_dump(mode="json")
        self._state = CheckpointData()
        self._journal_offset = 0  # bytes of the journal already applied
        self._journal_txns = 0
        self._snapshot_stat: tuple[int, int, int] | None = None
        self._journal_fd: int | None = None

    # ---- loading -------------------------------------------------------------------------------------------

    @classmethod
    def open(cls, directory: Path, **kwargs: Any) -> tuple["Checkpoint", LoadReport]:
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
        cp = cls(directory, **kwargs)
        with cp.lock.held():
            report = cp._load()
            boot_id = read_boot_id(cp._boot_id_path)
            if cp._state.boot_id != boot_id:
                report.new_boot = bool(cp._state.boot_id) or bool(cp._state.claims) or bool(cp._state.ledger)
                cp._on_new_boot(boot_id)
            if report.corrupt:
                # Fold what survived into a fresh, verified snapshot so the damage is not met again.
                cp.compact()
        return cp, report

    def _stat_key(self, path: Path) -> tuple[int, int, int] | None:
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _set_aside(self, path: Path) -> Path:
        n = 1
        while (target := path.with_name(f"{path.name}.corrupt-{n}")).exists():
            n += 1
        os.replace(path, target)
        fsync_dir(path.parent)
        return target

    def _load(self) -> LoadReport:
        report = LoadReport()
        data: dict[str, Any] = CheckpointData().model_dump(mode="json")
        snapshot_ok = True
        if self.snapshot_path.exists() and self._set_aside_nvidia(report):
            pass
        elif self.snapshot_path.exists():
            try:
                data = self._read_snapshot(self.snapshot_path)
            except CheckpointCorrupt as exc:
                snapshot_ok = False
                kept = self._set_aside(self.snapshot_path)
                report.problems.append(f"{self.snapshot_path}: {exc}; kept as {kept}")
                report.corrupt = True
        else:
            report.notes.append(f"{self.snapshot_path}: not present, starting with an empty checkpoint")
        self._snapshot_stat = self._stat_key(self.snapshot_path)
        self._journal_offset = 0
        self._journal_txns = 0
        # With a corrupt snapshot the journal's sequence numbers cannot be trusted to skip anything: apply all.
        min_seq = int(data.get("seq", 0)) if snapshot_ok else -1
        self._replay(data, min_seq, report)
        self._set_data(migrate(data, report.notes), report)
        return report

    def _set_aside_nvidia(self, report: LoadReport) -> bool:
        """Move NVIDIA's checkpoint out of the way; True when the snapshot was one."""
        claims = nvidia_checkpoint_claims(self.snapshot_path)
        if claims is None:
            return False
        n = 1
        while (target := self.snapshot_path.with_name(f"{self.snapshot_path.name}.nvidia-{n}")).exists():
            n += 1
        os.replace(self.snapshot_path, target)
        fsync_dir(self.snapshot_path.parent)
        report.notes.append(
            f"{self.snapshot_path}: NVIDIA's DRA driver checkpoint (claims it prepared: "
            f"{', '.join(claims) if claims else 'none'}), moved aside as {target}; starting with an empty checkpoint")
        return True

    def _read_snapshot(self, path: Path) -> dict[str, Any]:
        try:
            doc = json.loads(path.read_bytes())
        except (ValueError, UnicodeDecodeError) as exc:
            raise CheckpointCorrupt(f"not valid JSON ({exc})") from exc
        if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict):
            raise CheckpointCorrupt('missing the "data" object')
        if doc.get("version") != CHECKPOINT_VERSION:
            raise CheckpointCorrupt(f"unsupported version {doc.get('version')!r}; this driver reads version {CHECKPOINT_VERSION}")
        expected = f"sha256:{sha256_hex(canonical_json(doc['data']))}"
        if doc.get("checksum") != expected:
            raise CheckpointCorrupt(f"checksum mismatch (file says {doc.get('checksum')!r}, content hashes to {expected!r})")
        return doc["data"]

    def _replay(self, data: dict[str, Any], min_seq: int, report: LoadReport) -> None:
        """Apply the journal's verified transactions after `min_seq`.

        Every line carries its own checksum and every op writes a whole value, so a damaged line costs only that
        transaction: the ones after it are verified on their own and applied (each key ends with the value of the
        last verified write to it). A line whose damage is an interrupted append followed by later appends ends
        with a whole transaction, which is recovered too. What a lost transaction alone wrote is rebuilt at start
        (driver.recovery)."""
        try:
            raw = self.journal_path.read_bytes()
        except FileNotFoundError:
            return
        offset = 0
        lines = raw.split(b"\n")
        damaged: list[str] = []
        for i, line in enumerate(lines):
            is_last = i == len(lines) - 1
            if is_last:
                if line:
                    # No newline: an append interrupted by a crash; its operation was never acknowledged.
                    report.notes.append(f"{self.journal_path}: dropped an incomplete last transaction ({len(line)} bytes)")
                    self._truncate_journal(offset)
                break
            txn = self._parse_line(line)
            if txn is None:
                txn = self._salvage(line)
                damaged.append(f"{i + 1}" + (" (a whole transaction after the damage recovered)" if txn else ""))
                if txn is None:
                    report.lost_transactions += 1
            if txn is not None and txn["seq"] > min_seq:
                _apply(data, txn["ops"])
                data["seq"] = max(int(data.get("seq", 0)), txn["seq"])
            offset += len(line) + 1
            self._journal_txns += 1
        self._journal_offset = offset
        if damaged:
            kept = self._copy_aside(self.journal_path)
            report.problems.append(
                f"{self.journal_path}: transaction(s) {', '.join(damaged)} of {len(lines) - 1} damaged (checksum or "
                f"format); kept the journal as {kept}, applied every verified transaction; what a lost one alone "
                "wrote is rebuilt from the node's CDI specs, MPS state and the API's allocations"
            )
            report.corrupt = True

    def _salvage(self, line: bytes) -> dict[str, Any] | None:
        """The last whole, verified transaction inside a damaged line (a torn append with more appended after it)."""
        for match in reversed(list(_TXN_START.finditer(line, 1))):
            txn = self._parse_line(line[match.start():])
            if txn is not None:
                return txn
        return None

    def _copy_aside(self, path: Path) -> Path:
        n = 1
        while (target := path.with_name(f"{path.name}.corrupt-{n}")).exists():
            n += 1
        atomic_write(target, path.read_bytes())
        return target

    def _truncate_journal(self, length: int) -> None:
        fd = os.open(self.journal_path, os.O_WRONLY)
        try:
            os.ftruncate(fd, length)
            os.fsync(fd)
        finally:
            os.close(fd)

    @staticmethod
    def _parse_line(line: bytes) -> dict[str, Any] | None:
        checksum, _, body = line.partition(b" ")
        if len(checksum) != 64 or sha256_hex(body) != checksum.decode(errors="replace"):
            return None
        try:
            txn = json.loads(body)
        except ValueError:
            return None
        if not isinstance(txn, dict) or not isinstance(txn.get("seq"), int) or not isinstance(txn.get("ops"), list):
            return None
        if not all(isinstance(op, list) and len(op) == 3 for op in txn["ops"]):
            return None
        return txn

    def _set_data(self, data: dict[str, Any], report: LoadReport | None = None) -> None:
        try:
            state = CheckpointData.model_validate(data)
        except ValidationError as exc:
            if report is None:
                raise CheckpointCorrupt(f"checkpoint content does not match the schema: {exc}") from exc
            report.problems.append(f"{self.directory}: checkpoint content does not match the schema ({exc}); starting empty")
            report.corrupt = True
            if self.snapshot_path.exists():
                self._set_aside(self.snapshot_path)
            if self.journal_path.exists():
                self._set_aside(self.journal_path)
            self._journal_offset = 0
            self._journal_txns = 0
            data = CheckpointData().model_dump(mode="json")
            state = CheckpointData()
        problems = invalid_claim_records(state)
        if problems:
            if report is None:
                raise CheckpointCorrupt("; ".join(problems.values()))
            # A record whose uid or directories would put a path outside the state dir is never acted on.
            report.problems += [f"{self.directory}: {p}; dropped that record" for p in problems.values()]
            report.corrupt = True
            data = {**data, "claims": {k: v for k, v in data.get("claims", {}).items() if k not in problems}}
            state = CheckpointData.model_validate(data)
        self._data = data
        self._state = state

    def refresh(self) -> None:
        """Pick up transactions another process appended (call with the lock held)."""
        if self._stat_key(self.snapshot_path) != self._snapshot_stat:
            self._close_journal()
            report = self._load()
            for problem in report.problems:
                raise CheckpointCorrupt(problem)
            return
        try:
            size = self.journal_path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size == self._journal_offset:
            return
        if size < self._journal_offset:
            self._close_journal()
            self._load()
            return
        with open(self.journal_path, "rb") as f:
            f.seek(self._journal_offset)
            tail = f.read()
        data = json.loads(json.dumps(self._data))
        for line in tail.split(b"\n")[:-1]:
            txn = self._parse_line(line)
            if txn is None:
                raise CheckpointCorrupt(f"{self.journal_path}: damaged transaction written by another process")
            _apply(data, txn["ops"])
            data["seq"] = max(int(data.get("seq", 0)), txn["seq"])
            self._journal_offset += len(line) + 1
            self._journal_txns += 1
        self._set_data(data)

    # ---- writing -------------------------------------------------------------------------------------------

    @contextmanager
    def locked(self) -> Iterator[None]:
        with self.lock.held():
            self.refresh()
            yield

    def commit(self, ops: list[Op], *, durable: bool = True) -> None:
        """Apply one transaction (call with the lock held).

        `durable=False` appends without fdatasync: the line survives a process crash (it is in the page cache)
        and the next durable commit flushes it too. Use it only for state that a power loss makes moot anyway
        (PrepareStarted: after a reboot the CDI dir and GPU settings it guards are gone as well).
        """
        if not ops:
            return
        # Validate only what changes (the rest was validated when it was written): O(size of the change).
        checked: list[tuple[Op, Any]] = []
        for op in ops:
            if op.section == "claims":
                record = None if op.value is None else ClaimRecord.model_validate(op.value)
                problem = claim_record_problem(op.key, record) if record is not None else None
                if problem:
                    raise ValueError(problem)
                checked.append((op, record))
            elif op.section == "ledger":
                if op.value is not None and not (isinstance(op.value, list) and all(isinstance(h, str) for h in op.value)):
                    raise ValueError(f"ledger entry {op.key}: holders must be a list of strings, got {op.value!r}")
                checked.append((op, None if op.value is None else list(op.value)))
            elif op.section == "health":
                checked.append((op, None if op.value is None else HealthRecord.model_validate(op.value)))
            else:
                raise ValueError(f"checkpoint section {op.section!r}: accepted sections: claims, ledger, health")
        seq = int(self._data.get("seq", 0)) + 1
        body = canonical_json({"seq": seq, "ops": [op.as_json() for op in ops]})
        line = sha256_hex(body).encode() + b" " + body + b"\n"
        fd = self._journal()
        os.write(fd, line)
        if durable:
            os.fdatasync(fd)
        self._journal_offset += len(line)
        self._journal_txns += 1
        _apply(self._data, [op.as_json() for op in ops])
        self._data["seq"] = seq
        for op, value in checked:
            tables: dict[str, dict[str, Any]] = {
                "claims": self._state.claims, "ledger": self._state.ledger, "health": self._state.health,
            }
            table = tables[op.section]
            if value is None:
                table.pop(op.key, None)
            else:
                table[op.key] = value
        if self._journal_txns >= self._compact_every:
            self.compact()

    def _journal(self) -> int:
        if self._journal_fd is None:
            existed = self.journal_path.exists()
            self._journal_fd = os.open(self.journal_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            if not existed:
                fsync_dir(self.directory)
        return self._journal_fd

    def _close_journal(self) -> None:
        if self._journal_fd is not None:
            os.close(self._journal_fd)
            self._journal_fd = None

    def compact(self) -> None:
        """Fold the journal into a new snapshot (call with the lock held)."""
        doc = {"version": CHECKPOINT_VERSION, "checksum": f"sha256:{sha256_hex(canonical_json(self._data))}", "data": self._data}
        atomic_write(self.snapshot_path, canonical_json(doc))
        # A crash here leaves the old journal beside the new snapshot; its seqs are <= the snapshot's, so skipped.
        self._close_journal()
        fd = os.open(self.journal_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(self.directory)
        self._journal_offset = 0
        self._journal_txns = 0
        self._snapshot_stat = self._stat_key(self.snapshot_path)

    def close(self) -> None:
        self._close_journal()

    def _on_new_boot(self, boot_id: str) -> None:
        # A reboot resets every GPU: the faults recorded before it are gone with it.
        ops: list[Op] = [Op("health", uuid, None) for uuid in sorted(self._state.health)]
        for uuid, holders in self._state.ledger.items():
            kept = [h for h in holders if not h.startswith(DEVICE_PLUGIN_HOLDER_PREFIX)]
            if kept != holders:
                ops.append(Op("ledger", uuid, kept or None))
        self.commit(ops)
        # boot_id is a snapshot field; a crash before the compaction just repeats this (idempotent) step.
        self._data = {**self._data, "boot_id": boot_id}
        self._state = CheckpointData.model_validate(self._data)
        self.compact()

    # ---- reading -------------------------------------------------------------------------------------------

    @property
    def state(self) -> CheckpointData:
        return self._state

    def claim(self, uid: str) -> ClaimRecord | None:
        return self._state.claims.get(uid)

    def put_health_op(self, uuid: str, record: HealthRecord | None) -> Op:
        return Op("health", uuid, None if record is None else record.model_dump(mode="json"))

    def forget_health(self, uuids: Iterable[str] | None = None) -> list[str]:
        """Drop the recorded health of `uuids` (None: of every device), e.g. after a GPU reset; the UUIDs dropped.
        A running agent keeps what it saw in memory: restart it afterwards."""
        with self.locked():
            known = set(self._state.health)
            dropped = sorted(known if uuids is None else known & set(uuids))
            self.commit([Op("health", uuid, None) for uuid in dropped])
        return dropped

    def put_claim_op(self, record: ClaimRecord) -> Op:
        return Op("claims", record.uid, record.model_dump(mode="json"))

    def delete_claim_op(self, uid: str) -> Op:
        return Op("claims", uid, None)


class Ledger:
    """Which holder has each physical GPU. DRA claims may share a GPU among themselves (MIG devices of one GPU
    go to different claims; the scheduler prevents real double allocation), but a device plugin allocation
    excludes every other holder, and the other way round."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        self._cp = checkpoint

    @staticmethod
    def dra_holder(claim_uid: str) -> str:
        return f"{DRA_HOLDER_PREFIX}{claim_uid}"

    @staticmethod
    def device_plugin_holder(allocation_id: str) -> str:
        return f"{DEVICE_PLUGIN_HOLDER_PREFIX}{allocation_id}"

    def holders_of(self, uuid: str) -> tuple[str, ...]:
        return tuple(self._cp.state.ledger.get(uuid, ()))

    def holder_of(self, uuid: str) -> str | None:
        holders = self.holders_of(uuid)
        return holders[0] if holders else None

    def held(self) -> dict[str, tuple[str, ...]]:
        return {uuid: tuple(holders) for uuid, holders in self._cp.state.ledger.items()}

    def uuids_held_by(self, holder: str) -> set[str]:
        return {uuid for uuid, holders in self._cp.state.ledger.items() if holder in holders}

    @staticmethod
    def _excludes(a: str, b: str) -> bool:
        return a != b and (a.startswith(DEVICE_PLUGIN_HOLDER_PREFIX) or b.startswith(DEVICE_PLUGIN_HOLDER_PREFIX))

    def conflicts(self, holder: str, uuids: Iterable[str]) -> dict[str, tuple[str, ...]]:
        out: dict[str, tuple[str, ...]] = {}
        for uuid in uuids:
            blocking = tuple(h for h in self.holders_of(uuid) if self._excludes(h, holder))
            if blocking:
                out[uuid] = blocking
        return out

    def hold_ops(self, holder: str, uuids: Iterable[str]) -> list[Op]:
        """The ops that give `holder` all of `uuids`; raises LedgerConflict (and changes nothing) otherwise."""
        wanted = sorted(set(uuids))
        conflicts = self.conflicts(holder, wanted)
        if conflicts:
            raise LedgerConflict(holder, conflicts)
        ops = []
        for uuid in wanted:
            holders = self.holders_of(uuid)
            if holder not in holders:
                ops.append(Op("ledger", uuid, sorted({*holders, holder})))
        return ops

    def release_ops(self, holder: str, uuids: Iterable[str] | None = None) -> list[Op]:
        targets = self.uuids_held_by(holder) if uuids is None else set(uuids) & self.uuids_held_by(holder)
        ops = []
        for uuid in sorted(targets):
            rest = [h for h in self.holders_of(uuid) if h != holder]
            ops.append(Op("ledger", uuid, rest or None))
        return ops

    def hold(self, holder: str, uuids: Iterable[str]) -> None:
        with self._cp.locked():
            self._cp.commit(self.hold_ops(holder, uuids))

    def release(self, holder: str, uuids: Iterable[str] | None = None) -> None:
        with self._cp.locked():
            self._cp.commit(self.release_ops(holder, uuids))
