"""The DT_SONAME of a shared library, read from its ELF dynamic section (64- and 32-bit, either byte order).

The name a program asks the loader for (`libcuda.so.1`) is the library's soname, not its file name
(`libcuda.so.580.95.05`): a container must hold a file or link of that name where its loader searches.
`soname(path)` returns it, or None for a file that is not an ELF shared object or has no soname.
"""

from __future__ import annotations

import struct
from pathlib import Path

_PT_DYNAMIC = 2
_PT_LOAD = 1
_DT_NULL = 0
_DT_STRTAB = 5
_DT_SONAME = 14
_MAX_BYTES = 64 * 1024 * 1024  # a driver library is tens of MiB at most


def soname(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_BYTES)
    except OSError:
        return None
    return soname_of(data)


def soname_of(data: bytes) -> str | None:
    """The soname in an ELF image (pure); None when there is none or the image is malformed."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
        return None
    wide = data[4] == 2
    order = "<" if data[5] == 1 else ">"
    try:
        if wide:
            phoff, = struct.unpack_from(order + "Q", data, 0x20)
            phentsize, phnum = struct.unpack_from(order + "HH", data, 0x36)
        else:
            phoff, = struct.unpack_from(order + "I", data, 0x1C)
            phentsize, phnum = struct.unpack_from(order + "HH", data, 0x2A)
        loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
        dynamic: tuple[int, int] | None = None
        for i in range(phnum):
            at = phoff + i * phentsize
            if wide:
                p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(order + "IIQQQQ", data, at)
            else:
                p_type, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(order + "IIIII", data, at)
            if p_type == _PT_LOAD:
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == _PT_DYNAMIC:
                dynamic = (p_offset, p_filesz)
        if dynamic is None:
            return None
        entry = struct.Struct(order + ("qQ" if wide else "iI"))
        strtab_addr = soname_offset = None
        for at in range(dynamic[0], dynamic[0] + dynamic[1], entry.size):
            tag, value = entry.unpack_from(data, at)
            if tag == _DT_NULL:
                break
            if tag == _DT_STRTAB:
                strtab_addr = value
            elif tag == _DT_SONAME:
                soname_offset = value
        if strtab_addr is None or soname_offset is None:
            return None
        # DT_STRTAB is an address: map it to a file offset through the load segment holding it.
        for vaddr, offset, filesz in loads:
            if vaddr <= strtab_addr < vaddr + filesz:
                start = offset + (strtab_addr - vaddr) + soname_offset
                end = data.index(b"\0", start)
                return data[start:end].decode() or None
    except (struct.error, ValueError, UnicodeDecodeError):
        return None
    return None
