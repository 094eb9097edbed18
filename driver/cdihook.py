"""The agent's own CDI hook: the container's loader cache rebuilt to list the driver's libraries.

CUDA frameworks that JIT-compile kernels (Triton, hence torch.compile and vLLM) find libcuda with `ldconfig -p`
and link with `-lcuda`: the libraries being on the loader's built-in search path (driver.driverfiles mounts them
there) is not enough, the container's `/etc/ld.so.cache` must name them. NVIDIA's toolkit runs its
`nvidia-cdi-hook update-ldcache` for that, a binary that is not on a node with only a driver (nor on GKE). The
agent installs this hook instead, a POSIX shell script, onto the host (`install`), and every claim spec carries it
as a `createContainer` hook (`hook`).

What the script does, run by runc (or crun) on the host with the OCI state on stdin, in the container's mount
namespace before pivot_root:
- the container's root: `bundle` from the state, `root.path` from the bundle's config.json (relative to the
  bundle when not absolute); a root of `/` or one that is not a directory is refused;
- the host's glibc `ldconfig` (`ldconfig.real` first, Ubuntu's wrapper second) is run as
  `ldconfig -X -r ROOT DIR...`: ldconfig chroots into the root before reading anything, so no link in the image
  leads it to the host, and nothing from the image is executed (NVIDIA's hook runs the host's ldconfig for the
  same reason); `-X` leaves the image's links alone (the sonames are mounted as files); the DIRs are the
  container library directories the driver's files are mounted into, scanned whatever the image's ld.so.conf;
- a failed or impossible update (no ldconfig on the host, an image without /etc) is reported on stderr and the
  container still starts: its libraries are found on the loader's built-in path all the same, only `ldconfig -p`
  does not list them. Usage errors (a bad argument, no bundle on stdin) fail the hook.

`install` writes the script atomically, mode 0755 in a 0755 directory no one else can write to (a hook runs as
root), and rewrites it only when it differs; the hook's command line is kept stable across releases because
specs written by an older agent keep naming the same path.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

from gpudra.atomicfile import atomic_write

HOOK_FILE = "gpu-dra-cdi-hook"
UPDATE_LDCACHE = "update-ldcache"
# runc gives a hook only the env its spec entry names: the script sets PATH itself too.
HOOK_PATH_ENV = "PATH=/usr/sbin:/usr/bin:/sbin:/bin"

SCRIPT = r"""#!/bin/sh
# gpu-dra CDI hook, installed by the gpu-dra node agent (driver/cdihook.py); rewritten at every agent start.
# As a CDI createContainer hook: gpu-dra-cdi-hook update-ldcache [--folder DIR]...
# Reads the OCI state on stdin, finds the container's root and rebuilds its /etc/ld.so.cache with the host's
# ldconfig run chrooted into that root (-r), scanning the given container directories too.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
me=gpu-dra-cdi-hook
warn() { printf '%s: %s\n' "$me" "$*" >&2; }
usage() { warn "$*; usage: $me update-ldcache [--folder /container/dir]..."; exit 2; }

[ "${1-}" = update-ldcache ] || usage "unknown command '${1-}'"
shift
folders=
while [ $# -gt 0 ]; do
  case $1 in
    --folder)
      [ $# -ge 2 ] || usage "--folder needs a directory"
      case $2 in
        /*) folders="$folders $2" ;;
        *) usage "--folder '$2': expected an absolute path inside the container" ;;
      esac
      shift 2 ;;
    *) usage "unknown argument '$1'" ;;
  esac
done
case $folders in *[!a-zA-Z0-9_./\ -]*) usage "--folder: only letters, digits and _ . / - are accepted" ;; esac

state=$(tr -d '\n\r')
bundle=$(printf '%s' "$state" | sed -n 's/.*"bundle"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p')
case $bundle in
  /*) ;;
  *) warn "the OCI state on stdin names no absolute bundle path (is this run as a CDI hook?)"; exit 1 ;;
esac
config=$bundle/config.json
[ -f "$config" ] || { warn "$config: no such file"; exit 1; }
# The top-level "root" object has no nested object: its body is everything up to the first "}".
body=$(tr -d '\n\r' < "$config" | sed -n 's/.*"root"[[:space:]]*:[[:space:]]*{\([^}]*\)}.*/\1/p')
root=$(printf '%s' "$body" | sed -n 's/.*"path"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p')
case $root in
  "") warn "$config: no root.path"; exit 1 ;;
  /*) ;;
  *) root=$bundle/$root ;;
esac
if [ "$root" = / ] || [ ! -d "$root" ]; then
  warn "container root '$root' from $config: not a directory other than /"; exit 1
fi

ldconfig=
for candidate in /sbin/ldconfig.real /usr/sbin/ldconfig.real /sbin/ldconfig /usr/sbin/ldconfig /usr/bin/ldconfig /bin/ldconfig; do
  if [ -f "$candidate" ] && [ -x "$candidate" ]; then ldconfig=$candidate; break; fi
done
if [ -z "$ldconfig" ]; then
  warn "no ldconfig on the host (/sbin, /usr/sbin, /usr/bin, /bin): the container's ld.so.cache is not updated"
  exit 0
fi
if [ ! -d "$root/etc" ]; then
  warn "$root has no /etc: the container's ld.so.cache is not updated"
  exit 0
fi
# shellcheck disable=SC2086 # the folders are split on purpose; they hold no blanks (checked above)
if ! out=$("$ldconfig" -X -r "$root" $folders 2>&1); then
  warn "$ldconfig -X -r $root$folders failed: $out; the container's ld.so.cache is not updated"
fi
exit 0
"""


class HookInstallError(OSError):
    """The hook could not be installed; the message names the path and why."""


def _check_dir(directory: Path) -> None:
    st = os.lstat(directory)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise HookInstallError(f"{directory}: expected a directory for the CDI hook, found a symbolic link or a file")
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise HookInstallError(
            f"{directory}: owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}; a directory holding "
            f"a hook that runs as root must be this agent's (uid {os.geteuid()}) and writable by no one else")


def install(directory: Path) -> Path:
    """Write the hook script into `directory` (created 0755 with its parents) and return its path; the file is
    replaced (atomically) only when its content differs. Raises HookInstallError."""
    path = directory / HOOK_FILE
    try:
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        _check_dir(directory)
        wanted = SCRIPT.encode()
        try:
            current = path.read_bytes() if not path.is_symlink() else b""
        except FileNotFoundError:
            current = b""
        if current != wanted or stat.S_IMODE(os.lstat(path).st_mode) != 0o755:
            atomic_write(path, wanted, 0o755)
            os.chmod(path, 0o755)  # whatever the umask
    except HookInstallError:
        raise
    except OSError as exc:
        raise HookInstallError(f"{path}: cannot install the CDI hook: {exc}") from exc
    return path


def update_ldcache_args(folders: Sequence[str]) -> tuple[str, ...]:
    """The hook's argv (argv[0] included) for rebuilding the loader cache with `folders` scanned."""
    args: list[str] = [HOOK_FILE, UPDATE_LDCACHE]
    for folder in folders:
        args += ["--folder", folder]
    return tuple(args)
