"""A private mount namespace in which podman sees one simulated node's CDI dir and NVIDIA device nodes.

podman 4.3 reads CDI specs only from /etc/cdi and /var/run/cdi, and a device node a spec names must exist on
the host. Neither may be changed on the host (other processes may own them), so a holder process is started
in its own mount namespace (`unshare --mount --propagation private`, nothing propagates back) where:

- /dev is an overlay of the host's /dev with a tmpfs upper dir, so the node's own device nodes can be `mknod`ed without
  touching the host (/dev/pts and /dev/mqueue are moved into the overlay first; /dev/shm is a fresh tmpfs, where
  podman keeps its lock segment);
- the directory /var/run points to is a fresh tmpfs, the node's CDI dir is bind-mounted on its `cdi`, and
  /etc/cdi, when present, is masked by an empty tmpfs; podman's run root and tmp dir live in that tmpfs too
  (podman refuses a run root longer than 50 characters, which a state dir under a work dir easily is).

Every later command is run inside it with `nsenter --target PID --mount`. The mounts vanish with the
namespace, i.e. when the holder and the containers started in it (their conmon monitors) are gone.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

SETUP_TIMEOUT_SECONDS = 30.0
# Inside the namespace: the tmpfs on /var/run's directory.
PRIVATE_RUN = os.path.realpath("/var/run")

_SETUP = r"""
set -eu
state="$1"; cdi="$2"
mount -n -t tmpfs -o mode=0755 gpu-dra-dev "$state/devtmp"
mkdir -p "$state/devtmp/upper" "$state/devtmp/work"
mount -n -t overlay gpu-dra-dev -o "lowerdir=/dev,upperdir=$state/devtmp/upper,workdir=$state/devtmp/work" "$state/dev"
for sub in pts mqueue; do
  if mountpoint -q "/dev/$sub"; then mount -n --move "/dev/$sub" "$state/dev/$sub"; fi
done
# A private /dev/shm: podman keeps its lock segment there (libpod_lock), which must not land on the host's.
# (mount -n: util-linux must not record these mounts in the host's /run/mount/utab.)
mkdir -p "$state/dev/shm"
mount -n -t tmpfs -o mode=1777 gpu-dra-shm "$state/dev/shm"
mount -n --move "$state/dev" /dev
run="$(readlink -f /var/run)"
mount -n -t tmpfs -o mode=0755 gpu-dra-run "$run"
mkdir -p "$run/cdi"
mount -n --bind "$cdi" "$run/cdi"
if [ -d /etc/cdi ]; then mount -n -t tmpfs -o mode=0755,ro gpu-dra-etc-cdi /etc/cdi; fi
echo ready
exec sleep 2147483647
"""


HOLDER_PID = "holder.pid"


class NamespaceError(RuntimeError):
    pass


def leftover_holder(state_dir: Path) -> int | None:
    """The pid of a holder of `state_dir` still running after whoever started it died (SIGKILL), recognised by its
    mounts (its overlay's work dir is under `state_dir`), so a reused pid is never taken for it."""
    try:
        pid = int((state_dir / HOLDER_PID).read_text().strip())
        mounts = Path(f"/proc/{pid}/mountinfo").read_text()
    except (OSError, ValueError):
        return None
    return pid if f" {state_dir / 'devtmp'} " in mounts or f"workdir={state_dir}/devtmp/work" in mounts else None


def same_mount_namespace(pid: int) -> list[int]:
    """Every other process in `pid`'s mount namespace (the conmon monitors started in it)."""
    try:
        ns = os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return []
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != pid:
            try:
                if os.readlink(f"/proc/{entry}/ns/mnt") == ns:
                    out.append(int(entry))
            except OSError:
                continue
    return out


class PrivateMountNamespace:
    """The holder process of one private mount namespace; `run` executes a command inside it."""

    def __init__(self, state_dir: Path, cdi_dir: Path) -> None:
        self.state_dir = state_dir
        self.cdi_dir = cdi_dir
        self._holder: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self._holder is None:
            raise NamespaceError("the private mount namespace is not started")
        return self._holder.pid

    def start(self) -> None:
        for d in ("devtmp", "dev"):
            (self.state_dir / d).mkdir(parents=True, exist_ok=True)
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", _SETUP, "setup",
             str(self.state_dir), str(self.cdi_dir)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )
        assert holder.stdout is not None
        line = holder.stdout.readline()  # "ready", or EOF when the setup failed
        if line.strip() != b"ready":
            try:
                _, err = holder.communicate(timeout=SETUP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                holder.kill()
                _, err = holder.communicate()
            raise NamespaceError(f"setting up the private mount namespace failed: {err.decode(errors='replace').strip()}")
        self._holder = holder
        (self.state_dir / HOLDER_PID).write_text(f"{holder.pid}\n")  # for stop_leftovers after a SIGKILL

    def command(self, argv: Sequence[str]) -> list[str]:
        """argv run inside the namespace."""
        return ["nsenter", "--target", str(self.pid), "--mount", "--", *argv]

    def run(self, argv: Sequence[str], *, timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(self.command(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if check and done.returncode != 0:
            raise NamespaceError(f"{shlex.join(argv)} exited with status {done.returncode}: {done.stderr.strip()}")
        return done

    def ensure_char_devices(self, nodes: Sequence[tuple[str, int, int]]) -> None:
        """mknod each (path, major, minor) that does not exist in the namespace's /dev yet."""
        if not nodes:
            return
        # In batches: a claim of every IMEX channel names 2048 nodes, more than one argument list holds.
        for start in range(0, len(nodes), 256):
            script = "set -e\n" + "".join(
                f"[ -e {shlex.quote(p)} ] || {{ mkdir -p {shlex.quote(os.path.dirname(p))}; mknod -m 0666 {shlex.quote(p)} c {ma} {mi}; }}\n"
                for p, ma, mi in nodes[start:start + 256]
            )
            self.run(["sh", "-c", script])

    def close(self) -> None:
        holder, self._holder = self._holder, None
        if holder is None:
            return
        holder.send_signal(signal.SIGTERM)
        try:
            holder.wait(timeout=10)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
        for stream in (holder.stdout, holder.stderr):
            if stream is not None:
                stream.close()
