"""The checkpoint survives crashes, detects corruption (keeping the bad file), and carries the GPU ledger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from driver.checkpoint import (
    Checkpoint,
    ClaimPhase,
    ClaimRecord,
    Ledger,
    LedgerConflict,
    Op,
    PreparedDevice,
)


def _boot(tmp_path: Path, boot_id: str = "boot-1") -> Path:
    path = tmp_path / "boot_id"
    path.write_text(boot_id + "\n")
    return path


def _record(uid: str, phase: ClaimPhase = ClaimPhase.PREPARE_COMPLETED, gpu: str = "GPU-a") -> ClaimRecord:
    device = PreparedDevice(
        request_names=["gpu"], pool_name="node1", device_name="gpu-a", cdi_device_ids=[f"k8s.gpu.nvidia.com/claim={uid}-gpu-a"],
        uuid=gpu, gpu_uuid=gpu,
    )
    return ClaimRecord(uid=uid, namespace="ns", name=f"claim-{uid}", phase=phase, devices=[device])


def _open(directory: Path, boot: Path, **kwargs: object) -> Checkpoint:
    cp, report = Checkpoint.open(directory, boot_id_path=boot, **kwargs)  # type: ignore[arg-type]
    assert report.problems == []
    return cp


def test_commit_survives_reopen_and_compaction(tmp_path: Path) -> None:
    boot = _boot(tmp_path)
    d = tmp_path / "plugin"
    cp = _open(d, boot, compact_every=3)
    with cp.locked():
        for i in range(5):
            cp.commit([cp.put_claim_op(_record(f"u{i}"))])
        cp.commit([cp.delete_claim_op("u0")])
    cp.close()
    # 6 transactions with compaction every 3: the snapshot holds them all and the journal is empty.
    assert (d / "checkpoint.journal").read_bytes() == b""
    snapshot = json.loads((d / "checkpoint.json").read_text())
    assert snapshot["version"] == 1 and snapshot["checksum"].startswith("sha256:")
    again = _open(d, boot)
    assert sorted(again.state.claims) == ["u1", "u2", "u3", "u4"]
    assert again.claim("u1") == _record("u1")


def test_journal_replayed_after_crash_without_compaction(tmp_path: Path) -> None:
    boot = _boot(tmp_path)
    d = tmp_path / "plugin"
    cp = _open(d, boot)
    with cp.locked():
        cp.commit([cp.put_claim_op(_record("a", ClaimPhase.PREPARE_STARTED))])
        cp.commit([cp.put_claim_op(_record("a"))])
    # No close(): as if the process died here.
    again = _open(d, boot)
    record = again.claim("a")
    assert record is not None and record.phase is ClaimPhase.PREPARE_COMPLETED


def test_torn_last_journal_line_is_dropped_as_unacknowledged(tmp_path: Path) -> None:
    boot = _boot(tmp_path)
    d = tmp_path / "plugin"
    cp = _open(d, boot)
    with cp.locked():
        cp.commit([cp.put_claim_op(_record("a"))])
    with open(d / "checkpoint.journal", "ab") as f:
        f.write(b'0123abc {"seq": 2, "ops"')  # an append cut short by a crash
    again, report = Checkpoint.open(d, boot_id_path=boot)
    assert report.problems == [] and any("incomplete last transaction" in n for n in report.notes)
    assert list(again.state.claims) == ["a"]
    with again.locked():
        again.commit([again.put_claim_op(_record("b"))])
    third = _open(d, boot)
    assert sorted(third.state.claims) == ["a", "b"]


def test_corrupt_snapshot_is_reported_and_kept_aside(tmp_path: Path) -> None:
    boot = _boot(tmp_path)
    d = tmp_path / "plugin"
    cp = _open(d, boot)
    with cp.locked():
        cp.commit([cp.put_claim_op(_record("a"))])
        cp.compact()
        cp.commit([cp.put_claim_op(_record("b"))])
    cp.close()
    doc = json.loads((d / "checkpoint.json").read_text())
    doc["data"]["claims"]["a"]["name"] = "tampered"
    (d / "checkpoint.json").write_text(json.dumps(doc))
    again, report = Checkpoint.open(d, boot_id_path=boot)
    assert report.corrupt
    assert any("checksum mismatch" in p and "checkpoint.json.corrupt-1" in p for p in report.problems)
    assert json.loads((d / "checkpoint.json.corrupt-1").read_text())["data"]["claims"]["a"]["name"] == "tampered"
    # The journal after the snapshot is still applied; the new snapshot is valid again.
    assert list(again.state.claims) == ["b"]
    assert Checkpoint.open(d, boot_id_path=boot)[1].problems == []


def test_damaged_journal_line_costs_only_that_transaction(tmp_path: Path) -> None:
    boot = _boot(tmp_path)
    d = tmp_path / "plugin"
    cp = _open(d, boot)
    with cp.locked():
        for uid in ("a", "b", "c"):
            cp.commit([cp.put_claim_op(_record(uid))])
    lines = (d / "checkpoint.journal").read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'"b"', b'"x"')
    (d / "checkpoint.journal").write_bytes(b"\n".join(lines))
    again, report = Checkpoint.open(d, boot_id_path=boot)
    assert report.corrupt and any("transaction(s) 2 of 3 damaged" in p for p in report.problems)
    assert report.lost_transactions == 1
    assert (d / "checkpoint.journal.corrupt-1").exists()
    # Issue 37: every later transaction used to be dropped with it.
    assert sorted(again.state.claims) == ["a", "c"]
    assert Checkpoint.open(d, boot_id_path=boot)[1].problems == []  # folded into a verified snapshot


def test_one_flipped_byte_early_in_a_long_journal_loses_one_transaction(tmp_path: Path) -> None:
    boot = _boot(tmp_path)
    d = tmp_path / "plugin"
    cp = _open(d, boot)
    uids = [f"claim-{i:03d}" for i in range(150)]
    with cp.locked():
        for uid in uids:
            cp.commit([cp.put_claim_op(_record(uid)), Op("ledger", f"GPU-{uid}", [f"dra:{uid}"])])
    raw = bytearray((d / "checkpoint.journal").read_bytes())
    second = raw.index(b"\n") + 1
    raw[second + 100] ^= 0x01  # one bit of transaction 2
    (d / "checkpoint.journal").write_bytes(bytes(raw))
    again, report = Checkpoint.open(d, boot_id_path=boot)
    assert report.corrupt and report.lost_transactions == 1
    assert sorted(again.state.claims) == [u for u in uids if u != "claim-001"]
    assert len(again.state.ledger) == 149


def test_a_torn_append_followed_by_more_appends_recovers_the_whole_transaction_after_it(tmp_path: Path) -> None:
    boot = _boot(tmp_path)
    d = tmp_path / "plugin"
    cp = _open(d, boot)
    with cp.locked():
        for uid in ("a", "b"):
            cp.commit([cp.put_claim_op(_record(uid))])
    journal = d / "checkpoint.journal"
    first, second, _ = journal.read_bytes().split(b"\n")
    # A crash cut the append of "a" short, and the next append ("b") went on right after it.
    journal.write_bytes(first[:40] + second + b"\n")
    again, report = Checkpoint.open(d, boot_id_path=boot)
    assert report.corrupt and report.lost_transactions == 0
    assert any("whole transaction after the damage recovered" in p for p in report.problems)
    assert list(again.state.claims) == ["b"]


def test_unparsable_snapshot(tmp_path: Path) -> None:
    boot = _boot(tmp_path)
    d = tmp_path / "plugin"
    d.mkdir()
    (d / "checkpoint.json").write_text("{not json")
    cp, report = Checkpoint.open(d, boot_id_path=boot)
    assert any("not valid JSON" in p for p in report.problems)
    assert cp.state.claims == {}


def test_ledger_dra_and_device_plugin_exclude_each_other(tmp_path: Path) -> None:
    boot = _boot(tmp_path)
    cp = _open(tmp_path / "p", boot)
    ledger = Ledger(cp)
    ledger.hold(Ledger.dra_holder("c1"), ["GPU-a"])
    ledger.hold(Ledger.dra_holder("c2"), ["GPU-a"])  # e.g. two MIG devices of one GPU
    assert ledger.holders_of("GPU-a") == ("dra:c1", "dra:c2")
    with pytest.raises(LedgerConflict) as info:
        ledger.hold(Ledger.device_plugin_holder("alloc1"), ["GPU-b", "GPU-a"])
    assert "GPU-a is held by dra:c1 and dra:c2" in str(info.value)
    assert ledger.holder_of("GPU-b") is None  # all or nothing
    ledger.hold(Ledger.device_plugin_holder("alloc1"), ["GPU-b"])
    with pytest.raises(LedgerConflict):
        ledger.hold(Ledger.dra_holder("c3"), ["GPU-b"])
    ledger.hold(Ledger.device_plugin_holder("alloc1"), ["GPU-b"])  # idempotent for the same holder
    ledger.release(Ledger.dra_holder("c1"))
    assert ledger.holders_of("GPU-a") == ("dra:c2",)
    reopened = Ledger(_open(tmp_path / "p", boot))
    assert reopened.held() == {"GPU-a": ("dra:c2",), "GPU-b": ("deviceplugin:alloc1",)}


def test_new_boot_drops_device_plugin_holds_only(tmp_path: Path) -> None:
    cp = _open(tmp_path / "p", _boot(tmp_path, "boot-1"))
    ledger = Ledger(cp)
    ledger.hold(Ledger.dra_holder("c1"), ["GPU-a"])
    ledger.hold(Ledger.device_plugin_holder("x"), ["GPU-b"])
    with cp.locked():
        cp.commit([cp.put_claim_op(_record("c1"))])
    cp.close()
    after, report = Checkpoint.open(tmp_path / "p", boot_id_path=_boot(tmp_path, "boot-2"))
    assert report.new_boot
    assert Ledger(after).held() == {"GPU-a": ("dra:c1",)}
    assert after.state.boot_id == "boot-2" and list(after.state.claims) == ["c1"]
    assert not Checkpoint.open(tmp_path / "p", boot_id_path=_boot(tmp_path, "boot-2"))[1].new_boot


def test_two_instances_see_each_others_commits(tmp_path: Path) -> None:
    boot = _boot(tmp_path)
    first = _open(tmp_path / "p", boot, compact_every=2)
    second = _open(tmp_path / "p", boot, compact_every=2)
    with first.locked():
        first.commit([first.put_claim_op(_record("a"))])
    with second.locked():
        assert list(second.state.claims) == ["a"]
        second.commit([second.put_claim_op(_record("b"))])  # triggers a compaction
    with first.locked():
        assert sorted(first.state.claims) == ["a", "b"]
        first.commit([first.delete_claim_op("a")])
    with second.locked():
        assert list(second.state.claims) == ["b"]


def test_files_are_private(tmp_path: Path) -> None:
    cp = _open(tmp_path / "p", _boot(tmp_path))
    with cp.locked():
        cp.commit([cp.put_claim_op(_record("a"))])
        cp.compact()
    assert (tmp_path / "p").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "p" / "checkpoint.json").stat().st_mode & 0o777 == 0o600


def test_atomic_write_replaces_whole_file_and_leaves_no_temp_on_failure(tmp_path: Path) -> None:
    from gpudra.atomicfile import atomic_write

    target = tmp_path / "state.json"
    atomic_write(target, b"old")
    atomic_write(target, b"new", mode=0o644, durable=False)
    assert target.read_bytes() == b"new"
    # A failed write (here: the data is not bytes) keeps the old content and no temp file.
    with pytest.raises(TypeError):
        atomic_write(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_checkpointed_claims_no_path_may_be_built_from_are_dropped_on_load(tmp_path: Path) -> None:
    from driver.checkpoint import canonical_json, sha256_hex

    boot = _boot(tmp_path)
    d = tmp_path / "plugin"
    good = "5f0c7a3e-2b1d-4c8e-9a6f-0123456789ab"
    cp = _open(d, boot)
    with cp.locked():
        cp.commit([cp.put_claim_op(_record(good))])
        cp.compact()
        # Writing such a record is refused too.
        with pytest.raises(ValueError, match="not a Kubernetes UID"):
            cp.commit([cp.put_claim_op(_record("../../etc"))])
    cp.close()
    # Someone edits the snapshot (checksum recomputed): a traversing uid, a uid that differs from its key, MPS dirs
    # that step out of the state dir.
    doc = json.loads((d / "checkpoint.json").read_text())
    claims = doc["data"]["claims"]
    claims["../../root-only"] = {**claims[good], "uid": "../../root-only"}
    claims["a1"] = {**claims[good], "uid": "b2"}
    claims["c3"] = {**claims[good], "uid": "c3", "mps_daemons": [
        {"pipe_dir": "/state/mps/../../../root-only", "log_dir": "/state/mps/c3/log", "device_names": ["gpu-a"]}]}
    doc["checksum"] = f"sha256:{sha256_hex(canonical_json(doc['data']))}"
    (d / "checkpoint.json").write_text(json.dumps(doc))
    again, report = Checkpoint.open(d, boot_id_path=boot)
    assert sorted(again.state.claims) == [good]
    assert report.corrupt and len(report.problems) == 3
    assert any("'../../root-only'" in p and "not a Kubernetes UID" in p for p in report.problems)
    assert any("MPS pipe_dir" in p for p in report.problems)


def test_nvidias_checkpoint_is_moved_aside_not_treated_as_corrupt(tmp_path: Path) -> None:
    """Switching over from NVIDIA's driver: its checkpoint.json (same name, same plugin dir) is recognised,
    kept aside and its claims named; ours starts empty and is not reported corrupt."""
    d = tmp_path / "p"
    d.mkdir()
    nvidia = {"checksum": 2893617361, "v2": {"preparedClaims": {
        "7c1f9a4e-0000-4000-8000-000000000001": {"checkpointState": "PrepareCompleted", "preparedDevices": []},
        "7c1f9a4e-0000-4000-8000-000000000002": {"checkpointState": "PrepareStarted"}}}}
    (d / "checkpoint.json").write_text(json.dumps(nvidia))
    cp, report = Checkpoint.open(d, boot_id_path=_boot(tmp_path))
    try:
        assert report.problems == [] and not report.corrupt
        assert cp.state.claims == {}
        note = next(n for n in report.notes if "NVIDIA's DRA driver checkpoint" in n)
        assert "7c1f9a4e-0000-4000-8000-000000000001, 7c1f9a4e-0000-4000-8000-000000000002" in note
        assert json.loads((d / "checkpoint.json.nvidia-1").read_text()) == nvidia
    finally:
        cp.close()
