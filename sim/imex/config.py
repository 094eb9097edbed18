"""The IMEX daemon's config file (`KEY=VALUE` lines, `#` comments) and its nodes config (one IP or DNS name per
line; names resolve through the container's /etc/hosts, which NVIDIA's compute-domain daemon keeps).

Paths are the container's: under GPU_DRA_CONTAINER_ROOT when set (the simulated kubelet runs the daemon pod as a
host process, sim.runtime.hostprocess), as the stand-ins inherit the daemon's environment."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

ROOT_ENV = "GPU_DRA_CONTAINER_ROOT"


class ConfigError(Exception):
    pass


def container_path(path: str | Path) -> Path:
    root = os.environ.get(ROOT_ENV)
    return Path(root) / str(path).lstrip("/") if root else Path(path)


def hosts() -> dict[str, str]:
    """name -> address from the container's /etc/hosts (the first entry of a name wins, as the resolver's)."""
    try:
        text = container_path("/etc/hosts").read_text()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        for name in words[1:]:
            out.setdefault(name, words[0])
    return out


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class ImexConfig:
    bind_ip: str
    server_port: int
    cmd_ip: str
    cmd_port: int
    nodes_file: Path

    def entries(self) -> list[str]:
        try:
            text = container_path(self.nodes_file).read_text()
        except OSError as exc:
            raise ConfigError(f"IMEX_NODE_CONFIG_FILE {self.nodes_file}: {exc.strerror or exc}") from None
        return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]

    def peers(self) -> dict[str, str]:
        """entry -> address of the nodes config's entries that resolve (a name not in /etc/hosts is a node that
        has not joined)."""
        names = hosts()
        out = {}
        for entry in self.entries():
            address = entry if _is_ip(entry) else names.get(entry)
            if address:
                out[entry] = address
        return out


def read_config(path: str | Path) -> ImexConfig:
    try:
        text = container_path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ConfigError(f"config file {path}:{number}: expected KEY=VALUE, got {raw!r}")
        values[key.strip()] = value.strip()
    nodes = values.get("IMEX_NODE_CONFIG_FILE")
    if not nodes:
        raise ConfigError(f"config file {path}: IMEX_NODE_CONFIG_FILE is required")
    try:
        port = int(values.get("SERVER_PORT") or 50000)
        cmd_port = int(values.get("IMEX_CMD_PORT") or 50005)
    except ValueError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    bind = values.get("BIND_INTERFACE_IP") or ""
    return ImexConfig(bind_ip=bind, server_port=port, cmd_ip=values.get("IMEX_CMD_BIND_INTERFACE_IP") or bind or
                      "127.0.0.1", cmd_port=cmd_port, nodes_file=Path(nodes))
