"""The pure part of rebuilding after a damaged checkpoint (driver.recovery)."""

from __future__ import annotations

from pathlib import Path

from driver import cdi
from driver.checkpoint import ClaimPhase, ClaimRecord, PreparedDevice
from driver.recovery import mps_claim_uids, orphans, spec_gpu_minors, stray_dra_holders, to_promote


def _record(uid: str, phase: ClaimPhase = ClaimPhase.PREPARE_COMPLETED) -> ClaimRecord:
    device = PreparedDevice(request_names=["gpu"], pool_name="n", device_name="gpu-a", uuid="GPU-a", gpu_uuid="GPU-a")
    return ClaimRecord(uid=uid, namespace="ns", name=uid, phase=phase, devices=[device])


def test_orphans_are_specs_and_mps_dirs_without_a_record(tmp_path: Path) -> None:
    (tmp_path / "mps" / "uid-m" / "pipe").mkdir(parents=True)
    (tmp_path / "mps" / "shared" / "GPU-a").mkdir(parents=True)  # a GPU's shared daemon, not a claim
    (tmp_path / "mps" / "stray-file").write_text("")
    assert mps_claim_uids(tmp_path / "mps") == {"uid-m"}
    assert mps_claim_uids(tmp_path / "none") == set()
    records = {"uid-a": _record("uid-a")}
    assert orphans(records, {"uid-a", "uid-s"}, {"uid-m", "uid-a"}) == ["uid-m", "uid-s"]


def test_started_records_with_a_spec_are_promoted() -> None:
    records = {"a": _record("a", ClaimPhase.PREPARE_STARTED), "b": _record("b", ClaimPhase.PREPARE_STARTED),
               "c": _record("c")}
    assert [r.uid for r in to_promote(records, {"a", "c"})] == ["a"]


def test_gpu_minors_of_a_spec() -> None:
    spec = cdi.claim_spec("u", [cdi.DeviceEdits("d0", "GPU-a", 3), cdi.DeviceEdits("d1", "MIG-b", 5, mig=(1, 0))])
    assert spec_gpu_minors(spec) == {3, 5}


def test_stray_dra_holds_are_those_of_unknown_claims() -> None:
    ledger = {"GPU-a": ["deviceplugin:x", "dra:a", "dra:gone"], "GPU-b": ["dra:a"]}
    assert stray_dra_holders(ledger, {"a"}) == {"GPU-a": ["dra:gone"]}
    assert stray_dra_holders(ledger, {"a", "gone"}) == {}
