"""An ELF64 shared object image that holds nothing but a dynamic section naming its soname.

The simulated driver install (sim.runtime.driverinstall) ships the driver's libraries as such images: the node
agent's driver-file discovery (driver.driverfiles) reads their DT_SONAME and puts them into CDI specs under both
names exactly as it does a real driver's, and the IMEX stand-in looks for `libnvidia-ml.so.1` where a loader
would. Nothing in the simulator maps or runs them (a real loader would refuse them: they have no code).
"""

from __future__ import annotations

import struct

_EHDR, _PHDR, _DYN = 64, 56, 16
_ET_DYN, _PT_LOAD, _PT_DYNAMIC, _DT_STRTAB, _DT_SONAME = 3, 1, 2, 5, 14
_MACHINE_X86_64 = 62


def soname_image(soname: str) -> bytes:
    """The image (little-endian ELF64, one PT_LOAD over the whole file at address 0, one PT_DYNAMIC)."""
    strtab = b"\0" + soname.encode() + b"\0"
    dyn_at = _EHDR + 2 * _PHDR
    str_at = dyn_at + 3 * _DYN
    size = str_at + len(strtab)
    header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9) + struct.pack(
        "<HHIQQQIHHHHHH", _ET_DYN, _MACHINE_X86_64, 1, 0, _EHDR, 0, 0, _EHDR, _PHDR, 2, 0, 0, 0)
    load = struct.pack("<IIQQQQQQ", _PT_LOAD, 4, 0, 0, 0, size, size, 0x1000)
    dynamic = struct.pack("<IIQQQQQQ", _PT_DYNAMIC, 4, dyn_at, dyn_at, dyn_at, 3 * _DYN, 3 * _DYN, 8)
    entries = struct.pack("<qQqQqQ", _DT_STRTAB, str_at, _DT_SONAME, 1, 0, 0)
    return header + load + dynamic + entries + strtab
