"""The container root filesystem every image name maps to: Debian's static busybox and its applets.

No image is pulled: `podman run --rootfs DIR` runs a directory. It holds /bin/busybox with a link per applet,
`bash` as a two-line script that runs busybox's shell (bash-isms beyond POSIX sh are not available), and the
empty directories a container expects. Containers mount it read-only, so one copy serves every container.
`add_program` makes it a glibc image too: a dynamically linked program with this machine's loader and libc.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

BUSYBOX_CANDIDATES: tuple[str, ...] = ("/bin/busybox", "/usr/bin/busybox")
# Where the runtime mounts its probe script and each container's probe output (see sim.runtime.podman).
PROBE_DIR = "/.gpu-dra-sim"
SEEN_DIR = "/.gpu-dra-sim-seen"
# The system library dirs of both image families exist, as in real images: the rootfs is read-only, so mount
# points for the driver's libraries (driver.driverfiles) must be there already.
_DIRS = ("bin", "sbin", "usr/bin", "usr/sbin", "usr/local/bin", "usr/lib64", "usr/lib/x86_64-linux-gnu",
         "usr/lib/aarch64-linux-gnu", "etc", "dev", "proc", "sys", "tmp", "run", "var/tmp", "root",
         "var/run/secrets/kubernetes.io/serviceaccount",
         PROBE_DIR.lstrip("/"), SEEN_DIR.lstrip("/"))


def find_busybox() -> Path | None:
    """A statically linked busybox (Debian's busybox-static), or None."""
    for candidate in BUSYBOX_CANDIDATES:
        path = Path(candidate)
        if path.is_file() and os.access(path, os.X_OK) and _is_static(path):
            return path
    return None


def _is_static(path: Path) -> bool:
    # A dynamically linked ELF has a PT_INTERP program header naming its loader; the loader path is in the file.
    with open(path, "rb") as f:
        head = f.read(4096)
    return head[:4] == b"\x7fELF" and b"/ld-linux" not in head and b"ld64.so" not in head


def build(root: Path, busybox: Path) -> Path:
    """Make (or refresh) the rootfs under `root`; returns it."""
    for d in _DIRS:
        (root / d).mkdir(parents=True, exist_ok=True)
    target = root / "bin" / "busybox"
    if not target.exists():
        shutil.copy2(busybox, target)
    applets = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        link = root / "bin" / applet
        if applet != "busybox" and not link.exists() and not link.is_symlink():
            link.symlink_to("busybox")
    bash = root / "bin" / "bash"
    if not bash.exists():
        bash.write_text('#!/bin/sh\nexec /bin/sh "$@"\n')
        bash.chmod(0o755)
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")
    (root / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
    return root


def add_program(root: Path, program: Path, dest: str) -> Path:
    """Copy a dynamically linked program into the rootfs at `dest` with the loader and libraries it needs from
    this machine (glibc), at their own paths, so the container runs it with the image's own libc: a glibc
    image, not only busybox. Returns the program's path in the rootfs."""
    target = root / dest.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(program, target)
    listed = subprocess.run(["ldd", str(program)], capture_output=True, text=True, check=True).stdout
    for line in listed.splitlines():
        # "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
        words = line.split()
        path = words[2] if "=>" in words and len(words) > 2 else words[0] if words and words[0].startswith("/") else ""
        if not path.startswith("/"):
            continue
        copy = root / path.lstrip("/")
        if not copy.exists():
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.realpath(path), copy)
    return target
