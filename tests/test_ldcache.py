"""The driver root's ld.so.cache read as glibc writes it: glibc's own ldconfig writes the caches (new, old and
compat formats) of a small root, and the parser must agree with `ldconfig -p`; damaged caches are refused with
what is wrong."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from driver import ldcache

LDCONFIG = shutil.which("ldconfig") or shutil.which("ldconfig", path="/sbin:/usr/sbin")


def _root(tmp_path: Path) -> Path:
    """A root whose only library dir is a /etc/ld.so.conf.d entry, with this machine's libc copied in it."""
    root = tmp_path / "root"
    lib = root / "opt" / "vendor" / "lib"
    lib.mkdir(parents=True)
    (root / "etc" / "ld.so.conf.d").mkdir(parents=True)
    (root / "var" / "cache" / "ldconfig").mkdir(parents=True)
    (root / "etc" / "ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / "etc" / "ld.so.conf.d" / "vendor.conf").write_text("/opt/vendor/lib\n")
    libc = next(p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/lib64/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6")
                if os.path.exists(p))
    shutil.copy2(libc, lib / "libvendor.so.1.2.3")
    return root


@pytest.mark.process
@pytest.mark.skipif(LDCONFIG is None or os.geteuid() != 0, reason="needs glibc's ldconfig and root (ldconfig -r chroots)")
@pytest.mark.parametrize("fmt", ["new", "old", "compat"])
def test_caches_ldconfig_writes_are_read_as_ldconfig_prints_them(tmp_path: Path, fmt: str) -> None:
    root = _root(tmp_path)
    assert LDCONFIG is not None
    subprocess.run([LDCONFIG, "-c", fmt, "-r", str(root)], check=True, capture_output=True, timeout=60)
    data = (root / "etc" / "ld.so.cache").read_bytes()
    assert data.startswith(ldcache.NEW_MAGIC if fmt == "new" else ldcache.OLD_MAGIC)
    entries, warning = ldcache.read(root)
    assert warning == ""
    # libc.so.6 is the soname of the file copied in: ldconfig made the link and cached it.
    assert [(e.soname, e.path) for e in entries] == [("libc.so.6", "/opt/vendor/lib/libc.so.6")]
    printed = subprocess.run([LDCONFIG, "-p", "-C", str(root / "etc" / "ld.so.cache")], capture_output=True, text=True,
                             timeout=60).stdout
    assert "libc.so.6 (libc6," in printed and "=> /opt/vendor/lib/libc.so.6" in printed


def _new_cache(entries: list[tuple[int, str, str]]) -> bytes:
    """A new-format cache as glibc lays it out (header, entries, strings; offsets from the file's start)."""
    strings = b""
    table = b""
    base = ldcache.NEW_HEADER + len(entries) * ldcache.NEW_ENTRY
    for flags, key, value in entries:
        k = base + len(strings)
        strings += key.encode() + b"\0"
        v = base + len(strings)
        strings += value.encode() + b"\0"
        table += struct.pack("<iIIIQ", flags, k, v, 0, 0)
    header = ldcache.NEW_MAGIC + ldcache.NEW_VERSION + struct.pack("<IIB3xI12x", len(entries), len(strings), 2, 0)
    assert len(header) == ldcache.NEW_HEADER
    return header + table + strings


def test_only_this_machines_64_bit_libraries_count() -> None:
    data = _new_cache([(0x0303, "libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
                       (0x0003, "libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1"),
                       (0x0A03, "libcuda.so.1", "/usr/lib/aarch64-linux-gnu/libcuda.so.1")])
    entries = ldcache.parse(data)
    assert [e.path for e in entries if e.is_abi("x86_64")] == ["/usr/lib/x86_64-linux-gnu/libcuda.so.1"]
    assert [e.path for e in entries if e.is_abi("aarch64")] == ["/usr/lib/aarch64-linux-gnu/libcuda.so.1"]


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda d: b"not a cache", "unknown format (starts with b'not a cache'); accepted: "
                                          "glibc-ld.so.cache1.1, ld.so-1.7.0"),
        (lambda d: d[:30], "the new-format header at offset 0 is cut short (30 of 48 bytes)"),
        (lambda d: d[:60], "1 new-format entries do not fit in the file (60 bytes)"),
        (lambda d: d[:17] + b"9.9" + d[20:], "new-format version b'9.9'; accepted: 1.1"),
        (lambda d: d[:52] + struct.pack("<I", 10**6) + d[56:], "entry 0: string offset 1000000 is outside the file"),
        (lambda d: d[:-1] + b"x", "entry 0: string at offset"),
        (lambda d: ldcache.OLD_MAGIC + b"\0" + struct.pack("<I", 5), "5 old-format entries do not fit in the file"),
    ],
)
def test_a_damaged_cache_says_what_is_wrong(damage: object, expected: str) -> None:
    good = _new_cache([(0x0303, "libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1")])
    assert callable(damage)
    with pytest.raises(ldcache.LdCacheError) as exc:
        ldcache.parse(damage(good))
    assert expected in str(exc.value)


def test_read_falls_back_with_a_warning_naming_the_file(tmp_path: Path) -> None:
    assert ldcache.read(tmp_path) == ([], "")  # no cache (GKE's root): nothing to say
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "ld.so.cache").write_bytes(b"garbage")
    entries, warning = ldcache.read(tmp_path)
    assert entries == []
    assert warning.startswith(f"{tmp_path}/etc/ld.so.cache: not a dynamic-linker cache glibc wrote: unknown format")
    assert warning.endswith("looking for the driver's libraries in the standard directories")
