"""Volumes as the kubelet prepares them: a volumeMount's subPath resolved inside the volume, never a way out of it;
the projected ServiceAccount volume with the cluster CA when the API server serves TLS."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.kubelet.volumes import Mount, VolumeError, container_mounts, write_token


def _mounts(volume: Path, sub: str) -> list[Mount]:
    container = {"name": "main", "volumeMounts": [{"name": "data", "mountPath": "/data", "subPath": sub}]}
    return container_mounts(container, {"data": volume}, set())


def test_a_subpath_link_out_of_the_volume_is_refused(tmp_path: Path) -> None:
    volume, host = tmp_path / "volume", tmp_path / "host-secret"
    volume.mkdir()
    host.mkdir()
    (volume / "escape").symlink_to(host)  # what a tenant's container writes into its emptyDir
    (volume / "dir").mkdir()
    (volume / "dir" / "up").symlink_to("../../host-secret")
    (volume / "dangling").symlink_to(tmp_path / "made-on-the-host")
    for sub, message in (("escape", 'failed to prepare subPath for volumeMount "data" of container "main"'),
                         ("dir/up", 'failed to prepare subPath for volumeMount "data" of container "main"'),
                         ("escape/deeper", 'failed to create subPath directory for volumeMount "data" of container '
                                           '"main"'),
                         ("dangling", 'failed to create subPath directory for volumeMount "data" of container '
                                      '"main"')):
        with pytest.raises(VolumeError) as caught:
            _mounts(volume, sub)
        assert str(caught.value) == message and str(tmp_path) not in str(caught.value)
    assert not (host / "deeper").exists() and not (tmp_path / "made-on-the-host").exists()


def test_a_subpath_inside_the_volume_is_mounted_from_there(tmp_path: Path) -> None:
    volume = tmp_path / "volume"
    (volume / "real").mkdir(parents=True)
    (volume / "alias").symlink_to("real")  # a link that stays inside is resolved, as the kubelet's EvalSymlinks
    assert _mounts(volume, "alias")[0].host == (volume / "real").resolve()
    made = _mounts(volume, "new/dir")[0]  # a missing subPath is created inside the volume
    assert made.host == (volume / "new" / "dir").resolve() and made.host.is_dir()


def test_the_token_volume_carries_the_cluster_ca_over_tls(tmp_path: Path) -> None:
    pod = {"metadata": {"uid": "1234-abcd", "namespace": "team-a"}}
    plain = write_token(tmp_path, pod, "tok")
    assert sorted(p.name for p in plain.iterdir()) == ["namespace", "token"]
    tls = write_token(tmp_path, pod, "tok", "-----BEGIN CERTIFICATE-----\n")
    assert (tls / "ca.crt").read_text() == "-----BEGIN CERTIFICATE-----\n" and (tls / "namespace").read_text() == "team-a"
