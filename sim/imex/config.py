"""The IMEX daemon's config file (`KEY=VALUE` lines, `#` comments) and its nodes config (one IP per line)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class ImexConfig:
    bind_ip: str
    server_port: int
    cmd_ip: str
    cmd_port: int
    nodes_file: Path

    def peers(self) -> list[str]:
        try:
            text = self.nodes_file.read_text()
        except OSError as exc:
            raise ConfigError(f"IMEX_NODE_CONFIG_FILE {self.nodes_file}: {exc.strerror or exc}") from None
        return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def read_config(path: str | Path) -> ImexConfig:
    try:
        text = Path(path).read_text()
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
