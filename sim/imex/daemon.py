"""`nvidia-imex -c CONFIG`, simulated: serve peers on the bind address's SERVER_PORT, connect to every peer of the
nodes config, answer status queries on the command port. Ready when every peer that resolves answered its last
probe and the node's NVLink fabric is up.

The bind address is BIND_INTERFACE_IP, or (empty, as NVIDIA's template leaves it) the nodes config entry that
resolves to IMEX_CMD_BIND_INTERFACE_IP (this node's own address, the only one of the list that is local).
SIGUSR1 re-reads the nodes config and re-resolves its names (NVIDIA's daemon sends it when /etc/hosts changed);
SIGHUP does the same. The node's fabric state is the simulator's NVML faults file (`fabric`: its path and this
node's GPU UUIDs), which a GB200 node's IMEX daemon learns from the driver.

Like the real one it will not start in a container that lacks the driver (`missing`): the driver's NVML where the
loader looks (else the loader's error, exit 127), /dev/nvidiactl, every GPU's /dev/nvidia<N> and the
fabric-imex-mgmt capability node, each a character device with the driver's numbers. The loader's message is
glibc's; the device message is this stand-in's own wording (NVIDIA publishes none for it).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import sys
import threading
from pathlib import Path
from typing import Any

from sim.imex.config import ConfigError, ImexConfig, container_path, read_config

HELLO = b"IMEX-SIM 1\n"
PROBE_INTERVAL_S = 0.5

Fabric = tuple[Path, frozenset[str]]  # (the node's NVML faults file, its GPUs' UUIDs)


def _say(text: str) -> None:
    print(f"nvidia-imex (simulated): {text}", file=sys.stderr, flush=True)


def fabric_down(fabric: Fabric | None) -> list[str]:
    if fabric is None:
        return []
    from sim.nvml.faults import read_faults

    try:
        down = read_faults(fabric[0]).fabric_unhealthy
    except ValueError:
        return []
    return sorted(down & fabric[1])


class Daemon:
    def __init__(self, config_path: str, fabric: Fabric | None = None) -> None:
        self.config_path = config_path
        self.fabric = fabric
        self.config: ImexConfig = read_config(config_path)
        self.peers: dict[str, str] = self.config.peers()  # nodes config entry -> address
        self.connected: dict[str, bool] = {}
        self.stop = threading.Event()
        self._lock = threading.Lock()

    def bind_ip(self) -> str:
        if self.config.bind_ip:
            return self.config.bind_ip
        if self.config.cmd_ip in self.peers.values():
            return self.config.cmd_ip
        raise ConfigError(f"BIND_INTERFACE_IP is empty and no entry of the nodes config {self.config.nodes_file} "
                          f"resolves to this node ({self.config.cmd_ip})")

    def _serve(self, sock: socket.socket, answer: Any) -> None:
        sock.settimeout(0.5)
        while not self.stop.is_set():
            try:
                conn, _ = sock.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                try:
                    conn.settimeout(2.0)
                    conn.sendall(answer(conn))
                except OSError:
                    pass

    def _status(self, conn: socket.socket) -> bytes:
        conn.recv(64)
        with self._lock:
            nodes = {address: ("CONNECTED" if self.connected.get(address) else "UNAVAILABLE")
                     for address in self.peers.values()}
        down = fabric_down(self.fabric)
        ready = bool(nodes) and all(v == "CONNECTED" for v in nodes.values()) and not down
        body: dict[str, Any] = {"status": "READY" if ready else "NOT_READY", "nodes": nodes}
        if down:
            body["fabricDown"] = down
        return (json.dumps(body) + "\n").encode()

    def _probe(self) -> None:
        while not self.stop.is_set():
            with self._lock:
                addresses = sorted(set(self.peers.values()))
            for ip in addresses:
                try:
                    with socket.create_connection((ip, self.config.server_port), timeout=1.0) as s:
                        ok = s.recv(len(HELLO)) == HELLO
                except OSError:
                    ok = False
                with self._lock:
                    self.connected[ip] = ok
            self.stop.wait(PROBE_INTERVAL_S)

    def _reload(self, *_: Any) -> None:
        try:
            peers = read_config(self.config_path).peers()
        except ConfigError as exc:
            _say(f"reload failed: {exc}")
            return
        with self._lock:
            self.peers = peers
            self.connected = {ip: self.connected.get(ip, False) for ip in peers.values()}
        _say(f"nodes config reloaded: {sorted(peers.values())}")

    def run(self) -> int:
        try:
            bind = self.bind_ip()
        except ConfigError as exc:
            _say(str(exc))
            return 1
        if bind not in self.peers.values():
            _say(f"this node ({bind}) is not in the nodes config {self.config.nodes_file}")
            return 1
        try:
            server = socket.create_server((bind, self.config.server_port))
            cmd = socket.create_server((self.config.cmd_ip, self.config.cmd_port))
        except OSError as exc:
            _say(f"cannot listen: {exc}")
            return 1
        for sig in (signal.SIGHUP, signal.SIGUSR1):
            signal.signal(sig, self._reload)
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        threads = [threading.Thread(target=self._serve, args=(server, lambda c: HELLO), daemon=True),
                   threading.Thread(target=self._serve, args=(cmd, self._status), daemon=True),
                   threading.Thread(target=self._probe, daemon=True)]
        for t in threads:
            t.start()
        _say(f"listening on {bind}:{self.config.server_port}, peers {sorted(self.peers.values())}")
        while not self.stop.is_set():
            self.stop.wait(0.2)
        server.close()
        cmd.close()
        return 0


# Where a loader looks for a library no ld.so.cache names (glibc's built-in paths, both image families).
LOADER_DIRS = ("/lib64", "/usr/lib64", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
               "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu")
NVML_SONAME = "libnvidia-ml.so.1"
LOADER_EXIT = 127  # what the dynamic loader exits with when a needed library is missing


def _char_device(path: Path, major: int, minor: int) -> str | None:
    """Why `path` is not the character device major:minor (None when it is)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return exc.strerror or str(exc)
    if not stat.S_ISCHR(st.st_mode):
        return "not a character device"
    if (os.major(st.st_rdev), os.minor(st.st_rdev)) != (major, minor):
        return f"device {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}, the driver's is {major}:{minor}"
    return None


def missing(gpus: int, capability: Path | tuple[int, int]) -> tuple[int, str] | None:
    """(exit code, message) when this container lacks what a real nvidia-imex needs, else None: the driver's NVML
    where the loader finds it (the loader's own error and exit status), /dev/nvidiactl, each of the node's GPUs'
    /dev/nvidia<N>, and the fabric-imex-mgmt capability node whose minor the driver publishes in `capability`
    (its procfs file on the host; in a container, whose procfs is the host kernel's without the simulated driver,
    the (minor, nvidia-caps major) that file publishes). Paths are the container's (sim.imex.config.container_path)."""
    from driver.cdi import NVIDIA_MAJOR, NVIDIACTL_MINOR, NVIDIA_CAPS_DIR, DeviceNumbers, parse_capability_file

    if not any(container_path(f"{d}/{NVML_SONAME}").is_file() for d in LOADER_DIRS):
        return LOADER_EXIT, (f"nvidia-imex: error while loading shared libraries: {NVML_SONAME}: cannot open shared "
                             "object file: No such file or directory")
    wanted = [("/dev/nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR)]
    wanted += [(f"/dev/nvidia{i}", NVIDIA_MAJOR, i) for i in range(gpus)]
    if isinstance(capability, tuple):
        minor, caps_major = capability
    else:
        try:
            minor = parse_capability_file(capability.read_text())["DeviceFileMinor"]
            caps_major = DeviceNumbers.read(capability.parents[3]).majors["nvidia-caps"]
        except (OSError, KeyError) as exc:
            return 1, f"nvidia-imex (simulated): the driver's fabric-imex-mgmt capability cannot be read: {exc}"
    wanted.append((f"{NVIDIA_CAPS_DIR}/nvidia-cap{minor}", caps_major, minor))
    for path, major, device_minor in wanted:
        why = _char_device(container_path(path), major, device_minor)
        if why is not None:
            return 1, (f"nvidia-imex: failed to open {path}: {why}: the IMEX daemon needs the NVIDIA driver's "
                       "GPU, control and fabric-imex-mgmt device nodes in its container")
    return None


def main(argv: list[str], fabric: Fabric | None = None,
         needs: tuple[int, str] | tuple[int, tuple[int, int]] | None = None) -> int:
    """`needs`: (the node's GPU count, its driver's fabric-imex-mgmt capability file or what it publishes), checked
    before starting."""
    if len(argv) != 2 or argv[0] != "-c":
        print("usage: nvidia-imex -c CONFIG (gpu-dra simulator)", file=sys.stderr)
        return 2
    if needs is not None and (refused := missing(
            needs[0], needs[1] if isinstance(needs[1], tuple) else Path(needs[1]))) is not None:
        print(refused[1], file=sys.stderr, flush=True)
        return refused[0]
    try:
        return Daemon(argv[1], fabric).run()
    except ConfigError as exc:
        _say(str(exc))
        return 1
