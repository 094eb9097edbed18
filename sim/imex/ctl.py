"""`nvidia-imex-ctl -c CONFIG -q` (prints READY or NOT_READY) and `-N` (the node table), simulated: asks the local
daemon on its command port, as the real tool does."""

from __future__ import annotations

import json
import socket
import sys

from sim.imex.config import ConfigError, read_config


def query(config_path: str) -> dict[str, object]:
    config = read_config(config_path)
    with socket.create_connection((config.cmd_ip, config.cmd_port), timeout=2.0) as s:
        s.sendall(b"QUERY\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    return json.loads(data)  # type: ignore[no-any-return]


def main(argv: list[str]) -> int:
    if "-c" not in argv or argv.index("-c") + 1 >= len(argv) or not ({"-q", "-N"} & set(argv)):
        print("usage: nvidia-imex-ctl -c CONFIG (-q | -N) (gpu-dra simulator)", file=sys.stderr)
        return 2
    try:
        status = query(argv[argv.index("-c") + 1])
    except (ConfigError, OSError, ValueError) as exc:
        print(f"nvidia-imex-ctl (simulated): cannot reach the IMEX daemon: {exc}", file=sys.stderr)
        return 1
    if "-q" in argv:
        print(status.get("status"))
        return 0
    for ip, state in sorted((status.get("nodes") or {}).items()):  # type: ignore[union-attr]
        print(f"{ip}  {state}")
    print(f"Domain State: {'UP' if status.get('status') == 'READY' else 'DOWN'}")
    return 0
