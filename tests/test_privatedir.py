"""Private state and link directories under shared places: made 0700, an existing one used only when it is ours."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpudra.privatedir import PrivateDirError, ensure_private_dir


def test_private_dir_is_created_0700_and_reused_when_ours(tmp_path: Path) -> None:
    d = ensure_private_dir(tmp_path / "state")
    assert (os.stat(d).st_mode & 0o777) == 0o700
    assert ensure_private_dir(d) == d


def test_symlink_other_owner_and_writable_dirs_are_refused(tmp_path: Path) -> None:
    victim = tmp_path / "root-only"
    victim.mkdir(mode=0o700)
    (tmp_path / "planted").symlink_to(victim)
    with pytest.raises(PrivateDirError, match="not a directory"):
        ensure_private_dir(tmp_path / "planted")
    (tmp_path / "file").write_text("x")
    with pytest.raises(PrivateDirError, match="not a directory"):
        ensure_private_dir(tmp_path / "file")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(PrivateDirError, match="lets others write"):
        ensure_private_dir(shared)
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(PrivateDirError, match="owned by uid 65534"):
            ensure_private_dir(theirs)


def test_simulated_agent_refuses_a_state_dir_someone_else_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse
    import tempfile

    from driver.commands.plugin import node_dirs

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    planted = tmp_path / f"gpu-dra-sim-{os.getuid()}"
    planted.mkdir()
    planted.chmod(0o777)  # made in advance by another user of /tmp
    args = argparse.Namespace(nvml="sim:dgx-a100", node="n1", kubelet_dir=None, cdi_dir=None)
    with pytest.raises(PrivateDirError, match="lets others write"):
        node_dirs(args)
    planted.chmod(0o700)
    kubelet, _, _ = node_dirs(args)
    assert kubelet == planted / "n1" / "kubelet" and (os.stat(planted / "n1").st_mode & 0o777) == 0o700
