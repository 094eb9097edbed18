"""`nvidia-imex -c CONFIG`, simulated: serve peers on BIND_INTERFACE_IP:SERVER_PORT, connect to every peer of the
nodes config, answer status queries on the command port. Ready when every peer answered its last probe."""

from __future__ import annotations

import json
import signal
import socket
import sys
import threading
import time
from typing import Any

from sim.imex.config import ConfigError, ImexConfig, read_config

HELLO = b"IMEX-SIM 1\n"
PROBE_INTERVAL_S = 0.5


class Daemon:
    def __init__(self, config_path: str) -> None:
        self.config_path = config_path
        self.config: ImexConfig = read_config(config_path)
        self.peers: list[str] = self.config.peers()
        self.connected: dict[str, bool] = {}
        self.stop = threading.Event()
        self._lock = threading.Lock()

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
            nodes = {ip: ("CONNECTED" if self.connected.get(ip) else "UNAVAILABLE") for ip in self.peers}
        ready = bool(nodes) and all(v == "CONNECTED" for v in nodes.values())
        return (json.dumps({"status": "READY" if ready else "NOT_READY", "nodes": nodes}) + "\n").encode()

    def _probe(self) -> None:
        while not self.stop.is_set():
            for ip in list(self.peers):
                ok = False
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
            print(f"nvidia-imex (simulated): reload failed: {exc}", file=sys.stderr, flush=True)
            return
        with self._lock:
            self.peers = peers
            self.connected = {ip: self.connected.get(ip, False) for ip in peers}
        print(f"nvidia-imex (simulated): nodes config reloaded: {peers}", file=sys.stderr, flush=True)

    def run(self) -> int:
        if self.config.bind_ip and self.config.bind_ip not in self.peers:
            print(f"nvidia-imex (simulated): this node ({self.config.bind_ip}) is not in the nodes config "
                  f"{self.config.nodes_file}", file=sys.stderr, flush=True)
            return 1
        try:
            server = socket.create_server((self.config.bind_ip or "0.0.0.0", self.config.server_port))
            cmd = socket.create_server((self.config.cmd_ip, self.config.cmd_port))
        except OSError as exc:
            print(f"nvidia-imex (simulated): cannot listen: {exc}", file=sys.stderr, flush=True)
            return 1
        signal.signal(signal.SIGHUP, self._reload)
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        threads = [threading.Thread(target=self._serve, args=(server, lambda c: HELLO), daemon=True),
                   threading.Thread(target=self._serve, args=(cmd, self._status), daemon=True),
                   threading.Thread(target=self._probe, daemon=True)]
        for t in threads:
            t.start()
        print(f"nvidia-imex (simulated): listening on {self.config.bind_ip}:{self.config.server_port}, peers "
              f"{self.peers}", file=sys.stderr, flush=True)
        while not self.stop.is_set():
            time.sleep(0.2)
        server.close()
        cmd.close()
        return 0


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "-c":
        print("usage: nvidia-imex -c CONFIG (gpu-dra simulator)", file=sys.stderr)
        return 2
    try:
        return Daemon(argv[1]).run()
    except ConfigError as exc:
        print(f"nvidia-imex (simulated): {exc}", file=sys.stderr)
        return 1
