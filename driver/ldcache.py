"""The driver root's dynamic-linker cache (`/etc/ld.so.cache`), read as glibc writes it.

Where a driver's libraries are is what the root's own loader knows: on Debian's packages they live in
/usr/lib/x86_64-linux-gnu/nvidia/current, named by an /etc/ld.so.conf.d entry and found through the cache that
`ldconfig` builds from it. NVIDIA's nvcdi reads that cache before falling back to the standard library
directories; so does the agent (driver.driverfiles, driver.driverroot).

Formats (glibc's dl-cache.h), little-endian:
- new, "glibc-ld.so.cache" + version "1.1": a 48-byte header (nlibs at 20, len_strings at 24), then nlibs
  entries of 24 bytes (flags, key, value, osversion as 32-bit, hwcap as 64-bit); key and value are offsets from
  the start of that header to NUL-terminated strings (the soname, the path);
- old, "ld.so-1.7.0": a 16-byte header (nlibs at 12), entries of 12 bytes (flags, key, value), offsets from the
  end of the entries. glibc 2.31 and older write the old format with the new one after it ("compat"), at the
  next 8-byte boundary; the new part is then read, as glibc's loader does.

`parse` is pure and raises `LdCacheError` saying what is wrong; `read` returns the entries of libraries for this
machine's 64-bit ABI, or an empty list and a warning naming the file (a missing cache is no warning: plenty of
driver roots, GKE's among them, have none).
"""

from __future__ import annotations

import platform
import struct
from dataclasses import dataclass
from pathlib import Path

CACHE_PATH = "/etc/ld.so.cache"
OLD_MAGIC = b"ld.so-1.7.0"
NEW_MAGIC = b"glibc-ld.so.cache"
NEW_VERSION = b"1.1"
OLD_HEADER = 16
OLD_ENTRY = 12
NEW_HEADER = 48
NEW_ENTRY = 24
NEW_ALIGN = 8

FLAG_TYPE_MASK = 0x00FF
FLAG_ELF_LIBC6 = 0x0003
FLAG_REQUIRED_MASK = 0xFF00
# The 64-bit ABI flag of the machines the driver supports (dl-cache.h's FLAG_X8664_LIB64, FLAG_AARCH64_LIB64).
ABI_FLAGS = {"x86_64": 0x0300, "amd64": 0x0300, "aarch64": 0x0A00, "arm64": 0x0A00}


class LdCacheError(ValueError):
    """The cache is not in a format glibc writes, or is cut short; the message says where."""


@dataclass(frozen=True)
class Entry:
    soname: str  # the key: what a program asks the loader for (libcuda.so.1)
    path: str  # where the loader finds it, a path inside the root (often the soname's link)
    flags: int

    def is_abi(self, machine: str | None = None) -> bool:
        """A library of this machine's 64-bit ABI (not a 32-bit one of a multilib install)."""
        abi = ABI_FLAGS.get((machine or platform.machine()).lower(), ABI_FLAGS["x86_64"])
        return self.flags & FLAG_TYPE_MASK == FLAG_ELF_LIBC6 and self.flags & FLAG_REQUIRED_MASK == abi


def _string(data: bytes, offset: int, what: str) -> str:
    if not 0 <= offset < len(data):
        raise LdCacheError(f"{what}: string offset {offset} is outside the file ({len(data)} bytes)")
    end = data.find(b"\0", offset)
    if end < 0:
        raise LdCacheError(f"{what}: string at offset {offset} is not NUL-terminated")
    return data[offset:end].decode("utf-8", errors="surrogateescape")


def _new(data: bytes, start: int) -> list[Entry]:
    if len(data) - start < NEW_HEADER:
        raise LdCacheError(f"the new-format header at offset {start} is cut short ({len(data) - start} of {NEW_HEADER} bytes)")
    version = data[start + len(NEW_MAGIC):start + len(NEW_MAGIC) + len(NEW_VERSION)]
    if version != NEW_VERSION:
        raise LdCacheError(f"new-format version {version!r}; accepted: {NEW_VERSION.decode()}")
    (nlibs,) = struct.unpack_from("<I", data, start + 20)
    if start + NEW_HEADER + nlibs * NEW_ENTRY > len(data):
        raise LdCacheError(f"{nlibs} new-format entries do not fit in the file ({len(data)} bytes)")
    strings = data[start:]
    out = []
    for i in range(nlibs):
        flags, key, value = struct.unpack_from("<iII", data, start + NEW_HEADER + i * NEW_ENTRY)
        out.append(Entry(_string(strings, key, f"entry {i}"), _string(strings, value, f"entry {i}"), flags))
    return out


def parse(data: bytes) -> list[Entry]:
    """The cache's entries in file order (the loader's order of preference)."""
    if data.startswith(NEW_MAGIC):
        return _new(data, 0)
    if not data.startswith(OLD_MAGIC):
        raise LdCacheError(f"unknown format (starts with {data[:17]!r}); accepted: {NEW_MAGIC.decode()}"
                           f"{NEW_VERSION.decode()}, {OLD_MAGIC.decode()}")
    if len(data) < OLD_HEADER:
        raise LdCacheError(f"the old-format header is cut short ({len(data)} of {OLD_HEADER} bytes)")
    (nlibs,) = struct.unpack_from("<I", data, 12)
    end = OLD_HEADER + nlibs * OLD_ENTRY
    if end > len(data):
        raise LdCacheError(f"{nlibs} old-format entries do not fit in the file ({len(data)} bytes)")
    new_start = (end + NEW_ALIGN - 1) & ~(NEW_ALIGN - 1)
    if data[new_start:new_start + len(NEW_MAGIC)] == NEW_MAGIC:
        return _new(data, new_start)  # the compat format: the new part says everything the old one does
    strings = data[end:]
    out = []
    for i in range(nlibs):
        flags, key, value = struct.unpack_from("<iII", data, OLD_HEADER + i * OLD_ENTRY)
        out.append(Entry(_string(strings, key, f"entry {i}"), _string(strings, value, f"entry {i}"), flags))
    return out


def read(root: Path, machine: str | None = None) -> tuple[list[Entry], str]:
    """The root's cache entries of this machine's 64-bit libraries, and a warning ("" when none)."""
    path = root / CACHE_PATH.lstrip("/")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], ""
    except OSError as exc:
        return [], f"{path}: cannot be read ({exc}); looking for the driver's libraries in the standard directories"
    try:
        entries = parse(data)
    except LdCacheError as exc:
        return [], (f"{path}: not a dynamic-linker cache glibc wrote: {exc}; looking for the driver's libraries in "
                    "the standard directories")
    return [e for e in entries if e.is_abi(machine) and e.path.startswith("/")], ""
