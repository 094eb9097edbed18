"""CDI specs we write follow the CDI rules (reference section 5) and carry the right edits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from driver import cdi


def _spec(uid: str = "0f1e2d3c-aaaa-bbbb-cccc-000000000001") -> dict:
    return cdi.claim_spec(
        uid,
        [
            cdi.DeviceEdits(device_name="gpu-abc", uuid="GPU-1", gpu_minor=1),
            cdi.DeviceEdits(device_name="gpu-def-mig-1g-10gb-3", uuid="MIG-2", gpu_minor=0, mig=(2, 0)),
        ],
    )


def test_spec_is_valid_and_uses_lowest_version() -> None:
    spec = _spec()
    assert cdi.validate_spec(spec) == []
    assert spec["kind"] == "k8s.gpu.nvidia.com/claim"
    # The claim UID starts with a digit: device names with a leading digit need 0.5.0.
    assert spec["cdiVersion"] == "0.5.0"
    letter = _spec("abcdef00-aaaa-bbbb-cccc-000000000001")
    assert letter["cdiVersion"] == "0.3.0" and cdi.validate_spec(letter) == []


def test_device_edits() -> None:
    spec = _spec()
    full, mig = spec["devices"]
    assert full["name"] == "0f1e2d3c-aaaa-bbbb-cccc-000000000001-gpu-abc"
    # void: the NVIDIA runtime must not inject GPUs by this variable on top of CDI.
    assert full["containerEdits"]["env"] == mig["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    # No numbers known: GPU and control nodes by path; nvidia-uvm is not loaded, so its nodes are left out
    # (named by path they would fail every container on a runtime that stats them).
    assert [n["path"] for n in full["containerEdits"]["deviceNodes"]] == ["/dev/nvidia1", "/dev/nvidiactl"]
    # GPU minor 0, GI 2, CI 0: nvidia-cap21 and nvidia-cap22 as in the driver's mig-minors table.
    assert [n["path"] for n in mig["containerEdits"]["deviceNodes"]][-2:] == [
        "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22",
    ]


def test_caps_major_without_capability_files_types_the_fixed_table() -> None:
    numbers = cdi.DeviceNumbers({"nvidia-frontend": 195, "nvidia-caps": 238})
    nodes = numbers.mig_nodes(0, 2, 0)
    assert nodes == [
        {"path": "/dev/nvidia-caps/nvidia-cap21", "type": "c", "major": 238, "minor": 21, "fileMode": 0o444},
        {"path": "/dev/nvidia-caps/nvidia-cap22", "type": "c", "major": 238, "minor": 22, "fileMode": 0o444},
    ]
    assert [n["path"] for n in numbers.control_nodes()] == ["/dev/nvidiactl"]


def test_mig_cap_minors_table() -> None:
    assert cdi.mig_cap_minors(0, 0, 0) == (3, 4)
    assert cdi.mig_cap_minors(0, 1, 0) == (12, 13)
    assert cdi.mig_cap_minors(0, 3, 0) == (30, 31)
    assert cdi.mig_cap_minors(1, 0, 0) == (138, 139)


def test_minimum_version_rules() -> None:
    base = {"kind": "a.com/b", "devices": [{"name": "x", "containerEdits": {"env": ["A=1"]}}]}
    assert cdi.minimum_version(base) == "0.3.0"
    assert cdi.minimum_version({**base, "kind": "a.com/b.c"}) == "0.6.0"
    with_type = {**base, "devices": [{"name": "x", "containerEdits": {"mounts": [{"hostPath": "/a", "containerPath": "/b", "type": "bind"}]}}]}
    assert cdi.minimum_version(with_type) == "0.4.0"
    host_path = {**base, "devices": [{"name": "x", "containerEdits": {"deviceNodes": [{"path": "/dev/x", "hostPath": "/dev/y"}]}}]}
    assert cdi.minimum_version(host_path) == "0.5.0"
    gids = {**base, "devices": [{"name": "x", "containerEdits": {"additionalGids": [5]}}]}
    assert cdi.minimum_version(gids) == "0.7.0"
    net = {**base, "devices": [{"name": "x", "containerEdits": {"netDevices": [{"hostInterfaceName": "a", "name": "b"}]}}]}
    assert cdi.minimum_version(net) == "1.1.0"


def test_validator_catches_rule_breaks() -> None:
    bad = {
        "cdiVersion": "0.3.0",
        "kind": "vendor/class",
        "devices": [
            {"name": "1x", "containerEdits": {"env": ["=x"]}},
            {"name": "y-", "containerEdits": {}},
            {"name": "z", "containerEdits": {"deviceNodes": [{"path": "dev"}]}, "extra": 1},
        ],
    }
    errors = cdi.validate_spec(bad)
    assert any("lower than 0.5.0" in e for e in errors)
    assert any("devices[0].containerEdits.env[0]" in e for e in errors)
    assert any("devices[1].name" in e for e in errors)
    assert any("devices[1].containerEdits: empty device edits" in e for e in errors)
    assert any("devices[2].extra: unknown field" in e for e in errors)
    assert any("devices[2].containerEdits.deviceNodes[0].path" in e for e in errors)
    assert cdi.validate_spec({"cdiVersion": "9.9.9", "kind": "v/c", "devices": []})[:2] == [
        "cdiVersion: '9.9.9' is not a known CDI version (0.3.0, 0.4.0, 0.5.0, 0.6.0, 0.7.0, 0.8.0, 1.0.0, 1.1.0)",
        "devices: at least one device is required",
    ]


def test_files_written_atomically_and_orphans_removed(tmp_path: Path) -> None:
    path = cdi.write_claim_spec(tmp_path, "u1", _spec("u1"))
    assert path.name == "k8s.gpu.nvidia.com-claim_u1.json"
    assert json.loads(path.read_text())["devices"][0]["name"] == "u1-gpu-abc"
    assert path.stat().st_mode & 0o777 == 0o644
    cdi.write_claim_spec(tmp_path, "u2", _spec("u2"))
    (tmp_path / ".k8s.gpu.nvidia.com-claim_u3.json.tmp-1-2").write_text("partial")
    (tmp_path / "nvidia.com-gpu.json").write_text("{}")  # someone else's spec stays
    assert cdi.remove_orphans(tmp_path, keep={"u2"}) == ["u1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k8s.gpu.nvidia.com-claim_u2.json", "nvidia.com-gpu.json"]
    assert cdi.remove_claim_spec(tmp_path, "u2") and not cdi.remove_claim_spec(tmp_path, "u2")
    assert cdi.qualified_id(cdi.cdi_device_name("u1", "gpu-abc")) == "k8s.gpu.nvidia.com/claim=u1-gpu-abc"


PROC_DEVICES = """Character devices:
  1 mem
195 nvidia-frontend
234 nvidia-uvm
237 nvidia-caps
509 nvidia-nvlink

Block devices:
  8 sd
237 blkext
"""


def _fake_proc(tmp_path: Path) -> Path:
    """A procfs with the driver's device majors and the capability files of MIG device GI 2 / CI 0 on GPU 0."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "devices").write_text(PROC_DEVICES)
    gi = proc / "driver/nvidia/capabilities/gpu0/mig/gi2"
    (gi / "ci0").mkdir(parents=True)
    (gi / "access").write_text("DeviceFileMinor: 21\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    (gi / "ci0" / "access").write_text("DeviceFileMinor: 22\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    return proc


def test_proc_devices_parsing_ignores_block_devices() -> None:
    majors = cdi.parse_proc_devices(PROC_DEVICES)
    assert majors["nvidia-caps"] == 237 and majors["nvidia-uvm"] == 234 and majors["nvidia-frontend"] == 195
    assert "blkext" not in majors


def test_mig_spec_carries_type_major_minor_from_the_driver(tmp_path: Path) -> None:
    numbers = cdi.DeviceNumbers.read(_fake_proc(tmp_path))
    spec = cdi.claim_spec(
        "abc", [cdi.DeviceEdits(device_name="gpu-0-mig-1g-10gb-2", uuid="MIG-2", gpu_minor=0, mig=(2, 0))], numbers=numbers,
    )
    assert cdi.validate_spec(spec) == []
    nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
    assert nodes == [
        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0},
        {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
        {"path": "/dev/nvidia-uvm", "type": "c", "major": 234, "minor": 0},
        {"path": "/dev/nvidia-uvm-tools", "type": "c", "major": 234, "minor": 1},
        {"path": "/dev/nvidia-caps/nvidia-cap21", "type": "c", "major": 237, "minor": 21, "fileMode": 292},
        {"path": "/dev/nvidia-caps/nvidia-cap22", "type": "c", "major": 237, "minor": 22, "fileMode": 292},
    ]


def test_minors_come_from_the_driver_not_the_table(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path)
    (proc / "driver/nvidia/capabilities/gpu0/mig/gi2/access").write_text("DeviceFileMinor: 400\n")
    nodes = cdi.DeviceNumbers.read(proc).mig_nodes(0, 2, 0)
    assert nodes[0]["path"] == "/dev/nvidia-caps/nvidia-cap400" and nodes[0]["minor"] == 400


def test_missing_capability_file_names_it(tmp_path: Path) -> None:
    numbers = cdi.DeviceNumbers.read(_fake_proc(tmp_path))
    with pytest.raises(cdi.CapabilityError, match="gpu0/mig/gi5/access"):
        numbers.mig_nodes(0, 5, 0)


def test_without_driver_numbers_nodes_are_paths_only(tmp_path: Path) -> None:
    numbers = cdi.DeviceNumbers.read(tmp_path / "no-proc")
    assert numbers.mig_nodes(0, 2, 0) == [{"path": "/dev/nvidia-caps/nvidia-cap21"}, {"path": "/dev/nvidia-caps/nvidia-cap22"}]
    assert numbers.gpu_nodes(3)[0] == {"path": "/dev/nvidia3"}
