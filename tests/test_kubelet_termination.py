"""Termination messages as the kubelet keeps them: what a container wrote to its terminationMessagePath (at
most 4096 bytes), or with FallbackToLogsOnError the end of a failed container's log; the file is read as
untrusted (a link or a FIFO the container left there is not followed)."""

from __future__ import annotations

import os
from pathlib import Path

from sim.kubelet import termination

UID = "8f0f2f6e-3b1e-4c55-9a43-1f2d2c0b7a10"


def test_a_run_gets_its_own_empty_writable_file(tmp_path: Path) -> None:
    path = termination.message_file(tmp_path, UID, "main", "run-0")
    assert path == tmp_path / "pods" / UID / "containers" / "main" / "run-0"
    assert path.read_bytes() == b"" and path.stat().st_mode & 0o777 == 0o666
    assert termination.mount_path({}) == "/dev/termination-log"
    assert termination.mount_path({"terminationMessagePath": "/tmp/why"}) == "/tmp/why"


def test_the_message_is_what_the_container_wrote_at_most_4096_bytes(tmp_path: Path) -> None:
    path = termination.message_file(tmp_path, UID, "main", "run-0")
    path.write_text("bye now\n")
    assert termination.read_message(path, {}, 1, None) == "bye now\n"
    path.write_bytes(b"x" * 5000)
    assert termination.read_message(path, {}, 0, None) == "x" * 4096


def test_links_and_fifos_left_in_its_place_are_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("host secret")
    link = tmp_path / "link"
    link.symlink_to(secret)
    assert termination.read_message(link, {}, 1, None) == ""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert termination.read_message(fifo, {}, 1, None) == ""  # returns at once: no writer is waited for


def test_fallback_to_logs_on_error_takes_the_end_of_a_failed_containers_log(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    log.write_text("".join(f"2026-12-02T10:00:{i % 60:02d}.000000000Z stdout F line {i}\n" for i in range(100)))
    empty = termination.message_file(tmp_path, UID, "main", "run-0")
    fallback = {"terminationMessagePolicy": "FallbackToLogsOnError"}
    tail = termination.read_message(empty, fallback, 2, log)
    assert tail.splitlines() == [f"line {i}" for i in range(20, 100)]  # the last 80 lines
    assert termination.read_message(empty, fallback, 0, log) == ""  # only on failure
    assert termination.read_message(empty, {}, 2, log) == ""  # only with the policy
    empty.write_text("own words")
    assert termination.read_message(empty, fallback, 2, log) == "own words"  # a written message wins
    log.write_text("".join(f"2026-12-02T10:00:00.000000000Z stdout F {'y' * 100}\n" for _ in range(80)))
    assert len(termination.read_message(tmp_path / "none", fallback, 1, log).encode()) <= 2048
