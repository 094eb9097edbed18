"""The IMEX daemons this node runs, one per ComputeDomain whose daemon claim is prepared here.

Each gets a directory `<state>/<domain uid>/` with NVIDIA's daemon config (`imexd.cfg`, the keys of NVIDIA's
compute-domain-daemon template) and the nodes config naming its peers' IPs (`nodes_config.cfg`); the directory is
what the daemon pod sees at /imexd. `nvidia-imex` and `nvidia-imex-ctl` come from the driver root (the host's
install on a GB200 node; the simulator's stand-ins on a simulated one). Readiness is `nvidia-imex-ctl -c CFG -q`
printing READY, as NVIDIA's daemon checks it.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpudra.atomicfile import atomic_write

log = logging.getLogger("gpu-dra.compute-domain.imex")

SERVER_PORT = 50000
CMD_PORT = 50005
IMEX_BIN = "usr/bin/nvidia-imex"
IMEX_CTL_BIN = "usr/bin/nvidia-imex-ctl"


def daemon_config(node_ip: str, nodes_file: Path) -> str:
    """imexd.cfg: NVIDIA's template values, bound to this node's address."""
    lines = {
        "LOG_LEVEL": "4", "LOG_FILE_NAME": "", "DAEMONIZE": "0", "BIND_INTERFACE_IP": node_ip,
        "SERVER_PORT": str(SERVER_PORT), "IMEX_NODE_CONFIG_FILE": str(nodes_file), "IMEX_WAIT_FOR_QUORUM": "RECOVERY",
        "IMEX_ENABLE_AUTH_ENCRYPTION": "0", "IMEX_CMD_ENABLED": "1", "IMEX_CMD_BIND_INTERFACE_IP": node_ip,
        "IMEX_CMD_PORT": str(CMD_PORT), "IMEX_NODE_DISCONNECTED_GRACE_TIME": "-1",
    }
    return "".join(f"{k}={v}\n" for k, v in lines.items())


@dataclass
class Running:
    process: subprocess.Popen[bytes]
    peers: tuple[str, ...]
    config: Path


class ImexDaemons:
    def __init__(self, state_dir: Path, driver_root: Path | None) -> None:
        self.state_dir = state_dir
        self.driver_root = driver_root
        self._running: dict[str, Running] = {}

    def domain_dir(self, domain: str) -> Path:
        return self.state_dir / domain

    def _binary(self, rel: str) -> Path:
        if self.driver_root is None:
            raise ImexError("no driver root (--driver-root): nvidia-imex cannot be found")
        path = self.driver_root / rel
        if not os.access(path, os.X_OK):
            raise ImexError(f"{path}: not found or not executable; the NVIDIA driver install on this node has no "
                            "IMEX daemon (nvidia-imex is part of the driver's nvidia-imex package)")
        return path

    def ensure(self, domain: str, node_ip: str, peers: tuple[str, ...]) -> None:
        """Run the domain's daemon with `peers` (this node included); restart it when they change, as NVIDIA's
        daemon restarts nvidia-imex on a new nodes config."""
        running = self._running.get(domain)
        if running is not None and running.process.poll() is None and running.peers == peers:
            return
        directory = self.domain_dir(domain)
        directory.mkdir(parents=True, exist_ok=True)
        nodes = directory / "nodes_config.cfg"
        atomic_write(nodes, "".join(f"{ip}\n" for ip in peers).encode(), mode=0o644)
        config = directory / "imexd.cfg"
        atomic_write(config, daemon_config(node_ip, nodes).encode(), mode=0o644)
        if running is not None:
            self._terminate(running)
        else:
            self._kill_leftover(directory)
        binary = self._binary(IMEX_BIN)
        with open(directory / "nvidia-imex.log", "ab") as out:
            process = subprocess.Popen([str(binary), "-c", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        atomic_write(directory / "nvidia-imex.pid", f"{process.pid}\n".encode(), durable=False)
        self._running[domain] = Running(process, peers, config)
        log.info("event=imex-started domain=%s pid=%d peers=%s", domain, process.pid, ",".join(peers))

    def ready(self, domain: str) -> tuple[bool, str]:
        """(READY?, what nvidia-imex-ctl said)."""
        running = self._running.get(domain)
        if running is None:
            return False, "no IMEX daemon runs for this domain here"
        if running.process.poll() is not None:
            log_file = self.domain_dir(domain) / "nvidia-imex.log"
            tail = log_file.read_text(errors="replace").strip().splitlines()[-1:] if log_file.exists() else []
            return False, f"nvidia-imex exited with status {running.process.returncode}: {' '.join(tail)}"
        try:
            out = subprocess.run([str(self._binary(IMEX_CTL_BIN)), "-c", str(running.config), "-q"],
                                 capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired, ImexError) as exc:
            return False, f"nvidia-imex-ctl: {exc}"
        text = (out.stdout or out.stderr).decode(errors="replace").strip()
        return out.returncode == 0 and text == "READY", text

    def stop(self, domain: str) -> None:
        running = self._running.pop(domain, None)
        if running is not None:
            self._terminate(running)
            log.info("event=imex-stopped domain=%s", domain)

    def running(self) -> set[str]:
        return set(self._running)

    def stop_all(self) -> None:
        for domain in list(self._running):
            self.stop(domain)

    @staticmethod
    def _kill_leftover(directory: Path) -> None:
        """A daemon left by an agent that was killed (not stopped) still holds the domain's ports: end it, if the
        pid file's process is still that daemon (its command line names this domain's config)."""
        try:
            pid = int((directory / "nvidia-imex.pid").read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return
        if str(directory / "imexd.cfg").encode() in cmdline:
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    @staticmethod
    def _terminate(running: Running) -> None:
        if running.process.poll() is None:
            try:
                os.killpg(running.process.pid, signal.SIGTERM)
                running.process.wait(timeout=5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                running.process.kill()


class ImexError(Exception):
    pass
