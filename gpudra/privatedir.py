"""Private directories under shared places (/tmp, $XDG_RUNTIME_DIR): created 0700, and an existing one is used only
when it is a real directory (not a symlink) owned by this user that no one else can write into. A predictable name
under a world-writable directory can be made in advance by anyone; this check is what makes reusing it safe."""

from __future__ import annotations

import os
import stat
from pathlib import Path


class PrivateDirError(OSError):
    """A directory this process would keep private state in is not private; the message says why."""


def ensure_private_dir(path: Path) -> Path:
    """Create `path` (mode 0700; its parent must exist) or check an existing one; returns `path`."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise PrivateDirError(f"{path}: cannot create the private directory: {exc.strerror}") from exc
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise PrivateDirError(f"{path}: cannot inspect the private directory: {exc.strerror}") from exc
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise PrivateDirError(f"{path}: refusing to use it as a private directory: it is not a directory "
                              "(a symlink or another file); remove it or choose another place")
    if st.st_uid != os.geteuid():
        raise PrivateDirError(f"{path}: refusing to use it as a private directory: owned by uid {st.st_uid}, "
                              f"not by this user (uid {os.geteuid()}); remove it or choose another place")
    if st.st_mode & 0o022:
        raise PrivateDirError(f"{path}: refusing to use it as a private directory: mode "
                              f"{stat.S_IMODE(st.st_mode):04o} lets others write into it (expected 0700)")
    return path
